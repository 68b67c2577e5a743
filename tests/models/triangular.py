"""A triangular loop nest on a (data, tensor) mesh: step i of an OUTER-step fori_loop runs an inner
fori_loop i times, so the inner body runs 0 + 1 + ... + (OUTER - 1) times in all.

Per rank h is [BATCH/data, D/tensor] f32; each inner step all-gathers h over `tensor` and multiplies
it by w [D, D/tensor]. The inner loop's bound is the outer counter, carried into it unchanged: static
once the outer loop is unrolled.
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

OUTER, BATCH, D = 4, 64, 128


def step(w, x):
    def outer(i, h):
        return jax.lax.fori_loop(0, i, lambda j, g: jnp.tanh(g @ w), h)

    return jax.lax.fori_loop(0, OUTER, outer, x)


def workload(mesh):
    data, tensor = mesh.axis_names
    w = jax.ShapeDtypeStruct((D, D), jnp.float32, sharding=NamedSharding(mesh, P(None, tensor)))
    x = jax.ShapeDtypeStruct((BATCH, D), jnp.float32, sharding=NamedSharding(mesh, P(data, tensor)))
    return step, (w, x)

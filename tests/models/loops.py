"""A scan over LAYERS weights, a nested fori_loop (OUTER x INNER) and a cond, on a (data, tensor) mesh.

Per rank: x is [BATCH/data, D] and every weight [D, D/tensor]; each scan step all-gathers the carried
activation over `tensor` and multiplies it by one weight. The cond's first branch does one more such
matmul, its second only scales: the costlier (first) branch is the one traced.
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

LAYERS, OUTER, INNER, BATCH, D = 5, 2, 3, 16, 64


def step(ws, x):
    h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)

    def outer(i, c):
        return jax.lax.fori_loop(0, INNER, lambda j, d: d * 2.0, c) + 1.0

    h = jax.lax.fori_loop(0, OUTER, outer, h)
    return jax.lax.cond(h.sum() > 0, lambda v: v @ ws[0], lambda v: v * 3.0, h)


def workload(mesh):
    data, tensor = mesh.axis_names
    ws = jax.ShapeDtypeStruct((LAYERS, D, D), jnp.float32, sharding=NamedSharding(mesh, P(None, None, tensor)))
    x = jax.ShapeDtypeStruct((BATCH, D), jnp.float32, sharding=NamedSharding(mesh, P(data, None)))
    return step, (ws, x)

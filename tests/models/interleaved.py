"""Interleaved layers: a branch picked by the layer index, on a (data, tensor) mesh.

Per rank h is [BATCH/data, D/tensor] f32. A fori_loop of FORI steps runs the heavy branch (all-gather
h over `tensor`, multiply by w [D, D/tensor]) on even steps and only scales h on odd ones; then a
scan over `arange(SCAN)` runs the heavy branch on every third step. Each step's branch follows from
the loop counter alone, so the trace holds the branches the step runs: ceil(FORI/2) + ceil(SCAN/3)
all-gathers, where the costliest branch every time would give FORI + SCAN. Last, a reversed scan
over `arange(SWITCH)` picks one of three branches with `lax.switch(i % 3, ...)` (heavy, light,
light; the index is clamped to the branches): ceil(SWITCH/3) more.
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

FORI, SCAN, SWITCH, BATCH, D = 4, 6, 5, 64, 128


def step(w, x):
    def heavy(h):
        return jnp.sin(h @ w)

    def light(h):
        return h * 2.0

    h = jax.lax.fori_loop(0, FORI, lambda i, h: jax.lax.cond(i % 2 == 0, heavy, light, h), x)

    def layer(h, i):
        return jax.lax.cond(i % 3 == 0, heavy, light, h), None

    h, _ = jax.lax.scan(layer, h, jnp.arange(SCAN))

    def switched(h, i):
        return jax.lax.switch(i % 3, [heavy, light, light], h), None

    h, _ = jax.lax.scan(switched, h, jnp.arange(SWITCH), reverse=True)
    return h


def workload(mesh):
    data, tensor = mesh.axis_names
    w = jax.ShapeDtypeStruct((D, D), jnp.float32, sharding=NamedSharding(mesh, P(None, tensor)))
    x = jax.ShapeDtypeStruct((BATCH, D), jnp.float32, sharding=NamedSharding(mesh, P(data, tensor)))
    return step, (w, x)

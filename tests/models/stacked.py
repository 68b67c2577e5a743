"""One layer of stacked weights read by index, and a cache row written by index: how `lax.scan`
reads a layer's weights and how a decode step writes its KV cache. The layer index is an input,
so the compiler cannot fold either into a static slice."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

LAYERS, BATCH, WIDTH = 8, 16, 256


def step(w, cache, x, i):
    y = x @ lax.dynamic_index_in_dim(w, i, 0, keepdims=False)
    return lax.dynamic_update_index_in_dim(cache, y, i, 0)


def workload(mesh):
    def spec(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P()))

    return step, (spec((LAYERS, WIDTH, WIDTH), jnp.bfloat16), spec((LAYERS, BATCH, WIDTH), jnp.bfloat16),
                  spec((BATCH, WIDTH), jnp.bfloat16), spec((), jnp.int32))

"""A while loop that runs until the data says stop: no static trip count."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P


def step(x):
    return jax.lax.while_loop(lambda v: v.sum() < 100.0, lambda v: jnp.exp(v), x)


def workload(mesh):
    return step, (jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=NamedSharding(mesh, P())),)

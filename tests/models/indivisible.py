"""A weight of 100 rows sharded 8 ways: 100 does not divide by 8."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P


def workload(mesh):
    w = jax.ShapeDtypeStruct((100, 64), jnp.float32, sharding=NamedSharding(mesh, P("data", None)))
    return (lambda params: params["w"] * 2), ({"w": w},)

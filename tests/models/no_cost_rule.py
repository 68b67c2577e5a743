"""A step with a Cholesky factorisation, an op Flint has no cost rule for."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P


def workload(mesh):
    a = jax.ShapeDtypeStruct((8, 16, 16), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    return jnp.linalg.cholesky, (a,)

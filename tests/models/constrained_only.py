"""A matmul whose inputs are all replicated: only a sharding constraint inside the step splits its
result's rows over the `data` axis, so every mesh axis but `data` replicates the work."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P


def workload(mesh):
    def step(w, x):
        return jax.lax.with_sharding_constraint(x @ w, NamedSharding(mesh, P("data")))

    whole = NamedSharding(mesh, P())
    return step, (
        jax.ShapeDtypeStruct((64, 128), jnp.float32, sharding=whole),
        jax.ShapeDtypeStruct((32, 64), jnp.float32, sharding=whole),
    )

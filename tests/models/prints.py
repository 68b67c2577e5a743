"""A model file that writes to standard output, from Python and through the file descriptor as
native code would, on import, in workload and while its step is traced."""

import os

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

print("printed on import")
os.write(1, b"written to fd 1 on import\n")


def workload(mesh):
    print("printed by workload")

    def step(w, x):
        print("printed while tracing")
        return jnp.tanh(x @ w).sum()

    w = jax.ShapeDtypeStruct((64, 64), jnp.float32, sharding=NamedSharding(mesh, P()))
    x = jax.ShapeDtypeStruct((8, 64), jnp.float32, sharding=NamedSharding(mesh, P(mesh.axis_names[0])))
    return step, (w, x)

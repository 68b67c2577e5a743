"""A step whose kernels call libdevice (exp, tanh): XLA's GPU compiler needs the CUDA compiler's
libdevice to build it, so extracting it on a GPU backend shows where libdevice comes from."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

ROWS, COLS = 64, 128


def step(x):
    return jnp.exp(x) * jnp.tanh(x)


def workload(mesh):
    sharding = NamedSharding(mesh, P(mesh.axis_names[0], None))
    return step, (jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32, sharding=sharding),)

"""Two collective permutes over a 1-D mesh of 4: a full ring shift, then pairs (0->1), (2->3) only."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

ROWS, COLS = 16, 32  # per-rank block of the f32 input


def workload(mesh):
    axis = mesh.axis_names[0]
    n = mesh.shape[axis]

    def per_rank(x):
        ring = jax.lax.ppermute(x, axis, [(i, (i + 1) % n) for i in range(n)])
        half = jax.lax.ppermute(ring * 2.0, axis, [(0, 1), (2, 3)])
        return half + 1.0

    step = jax.shard_map(per_rank, mesh=mesh, in_specs=P(axis), out_specs=P(axis))
    x = jax.ShapeDtypeStruct((n * ROWS, COLS), jnp.float32, sharding=NamedSharding(mesh, P(axis)))
    return step, (x,)

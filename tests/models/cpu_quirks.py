"""Three things XLA:CPU runs otherwise than its module writes them, for `flint validate`, on a 1-D
mesh of 4 (one shard_map over it, f32 [ROWS, COLS] per rank):

- small while loops (the threefry rounds of `jax.random` in each step of a scan), which XLA:CPU
  would run as single kernels that the profiler cannot see into;
- a sort, which XLA:CPU runs as a copy of its operand and then an in-place sort;
- a collective-permute whose pairs send ranks 0 and 3 to themselves, and swap ranks 1 and 2.
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

ROWS, COLS, STEPS = 8, 128, 3
PAIRS = [(0, 0), (1, 2), (2, 1), (3, 3)]


def workload(mesh):
    axis = mesh.axis_names[0]

    def per_rank(x, key):
        def noisy(h, i):
            keep = jax.random.bernoulli(jax.random.fold_in(key, i), 0.5, h.shape)
            return jnp.where(keep, jnp.tanh(h), h), None

        h, _ = jax.lax.scan(noisy, x, jnp.arange(STEPS))
        return jax.lax.ppermute(jnp.sort(h, axis=-1), axis, PAIRS)

    step = jax.shard_map(per_rank, mesh=mesh, in_specs=(P(axis), P()), out_specs=P(axis))
    x = jax.ShapeDtypeStruct((4 * ROWS, COLS), jnp.float32, sharding=NamedSharding(mesh, P(axis)))
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=NamedSharding(mesh, P()))
    return step, (x, key)

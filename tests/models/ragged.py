"""A ragged all-to-all (how MoE layers send each expert a variable number of tokens) on a 1-D mesh.

Per rank: an f32 [ROWS, COLS] block of tokens and four int32 [RANKS] vectors (input offsets, send
sizes, output offsets, receive sizes). How many rows go where is data; the most a rank can send is
its whole block. XLA:CPU cannot generate code for the op, but partitions it like any other.
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

ROWS, COLS = 64, 32


def workload(mesh):
    (axis,) = mesh.axis_names
    ranks = mesh.shape[axis]

    def per_rank(tokens, input_offsets, send_sizes, output_offsets, recv_sizes):
        return jax.lax.ragged_all_to_all(
            tokens, jnp.zeros_like(tokens), input_offsets, send_sizes, output_offsets, recv_sizes,
            axis_name=axis,
        )

    step = jax.shard_map(per_rank, mesh=mesh, in_specs=(P(axis),) * 5, out_specs=P(axis))
    tokens = jax.ShapeDtypeStruct((ranks * ROWS, COLS), jnp.float32, sharding=NamedSharding(mesh, P(axis)))
    sizes = jax.ShapeDtypeStruct((ranks * ranks,), jnp.int32, sharding=NamedSharding(mesh, P(axis)))
    return step, (tokens, sizes, sizes, sizes, sizes)

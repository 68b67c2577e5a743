"""Attention's output projection, which the GPU compiler of JAX 0.10.2 could not tile as a Triton
GEMM on an A100 (those of JAX 0.11.2 and 0.12 do).

Per data rank: the probabilities [b, HEADS, SEQ, SEQ] times the values [b, SEQ, HEADS, HEAD_DIM],
then projected by wo [HEADS, HEAD_DIM, WIDTH]: the projection is one dot of [b*SEQ, HEADS*HEAD_DIM]
by [HEADS*HEAD_DIM, WIDTH], bf16, of 2*b*SEQ*HEADS*HEAD_DIM*WIDTH FLOPs. Fused with the einsum
before it, that compiler for sm_80 found no output tile sizes for it (sm_90 did); the real
compiler then ran the program with cuBLAS GEMMs. The sizes are Megatron-LM's 1.7B GPT's (hidden
2304, 24 heads) at a short sequence.
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

BATCH, SEQ, HEADS, HEAD_DIM = 64, 16, 24, 96
WIDTH = HEADS * HEAD_DIM


def step(probs, v, wo):
    attended = jnp.einsum("bhst,bthk->bshk", probs, v)
    return jnp.einsum("bshk,hkd->bsd", attended, wo)


def workload(mesh):
    data = mesh.axis_names[0]

    def spec(shape, *partition):
        return jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, P(*partition)))

    probs = spec((BATCH, HEADS, SEQ, SEQ), data)
    v = spec((BATCH, SEQ, HEADS, HEAD_DIM), data)
    return step, (probs, v, spec((HEADS, HEAD_DIM, WIDTH)))

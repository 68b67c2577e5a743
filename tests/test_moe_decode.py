"""The MoE and KV-cache decode examples' traces against numbers derived by hand.

Everything expected below is computed from the example modules' constants and the sharding math in
their docstrings; rank r sits at the row-major position of the mesh.

MoE (examples/moe.py) on a mesh (ep, rest...): n = ep * R ranks, R the product of the other axes.
Each rank routes t = TOKENS/n tokens into a [E, C, D] dispatch buffer (E = EXPERTS, C = CAPACITY,
D = D_MODEL) and holds El = E/ep experts; after the all_to_all a rank's experts see ep*C slots each.

Decode (examples/decode.py) on a mesh (dp axes..., tp): b = BATCH/dp sequences and h = HEADS/tp heads
per rank, f = D_FF/tp hidden columns and v = VOCAB/tp vocabulary columns; prefill covers S = PROMPT
positions, decode one position attending over the whole cache of M = MAX_LEN positions.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import EXAMPLES, extract, load_example, matmuls_and_collectives

from flint.schema import et_def_pb2 as pb
from flint.trace.contract import check_traces
from flint.trace.reader import attr_value, read_comm_groups, read_trace

BF16, F32, I32 = 2, 4, 4


moe = load_example("moe")
decode = load_example("decode")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """(directory, --json summary) of an example on a mesh, extracted once per module."""
    cache: dict[tuple[str, str], tuple] = {}

    def get(model: str, mesh: str):
        if (model, mesh) not in cache:
            out = tmp_path_factory.mktemp(model) / "traces"
            cache[model, mesh] = (out, extract(EXAMPLES / f"{model}.py", mesh, out))
        return cache[model, mesh]

    return get


def shape_of(mesh: str) -> tuple[int, ...]:
    return tuple(int(s) for s in mesh.split("x"))


def group_over(shape: tuple[int, ...], rank: int, axes: tuple[int, ...]) -> tuple[int, ...]:
    """Ranks that share `rank`'s mesh coordinates on every axis except `axes`, ascending."""
    coords = np.unravel_index(rank, shape)
    kept = [a for a in range(len(shape)) if a not in axes]
    return tuple(
        r
        for r in range(math.prod(shape))
        if all(np.unravel_index(r, shape)[a] == coords[a] for a in kept)
    )


def totals_of(colls) -> dict:
    """The --json summary's per-rank `collectives` block for a list of (type, size, group)."""
    names = {pb.ALL_REDUCE: "all_reduce", pb.ALL_TO_ALL: "all_to_all"}
    out: dict[str, dict[str, int]] = {}
    for kind, size, _ in colls:
        entry = out.setdefault(names[kind], {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += size
    return out


# ---------------------------------------------------------------------------------------------- MoE


def moe_expected(shape: tuple[int, ...], rank: int):
    ep, n = shape[0], math.prod(shape)
    rest = n // ep
    E, C, D, F = moe.EXPERTS, moe.CAPACITY, moe.D_MODEL, moe.D_FF
    t, El = moe.TOKENS // n, moe.EXPERTS // ep
    slots = ep * C  # slots per local expert after the all_to_all
    forward = (
        2 * t * D * E  # router logits x[t,D] @ w_router[D,E]
        + 2 * E * C * D * t  # dispatch: [t,E,C] x [t,D] contracting t -> [E,C,D]
        + 2 * El * slots * F * D  # expert up: [El,slots,D] x [El,D,F]
        + 2 * El * slots * D * F  # expert down: [El,slots,F] x [El,F,D]
        + 2 * t * D * E * C  # combine: [t,E,C] x [E,C,D] contracting (E,C) -> [t,D]
    )
    backward = (
        2 * t * E * C * D  # d combine weights: dy[t,D] x out[E,C,D] contracting D (feeds the gate)
        + 2 * E * C * D * t  # d expert output: combine[t,E,C] x dy[t,D] contracting t
        + 2 * El * slots * F * D  # d hidden = d_out @ w_out^T
        + 2 * El * F * D * slots  # d w_out = hidden^T @ d_out
        + 2 * El * D * F * slots  # d w_in = buffers^T @ d_hidden
        + 2 * D * E * t  # d w_router = x^T @ d_logits
        # No d buffers = d_hidden @ w_in^T and no d dispatch: the tokens are an input and the
        # one-hot dispatch mask comes from argmax, so nothing needs a gradient through them.
    )
    everyone = tuple(range(n))
    expert_group = group_over(shape, rank, (0,))
    replicas = group_over(shape, rank, tuple(range(1, len(shape))))
    # The dispatch buffer [E,C,D] forward, the returning [El,ep*C,D] (same elements), and in the
    # backward pass the transpose of the return, whose operand is the cotangent of [E,C,D]. The
    # dispatch itself has no backward all_to_all (no gradient flows into the tokens, see above).
    colls = [(pb.ALL_TO_ALL, E * C * D * BF16, expert_group)] * 3
    # w_router is replicated on every rank, which all see different tokens: its gradient is summed
    # over all ranks (the transpose of shard_map's implicit pvary over every axis).
    colls.append((pb.ALL_REDUCE, D * E * BF16, everyone))
    if rest > 1:  # expert weights are replicated over the other axes: gradients summed there
        colls += [(pb.ALL_REDUCE, El * D * F * BF16, replicas)] * 2
    colls.append((pb.ALL_REDUCE, F32, everyone))  # the f32 loss, a mean over all tokens
    return forward + backward, sorted(colls)


@pytest.mark.parametrize("mesh", ["4x2", "4", "2x2x2"])
def test_moe_every_rank_matches_hand_derivation(traces, mesh):
    directory, summary = traces("moe", mesh)
    shape = shape_of(mesh)
    for rank in range(math.prod(shape)):
        assert matmuls_and_collectives(directory, rank) == moe_expected(shape, rank), f"rank {rank}"
    assert summary["per_rank"]["collectives"] == totals_of(moe_expected(shape, 0)[1])
    assert check_traces(directory) == []


def test_moe_groups_file(traces):
    directory, _ = traces("moe", "4x2")
    groups = set(read_comm_groups(directory / "moe.comm_groups.json").values())
    # all_to_all over the expert axis (mesh columns), expert-gradient sums over the rows, all ranks.
    columns = {(0, 2, 4, 6), (1, 3, 5, 7)}
    rows = {(0, 1), (2, 3), (4, 5), (6, 7)}
    assert groups == columns | rows | {tuple(range(8))}


# ------------------------------------------------------------------------------------------- decode


def decode_expected(shape: tuple[int, ...], rank: int):
    m = decode
    tp = shape[-1] if len(shape) > 1 else 1
    dp = math.prod(shape) // tp
    b, h, f, v = m.BATCH // dp, m.HEADS // tp, m.D_FF // tp, m.VOCAB // tp
    S, M, D, Dh = m.PROMPT, m.MAX_LEN, m.D_MODEL, m.HEAD_DIM

    def layer(s, keys):
        """One block over s positions per sequence attending over `keys` positions."""
        return (
            3 * 2 * b * s * D * h * Dh  # wq, wk, wv: [b,s,D] x [D,h,Dh]
            + 2 * b * h * s * keys * Dh  # scores q.k
            + 2 * b * h * s * keys * Dh  # probs @ v
            + 2 * b * s * h * Dh * D  # wo: [b,s,h,Dh] x [h,Dh,D], contracting (h,Dh)
            + 2 * b * s * D * f  # w_up
            + 2 * b * s * f * D  # w_down
        )

    flops = (
        m.LAYERS * layer(S, S)  # prefill: causal attention among the prompt's own S keys
        + 2 * b * D * v  # prefill logits of the last prompt position
        # decode: one position; it reads the whole cache (all M positions, masked to <= PROMPT),
        # since the cache length is static
        + m.LAYERS * layer(1, M)
        + 2 * b * D * v  # decode logits
    )
    colls = []
    if tp > 1:
        tensor_group = group_over(shape, rank, (len(shape) - 1,))
        # row-parallel wo and w_down each end in a sum over the tensor group, every layer, every pass
        colls += [(pb.ALL_REDUCE, b * S * D * BF16, tensor_group)] * (2 * m.LAYERS)
        colls += [(pb.ALL_REDUCE, b * 1 * D * BF16, tensor_group)] * (2 * m.LAYERS)
    return flops, sorted(colls)


@pytest.mark.parametrize("mesh", ["2x4", "4"])
def test_decode_every_rank_matches_hand_derivation(traces, mesh):
    directory, summary = traces("decode", mesh)
    shape = shape_of(mesh)
    for rank in range(math.prod(shape)):
        assert matmuls_and_collectives(directory, rank) == decode_expected(shape, rank), f"rank {rank}"
    assert summary["per_rank"]["collectives"] == totals_of(decode_expected(shape, 0)[1])
    assert check_traces(directory) == []


def test_decode_writes_the_cache_with_dynamic_update_slice(traces):
    """Each layer writes k and v once in prefill (S positions) and once in decode (1 position), in
    place: each write reads and writes its update, never the cache."""
    directory, _ = traces("decode", "2x4")
    m = decode
    b, h = m.BATCH // 2, m.HEADS // 4
    indices = 4 * I32  # one scalar start index per cache dimension

    def size(positions):  # the update read, the indices, the update written into the cache
        return 2 * b * positions * h * m.HEAD_DIM * BF16 + indices

    for rank in range(8):
        trace = read_trace(directory / f"decode.{rank}.et")
        writes = sorted(
            attr_value(n, "tensor_size")
            for n in trace.nodes
            if attr_value(n, "op") == "dynamic_update_slice"
        )
        assert writes == sorted([size(m.PROMPT)] * 2 * m.LAYERS + [size(1)] * 2 * m.LAYERS)

"""`--pipeline-stages` on the GPU compiler's kernels (`--backend gpu:h100`, its default stage when
pipelining: `optimized`), against values derived by hand and against the partitioned stage.

Model: `examples/gpt.py` with L = 4 layers on `pp=2,data=2,tensor=2` (`--strategy dp+tp`), S = 2
stages, M = 4 microbatches, 1F1B: 2 layers per stage. Rank r = 4s + 2d + t (stage s, data position
d, tensor position t); its peer on the other stage is r +- 4, its data group {4s + t, 4s + 2 + t},
its tensor group {4s + 2d, 4s + 2d + 1}. A microbatch on one rank is b = BATCH / M / dp = 2
sequences of T = b * SEQ = 256 tokens, so the activation the forward layer loop carries from layer
to layer (and its gradient going back) is bf16 [b, SEQ, D_MODEL]: 2 * 128 * 256 * 2 = 131,072 bytes.

Matmul FLOPs of one layer's forward on one rank (tp = 2 splits heads, MLP columns, vocabulary):
q, k, v 3 * 2T * D * D/tp; QK^T and PV 2 * 2b * H/tp * SEQ^2 * D_HEAD; the output projection
2T * D/tp * D; w_in and w_out 2 * 2T * D * F/tp. Its backward runs two matmuls per forward one (input
and weight gradients). The head is 2T * D * V/tp forward and twice that backward.

In the optimised module the compiler's combiner joins each layer's six matrix gradients into one
data-group all-reduce of (4 D^2 + 2 D F) / tp bf16 elements, and its backward reduces the input
gradients of q, k and v summed: 2 tensor-group all-reduces per layer in forward and in backward.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from conftest import EXAMPLES, assert_sends_match_receives, extract, flint, load_example, transfers

from flint.schema import et_def_pb2 as pb
from flint.trace.contract import check_traces
from flint.trace.reader import attr_value, find_traces, read_comm_groups, read_trace

gpt = load_example("gpt")
S, M, L, DP, TP = 2, 4, 4, 2, 2
RANKS = S * DP * TP
b = gpt.BATCH // M // DP
T = b * gpt.SEQ
D, F, H, V = gpt.D_MODEL, gpt.D_FF, gpt.HEADS, gpt.VOCAB
ACTIVATION = b * gpt.SEQ * D * 2
LAYER_FORWARD = (
    3 * 2 * T * D * (D // TP)
    + 2 * 2 * b * (H // TP) * gpt.SEQ * gpt.SEQ * gpt.D_HEAD
    + 2 * T * (D // TP) * D
    + 2 * 2 * T * D * (F // TP)
)
HEAD_FORWARD = 2 * T * D * (V // TP)
MATRIX_GRADIENTS = (4 * D * D + 2 * D * F) // TP * 2
FLAGS = ("--model-arg", f"layers={L}", "--strategy", "dp+tp", "--pipeline-stages", str(S),
         "--microbatches", str(M), "--backend", "gpu:h100")
UNIT = re.compile(r"^((?:[FB]\d+|U)\.\d+) ")


def F_(m):
    return f"F{m}.0"


def B_(m):
    return f"B{m}.0"


HAND_1F1B = {  # stage 0 warms up with S - 0 - 1 = 1 forward; the last stage alternates from the start
    0: [F_(0), F_(1), B_(0), F_(2), B_(1), F_(3), B_(2), B_(3)],
    1: [F_(0), B_(0), F_(1), B_(1), F_(2), B_(2), F_(3), B_(3)],
}


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    out = tmp_path_factory.mktemp("optimized") / "gpt"
    return out, extract(EXAMPLES / "gpt.py", "pp=2,data=2,tensor=2", out, *FLAGS)


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory):
    out = tmp_path_factory.mktemp("partitioned") / "gpt"
    return out, extract(EXAMPLES / "gpt.py", "pp=2,data=2,tensor=2", out, *FLAGS, "--stage", "partitioned")


def test_the_partitioned_stage_stays_available(partitioned):
    manifest = json.loads((partitioned[0] / "manifest.json").read_text())
    assert (manifest["backend"], manifest["stage"]) == ("gpu:h100", "partitioned")
    assert manifest["pipeline"]["activation_bytes"] == ACTIVATION


def test_one_layer_per_chunk_keeps_its_layer_loops(tmp_path):
    """2 layers on 2 stages, one per chunk: the compiler would inline a loop of one trip, so the
    piece's compile keeps them (`ONE_TRIP_LOOPS`), and each forward runs one layer's GEMMs (the
    last stage's also the head's), each backward twice that, with the activation of the two-layer
    chunks. The layer's stacked outputs, which the one-trip loop writes whole, are not taken for
    what it carries."""
    out = tmp_path / "gpt"
    extract(EXAMPLES / "gpt.py", "pp=2,data=2,tensor=2", out, "--model-arg", "layers=2", *FLAGS[2:])
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["pipeline"]["layers_per_chunk"], manifest["pipeline"]["activation_bytes"]) == (1, ACTIVATION)
    for rank in (0, 7):
        last = rank >= 4
        expected = {F_(m): LAYER_FORWARD + last * 2 * HEAD_FORWARD for m in range(M)}
        expected |= {B_(m): 2 * LAYER_FORWARD + last * HEAD_FORWARD for m in range(M)}
        assert gemm_flops_by_unit(out, rank, lambda n: attr_value(n, "kernel") == "gemm") == expected, rank
    assert {t.size for ts in transfers(out).values() for t in ts} == {ACTIVATION}
    assert check_traces(out) == []


def rank_trace(directory: Path, rank: int):
    prefix, _ = find_traces(directory)
    return read_trace(directory / f"{prefix}.{rank}.et")


def unit_of(node) -> str | None:
    match = UNIT.match(node.name)
    return match[1] if match else None


def test_pipelining_on_a_gpu_traces_its_kernels_by_default(kernels):
    """No --stage: the kernel-level stage, whose matmuls are GEMM kernels, not dot ops. No memory
    per rank: the compile is one microbatch of one chunk of layers, not what a rank holds."""
    out, summary = kernels
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["backend"], manifest["stage"]) == ("gpu:h100", "optimized")
    assert summary["memory_per_rank"] is None
    assert manifest["pipeline"] == {
        "stages": S, "microbatches": M, "schedule": "1f1b", "virtual_stages": 1,
        "layers_per_chunk": L // S, "activation_bytes": ACTIVATION, "gradient_bytes": ACTIVATION,
    }
    nodes = rank_trace(out, 0).nodes
    assert not [n for n in nodes if attr_value(n, "op") in ("dot", "dot_general")]
    assert [n for n in nodes if attr_value(n, "kernel") == "gemm"]


def test_stages_exchange_one_activation_per_microbatch(kernels):
    """Stage 0 sends M activations to r + 4 and receives M gradients from it; stage 1 the other
    way round; every one is 131,072 bytes and every send has its receive."""
    out, _ = kernels
    found = transfers(out)
    assert sorted(found) == list(range(RANKS))
    for rank, moves in found.items():
        peer = rank + 4 if rank < 4 else rank - 4
        expected = Counter({(True, rank, peer): M, (False, peer, rank): M})
        assert Counter((t.send, t.src, t.dst) for t in moves) == expected, rank
        assert {t.size for t in moves} == {ACTIVATION}, rank
    assert_sends_match_receives(found)


def named_transfers(directory: Path) -> dict[int, set]:
    """Per rank: (name, send, src, dst, size) of every SEND and RECV, and that their tags are unique."""
    found = {}
    for rank in range(RANKS):
        moves = [n for n in rank_trace(directory, rank).nodes if n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)]
        assert len({attr_value(n, "comm_tag") for n in moves}) == len(moves)
        found[rank] = {
            (n.name, n.type == pb.COMM_SEND_NODE, *(attr_value(n, a) for a in ("comm_src", "comm_dst", "comm_size")))
            for n in moves
        }
    return found


def test_transfers_are_the_partitioned_stages(kernels, partitioned):
    """The same SENDs and RECVs (named after the unit that sends them, so the same microbatch and
    direction), peers and sizes as the partitioned stage's, whose tags pair up likewise."""
    assert named_transfers(kernels[0]) == named_transfers(partitioned[0])
    assert_sends_match_receives(transfers(partitioned[0]))


def gemm_flops_by_unit(directory: Path, rank: int, gemm) -> dict[str, int]:
    flops: dict[str, int] = defaultdict(int)
    for node in rank_trace(directory, rank).nodes:
        if gemm(node):
            flops[unit_of(node)] += attr_value(node, "num_ops")
    return dict(flops)


def test_gemm_flops_are_the_matmuls_of_each_unit(kernels, partitioned):
    """Each forward runs the stage's 2 layers, each backward twice their matmuls; on the last stage
    a forward also runs the head and its input gradient (which the layers' backward needs), a
    backward the head's weight gradient. The per-step updates run none. The partitioned stage's
    dots add up to the same."""
    per_rank = {}
    for rank in range(RANKS):
        last = rank >= 4
        forward = (L // S) * LAYER_FORWARD + last * 2 * HEAD_FORWARD
        backward = 2 * (L // S) * LAYER_FORWARD + last * HEAD_FORWARD
        expected = {F_(m): forward for m in range(M)} | {B_(m): backward for m in range(M)}
        found = gemm_flops_by_unit(kernels[0], rank, lambda n: attr_value(n, "kernel") == "gemm")
        assert found == expected, rank
        per_rank[rank] = sum(found.values())
    assert per_rank[0] == 3 * M * (L // S) * LAYER_FORWARD == 4_429_185_024
    for rank in (0, 7):
        dots = gemm_flops_by_unit(partitioned[0], rank, lambda n: attr_value(n, "op") in ("dot", "dot_general"))
        assert sum(dots.values()) == per_rank[rank]


def collectives_by_unit(directory: Path, rank: int) -> Counter:
    """(unit, 'data' | 'tensor', bytes) of every collective of a rank."""
    groups = read_comm_groups(next(directory.glob("*.comm_groups.json")))
    stage, d, t = rank // 4, rank // 2 % 2, rank % 2
    named = {(4 * stage + t, 4 * stage + 2 + t): "data", (4 * stage + 2 * d, 4 * stage + 2 * d + 1): "tensor"}
    found = Counter()
    for node in rank_trace(directory, rank).nodes:
        if node.type == pb.COMM_COLL_NODE:
            assert attr_value(node, "comm_type") == pb.ALL_REDUCE
            group = named[tuple(groups[int(attr_value(node, "pg_name"))])]
            found[unit_of(node), group, attr_value(node, "comm_size")] += 1
    return found


def test_gradient_syncs_run_once_per_step_before_the_update(kernels):
    """Data-group reductions run in the update (U.0) alone, never in a backward or a forward: it
    syncs each of the stage's 2 layers' six matrix gradients as one combined all-reduce. The
    tensor-group reductions of activations run in every unit: 2 per layer in each forward and
    backward, plus the embedding lookup's in the first stage's forwards and the head's input
    gradient in the last stage's."""
    for rank in range(RANKS):
        first, last = rank < 4, rank >= 4
        found = collectives_by_unit(kernels[0], rank)
        data_units = {unit for unit, group, _ in found if group == "data"}
        assert data_units == {"U.0"}, rank
        assert found["U.0", "data", MATRIX_GRADIENTS] == L // S, rank
        for m in range(M):
            assert found[F_(m), "tensor", ACTIVATION] == 2 * (L // S) + first + last, rank
            assert found[B_(m), "tensor", ACTIVATION] == 2 * (L // S), rank


def test_every_backward_but_the_first_sums_the_gradients_it_syncs(kernels):
    """A step sums each weight gradient over its microbatches before syncing it once: every
    backward after a chunk's first adds what it hands the update's syncs to the sum, reading both
    and writing the sum (3 x its bytes, one add per element). Those are the buffers the compiler's
    combiner joins: each layer's six matrix gradients, and on the first stage the embedding's and
    the head's (bf16 [V / tp, D] each) in one. The layer norms' small f32 gradients come out of a
    kernel that also writes synced ones, so they are not summed."""
    embedding_and_head = 2 * (V // TP) * D * 2
    for rank in range(RANKS):
        first = rank < 4
        expected = [MATRIX_GRADIENTS] * (L // S) + [embedding_and_head] * first
        for m in range(M):
            adds = [node for node in rank_trace(kernels[0], rank).nodes
                    if unit_of(node) == B_(m) and attr_value(node, "op") == "accumulate"]
            sizes = sorted(attr_value(node, "tensor_size") // 3 for node in adds)
            assert sizes == (sorted(expected) if m > 0 else []), (rank, m)
            assert all(attr_value(node, "tensor_size") == 3 * 2 * attr_value(node, "num_ops")
                       for node in adds)


def test_before_fusion_every_parameter_s_gradient_is_summed(partitioned):
    """On the partitioned stage nothing is fused, so each parameter's gradient is summed on its
    own: one add per element of every parameter the stage's rank holds. Per layer the four
    attention matrices (D x D / tp each), the MLP's two (D x F / tp) and the layer norms' four
    vectors (D each, not split); the embedding on the first stage, the head (V / tp x D each) and
    the final layer norm's two vectors on the last. The optimizer's broadcast constants, which run
    with every backward too, are not gradients and are not summed."""
    layer = 4 * D * (D // TP) + 2 * D * (F // TP) + 4 * D
    for rank in range(RANKS):
        first, last = rank < 4, rank >= 4
        expected = (L // S) * layer + first * (V // TP) * D + last * ((V // TP) * D + 2 * D)
        for m in range(M):
            adds = [attr_value(node, "num_ops") for node in rank_trace(partitioned[0], rank).nodes
                    if unit_of(node) == B_(m) and attr_value(node, "op") == "accumulate"]
            assert sum(adds) == (expected if m > 0 else 0), (rank, m)


def units_in_ctrl_order(trace) -> list[str]:
    """The units of a rank in the order their start nodes chain them: every control edge between
    two units leads to a unit's start node (op `unit_start`); the compiler's schedule stays inside
    a unit."""
    unit = {node.id: unit_of(node) for node in trace.nodes}
    starts = {node.id for node in trace.nodes if attr_value(node, "op") == "unit_start"}
    follows = {}
    for node in trace.nodes:
        for dep in node.ctrl_deps:
            if unit[dep] != unit[node.id]:
                assert node.id in starts, (node.name, dep)
                if unit[dep] is not None:
                    assert follows.setdefault(unit[dep], unit[node.id]) == unit[node.id]
    (first,) = set(follows) - set(follows.values())
    order = [first]
    while order[-1] in follows:
        order.append(follows[order[-1]])
    return order


def test_each_stage_runs_the_1f1b_order_and_the_trace_is_valid(kernels):
    out, _ = kernels
    for rank in range(RANKS):
        assert units_in_ctrl_order(rank_trace(out, rank)) == HAND_1F1B[rank // 4] + ["U.0"], rank
    assert check_traces(out) == []
    run = flint("check", out)
    assert run.returncode == 0, run.stdout + run.stderr


SIMULATOR = os.environ.get("ASTRA_SIM", "")


@pytest.mark.skipif(
    not (SIMULATOR and os.path.isfile(SIMULATOR) and os.access(SIMULATOR, os.X_OK)),
    reason="needs ASTRA-sim: set ASTRA_SIM to its astra-sim wrapper",
)
def test_astra_sim_runs_the_pipelined_kernels_to_the_end(kernels, tmp_path):
    """The real simulator replays every rank to its end; each rank computes at least its GEMMs'
    roofline time on an H100 (989 TFLOP/s)."""
    out, _ = kernels
    run = flint("simulate", out, "--json", "--network", "flat", "-o", tmp_path / "sim", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert sorted(r["rank"] for r in result["per_rank"]) == list(range(RANKS))
    for r in result["per_rank"]:
        gemm = 3 * M * ((L // S) * LAYER_FORWARD + (r["rank"] >= 4) * HEAD_FORWARD)
        assert r["compute_us"] >= gemm / 989e12 * 1e6, r
        assert r["step_us"] >= r["compute_us"], r

"""`--pipeline-stages`: schedules against lists written by hand, and pipelined GPT traces against
traffic and orders derived by hand.

Model: `tests/models/pipeline_gpt.py`, `examples/gpt.py` with L = 16 layers and a 256-word
vocabulary, on S = 4 stages and M = 8 microbatches. On `pp=4,tp=2` rank r = 2s + t (stage s,
tensor position t); its peer on stage s +- 1 is r +- 2. A microbatch is BATCH / M = 2 sequences, so
one activation (and its gradient) is bf16 [2, SEQ, D_MODEL]: 2 * 128 * 256 * 2 = 131,072 bytes.

Per rank each stage runs M forwards and M backwards (units named `F<m>.<chunk>`, `B<m>.<chunk>`).
Every stage but the last sends M activations to the next stage and receives M gradients from it;
every stage but the first receives M activations and sends M gradients back.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from conftest import MODELS, assert_sends_match_receives, extract, flint, transfers

from flint.step.schedule import load_timeline
from flint.devices import Device
from flint.pipelining import gpipe, interleaved, one_f_one_b
from flint.schema import et_def_pb2 as pb
from flint.trace.contract import check_traces
from flint.trace.reader import attr_value, find_traces, read_comm_groups, read_trace
from flint.trace.timing import Compute, Link, NodeTimer

MODEL = MODELS / "pipeline_gpt.py"
S, M = 4, 8
BATCH, SEQ, D_MODEL = 16, 128, 256
ACTIVATION = BATCH // M * SEQ * D_MODEL * 2
UNIT = re.compile(r"^([FB])(\d+)\.(\d+) ")


def F(m, c=0):
    return ("F", m, c)


def B(m, c=0):
    return ("B", m, c)


# ------------------------------------------------------------------------------ schedules by hand


def test_gpipe_runs_every_forward_then_every_backward():
    assert gpipe(3, 3, 1) == [F(0), F(1), F(2), B(0), B(1), B(2)]


def test_1f1b_warms_up_alternates_and_cools_down():
    assert one_f_one_b(4, 8, 0) == [
        F(0), F(1), F(2),
        F(3), B(0), F(4), B(1), F(5), B(2), F(6), B(3), F(7), B(4),
        B(5), B(6), B(7),
    ]
    assert one_f_one_b(4, 8, 1) == [
        F(0), F(1),
        F(2), B(0), F(3), B(1), F(4), B(2), F(5), B(3), F(6), B(4), F(7), B(5),
        B(6), B(7),
    ]
    assert one_f_one_b(4, 8, 3) == [x for m in range(8) for x in (F(m), B(m))]
    assert one_f_one_b(4, 2, 0) == [F(0), F(1), B(0), B(1)]  # warm-up capped at M


def test_interleaved_goes_through_the_chunks_in_groups_of_s_microbatches():
    # S = 2, M = 4, V = 2: forwards (m, chunk) 00 10 01 11 20 30 21 31, backwards with the chunks
    # reversed 01 11 00 10 21 31 20 30; warm-up (S - s - 1) * 2 + (V - 1) * S = 4 on stage 0, 2 on 1
    assert interleaved(2, 4, 2, 0) == [
        F(0, 0), F(1, 0), F(0, 1), F(1, 1),
        F(2, 0), B(0, 1), F(3, 0), B(1, 1), F(2, 1), B(0, 0), F(3, 1), B(1, 0),
        B(2, 1), B(3, 1), B(2, 0), B(3, 0),
    ]
    assert interleaved(2, 4, 2, 1) == [
        F(0, 0), F(1, 0),
        F(0, 1), B(0, 1), F(1, 1), B(1, 1), F(2, 0), B(0, 0), F(3, 0), B(1, 0),
        F(2, 1), B(2, 1), F(3, 1), B(3, 1),
        B(2, 0), B(3, 0),
    ]


def hand_1f1b(stage: int) -> list[tuple]:
    """The 1F1B rule as the issue states it: S - s - 1 forwards, alternate, then cool down."""
    warmup = S - stage - 1
    order = [F(m) for m in range(warmup)]
    for m in range(M - warmup):
        order += [F(warmup + m), B(m)]
    return order + [B(m) for m in range(M - warmup, M)]


# ------------------------------------------------------------------------------ traces


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """`pp=4,tp=2` extracted once per schedule."""
    cache: dict[str, Path] = {}

    def get(schedule: str, mesh: str = "pp=4,tp=2", strategy: str = "tp") -> Path:
        key = f"{schedule}-{mesh}"
        if key not in cache:
            out = tmp_path_factory.mktemp(schedule) / "traces"
            extract(MODEL, mesh, out, "--strategy", strategy, "--pipeline-stages", str(S),
                    "--microbatches", str(M), "--schedule", schedule)
            cache[key] = out
        return cache[key]

    return get


def units_in_ctrl_order(trace) -> list[tuple]:
    """A rank's units in the order its control dependencies chain them (and the chain's links)."""
    unit_of = {}
    for node in trace.nodes:
        match = UNIT.match(node.name)
        if match:
            unit_of[node.id] = (match[1], int(match[2]), int(match[3]))
    links = {
        (unit_of[dep], unit_of[node.id])
        for node in trace.nodes
        if node.id in unit_of
        for dep in node.ctrl_deps
        if dep in unit_of and unit_of[dep] != unit_of[node.id]
    }
    follows = dict(links)
    assert len(follows) == len(links), "a unit is followed by two others"
    (first,) = set(follows) - set(follows.values())
    order = [first]
    while order[-1] in follows:
        order.append(follows[order[-1]])
    assert set(order) == set(unit_of.values())
    return order


def read_rank(directory: Path, rank: int):
    prefix, _ = find_traces(directory)
    return read_trace(directory / f"{prefix}.{rank}.et")


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_each_rank_runs_its_stage_in_schedule_order(traces, schedule):
    directory = traces(schedule)
    for rank in range(2 * S):
        stage = rank // 2
        order = units_in_ctrl_order(read_rank(directory, rank))
        assert Counter(kind for kind, _, _ in order) == {"F": M, "B": M}
        hand = [F(m) for m in range(M)] + [B(m) for m in range(M)] if schedule == "gpipe" else hand_1f1b(stage)
        assert order == hand, rank


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_stages_send_activations_forward_and_gradients_back(traces, schedule):
    found = transfers(traces(schedule))
    assert sorted(found) == list(range(2 * S))
    for rank, ts in found.items():
        stage = rank // 2
        expected = Counter()
        if stage < S - 1:
            expected[True, rank, rank + 2] += M  # activations to the next stage
            expected[False, rank + 2, rank] += M  # their gradients back from it
        if stage > 0:
            expected[False, rank - 2, rank] += M
            expected[True, rank, rank - 2] += M
        assert Counter((t.send, t.src, t.dst) for t in ts) == expected, rank
        assert {t.size for t in ts} == {ACTIVATION}
    assert_sends_match_receives(found)
    assert check_traces(traces(schedule)) == []


def test_embedding_runs_on_the_first_stage_and_head_on_the_last(traces):
    """Per layer 8 forward matmuls (q, k, v, QK^T, PV, output, w_in, w_out) and 16 backward ones, 4
    layers per stage, M microbatches: 256 and 512 on every stage. The first stage also looks up
    the embedding (a gather) in each forward and scatters its gradient in each backward; the last
    runs the head and its input gradient (which the layers' backward needs) in each forward, and
    the head's weight gradient in each backward."""
    directory = traces("1f1b")
    for rank in range(0, 2 * S, 2):
        stage = rank // 2
        ops = Counter(
            (node.name[0], attr_value(node, "op"))
            for node in read_rank(directory, rank).nodes
            if attr_value(node, "op") in ("dot_general", "gather", "scatter")
        )
        expected = Counter({("F", "dot_general"): 8 * 4 * M, ("B", "dot_general"): 16 * 4 * M})
        if stage == 0:
            expected += Counter({("F", "gather"): M, ("B", "scatter"): M})
        if stage == S - 1:
            expected += Counter({("F", "dot_general"): 2 * M, ("B", "dot_general"): M})
        assert ops == expected, rank


def test_a_second_run_writes_the_same_bytes(traces, tmp_path):
    """Ids count up through each stage's units, and a transfer's tag follows from what it carries
    (its direction, microbatch and virtual stage): runs repeat."""
    first = traces("gpipe")
    again = tmp_path / "again"
    extract(MODEL, "pp=4,tp=2", again, "--strategy", "tp", "--pipeline-stages", str(S),
            "--microbatches", str(M), "--schedule", "gpipe")
    names = sorted(p.name for p in first.glob("*.et"))
    assert names == sorted(p.name for p in again.glob("*.et")) and len(names) == 2 * S
    for name in names:
        assert (first / name).read_bytes() == (again / name).read_bytes(), name


def test_manifest_records_the_compiled_activation(traces):
    manifest = json.loads((traces("1f1b") / "manifest.json").read_text())
    assert manifest["pipeline"] == {
        "stages": S, "microbatches": M, "schedule": "1f1b", "virtual_stages": 1,
        "layers_per_chunk": 16 // S, "activation_bytes": ACTIVATION, "gradient_bytes": ACTIVATION,
    }


ANY_UNIT = re.compile(r"^((?:[FB]\d+|U)\.\d+) ")


def ancestors(trace) -> dict[int, int]:
    """Node id -> the ids it follows through data and ctrl deps, as bits (the file is in
    dependency order)."""
    found: dict[int, int] = {}
    for node in trace.nodes:
        bits = 0
        for dep in (*node.data_deps, *node.ctrl_deps):
            bits |= found[dep] | (1 << dep)
        found[node.id] = bits
    return found


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_a_unit_boundary_costs_a_control_edge_per_end_and_first_node(traces, schedule):
    """Each unit that waits for something begins with a start node (op `unit_start`): it follows
    the previous unit's ends and what the unit receives, and the unit's first nodes follow it. A
    rank runs 2MV + V units (its forwards, backwards and per-chunk updates); all wait but the
    first stage's first forward. Virtual stage v = cS + s receives an activation per microbatch
    unless v = 0 and a gradient unless v = SV - 1. Every control edge touches a start node, each
    RECV starts one unit, and a node is the end of at most one boundary and a first node of at
    most one, so a rank has at most 2 x nodes + RECVs control edges (tying every end of a unit to
    every first node of the next, as before, cost 59,010 on rank 0 of 1F1B). And the schedule
    holds as it did: every node of a unit follows, directly or not, every node of the stage's
    unit before it (the F/B order as `units_in_ctrl_order` reads it, then the updates)."""
    V = 2 if schedule == "interleaved" else 1
    directory = traces(schedule)
    for rank in range(0, 2 * S, 2):
        stage = rank // 2
        trace = read_rank(directory, rank)
        starts = {n.id for n in trace.nodes if attr_value(n, "op") == "unit_start"}
        assert len(starts) == 2 * M * V + V - (stage == 0), rank
        ctrl = [(dep, node.id) for node in trace.nodes for dep in node.ctrl_deps]
        assert all(dep in starts or node in starts for dep, node in ctrl), rank
        recvs = {n.id for n in trace.nodes if n.type == pb.COMM_RECV_NODE}
        assert len(recvs) == M * (2 * V - (stage == 0) - (stage == S - 1)), rank
        assert sum(dep in recvs for dep, _ in ctrl) == len(recvs), rank
        assert len(ctrl) <= 2 * len(trace.nodes) + len(recvs), rank
        assert len(ctrl) < sum(len(n.data_deps) for n in trace.nodes), rank  # the product: 3x more

        follows = ancestors(trace)
        units: dict[str, int] = defaultdict(int)
        for node in trace.nodes:
            match = ANY_UNIT.match(node.name)
            if match:
                units[match[1]] |= 1 << node.id
        order = [f"{kind}{m}.{c}" for kind, m, c in units_in_ctrl_order(trace)]
        order += [f"U.{c}" for c in range(V)]
        assert sorted(order) == sorted(units), rank
        for before, after in zip(order, order[1:]):
            for node in trace.nodes:
                if units[after] >> node.id & 1:
                    assert follows[node.id] & units[before] == units[before], (rank, before, after)


def test_1f1b_holds_at_most_s_minus_s_microbatches(traces):
    """Peak activations in flight (forwards done, their backwards not yet) along the ctrl order:
    S - s under 1F1B, M under GPipe."""
    for schedule, bound in (("1f1b", lambda stage: S - stage), ("gpipe", lambda stage: M)):
        for rank in range(0, 2 * S, 2):
            held = peak = 0
            for kind, _, _ in units_in_ctrl_order(read_rank(traces(schedule), rank)):
                held += 1 if kind == "F" else -1
                peak = max(peak, held)
            assert peak == bound(rank // 2) <= (S if schedule == "1f1b" else M)


# ------------------------------------------------------------------------------ the bubble


# A slow device keeps every node's roofline time well above the 1 µs rounding, so stage times
# follow the work; a fixed 10 µs per hop.
SLOW = Device("slow", peak_tflops=10, mem_bw_gbps=100)
HOP = Link(bandwidth_gbps=400, latency_us=10)


def bubbles(directory: Path) -> dict[int, float]:
    """Per stage: the share of the pipeline's span (first forward to last backward over all ranks)
    that the stage spends outside its forwards and backwards. A unit lasts from its first node's
    start to its last node's end, tensor-parallel reductions inside it included."""
    timeline = load_timeline(directory, None, lambda groups, n: NodeTimer(Compute(SLOW, "roofline"), HOP, groups, n))
    units: dict[tuple[int, str], tuple[float, float]] = {}
    for piece in timeline.slices:
        match = UNIT.match(piece.name)
        if match:
            start, end = units.get((piece.rank, match[0]), (piece.start, piece.end))
            units[piece.rank, match[0]] = (min(start, piece.start), max(end, piece.end))
    span = max(end for _, end in units.values()) - min(start for start, _ in units.values())
    busy: dict[int, float] = defaultdict(float)
    for (rank, _), (start, end) in units.items():
        busy[rank] += end - start
    return {rank // 2: 1 - time / span for rank, time in busy.items() if rank % 2 == 0}


def test_bubbles_are_the_textbook_ones(traces):
    """(S - 1) / (M + S - 1) = 3 / 11 for GPipe and 1F1B, (S - 1) / (V * M + S - 1) = 3 / 19 for the
    interleaved schedule with V = 2: the idle share of a pipeline whose stages all take the slowest
    stage's time. The last stage, which also runs the head and the loss, is the slowest; its idle
    share is within 5% of that. The others also wait for it, so they idle a little more."""
    for schedule, textbook in (("gpipe", 3 / 11), ("1f1b", 3 / 11), ("interleaved", 3 / 19)):
        found = bubbles(traces(schedule))
        assert found[S - 1] == min(found.values()) == pytest.approx(textbook, rel=0.05), schedule
        assert max(found.values()) == pytest.approx(textbook, abs=0.05), schedule


# ------------------------------------------------------------------------------ data parallelism and interleaving


def test_gradient_syncs_run_once_per_step_before_the_update(traces):
    """pp=4,dp=2,tp=2 (rank 4s + 2d + t). Each layer's 10 weight gradients are reduced over the
    data group {4s + t, 4s + 2 + t} once per step, by the update after the pipeline has flushed:
    4 layers x 10 in U.0; the first stage adds the embedding's gradient, the last the head's and
    the final layernorm's two. The loss is reduced in every backward of the last stage. The update's
    own nodes wait for every sync: each of its first nodes has them all as control dependencies.
    The tensor group {4s + 2d, 4s + 2d + 1} reduces 4 input gradients per layer in every backward
    (see examples/gpt.py): 16 each."""
    directory = traces("1f1b", "pp=4,dp=2,tp=2", "dp+tp")
    groups = read_comm_groups(next(directory.glob("*.comm_groups.json")))
    for rank in (0, 5, 14):
        stage, d, t = rank // 4, rank // 2 % 2, rank % 2
        data_group = (4 * stage + t, 4 * stage + 2 + t)
        tensor_group = (4 * stage + 2 * d, 4 * stage + 2 * d + 1)
        data, tensor = Counter(), Counter()
        syncs, update = set(), []
        for node in read_rank(directory, rank).nodes:
            match = UNIT.match(node.name)
            is_data = (attr_value(node, "comm_type") == pb.ALL_REDUCE
                       and tuple(groups[int(attr_value(node, "pg_name"))]) == data_group)
            if node.name.startswith("U.0 ") and node.name != "U.0 start":
                (syncs.add(node.id) if is_data else update.append(node))
            if match and match[1] == "B" and attr_value(node, "comm_type") == pb.ALL_REDUCE:
                group = groups[int(attr_value(node, "pg_name"))]
                assert group in (data_group, tensor_group)
                (data if group == data_group else tensor)[int(match[2])] += 1
        assert len(syncs) == 4 * 10 + {0: 1, S - 1: 3}.get(stage, 0), rank
        every = 1 if stage == S - 1 else 0
        assert data == Counter({m: every for m in range(M)}), rank
        first_nodes = [n for n in update if not {*n.data_deps, *n.ctrl_deps} & {u.id for u in update}]
        assert first_nodes and all(syncs <= set(n.ctrl_deps) for n in first_nodes), rank
        assert max(syncs) < min(n.id for n in update), rank
        assert len(set(tensor.values())) == 1 and len(tensor) == M, rank
        if stage < S - 1:
            assert tensor[0] == 4 * 4, rank
    assert {t.size for ts in transfers(directory).values() for t in ts} == {ACTIVATION // 2}


def test_interleaved_chunks_wrap_from_the_last_stage_to_the_first(traces):
    """V = 2 chunks of 2 layers per stage: virtual stage c * S + s. Chunk 0 of the last stage
    sends to chunk 1 of the first, so every stage sends 2M activations forward except the last
    (M, to stage 0), and 2M gradients back except the first (M, to stage 3)."""
    directory = traces("interleaved")
    found = transfers(directory)
    for rank, ts in found.items():
        stage = rank // 2
        sends = Counter((t.dst - rank) % (2 * S) for t in ts if t.send)
        assert sends == {2: M if stage == S - 1 else 2 * M, 2 * S - 2: M if stage == 0 else 2 * M}
        order = units_in_ctrl_order(read_rank(directory, rank))
        assert order == [tuple(w) for w in interleaved(S, M, 2, stage)]
    assert_sends_match_receives(found)


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--microbatches", "4"), "--microbatches needs --pipeline-stages"),
        (("--pipeline-stages", "2"), "mesh axis pp has 4 ranks but --pipeline-stages is 2"),
        (("--pipeline-stages", "4", "--microbatches", "3"), "does not divide into 3 microbatches"),
        (("--pipeline-stages", "4", "--schedule", "interleaved", "--microbatches", "6"),
         "microbatches divisible by the stages"),
        (("--pipeline-stages", "4", "--schedule", "interleaved", "--virtual-stages", "8"),
         "(16 layers) does not divide into 32 chunks"),
        (("--pipeline-stages", "4", "--schedule", "interleaved", "--virtual-stages", "8"), "model 32 layers"),
        (("--pipeline-stages", "4", "--schedule", "interleaved", "--virtual-stages", "3"), "model 12 or 24 layers"),
    ],
)
def test_bad_requests_stop_with_one_line_and_write_nothing(tmp_path, flags, message):
    out = tmp_path / "out"
    run = flint("extract", MODEL, "--mesh", "pp=4,tp=2", "-o", out, *flags)
    assert run.returncode == 2 and message in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_a_mesh_without_a_stage_axis_is_refused(tmp_path):
    run = flint("extract", MODEL, "--mesh", "data=4,tp=2", "-o", tmp_path / "out", "--pipeline-stages", "4")
    assert run.returncode == 2 and "needs a mesh axis named pp or stage" in run.stderr

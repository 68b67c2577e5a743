"""Loops unrolled by their static trip count, conditionals, and permutes as per-rank SEND/RECV."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter

import pytest
from conftest import EXAMPLES, MODELS, extract, flint
from models import interleaved, loops, triangular

from flint.schema import et_def_pb2 as pb
from flint.trace.contract import check_traces
from flint.trace.reader import attr_value, read_trace


def graph(directory, name):
    return json.loads((directory / f"{name}.graph.json").read_text())


def test_scan_fori_and_cond_unroll(tmp_path):
    out = tmp_path / "t"
    extract(MODELS / "loops.py", "2x2", out)
    nodes = graph(out, "loops")["nodes"]
    ops = Counter(n["op"] for n in nodes)
    b, d_local = loops.BATCH // 2, loops.D // 2
    # LAYERS scan steps + the cond's costlier branch each: all-gather the activation, one matmul.
    assert ops["all_gather"] == loops.LAYERS + 1
    dots = [n for n in nodes if n["op"] in ("dot", "dot_general")]
    assert [n["flops"] for n in dots] == [2 * b * loops.D * d_local] * (loops.LAYERS + 1)
    gathers = [n for n in nodes if n["op"] == "all_gather"]
    assert {n["comm_bytes"] for n in gathers} == {b * d_local * 4}  # per-rank input, f32
    # The nested fori_loop scales the activation OUTER * INNER times.
    assert ops["multiply"] == loops.OUTER * loops.INNER
    # The cond's selector is h.sum() > 0: data, so the manifest says one branch was a guess.
    assert json.loads((out / "manifest.json").read_text())["costliest_branches"] == 1
    assert check_traces(out) == []


def test_iteration_depends_on_the_previous_one(tmp_path):
    out = tmp_path / "t"
    extract(MODELS / "loops.py", "2x2", out)
    data = graph(out, "loops")
    by_id = {n["id"]: n for n in data["nodes"]}
    preds = {n["id"]: set() for n in data["nodes"]}
    for edge in data["edges"]:
        preds[edge["target"]].add(edge["source"])
    gathers = [n["id"] for n in data["nodes"] if n["op"] == "all_gather"][1 : loops.LAYERS]
    for node in gathers:  # every scan step after the first gathers the previous step's tanh
        assert {by_id[p]["op"] for p in preds[node]} == {"tanh"}


def test_loop_without_static_trip_count(tmp_path):
    out = tmp_path / "t"
    run = flint("extract", MODELS / "dynamic_loop.py", "--mesh", "2", "--backend", "cpu", "-o", out)
    assert run.returncode != 0 and "--loop-trips" in run.stderr and "while" in run.stderr
    assert not out.exists()
    extract(MODELS / "dynamic_loop.py", "2", out, "--loop-trips", "3")
    nodes = graph(out, "dynamic_loop")["nodes"]
    assert [n["op"] for n in nodes].count("exponential") == 3


def test_permute_peers_sizes_and_tags(tmp_path):
    out = tmp_path / "t"
    extract(MODELS / "permute.py", "4", out)
    block = 16 * 32 * 4  # per-rank f32 block of the model
    sends, recvs = {}, {}
    for rank in range(4):
        for node in read_trace(out / f"permute.{rank}.et").nodes:
            if node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                assert attr_value(node, "comm_size") == block
                key = (attr_value(node, "comm_src"), attr_value(node, "comm_dst"))
                (sends if node.type == pb.COMM_SEND_NODE else recvs).setdefault(rank, []).append(key)
    ring = [(r, (r + 1) % 4) for r in range(4)]
    half = [(0, 1), (2, 3)]
    for rank in range(4):
        assert sorted(sends[rank]) == sorted(p for p in ring + half if p[0] == rank)
        assert sorted(recvs[rank]) == sorted(p for p in ring + half if p[1] == rank)
    assert check_traces(out) == []  # every send matched by a receive with equal size and tag


def test_optimized_stage_orders_every_rank_by_the_schedule(tmp_path):
    """Each node follows the one before it in the file (the compiler's schedule, no async work on
    the CPU): through a data dependency or a control one. The partitioned stage has no control deps."""
    for stage in ("optimized", "partitioned"):
        out = tmp_path / stage
        extract(EXAMPLES / "mlp.py", "2x4", out, "--stage", stage)
        for rank in (0, 5):
            nodes = read_trace(out / f"mlp.{rank}.et").nodes
            if stage == "partitioned":
                assert not any(n.ctrl_deps for n in nodes)
                continue
            for before, node in zip(nodes, nodes[1:]):
                assert before.id in set(node.data_deps) | set(node.ctrl_deps), node.name
                assert not set(node.ctrl_deps) & set(node.data_deps)


def collective_sizes(directory, name: str, rank: int) -> list[int]:
    return [
        attr_value(n, "comm_size")
        for n in read_trace(directory / f"{name}.{rank}.et").nodes
        if n.type == pb.COMM_COLL_NODE
    ]


TPU = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None, reason="needs libtpu (flint-traces[tpu])"
)
ON_TPU = pytest.param(("--backend", "tpu:v5e:2x4"), marks=TPU)


@pytest.mark.parametrize("compiled", [("--stage", "partitioned"), ("--stage", "optimized"), ON_TPU])
def test_branches_follow_the_loop_counter(tmp_path, compiled):
    """interleaved.py on 2x4: the trace runs the heavy branch on even fori steps and every third step
    of each scan only, at both stages (the optimised module computes the selector inside fusions) and
    as the TPU compiler partitions it. Each all-gather is one rank's h, [BATCH/2, D/4] f32 (Chakra's
    per-rank input)."""
    out = tmp_path / "t"
    extract(MODELS / "interleaved.py", "2x4", out, *compiled)
    heavy_steps = sum(len(range(0, n, k)) for n, k in [(interleaved.FORI, 2), (interleaved.SCAN, 3),
                                                       (interleaved.SWITCH, 3)])
    assert heavy_steps == 6
    gather = interleaved.BATCH // 2 * interleaved.D // 4 * 4
    for rank in range(8):
        assert collective_sizes(out, "interleaved", rank) == [gather] * heavy_steps
    assert json.loads((out / "manifest.json").read_text())["costliest_branches"] == 0


@pytest.mark.parametrize("stage", ["partitioned", "optimized"])
def test_inner_loop_runs_as_often_as_the_outer_counter_says(tmp_path, stage):
    """triangular.py on 2x4: 0 + 1 + 2 + 3 = 6 inner steps, each all-gathering [BATCH/2, D/4] f32."""
    out = tmp_path / "t"
    extract(MODELS / "triangular.py", "2x4", out, "--stage", stage)
    inner_steps = sum(range(triangular.OUTER))
    assert inner_steps == 6
    gather = triangular.BATCH // 2 * triangular.D // 4 * 4
    for rank in range(8):
        assert collective_sizes(out, "triangular", rank) == [gather] * inner_steps

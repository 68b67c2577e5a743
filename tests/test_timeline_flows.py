"""`flint timeline` on a small pipelined trace: flow arrows, a parent slice per pipeline unit and
per-rank summaries, against counts derived by hand.

Model: `examples/gpt.py` (3 layers) on `pp=3,tp=2` with S = 3 stages of one layer each, M = 2
microbatches, 1F1B, Megatron TP over `tp`. Rank r = 2s + t (stage s, tensor position t).

- Point-to-point: every stage but the last sends M activations to the rank at its tensor position
  on the next stage, every stage but the first M gradients back: 2 (S - 1) M T = 16 SEND/RECV
  pairs, one `send/recv` arrow each, from the SEND's rank to r +- 2.
- Collectives: every one runs over a tensor pair {2s, 2s + 1}, so each is one arrow from rank 2s
  to 2s + 1, as many as rank 2s has collectives. The middle stage runs no embedding and no head:
  per layer 2 all-reduces in each forward (attention and MLP outputs), 4 in each backward.
- Units: F0.0, F1.0, B0.0, B1.0 and the update U.0 on every rank (2M + 1 = 5), in 1F1B order:
  stage s warms up with min(S - s - 1, M) forwards; stage 0: F0 F1 B0 B1, stage 1: F0 F1 B0 B1,
  stage 2: F0 B0 F1 B1.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest
from conftest import EXAMPLES, extract, flint

from flint.schema import et_def_pb2 as pb
from flint.trace.reader import find_traces, read_trace

S, M, T = 3, 2, 2
ORDER = {
    0: ["F0.0", "F1.0", "B0.0", "B1.0", "U.0"],
    1: ["F0.0", "F1.0", "B0.0", "B1.0", "U.0"],
    2: ["F0.0", "B0.0", "F1.0", "B1.0", "U.0"],
}


@pytest.fixture(scope="module")
def timeline(tmp_path_factory):
    """The trace directory and its timeline's trace-event JSON."""
    root = tmp_path_factory.mktemp("flows")
    directory = root / "traces"
    extract(EXAMPLES / "gpt.py", "pp=3,tp=2", directory, "--strategy", "tp", "--pipeline-stages",
            str(S), "--microbatches", str(M))
    run = flint("timeline", directory, "-o", root / "step.json")
    assert run.returncode == 0, run.stderr
    return directory, json.loads((root / "step.json").read_text())


def flows(events, name):
    """Flow id -> its (phase, pid, tid, ts) events, for the flows called `name`."""
    found = defaultdict(list)
    for event in events:
        if event["ph"] in "stf" and event["name"] == name:
            found[event["id"]].append((event["ph"], event["pid"], event["tid"], event["ts"]))
    return found


def slice_at(events, pid, tid, ts):
    """The node slice a flow event binds to: on its thread, starting when it does."""
    (found,) = [e for e in events if e["ph"] == "X" and e.get("cat") != "unit"
                and (e["pid"], e["tid"], e["ts"]) == (pid, tid, ts)]
    return found


def test_one_arrow_per_send_recv_pair(timeline):
    _, data = timeline
    events = data["traceEvents"]
    found = flows(events, "send/recv")
    assert len(found) == 2 * (S - 1) * M * T
    hops = Counter()
    for chain in found.values():
        assert [phase for phase, *_ in chain] == ["s", "f"]
        sender, receiver = slice_at(events, *chain[0][1:]), slice_at(events, *chain[1][1:])
        assert (sender["args"]["type"], receiver["args"]["type"]) == ("COMM_SEND_NODE", "COMM_RECV_NODE")
        assert sender["args"]["comm_tag"] == receiver["args"]["comm_tag"]
        assert (sender["args"]["comm_src"], sender["args"]["comm_dst"]) == (chain[0][1], chain[1][1])
        hops[chain[1][1] - chain[0][1]] += 1
    assert hops == {2: (S - 1) * M * T, -2: (S - 1) * M * T}  # activations forward, gradients back


def test_one_arrow_per_collective_across_its_tensor_pair(timeline):
    directory, data = timeline
    events = data["traceEvents"]
    found = flows(events, "collective")
    _, paths = find_traces(directory)
    per_rank = {read_trace(p).rank: read_trace(p) for p in paths}
    collectives = {r: sum(n.type == pb.COMM_COLL_NODE for n in t.nodes) for r, t in per_rank.items()}
    assert len(found) == sum(collectives[2 * s] for s in range(S))
    by_pair = Counter()
    for chain in found.values():
        assert [(phase, pid % 2) for phase, pid, *_ in chain] == [("s", 0), ("f", 1)]
        assert chain[0][1] + 1 == chain[1][1] and chain[0][3] == chain[1][3]  # they start together
        by_pair[chain[0][1] // 2] += 1
    assert by_pair == {s: collectives[2 * s] for s in range(S)}
    # the middle stage's arrows, by unit: 2 per forward, 4 per backward
    units = Counter(slice_at(events, *chain[0][1:])["name"].split(" ")[0]
                    for chain in found.values() if chain[0][1] == 2)
    assert units == {"F0.0": 2, "F1.0": 2, "B0.0": 4, "B1.0": 4}


def test_a_parent_slice_per_unit_in_schedule_order(timeline):
    _, data = timeline
    events = data["traceEvents"]
    units = [e for e in events if e.get("cat") == "unit"]
    for rank in range(S * T):
        mine = sorted((e for e in units if e["pid"] == rank), key=lambda e: e["ts"])
        assert [e["name"] for e in mine] == ORDER[rank // T], rank
        assert all(e["tid"] == 0 for e in mine)  # the compute thread: its slices nest under them
        for before, after in zip(mine, mine[1:]):
            assert before["ts"] + before["dur"] <= after["ts"] + 1e-9
        for unit in mine:
            inside = [e for e in events if e["ph"] == "X" and e["pid"] == rank and e.get("cat") != "unit"
                      and e["name"].startswith(unit["name"] + " ")]
            assert inside
            assert min(e["ts"] for e in inside) == unit["ts"]
            assert max(e["ts"] + e["dur"] for e in inside) == pytest.approx(unit["ts"] + unit["dur"])


def test_per_rank_summaries_in_the_metadata(timeline):
    _, data = timeline
    ranks = data["otherData"]["ranks"]
    assert [r["rank"] for r in ranks] == list(range(S * T))
    for summary in ranks:
        stage = summary["rank"] // T
        transfers = M * ((stage < S - 1) + (stage > 0))  # activations out and gradients in, or back
        assert (summary["sends"], summary["recvs"]) == (transfers, transfers)
        assert summary["pipeline_units"] == 2 * M + 1
        assert summary["compute_us"] + summary["exposed_communication_us"] + summary["idle_us"] == (
            pytest.approx(data["otherData"]["step_us"])
        )
    assert max(r["step_us"] for r in ranks) == pytest.approx(data["otherData"]["step_us"])

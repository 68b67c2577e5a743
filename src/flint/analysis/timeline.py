"""One step of a trace set on a timeline (`flint timeline`): the schedule of `flint.step.schedule`
as Chrome trace-event JSON (`ui.perfetto.dev`, `chrome://tracing`).

One process per rank, a compute thread and as many communication threads as transfers overlap. Flow arrows join each SEND to the RECV it matched and
the members of each collective across ranks, in rank order; a pipelined trace's nodes are grouped
under a parent slice per pipeline unit (`F3.0`, `B3.0`, `U.0`, from their names); and the trace's
metadata (`otherData`) holds each rank's summary.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

from flint.pipelining import UNIT_NAME
from flint.schema import et_def_pb2 as pb
from flint.step.schedule import COMM, COMPUTE, Member, Slice, Timeline
from flint.trace.reader import enum_name

UNIT = "unit"
SEND_RECV, COLLECTIVE = "send/recv", "collective"
"""The names of the two kinds of flow arrows."""


def to_trace_events(timeline: Timeline, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Chrome trace-event JSON: `X` slices in µs, pid = rank, tid 0 compute, 1.. communication;
    a parent slice per pipeline unit on the compute thread; flow arrows (`s`, `t`, `f` events
    bound to the slices they start in) for transfers and collectives; per-rank summaries."""
    events: list[dict[str, Any]] = []
    lanes: dict[int, list[float]] = defaultdict(list)  # rank -> end of each comm lane
    slices: list[dict[str, Any]] = []
    where: dict[Member, dict[str, Any]] = {}  # (rank, node) -> its slice event
    for piece in sorted(timeline.slices, key=lambda s: (s.rank, s.stream, s.start, s.node_id)):
        tid = 0
        if piece.stream == COMM:
            ends = lanes[piece.rank]
            lane = next((i for i, end in enumerate(ends) if end <= piece.start), len(ends))
            if lane == len(ends):
                ends.append(piece.end)
            ends[lane] = piece.end
            tid = lane + 1
        slices.append({
            "name": piece.name, "cat": piece.stream, "ph": "X", "pid": piece.rank, "tid": tid,
            "ts": piece.start, "dur": piece.duration, "args": piece.args,
        })
        where[piece.rank, piece.node_id] = slices[-1]
    units = _unit_slices(timeline.slices)
    for rank in timeline.ranks:
        events.append(_meta("process_name", rank.rank, 0, name=f"rank {rank.rank}"))
        events.append(_meta("process_sort_index", rank.rank, 0, sort_index=rank.rank))
        events.append(_meta("process_labels", rank.rank, 0, labels=(
            f"step {rank.step:,.1f} µs, compute {rank.compute:,.1f} µs, "
            f"exposed communication {rank.exposed:,.1f} µs"
        )))
        events.append(_meta("thread_name", rank.rank, 0, name=COMPUTE))
        for lane in range(len(lanes[rank.rank])):
            name = COMM if lane == 0 else f"{COMM} {lane + 1}"
            events.append(_meta("thread_name", rank.rank, lane + 1, name=name))
    return {
        "traceEvents": events + units + slices + _flows(timeline, where),
        "displayTimeUnit": "ns",
        "otherData": {
            **metadata,
            "step_us": timeline.step,
            "ranks": _rank_summaries(timeline),
        },
    }


def _unit_slices(pieces: list[Slice]) -> list[dict[str, Any]]:
    """A parent slice per pipeline unit and rank, on the compute thread: from its first node's
    start to its last node's end (a stage runs its units one after another, so they nest)."""
    spans: dict[tuple[int, str], tuple[float, float]] = {}
    for piece in pieces:
        match = UNIT_NAME.match(piece.name)
        if match:
            start, end = spans.get((piece.rank, match[1]), (piece.start, piece.end))
            spans[piece.rank, match[1]] = (min(start, piece.start), max(end, piece.end))
    return [
        {"name": label, "cat": UNIT, "ph": "X", "pid": rank, "tid": 0, "ts": start,
         "dur": end - start, "args": {"unit": label}}
        for (rank, label), (start, end) in sorted(spans.items(), key=lambda item: (item[0][0], item[1]))
    ]


def _flows(timeline: Timeline, where: Mapping[Member, dict[str, Any]]) -> list[dict[str, Any]]:
    """Flow events: one arrow per SEND/RECV pair, one chain through each collective's members.
    Each event takes the category, process, thread and start of the slice it binds to, which is
    how both Perfetto and Chrome's viewer attach it."""
    flows: list[dict[str, Any]] = []
    chains = [(SEND_RECV, pair) for pair in timeline.transfers]
    chains += [(COLLECTIVE, members) for members in timeline.collectives if len(members) > 1]
    for flow_id, (name, members) in enumerate(chains, start=1):
        for position, member in enumerate(members):
            piece = where[member]
            phase = "s" if position == 0 else "f" if position == len(members) - 1 else "t"
            flows.append({
                "name": name, "cat": piece["cat"], "ph": phase, "id": flow_id, "pid": piece["pid"],
                "tid": piece["tid"], "ts": piece["ts"], **({"bp": "e"} if phase != "s" else {}),
            })
    return flows


def _rank_summaries(timeline: Timeline) -> list[dict[str, Any]]:
    """Each rank's totals with its idle time (the step's, less its compute and exposed
    communication), its nodes by kind and its pipeline units."""
    kinds: dict[int, Counter[str]] = defaultdict(Counter)
    units: dict[int, set[str]] = defaultdict(set)
    for piece in timeline.slices:
        kinds[piece.rank][piece.args.get("type")] += 1
        match = UNIT_NAME.match(piece.name)
        if match:
            units[piece.rank].add(match[1])
    return [
        {
            **rank.as_json(),
            "idle_us": max(0.0, timeline.step - rank.compute - rank.exposed),
            "nodes": sum(kinds[rank.rank].values()),
            "collectives": kinds[rank.rank][enum_name(pb.NodeType, pb.COMM_COLL_NODE)],
            "sends": kinds[rank.rank][enum_name(pb.NodeType, pb.COMM_SEND_NODE)],
            "recvs": kinds[rank.rank][enum_name(pb.NodeType, pb.COMM_RECV_NODE)],
            "pipeline_units": len(units[rank.rank]),
        }
        for rank in timeline.ranks
    ]


def _meta(kind: str, pid: int, tid: int, **args) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}

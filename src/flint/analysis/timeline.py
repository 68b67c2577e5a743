"""One step of a trace set on a timeline: a quick look before spending hours in ASTRA-sim.

Every rank's graph is list-scheduled, all ranks together, by a deterministic discrete-event
simulation with node times from `flint.trace.timing` (roofline compute, alpha-beta communication):

- a node becomes ready when all its ctrl and data dependencies have finished;
- each rank has one compute stream: COMP and MEM nodes run one at a time, the ready node that became
  ready first (then the lowest id) going next;
- communication does not queue behind other communication (ASTRA-sim keeps several collectives in
  flight too), but it waits for its partners: a collective starts when the last member of its group
  reaches it (matched per group in node-id order, as the contract requires), and a RECV starts no
  earlier than its SEND (matched by source, destination and tag), so it cannot finish before it.

Each node is one slice of exactly its own duration, so a rank's busy time is the sum of its node
times; waiting for partners shows up as gaps. The result converts to Chrome trace-event JSON
(`ui.perfetto.dev`, `chrome://tracing`): one process per rank, a compute thread and as many
communication threads as transfers overlap.
"""

from __future__ import annotations

import heapq
import os
from collections import Counter, defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flint.errors import FlintError
from flint.schema import et_def_pb2 as pb
from flint.trace.contract import check_traces
from flint.trace.node_rules import ALL_RANKS
from flint.trace.reader import RankTrace, attr_value, attribute_value, enum_name, read_trace_set
from flint.trace.timing import NodeTimer, group_id

COMPUTE, COMM = "compute", "comm"
_COMPUTE_TYPES = frozenset({pb.COMP_NODE, pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE})


@dataclass(frozen=True)
class Slice:
    """One node's run: on which rank and stream, from when (µs after the step began), how long."""

    rank: int
    node_id: int
    name: str
    stream: str
    start: float
    duration: float
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass(frozen=True)
class RankTime:
    """Where one rank's step went, in µs: `exposed` is communication not hidden behind compute."""

    rank: int
    step: float
    compute: float
    communication: float
    exposed: float

    def as_json(self) -> dict[str, float]:
        return {
            "rank": self.rank,
            "step_us": self.step,
            "compute_us": self.compute,
            "communication_us": self.communication,
            "exposed_communication_us": self.exposed,
        }


@dataclass(frozen=True)
class Timeline:
    """The scheduled step: every node's slice and each rank's totals."""

    slices: list[Slice]
    ranks: list[RankTime]

    @property
    def step(self) -> float:
        return max((r.step for r in self.ranks), default=0.0)


def load_timeline(
    directory: str | os.PathLike[str], prefix: str | None, timer_for
) -> Timeline:
    """Check and read a trace directory, then schedule it.

    `timer_for(groups, num_ranks)` builds the `NodeTimer`, which needs the trace's groups. A trace
    that breaks the contract is refused: its collectives or SEND/RECVs might never match up.
    """
    violations = check_traces(directory, prefix)
    if violations:
        raise FlintError(
            f"{directory} breaks the trace contract ({len(violations)} violations, first: "
            f"{violations[0]}): run `flint check {directory}`"
        )
    traces, groups = read_trace_set(directory, prefix)
    return schedule(traces, groups, timer_for(groups, len(traces)))


def schedule(
    traces: Sequence[RankTrace], groups: Mapping[int, Sequence[int]], timer: NodeTimer
) -> Timeline:
    """Schedule every rank of a contract-abiding trace set (see the module docstring)."""
    simulation = _Simulation(traces, groups, timer)
    simulation.run()
    slices = sorted(simulation.slices, key=lambda s: (s.rank, s.start, s.node_id))
    by_rank: dict[int, list[Slice]] = defaultdict(list)
    for piece in slices:
        by_rank[piece.rank].append(piece)
    return Timeline(slices, [_rank_time(t.rank, by_rank[t.rank]) for t in traces])


class _Rank:
    """One rank's graph and the state of its compute stream during the simulation."""

    def __init__(self, trace: RankTrace):
        self.rank = trace.rank
        self.nodes = {node.id: node for node in trace.nodes}
        self.waiting: dict[int, int] = {}
        self.dependents: dict[int, list[int]] = defaultdict(list)
        for node in trace.nodes:
            deps = {*node.ctrl_deps, *node.data_deps}
            self.waiting[node.id] = len(deps)
            for dep in deps:
                self.dependents[dep].append(node.id)
        self.ready: list[tuple[float, int]] = []
        self.computing = False
        self.finished: set[int] = set()


class _Simulation:
    """All ranks at once, event by event: node ends are the events, processed in time order (ties:
    rank, then node id) and a batch per instant, so each compute stream picks among everything
    that became ready at that instant."""

    def __init__(
        self, traces: Sequence[RankTrace], groups: Mapping[int, Sequence[int]], timer: NodeTimer
    ):
        self.ranks = {trace.rank: _Rank(trace) for trace in traces}
        self.timer = timer
        self.members = {ALL_RANKS: len(traces), **{g: len(r) for g, r in groups.items()}}
        self.instance = {rank_id: _collective_instances(rank) for rank_id, rank in self.ranks.items()}
        self.arrived: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
        self.sends_started: Counter[tuple] = Counter()
        self.recvs_waiting: dict[tuple, deque[tuple[int, int]]] = defaultdict(deque)
        self.events: list[tuple[float, int, int]] = []
        self.touched: set[int] = set()
        self.slices: list[Slice] = []

    def run(self) -> None:
        for rank in self.ranks.values():
            for node_id, count in rank.waiting.items():
                if count == 0:
                    self.ready(rank, node_id, 0.0)
        self.dispatch(0.0)
        while self.events:
            now = self.events[0][0]
            while self.events and self.events[0][0] == now:
                _, rank_id, node_id = heapq.heappop(self.events)
                self.finish(self.ranks[rank_id], node_id, now)
            self.dispatch(now)
        self._check_all_ran()

    def start(self, rank: _Rank, node_id: int, now: float, stream: str) -> None:
        node = rank.nodes[node_id]
        duration = self.timer.micros(node)
        name = node.name or f"{enum_name(pb.NodeType, node.type)} {node_id}"
        self.slices.append(Slice(rank.rank, node_id, name, stream, now, duration, _args(node)))
        heapq.heappush(self.events, (now + duration, rank.rank, node_id))

    def finish(self, rank: _Rank, node_id: int, now: float) -> None:
        rank.finished.add(node_id)
        if rank.nodes[node_id].type in _COMPUTE_TYPES:
            rank.computing = False
            self.touched.add(rank.rank)
        for dependent in rank.dependents.pop(node_id, ()):
            rank.waiting[dependent] -= 1
            if rank.waiting[dependent] == 0:
                self.ready(rank, dependent, now)

    def ready(self, rank: _Rank, node_id: int, now: float) -> None:
        node = rank.nodes[node_id]
        if node.type in _COMPUTE_TYPES:
            heapq.heappush(rank.ready, (now, node_id))
            self.touched.add(rank.rank)
        elif node.type == pb.COMM_COLL_NODE:
            key = self.instance[rank.rank][node_id]
            self.arrived[key].append((rank.rank, node_id))
            if len(self.arrived[key]) == self.members[key[0]]:
                for member, member_node in self.arrived.pop(key):
                    self.start(self.ranks[member], member_node, now, COMM)
        else:
            self._point_to_point(rank, node, now)

    def _point_to_point(self, rank: _Rank, node: pb.Node, now: float) -> None:
        key = tuple(attr_value(node, name) for name in ("comm_src", "comm_dst", "comm_tag"))
        if node.type == pb.COMM_SEND_NODE:
            self.start(rank, node.id, now, COMM)
            if self.recvs_waiting[key]:
                receiver, recv_id = self.recvs_waiting[key].popleft()
                self.start(self.ranks[receiver], recv_id, now, COMM)
            else:
                self.sends_started[key] += 1
        elif self.sends_started[key]:
            self.sends_started[key] -= 1  # that SEND started no later than now
            self.start(rank, node.id, now, COMM)
        else:
            self.recvs_waiting[key].append((rank.rank, node.id))

    def dispatch(self, now: float) -> None:
        for rank_id in sorted(self.touched):
            rank = self.ranks[rank_id]
            if not rank.computing and rank.ready:
                _, node_id = heapq.heappop(rank.ready)
                rank.computing = True
                self.start(rank, node_id, now, COMPUTE)
        self.touched.clear()

    def _check_all_ran(self) -> None:
        for rank in self.ranks.values():
            stuck = sorted(set(rank.nodes) - rank.finished)
            if stuck:
                raise FlintError(
                    f"rank {rank.rank} never finishes node {stuck[0]}: ranks wait on each other in a "
                    "cycle (collectives issued in different orders on different groups?)"
                )


def _collective_instances(rank: _Rank) -> dict[int, tuple[int, int]]:
    """Node id -> (group, position among the rank's collectives on that group by node id): the
    order in which the contract matches collectives across ranks."""
    by_group: dict[int, list[int]] = defaultdict(list)
    for node_id in sorted(rank.nodes):
        if rank.nodes[node_id].type == pb.COMM_COLL_NODE:
            by_group[group_id(rank.nodes[node_id])].append(node_id)
    return {node_id: (group, index) for group, ids in by_group.items() for index, node_id in enumerate(ids)}


def _args(node: pb.Node) -> dict[str, Any]:
    """What a viewer shows on click: the node's id, type and scalar attributes."""
    args: dict[str, Any] = {"id": node.id, "type": enum_name(pb.NodeType, node.type)}
    for attr in node.attr:
        value = attribute_value(attr)
        if isinstance(value, (bool, int, float, str)):
            args[attr.name] = value
    if isinstance(args.get("comm_type"), int) and args["comm_type"] in pb.CollectiveCommType.values():
        args["comm_type"] = pb.CollectiveCommType.Name(args["comm_type"])
    return args


def _rank_time(rank: int, slices: list[Slice]) -> RankTime:
    compute = [(s.start, s.end) for s in slices if s.stream == COMPUTE]
    comm = _union((s.start, s.end) for s in slices if s.stream == COMM)
    in_flight = sum(end - start for start, end in comm)
    return RankTime(
        rank=rank,
        step=max((s.end for s in slices), default=0.0),
        compute=sum(s.duration for s in slices if s.stream == COMPUTE),
        communication=in_flight,
        exposed=in_flight - _overlap(comm, compute),
    )


def _union(intervals) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total overlap of two sorted lists of disjoint intervals."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def to_trace_events(timeline: Timeline, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Chrome trace-event JSON: `X` slices in µs, pid = rank, tid 0 compute, 1.. communication."""
    events: list[dict[str, Any]] = []
    lanes: dict[int, list[float]] = defaultdict(list)  # rank -> end of each comm lane
    slices: list[dict[str, Any]] = []
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
    for rank in timeline.ranks:
        events.append(_meta("process_name", rank.rank, 0, name=f"rank {rank.rank}"))
        events.append(_meta("process_sort_index", rank.rank, 0, sort_index=rank.rank))
        events.append(_meta("thread_name", rank.rank, 0, name=COMPUTE))
        for lane in range(len(lanes[rank.rank])):
            name = COMM if lane == 0 else f"{COMM} {lane + 1}"
            events.append(_meta("thread_name", rank.rank, lane + 1, name=name))
    return {
        "traceEvents": events + slices,
        "displayTimeUnit": "ns",
        "otherData": {**metadata, "step_us": timeline.step},
    }


def _meta(kind: str, pid: int, tid: int, **args) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}

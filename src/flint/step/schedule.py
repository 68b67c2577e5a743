"""One step of a trace set, scheduled: the step every reader of a trace gives (timeline, simulate's
estimator, sweep).

Every rank's graph is list-scheduled, all ranks together, by a deterministic discrete-event
simulation with node times from `flint.trace.timing` (communication by a model of `flint.step`):

- a node becomes ready when all its ctrl and data dependencies have finished;
- each rank has one compute stream: COMP and MEM nodes run one at a time;
- communication waits for its partners: a collective starts when the last member of its group
  issues it (matched per group in node-id order, as the contract requires); a RECV starts no
  earlier than its SEND (matched by source, destination and tag) and ends when the SEND's message
  arrives: at once if it already has, as in ASTRA-sim.

Two issue orders. `READY_FIRST` (the library's default): the compute stream takes the node that
became ready first (then the lowest id), and communication never queues behind other
communication. `AS_ASTRA_SIM` (what `flint timeline` and `flint simulate --engine flint` use, so
that their step is ASTRA-sim's): as ASTRA-sim's workload layer issues nodes, the compute stream
takes the ready node with the lowest id, and each rank also has one communication stream on which
collectives and SENDs run one at a time, lowest id first (a collective holds it until it ends);
RECVs never wait for it.

Each node is one slice of its own duration (a RECV's: until its message arrives), so a rank's busy
time is the sum of its node times; waiting for partners shows up as gaps. `flint.analysis.timeline`
turns the result into Chrome trace-event JSON.

**One rank per class.** Flint's emitter writes ranks that run the same work (the same nodes and
dependencies, differing only in group ids and peers) as one class, recorded in the manifest's
`rank_totals`. Above `FULL_SCHEDULE_MAX_RANKS` ranks, only the first rank of each class is
scheduled: a collective starts when the representative of every class its group holds has reached
it (groups matched by their shape: the ranks' offsets from the group's lowest), and takes as long
as the slowest group of that shape on the network; a SEND meets the RECV of its peer's class
(matched by the two classes and the tag). Every rank of a class then has its representative's
times. Where the manifest records no classes, a class's first and last rank files differ in
shape, or the representatives never meet, every rank is scheduled. A set of one file per class
(`flint extract --rank-files classes`) is always scheduled this way: it has no other ranks' files.
"""

from __future__ import annotations

import heapq
import os
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flint.errors import FlintError
from flint.schema import et_def_pb2 as pb
from flint.trace.contract import contract_breach
from flint.trace.node_rules import ALL_RANKS
from flint.trace.reader import (
    RankTrace,
    TraceFiles,
    attr_value,
    attribute_value,
    enum_name,
    locate_traces,
    parse_trace_name,
    read_trace,
    transfer_peers,
)
from flint.trace.timing import COMPUTE_TYPES, NodeTimer, group_id

READY_FIRST, AS_ASTRA_SIM = "ready-first", "as-astra-sim"
"""The orders in which a rank's ready nodes issue (see the module docstring)."""
FULL_SCHEDULE_MAX_RANKS = 64
"""Above this many ranks, a trace whose manifest records rank classes is scheduled one rank per
class (see the module docstring)."""

COMPUTE, COMM = "compute", "comm"
"""The streams a slice runs on."""


@dataclass(frozen=True, slots=True)
class Slice:
    """One node's run: on which rank and stream, from when (µs after the step began), how long.
    Its node's attributes (`args`) are read only when asked for: a pipelined step of a large model
    has millions of slices, and most readers want only their times."""

    rank: int
    node_id: int
    name: str
    stream: str
    start: float
    duration: float
    message: bytes | None = field(default=None, compare=False, repr=False)
    """The node, serialized: decoded only for `args`."""

    @property
    def end(self) -> float:
        return self.start + self.duration

    @property
    def args(self) -> dict[str, Any]:
        """What a viewer shows on click: the node's id, type and scalar attributes."""
        return {} if self.message is None else _args(pb.Node.FromString(self.message))


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


Member = tuple[int, int]
"""A node of one rank: (rank, node id)."""


@dataclass(frozen=True)
class Timeline:
    """The scheduled step: every node's slice and each rank's totals; which SEND each RECV
    matched (`transfers`, SEND first) and which nodes ran each collective together (`collectives`,
    by rank)."""

    slices: list[Slice]
    ranks: list[RankTime]
    transfers: list[tuple[Member, Member]] = field(default_factory=list)
    collectives: list[tuple[Member, ...]] = field(default_factory=list)
    represents: dict[int, list[int]] | None = None
    """Scheduled one rank per class: each scheduled rank -> every rank of its class."""

    def every_rank(self) -> list[RankTime]:
        """Each rank's times, in rank order: a class's ranks take their representative's."""
        if self.represents is None:
            return list(self.ranks)
        by_rank = {r.rank: r for r in self.ranks}
        every = [RankTime(member, t.step, t.compute, t.communication, t.exposed)
                 for rep, members in self.represents.items() for t in (by_rank[rep],) for member in members]
        return sorted(every, key=lambda r: r.rank)

    @property
    def step(self) -> float:
        return max((r.step for r in self.ranks), default=0.0)


def load_timeline(
    directory: str | os.PathLike[str], prefix: str | None, timer_for,
    groups_file: str | os.PathLike[str] | None = None, by_class: bool | None = None,
    issue: str = READY_FIRST,
) -> Timeline:
    """Open a trace directory (its groups from `groups_file` where one is named) and schedule it
    (`schedule_trace_set`)."""
    return schedule_trace_set(locate_traces(directory, prefix, groups_file=groups_file), timer_for, by_class, issue)


def schedule_trace_set(files: TraceFiles, timer_for, by_class: bool | None = None, issue: str = READY_FIRST,
                       detail: bool = True) -> Timeline:
    """Check and schedule an opened trace set (`locate_traces`): one rank per class where
    `by_class` (default: above `FULL_SCHEDULE_MAX_RANKS` ranks, where the manifest records
    classes), else every rank; nodes issue in the `issue` order (`READY_FIRST` or `AS_ASTRA_SIM`,
    see the module docstring). Each file is read from disk once: the check leaves its bytes in
    the set for the schedule. Without `detail`, slices have no names or attributes: what an
    estimate, which reads only each rank's times, needs of a pipelined step's millions of nodes.

    `timer_for(groups, num_ranks)` builds the `NodeTimer`, which needs the trace's groups. A trace
    with contract errors is refused: its collectives or SEND/RECVs might never match up.
    """
    if files.one_per_class:
        return _schedule_per_class_set(files, timer_for(files.groups, files.num_ranks), issue, detail)
    if by_class is not False:
        if by_class or files.num_ranks > FULL_SCHEDULE_MAX_RANKS:
            classes = _rank_classes(files)
            if classes is not None:
                try:
                    return _schedule_by_class(files, classes, timer_for(files.groups, files.num_ranks), issue,
                                              detail)
                except FlintError:
                    pass  # representatives that never meet: every rank is scheduled, and checked
    breach = contract_breach(files)
    if breach:
        raise FlintError(breach)
    traces = (files.trace(path) for path in files.paths)  # each let go once the schedule has taken it in
    return schedule(traces, files.groups, timer_for(files.groups, len(files.paths)), issue, detail)


def schedule(
    traces: Iterable[RankTrace], groups: Mapping[int, Sequence[int]], timer: NodeTimer, issue: str = READY_FIRST,
    detail: bool = True,
) -> Timeline:
    """Schedule every rank of a contract-abiding trace set (see the module docstring)."""
    simulation = _Simulation(traces, groups, timer, issue, detail)
    simulation.run()
    return _timeline(simulation)


def _timeline(simulation, classes: dict[int, list[int]] | None = None) -> Timeline:
    """The finished simulation's slices in rank order, each scheduled rank's totals."""
    slices = sorted(simulation.slices, key=lambda s: (s.rank, s.start, s.node_id))
    by_rank: dict[int, list[Slice]] = defaultdict(list)
    for piece in slices:
        by_rank[piece.rank].append(piece)
    return Timeline(
        slices,
        [_rank_time(rank, by_rank[rank]) for rank in simulation.ranks],
        simulation.transfers,
        simulation.collectives,
        classes,
    )


@dataclass(frozen=True, slots=True)
class _Node:
    """What the schedule needs of one node, taken from it once as its trace is read: a pipelined
    step has millions of nodes, and a decoded protobuf node takes about ten times its serialized
    bytes (`message`, kept for `Slice.args`). `duration` is its own time (a RECV's, where its
    SEND has not started when it is issued); `group` a collective's; `transfer` a SEND's or
    RECV's match key."""

    type: int
    name: str
    duration: float
    group: int | None
    transfer: tuple | None
    message: bytes | None


class _Rank:
    """One rank's graph and the state of its compute stream during the simulation."""

    def __init__(self, trace: RankTrace, simulation: _Simulation):
        self.rank = trace.rank
        self.nodes = {node.id: simulation.take(self, node) for node in trace.nodes}
        self.waiting: dict[int, int] = {}
        self.dependents: dict[int, list[int]] = defaultdict(list)
        for node in trace.nodes:
            deps = {*node.ctrl_deps, *node.data_deps}
            self.waiting[node.id] = len(deps)
            for dep in deps:
                self.dependents[dep].append(node.id)
        self.ready: list[tuple[float, int]] = []
        self.computing = False
        self.comm_ready: list[int] = []
        self.communicating = False
        self.finished: set[int] = set()


class _Simulation:
    """All ranks at once, event by event: node ends are the events, processed in time order (ties:
    rank, then node id) and a batch per instant, so each compute stream picks among everything
    that became ready at that instant."""

    def __init__(
        self, traces: Iterable[RankTrace], groups: Mapping[int, Sequence[int]], timer: NodeTimer,
        issue: str = READY_FIRST, detail: bool = True,
    ):
        if issue not in (READY_FIRST, AS_ASTRA_SIM):
            raise ValueError(f"unknown issue order {issue!r}")
        self.as_astra_sim = issue == AS_ASTRA_SIM
        self.detail = detail
        self.timer = timer
        self.ranks = {trace.rank: _Rank(trace, self) for trace in traces}
        self.members = {ALL_RANKS: len(self.ranks), **{g: len(r) for g, r in groups.items()}}
        self.instance = {rank_id: _collective_instances(rank) for rank_id, rank in self.ranks.items()}
        self.arrived: dict[tuple[int, int], list[Member]] = defaultdict(list)
        self.sends_started: dict[tuple, deque[Member]] = defaultdict(deque)
        self.recvs_waiting: dict[tuple, deque[Member]] = defaultdict(deque)
        self.transfers: list[tuple[Member, Member]] = []
        self.collectives: list[tuple[Member, ...]] = []
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

    def take(self, rank: _Rank, node: pb.Node) -> _Node:
        """What the schedule keeps of a node of `rank`'s trace."""
        transfer = self.transfer_key(rank, node) if node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE) else None
        group = group_id(node) if node.type == pb.COMM_COLL_NODE else None
        if not self.detail:
            return _Node(node.type, "", self.duration(rank, node), group, transfer, None)
        name = node.name or f"{enum_name(pb.NodeType, node.type)} {node.id}"
        return _Node(node.type, name, self.duration(rank, node), group, transfer, node.SerializeToString())

    def duration(self, rank: _Rank, node: pb.Node) -> float:
        return self.timer.micros(node)

    def collective_key(self, rank: _Rank, node_id: int) -> tuple[tuple, int]:
        """Which instance of which collective a node is, and how many ranks must reach it."""
        key = self.instance[rank.rank][node_id]
        return key, self.members[key[0]]

    def transfer_key(self, rank: _Rank, node: pb.Node) -> tuple:
        return (*transfer_peers(node, rank.rank), attr_value(node, "comm_tag"))

    def start(self, rank: _Rank, node_id: int, now: float, stream: str, arrives: float | None = None) -> float:
        """Start a node now; it lasts its own time, or, a RECV whose message `arrives` at a known
        time, until then. Returns when it ends."""
        node = rank.nodes[node_id]
        duration = node.duration if arrives is None else max(0.0, arrives - now)
        self.slices.append(Slice(rank.rank, node_id, node.name, stream, now, duration, node.message))
        heapq.heappush(self.events, (now + duration, rank.rank, node_id))
        return now + duration

    def finish(self, rank: _Rank, node_id: int, now: float) -> None:
        rank.finished.add(node_id)
        node_type = rank.nodes[node_id].type
        if node_type in COMPUTE_TYPES:
            rank.computing = False
            self.touched.add(rank.rank)
        elif self.as_astra_sim and node_type in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE):
            rank.communicating = False
            self.touched.add(rank.rank)
        for dependent in rank.dependents.pop(node_id, ()):
            rank.waiting[dependent] -= 1
            if rank.waiting[dependent] == 0:
                self.ready(rank, dependent, now)

    def ready(self, rank: _Rank, node_id: int, now: float) -> None:
        node = rank.nodes[node_id]
        if node.type in COMPUTE_TYPES:
            heapq.heappush(rank.ready, (0.0 if self.as_astra_sim else now, node_id))
            self.touched.add(rank.rank)
        elif self.as_astra_sim and node.type in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE):
            heapq.heappush(rank.comm_ready, node_id)
            self.touched.add(rank.rank)
        else:
            self.issue(rank, node_id, now)

    def issue(self, rank: _Rank, node_id: int, now: float) -> None:
        node = rank.nodes[node_id]
        if node.type == pb.COMM_COLL_NODE:
            key, needed = self.collective_key(rank, node_id)
            self.arrived[key].append((rank.rank, node_id))
            if len(self.arrived[key]) == needed:
                members = tuple(sorted(self.arrived.pop(key)))
                self.collectives.append(members)
                for member, member_node in members:
                    self.start(self.ranks[member], member_node, now, COMM)
        else:
            self._point_to_point(rank, node_id, now)

    def _point_to_point(self, rank: _Rank, node_id: int, now: float) -> None:
        node = rank.nodes[node_id]
        key = node.transfer
        here = (rank.rank, node_id)
        if node.type == pb.COMM_SEND_NODE:
            arrives = self.start(rank, node_id, now, COMM)
            if self.recvs_waiting[key]:
                receiver, recv_id = self.recvs_waiting[key].popleft()
                self.transfers.append((here, (receiver, recv_id)))
                self.start(self.ranks[receiver], recv_id, now, COMM)
            else:
                self.sends_started[key].append((here, arrives))
        elif self.sends_started[key]:
            # that SEND started no later than now: the RECV ends when its message arrives (now, if
            # it already has), as in ASTRA-sim
            send, arrives = self.sends_started[key].popleft()
            self.transfers.append((send, here))
            self.start(rank, node_id, now, COMM, arrives)
        else:
            self.recvs_waiting[key].append(here)

    def dispatch(self, now: float) -> None:
        while self.touched:
            touched, self.touched = sorted(self.touched), set()
            for rank_id in touched:
                rank = self.ranks[rank_id]
                if not rank.computing and rank.ready:
                    _, node_id = heapq.heappop(rank.ready)
                    rank.computing = True
                    self.start(rank, node_id, now, COMPUTE)
                if not rank.communicating and rank.comm_ready:
                    rank.communicating = True
                    self.issue(rank, heapq.heappop(rank.comm_ready), now)

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
            by_group[rank.nodes[node_id].group].append(node_id)
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


# -- one rank per class ----------------------------------------------------------------------------


def _recorded_classes(files: TraceFiles) -> list[list[int]] | None:
    """The manifest's classes of ranks (each a list of ranks), or None where it records none or
    they do not cover every rank once (or it is unreadable: every rank is then scheduled, and its
    check says why)."""
    totals = (files.manifest or {}).get("rank_totals")
    if not isinstance(totals, list) or not totals:
        return None
    classes: list[list[int]] = []
    try:
        for entry in totals:
            ranks = [r for lo, hi in entry["ranks"] for r in range(int(lo), int(hi) + 1)]
            classes.append(ranks)
    except (KeyError, TypeError, ValueError):
        return None
    every = sorted(r for ranks in classes for r in ranks)
    return classes if every == list(range(files.num_ranks)) else None


def _schedule_per_class_set(files: TraceFiles, timer: NodeTimer, issue: str, detail: bool) -> Timeline:
    """A set of one file per class (`flint extract --rank-files classes`): its representatives,
    each class's first rank, are all there is to schedule."""
    classes = _recorded_classes(files)
    have = {parse_trace_name(path)[1] for path in files.paths}
    lacking = None if classes is None else next((ranks[0] for ranks in classes if ranks[0] not in have), None)
    if classes is None or lacking is not None:
        what = "its manifest records no rank classes" if classes is None else f"rank {lacking}'s file is missing"
        raise FlintError(f"{files.directory} holds one file per rank class but {what}: extract it again")
    try:
        return _schedule_by_class(files, classes, timer, issue, detail)
    except FlintError as exc:
        raise FlintError(f"{exc}: extract again with --rank-files all, whose every rank is scheduled") from None


def _rank_classes(files: TraceFiles) -> list[list[int]] | None:
    """The manifest's classes of ranks, or None where it records none, they do not cover every
    rank once, a rank's file is missing, or a class's first and last rank files differ in shape
    (the first ones are then held in the set, for the schedule)."""
    classes = _recorded_classes(files)
    if classes is None or len(files.paths) != files.num_ranks:
        return None
    by_rank = _paths_by_rank(files)
    for ranks in classes:
        if len(ranks) > 1:
            first = files.held[by_rank[ranks[0]]] = read_trace(by_rank[ranks[0]])
            if _shape(first) != _shape(read_trace(by_rank[ranks[-1]])):
                return None
    return classes


def _shape(trace: RankTrace) -> list[tuple]:
    return [(n.id, n.type, tuple(n.ctrl_deps), tuple(n.data_deps)) for n in trace.nodes]


class _PathsInOrder:
    """`files.paths` as rank -> path where they are in rank order (checked on each look-up), so
    that 131,072 names need not all be parsed."""

    def __init__(self, paths):
        self.paths = paths
        self.parsed: dict[int, object] | None = None

    def __getitem__(self, rank: int):
        if self.parsed is None and rank < len(self.paths) and parse_trace_name(self.paths[rank])[1] == rank:
            return self.paths[rank]
        if self.parsed is None:
            self.parsed = {parse_trace_name(path)[1]: path for path in self.paths}
        return self.parsed[rank]


def _paths_by_rank(files) -> _PathsInOrder:
    return _PathsInOrder(files.paths)


def _schedule_by_class(files, classes: list[list[int]], timer: NodeTimer, issue: str, detail: bool = True
                       ) -> Timeline:
    by_rank = _paths_by_rank(files)
    traces = (files.trace(by_rank[ranks[0]]) for ranks in classes)  # each let go once taken in
    class_of = {}
    for index, ranks in enumerate(classes):
        for rank in ranks:
            class_of[rank] = index
    simulation = _ClassSimulation(traces, files.groups, timer, classes, class_of, issue, detail)
    simulation.run()
    return _timeline(simulation, {ranks[0]: list(ranks) for ranks in classes})


class _ClassSimulation(_Simulation):
    """The representatives of the classes, each standing for its class (see the module docstring)."""

    def __init__(self, traces, groups, timer: NodeTimer, classes: list[list[int]], class_of: dict[int, int],
                 issue: str, detail: bool):
        self.class_of = class_of  # what taking in the traces' nodes needs (`transfer_key`, `duration`)
        self.num_classes = len(classes)
        self.pattern: dict[int, tuple] = {}      # group -> its offsets from its lowest rank
        self.siblings: dict[tuple, list[int]] = defaultdict(list)  # offsets -> the groups of that shape
        for group, ranks in groups.items():
            low = min(ranks) if ranks else 0
            offsets = tuple(sorted(r - low for r in ranks))
            self.pattern[group] = offsets
            self.siblings[offsets].append(group)
        self.pattern[ALL_RANKS] = ("all",)
        self.classes_in: dict[int, int] = {}
        self.shapes: dict[tuple, list] = {}
        super().__init__(traces, groups, timer, issue, detail)
        self.class_keys = {rank_id: self._instances(rank) for rank_id, rank in self.ranks.items()}

    def _instances(self, rank: _Rank) -> dict[int, tuple]:
        by_pattern: dict[tuple, list[int]] = defaultdict(list)
        for node_id in sorted(rank.nodes):
            if rank.nodes[node_id].type == pb.COMM_COLL_NODE:
                by_pattern[self.pattern.get(rank.nodes[node_id].group, ("missing",))].append(node_id)
        return {node_id: (pattern, index) for pattern, ids in by_pattern.items() for index, node_id in enumerate(ids)}

    def collective_key(self, rank: _Rank, node_id: int) -> tuple[tuple, int]:
        group = rank.nodes[node_id].group
        if group not in self.classes_in:
            members = range(len(self.class_of)) if group == ALL_RANKS else self.timer.groups.get(group, ())
            self.classes_in[group] = len({self.class_of[m] for m in members if m in self.class_of}) or 1
        return self.class_keys[rank.rank][node_id], self.classes_in[group]

    def transfer_key(self, rank: _Rank, node: pb.Node) -> tuple:
        src, dst = transfer_peers(node, rank.rank)
        return (self.class_of.get(src, src), self.class_of.get(dst, dst), attr_value(node, "comm_tag"))

    def duration(self, rank: _Rank, node: pb.Node) -> float:
        """A collective takes as long as the slowest group of its shape; the rest as timed."""
        model = self.timer.collectives
        group = group_id(node) if node.type == pb.COMM_COLL_NODE else None
        if model is None or group is None or group == ALL_RANKS or group not in self.pattern:
            return self.timer.micros(node)
        comm_type, size = attr_value(node, "comm_type"), attr_value(node, "comm_size")
        if not (isinstance(comm_type, int) and isinstance(size, int)) or not model.times(comm_type):
            return self.timer.micros(node)
        offsets = self.pattern[group]
        if offsets not in self.shapes:
            self.shapes[offsets] = list({model.group_shape(self.timer.groups[g]) for g in self.siblings[offsets]})
        return max(model.shaped_micros(comm_type, size, shape) for shape in self.shapes[offsets])

"""What a trace holds, per rank: the numbers `flint inspect` prints and tests round-trip through.

Works on any trace that follows the Chakra schema, not only Flint's own: it reads only the fields and
attributes the contract names. Names and the definition of FLOPs are `flint.trace.vocabulary`'s, so
`inspect --json` reads as `extract --json` does. Node times (for the heaviest nodes) come from
`flint.trace.timing`.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from flint.schema import et_def_pb2 as pb
from flint.trace.reader import RankTrace, integer_attr, transfer_peers
from flint.trace.timing import NodeTimer
from flint.trace.vocabulary import (
    RECV,
    SEND,
    collective_name,
    compute_flops,
    node_type_name,
    totals_json,
)

HEAVIEST = 10
_COMM = frozenset({pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE})


@dataclass(frozen=True)
class HeavyNode:
    """A node among a rank's most expensive ones, with what makes it expensive."""

    id: int
    name: str
    type: str
    micros: float
    flops: int = 0
    bytes: int = 0

    def as_json(self) -> dict:
        return {"id": self.id, "name": self.name, "type": self.type, "micros": self.micros,
                "flops": self.flops, "bytes": self.bytes}


@dataclass(frozen=True)
class TraceSummary:
    """One rank's totals: nodes by type, FLOPs and bytes of COMP nodes, communication by kind
    (`send` and `recv` among the collectives, as `extract` counts them)."""

    rank: int
    nodes: int
    nodes_by_type: dict[str, int] = field(default_factory=dict)
    flops: int = 0
    transcendentals: int = 0
    bytes: int = 0
    collectives: dict[str, tuple[int, int]] = field(default_factory=dict)
    by_group_size: dict[tuple[str, int | None], tuple[int, int]] = field(default_factory=dict)
    """(collective kind, ranks in its group; None if unknown) -> (count, bytes)."""
    sends_to: dict[int, tuple[int, int]] = field(default_factory=dict)
    """peer -> (count, bytes); likewise `recvs_from`."""
    recvs_from: dict[int, tuple[int, int]] = field(default_factory=dict)
    heaviest: list[HeavyNode] = field(default_factory=list)

    @property
    def sends(self) -> int:
        return self.collectives.get(SEND, (0, 0))[0]

    @property
    def recvs(self) -> int:
        return self.collectives.get(RECV, (0, 0))[0]

    @property
    def ungrouped(self) -> int:
        """Collectives whose group the groups file lacks: untimed, so absent from `heaviest`."""
        return sum(count for (_, n), (count, _) in self.by_group_size.items() if n is None)

    @property
    def group_collectives(self) -> dict[str, tuple[int, int]]:
        """`collectives` without the halves of point-to-point transfers."""
        return {k: v for k, v in self.collectives.items() if k not in (SEND, RECV)}

    def as_json(self) -> dict:
        counts = {kind: count for kind, (count, _) in self.collectives.items()}
        sizes = {kind: size for kind, (_, size) in self.collectives.items()}
        return {
            "rank": self.rank,
            **totals_json(self.nodes, self.flops, self.transcendentals, self.bytes, counts, sizes),
            "nodes_by_type": self.nodes_by_type,
            "collectives_by_group_size": [
                {"kind": kind, "group_size": n, "count": c, "bytes": b}
                for (kind, n), (c, b) in self.by_group_size.items()
            ],
            "sends_to": {str(p): {"count": c, "bytes": b} for p, (c, b) in self.sends_to.items()},
            "recvs_from": {str(p): {"count": c, "bytes": b} for p, (c, b) in self.recvs_from.items()},
            "heaviest": [node.as_json() for node in self.heaviest],
        }


def summarize(trace: RankTrace, timer: NodeTimer) -> TraceSummary:
    """One rank's totals; `timer` knows the groups and the roofline for group sizes and times."""
    by_type: Counter[str] = Counter()
    count: Counter[str] = Counter()
    size: Counter[str] = Counter()
    group_count: Counter[tuple[str, int | None]] = Counter()
    group_size: Counter[tuple[str, int | None]] = Counter()
    peers: dict[bool, tuple[Counter[int], Counter[int]]] = {
        True: (Counter(), Counter()), False: (Counter(), Counter())
    }
    flops = transcendentals = nbytes = 0
    for node in trace.nodes:
        by_type[node_type_name(node.type)] += 1
        if node.type == pb.COMP_NODE:
            flops += compute_flops(integer_attr(node, "num_ops") or 0)
            transcendentals += integer_attr(node, "transcendentals") or 0
            nbytes += integer_attr(node, "tensor_size") or 0
        elif node.type in _COMM:
            kind = communication_kind(node)
            comm_size = integer_attr(node, "comm_size") or 0
            count[kind] += 1
            size[kind] += comm_size
            if node.type == pb.COMM_COLL_NODE:
                group_count[kind, timer.group_size(node)] += 1
                group_size[kind, timer.group_size(node)] += comm_size
                continue
            is_send = node.type == pb.COMM_SEND_NODE
            src, dst = transfer_peers(node, trace.rank)
            peer = dst if is_send else src
            if peer is not None:  # a transfer without one (see `flint check`) has no row of its own
                peers[is_send][0][peer] += 1
                peers[is_send][1][peer] += comm_size
    return TraceSummary(
        rank=trace.rank,
        nodes=len(trace.nodes),
        nodes_by_type=dict(sorted(by_type.items())),
        flops=flops,
        transcendentals=transcendentals,
        bytes=nbytes,
        collectives={k: (count[k], size[k]) for k in sorted(count)},
        by_group_size={k: (group_count[k], group_size[k]) for k in sorted(group_count, key=str)},
        sends_to=_by_peer(*peers[True]),
        recvs_from=_by_peer(*peers[False]),
        heaviest=heaviest_nodes(trace.nodes, timer),
    )


def heaviest_nodes(nodes: Sequence[pb.Node], timer: NodeTimer, k: int = HEAVIEST) -> list[HeavyNode]:
    """The `k` nodes that take longest (ties: lowest id first), of those that can be timed: not a
    collective whose group the groups file lacks."""
    timable = (n for n in nodes if n.type != pb.COMM_COLL_NODE or timer.group_ranks(n) is not None)
    timed = heapq.nsmallest(k, ((-timer.micros(n), n.id, n) for n in timable), key=lambda t: t[:2])
    return [
        HeavyNode(
            id=node.id,
            name=node.name,
            type=communication_kind(node) if node.type in _COMM else node_type_name(node.type),
            micros=-minus_micros,
            flops=compute_flops(integer_attr(node, "num_ops") or 0) if node.type == pb.COMP_NODE else 0,
            bytes=integer_attr(node, "comm_size" if node.type in _COMM else "tensor_size") or 0,
        )
        for minus_micros, _, node in timed
    ]


def communication_kind(node: pb.Node) -> str:
    """A communication node's name in the vocabulary: its collective's kind, `send` or `recv`."""
    if node.type == pb.COMM_SEND_NODE:
        return SEND
    if node.type == pb.COMM_RECV_NODE:
        return RECV
    return collective_name(integer_attr(node, "comm_type"))


def _by_peer(count: Counter[int], size: Counter[int]) -> dict[int, tuple[int, int]]:
    return {peer: (count[peer], size[peer]) for peer in sorted(count)}


@dataclass(frozen=True)
class Spread:
    """One quantity across ranks: its smallest and largest value and a rank holding each."""

    metric: str
    low: int
    low_rank: int
    high: int
    high_rank: int

    def as_json(self) -> dict:
        return {"metric": self.metric, "min": self.low, "min_rank": self.low_rank,
                "max": self.high, "max_rank": self.high_rank}


SPREAD_METRICS = {
    "nodes": lambda s: s.nodes,
    "FLOPs": lambda s: s.flops,
    "bytes": lambda s: s.bytes,
    "collectives": lambda s: sum(c for c, _ in s.group_collectives.values()),
    "collective bytes": lambda s: sum(b for _, b in s.group_collectives.values()),
    "sends": lambda s: s.sends,
    "recvs": lambda s: s.recvs,
}


def spread(summaries: Sequence[TraceSummary]) -> list[Spread]:
    """Min and max of each per-rank total across `summaries` (the lowest rank wins ties)."""
    rows = []
    for metric, value in SPREAD_METRICS.items():
        low = min(summaries, key=lambda s: (value(s), s.rank))
        high = max(summaries, key=lambda s: (value(s), -s.rank))
        rows.append(Spread(metric, value(low), low.rank, value(high), high.rank))
    return rows

"""What a trace holds, per rank: the numbers `flint inspect` prints and tests round-trip through.

Works on any trace that follows the Chakra schema, not only Flint's own: it reads only the fields and
attributes the contract names.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from flint.schema import et_def_pb2 as pb
from flint.trace.reader import RankTrace, attr_value


@dataclass(frozen=True)
class TraceSummary:
    """One rank's totals: nodes by type, FLOPs and bytes of COMP nodes, communication by kind."""

    rank: int
    nodes: int
    nodes_by_type: dict[str, int] = field(default_factory=dict)
    flops: int = 0
    bytes: int = 0
    collectives: dict[str, tuple[int, int]] = field(default_factory=dict)
    sends: int = 0
    recvs: int = 0

    def as_json(self) -> dict:
        return {
            "rank": self.rank,
            "nodes": self.nodes,
            "nodes_by_type": self.nodes_by_type,
            "flops": self.flops,
            "bytes": self.bytes,
            "collectives": {k: {"count": c, "bytes": b} for k, (c, b) in self.collectives.items()},
            "sends": self.sends,
            "recvs": self.recvs,
        }


def summarize(trace: RankTrace) -> TraceSummary:
    by_type: Counter[str] = Counter()
    count: Counter[str] = Counter()
    size: Counter[str] = Counter()
    flops = nbytes = sends = recvs = 0
    for node in trace.nodes:
        by_type[pb.NodeType.Name(node.type)] += 1
        if node.type == pb.COMP_NODE:
            flops += attr_value(node, "num_ops") or 0
            nbytes += attr_value(node, "tensor_size") or 0
        elif node.type == pb.COMM_COLL_NODE:
            comm_type = attr_value(node, "comm_type")
            known = comm_type in pb.CollectiveCommType.values()
            kind = pb.CollectiveCommType.Name(comm_type) if known else f"comm_type {comm_type}"
            count[kind] += 1
            size[kind] += attr_value(node, "comm_size") or 0
        elif node.type == pb.COMM_SEND_NODE:
            sends += 1
        elif node.type == pb.COMM_RECV_NODE:
            recvs += 1
    return TraceSummary(
        rank=trace.rank,
        nodes=len(trace.nodes),
        nodes_by_type=dict(sorted(by_type.items())),
        flops=flops,
        bytes=nbytes,
        collectives={k: (count[k], size[k]) for k in sorted(count)},
        sends=sends,
        recvs=recvs,
    )

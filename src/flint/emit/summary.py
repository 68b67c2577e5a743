"""Per-rank totals: what the summary line, `--json` and `manifest.json` report."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from flint.graph import WorkloadGraph


@dataclass(frozen=True)
class RankTotals:
    """What one rank does in one step: node count, FLOPs, bytes, and collectives by kind."""

    nodes: int
    flops: int
    transcendentals: int
    bytes: int
    collective_count: dict[str, int] = field(default_factory=dict)
    collective_bytes: dict[str, int] = field(default_factory=dict)

    def as_json(self) -> dict:
        return {
            "nodes": self.nodes,
            "flops": self.flops,
            "transcendentals": self.transcendentals,
            "bytes": self.bytes,
            "collectives": {
                kind: {"count": self.collective_count[kind], "bytes": self.collective_bytes[kind]}
                for kind in sorted(self.collective_count)
            },
        }


def rank_totals(graph: WorkloadGraph) -> RankTotals:
    """Totals of one rank. Every rank runs the same SPMD graph, so they hold for all ranks."""
    count: Counter[str] = Counter()
    size: Counter[str] = Counter()
    flops = transcendentals = nbytes = 0
    for _, data in graph.nodes():
        if data["kind"] == "collective":
            count[data["collective"]] += 1
            size[data["collective"]] += data["comm_bytes"]
        else:
            flops += data["flops"]
            transcendentals += data["transcendentals"]
            nbytes += data["bytes"]
    return RankTotals(
        nodes=graph.graph.number_of_nodes(),
        flops=flops,
        transcendentals=transcendentals,
        bytes=nbytes,
        collective_count=dict(count),
        collective_bytes=dict(size),
    )

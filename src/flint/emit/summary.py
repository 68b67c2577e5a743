"""Per-rank totals: what the summary line, `--json` and `manifest.json` report."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from flint.graph import WorkloadGraph


@dataclass(frozen=True)
class RankTotals:
    """What one rank does in one step: node count, FLOPs, bytes, and communication by kind.

    Collectives are keyed by StableHLO name (`all_reduce`, ...); a permute's halves count as `send`
    and `recv`.
    """

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


def _ranges(ranks: list[int]) -> list[list[int]]:
    """[0, 1, 2, 5] -> [[0, 2], [5, 5]]: compact even for very many ranks."""
    out: list[list[int]] = []
    for rank in ranks:
        if out and out[-1][1] == rank - 1:
            out[-1][1] = rank
        else:
            out.append([rank, rank])
    return out


def rank_totals(graph: WorkloadGraph) -> list[tuple[list[list[int]], RankTotals]]:
    """Totals per class of ranks that do the same work, as `(rank ranges, totals)`, rank 0's first.

    Every rank runs the same SPMD program; only permutes differ (a rank may send, receive, both or
    neither), so the shared part is counted once and the permutes per rank.
    """
    count: Counter[str] = Counter()
    size: Counter[str] = Counter()
    flops = transcendentals = nbytes = nodes = 0
    roles: list[Counter] = [Counter() for _ in range(graph.num_ranks)]
    for _, data in graph.nodes():
        if data.get("collective") == "collective_permute":
            for src, dst in data["pairs"]:
                roles[src]["send", data["comm_bytes"]] += 1
                roles[dst]["recv", data["comm_bytes"]] += 1
            continue
        nodes += 1
        if data["kind"] == "collective":
            count[data["collective"]] += 1
            size[data["collective"]] += data["comm_bytes"]
        else:
            flops += data["flops"]
            transcendentals += data["transcendentals"]
            nbytes += data["bytes"]
    shared = RankTotals(nodes, flops, transcendentals, nbytes, dict(count), dict(size))
    classes: dict[tuple, list[int]] = {}
    for rank, role in enumerate(roles):
        classes.setdefault(tuple(sorted(role.items())), []).append(rank)
    result = []
    for role, ranks in classes.items():
        rank_count, rank_size = Counter(shared.collective_count), Counter(shared.collective_bytes)
        for (kind, comm_bytes), times in role:
            rank_count[kind] += times
            rank_size[kind] += comm_bytes * times
        totals = replace(
            shared,
            nodes=shared.nodes + sum(times for _, times in role),
            collective_count=dict(rank_count),
            collective_bytes=dict(rank_size),
        )
        result.append((_ranges(ranks), totals))
    return result

"""Per-rank totals: what the summary line, `--json` and `manifest.json` report."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from flint.emit.chakra import COMM_TYPE
from flint.emit.classes import RankClasses
from flint.graph import WorkloadGraph
from flint.trace.vocabulary import RECV, SEND, collective_name, compute_flops, totals_json


@dataclass(frozen=True)
class RankTotals:
    """What one rank does in one step: node count, FLOPs, bytes, and communication by kind.

    Counted as `inspect` counts the trace (`flint.trace.vocabulary`): collectives by their Chakra
    kind (`all_reduce`, ...; a ragged all-to-all is an `all_to_all`), a permute's halves as `send`
    and `recv`, FLOPs of the nodes that compute.
    """

    nodes: int
    flops: int
    transcendentals: int
    bytes: int
    collective_count: dict[str, int] = field(default_factory=dict)
    collective_bytes: dict[str, int] = field(default_factory=dict)

    def as_json(self) -> dict:
        return totals_json(self.nodes, self.flops, self.transcendentals, self.bytes,
                           self.collective_count, self.collective_bytes)


def _ranges(ranks: np.ndarray) -> list[list[int]]:
    """[0, 1, 2, 5] -> [[0, 2], [5, 5]]: compact even for very many ranks."""
    if not len(ranks):
        return []
    breaks = np.flatnonzero(np.diff(ranks) != 1)
    starts = np.concatenate(([ranks[0]], ranks[breaks + 1]))
    ends = np.concatenate((ranks[breaks], [ranks[-1]]))
    return [[int(a), int(b)] for a, b in zip(starts, ends)]


def _totals(nodes) -> RankTotals:
    """The totals of `(id, attributes)` nodes, permutes left out (they differ per rank)."""
    count: Counter[str] = Counter()
    size: Counter[str] = Counter()
    flops = transcendentals = nbytes = total = 0
    for _, data in nodes:
        if data.get("collective") == "collective_permute":
            continue
        total += 1
        if data["kind"] == "collective":
            kind = collective_name(COMM_TYPE[data["collective"]])
            count[kind] += 1
            size[kind] += data["comm_bytes"]
        else:
            flops += compute_flops(data["flops"])
            transcendentals += data["transcendentals"]
            nbytes += data["bytes"]
    return RankTotals(total, flops, transcendentals, nbytes, dict(count), dict(size))


def rank_totals(
    graph: WorkloadGraph, classes: RankClasses
) -> list[tuple[list[list[int]], RankTotals]]:
    """Totals per class of ranks that do the same work, as `(rank ranges, totals)`, rank 0's first.

    Every rank runs the same SPMD program (in a pipeline, its stage's); only permutes differ (a
    rank may send, receive, both or neither), so the shared part is counted once and each rank
    class's permutes on top. Classes whose sends and receives add up to the same totals are
    reported together.
    """
    by_stage: dict[int | None, list] = {}
    for node in graph.nodes():
        by_stage.setdefault(node[1].get("stage"), []).append(node)
    permute_bytes = [graph.graph.nodes[node]["comm_bytes"] for node in classes.permutes]
    merged: dict[tuple, list[int]] = {}  # stage and role totals -> classes, in order of first rank
    for cls, role in enumerate(classes.roles):
        key = Counter()
        for comm_bytes, sends, receives in zip(permute_bytes, role.sends, role.receives):
            key[SEND, comm_bytes] += sends
            key[RECV, comm_bytes] += receives
        merged.setdefault(
            (role.stage, tuple(sorted((k, n) for k, n in key.items() if n))), []
        ).append(cls)
    result = []
    for (stage, role), members in merged.items():
        runs = by_stage.get(None, []) + (by_stage.get(stage, []) if stage is not None else [])
        shared = _totals(runs)
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
        ranks = np.flatnonzero(np.isin(classes.of_rank, members))
        result.append((_ranges(ranks), totals))
    return result

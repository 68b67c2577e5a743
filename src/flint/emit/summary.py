"""Per-rank totals: what the summary line, `--json` and `manifest.json` report."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from flint.emit.classes import RankClasses
from flint.emit.plan import COLLECTIVE, COMM_TYPE, COMPUTE, Planned
from flint.trace.vocabulary import collective_name, compute_flops, totals_json


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


class TotalsCounter:
    """Counts one class's file as it is planned, node by node."""

    def __init__(self) -> None:
        self.nodes = self.flops = self.transcendentals = self.bytes = 0
        self.count: Counter[str] = Counter()
        self.size: Counter[str] = Counter()

    def add(self, planned: Planned) -> None:
        self.nodes += 1
        data = planned.data
        if planned.kind == COMPUTE:
            self.flops += compute_flops(data["flops"])
            self.transcendentals += data["transcendentals"]
            self.bytes += data["bytes"]
            return
        kind = collective_name(COMM_TYPE[data["collective"]]) if planned.kind == COLLECTIVE else planned.kind
        self.count[kind] += 1
        self.size[kind] += data["comm_bytes"]

    def totals(self) -> RankTotals:
        return RankTotals(self.nodes, self.flops, self.transcendentals, self.bytes, dict(self.count),
                          dict(self.size))


def merged_totals(
    classes: RankClasses, per_class: list[RankTotals]
) -> list[tuple[list[list[int]], RankTotals]]:
    """Totals per class of ranks that do the same work, as `(rank ranges, totals)`, rank 0's first:
    classes of one stage whose sends and receives add up to the same totals are reported together."""
    merged: dict[tuple, list[int]] = {}  # stage and totals -> classes, in order of first rank
    for cls, (role, totals) in enumerate(zip(classes.roles, per_class)):
        merged.setdefault((role.stage, repr(totals.as_json())), []).append(cls)
    return [
        (_ranges(np.flatnonzero(np.isin(classes.of_rank, members))), per_class[members[0]])
        for members in merged.values()
    ]

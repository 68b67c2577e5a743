"""Rank classes: ranks whose trace files have the same shape.

Every rank runs one SPMD program. Only point-to-point traffic changes which nodes a rank has: at each
`collective_permute` a rank sends, receives, both or neither, and its dependents wait on whichever it
did. Ranks that play the same role at every permute get files with the same nodes and dependencies,
differing only in group ids and peer ranks, so one template per class serves all its ranks. In a
pipelined step a rank also runs only its own stage's units, so its stage is part of its role.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flint.graph import WorkloadGraph


@dataclass(frozen=True)
class Role:
    """What a rank does at each permute node (in program order): send to a peer, receive, both;
    and the pipeline stage whose nodes it runs (None: every node)."""

    sends: tuple[bool, ...]
    receives: tuple[bool, ...]
    stage: int | None = None


@dataclass(frozen=True)
class RankClasses:
    """`of_rank[rank]` is the rank's class; classes are numbered in order of their first rank."""

    permutes: tuple[int, ...]
    roles: tuple[Role, ...]
    of_rank: np.ndarray

    def ranks(self, cls: int) -> np.ndarray:
        return np.flatnonzero(self.of_rank == cls)

    def first_ranks(self) -> list[int]:
        """The lowest rank of each class, by class."""
        return np.unique(self.of_rank, return_index=True)[1].tolist()

    def last_ranks(self) -> list[int]:
        """The highest rank of each class, by class."""
        last_from_end = np.unique(self.of_rank[::-1], return_index=True)[1]
        return (len(self.of_rank) - 1 - last_from_end).tolist()


def rank_classes(graph: WorkloadGraph) -> RankClasses:
    """Group the ranks by their role at every permute (one class when there are none). A rank's
    role is the permutes it sends and receives at, as lists: a step may have thousands of
    permutes, each between a few ranks."""
    permutes = tuple(
        node for node, data in graph.nodes() if data.get("collective") == "collective_permute"
    )
    if not permutes:
        return RankClasses((), (Role((), ()),), np.zeros(graph.num_ranks, dtype=np.int64))
    sends: list[list[int]] = [[] for _ in range(graph.num_ranks)]
    receives: list[list[int]] = [[] for _ in range(graph.num_ranks)]
    for column, node in enumerate(permutes):
        for source, target in graph.graph.nodes[node]["pairs"]:
            sends[source].append(column)
            receives[target].append(column)
    class_of: dict[tuple, int] = {}  # numbered in order of their lowest rank: deterministic, rank 0 first
    of_rank = np.empty(graph.num_ranks, dtype=np.int64)
    roles = []
    for rank in range(graph.num_ranks):
        key = (tuple(sends[rank]), tuple(receives[rank]))
        if key not in class_of:
            class_of[key] = len(roles)
            roles.append(Role(_marks(key[0], len(permutes)), _marks(key[1], len(permutes))))
        of_rank[rank] = class_of[key]
    return RankClasses(permutes=permutes, roles=tuple(roles), of_rank=of_rank)


def _marks(columns: tuple[int, ...], count: int) -> tuple[bool, ...]:
    marks = [False] * count
    for column in columns:
        marks[column] = True
    return tuple(marks)

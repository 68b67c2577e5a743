"""Rank classes: ranks whose trace files have the same shape.

Every rank runs one SPMD program. Only point-to-point traffic changes which nodes a rank has: at each
`collective_permute` a rank sends, receives, both or neither, and its dependents wait on whichever it
did. Ranks that play the same role at every permute get files with the same nodes and dependencies,
differing only in group ids and peer ranks, so one template per class serves all its ranks. In a
pipelined graph a rank also runs only its own stage's nodes, so its stage is part of its role.
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
    """Group the ranks by their stage and their role at every permute (one class when there are
    neither)."""
    permutes = tuple(
        node for node, data in graph.nodes() if data.get("collective") == "collective_permute"
    )
    roles = np.zeros((graph.num_ranks, 1 + 2 * len(permutes)), dtype=np.int64)
    roles[:, 0] = graph.stage_of_rank()
    for column, node in enumerate(permutes):
        pairs = np.asarray(graph.graph.nodes[node]["pairs"], dtype=np.int64)
        roles[pairs[:, 0], 1 + column] = 1
        roles[pairs[:, 1], 1 + len(permutes) + column] = 1
    if not permutes and not graph.stages:
        return RankClasses((), (Role((), ()),), np.zeros(graph.num_ranks, dtype=np.int64))
    distinct, first, inverse = np.unique(roles, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first)  # number classes by their lowest rank: deterministic, rank 0 first
    renumber = np.empty_like(order)
    renumber[order] = np.arange(len(order))
    return RankClasses(
        permutes=permutes,
        roles=tuple(
            Role(
                tuple(bool(x) for x in row[1 : 1 + len(permutes)]),
                tuple(bool(x) for x in row[1 + len(permutes) :]),
                int(row[0]) if graph.stages else None,
            )
            for row in distinct[order]
        ),
        of_rank=renumber[inverse.reshape(-1)],
    )

"""Communicator groups: ids for `pg_name`, and each rank's group for every collective.

A collective's groups partition (part of) the ranks. Meshes of 100K+ ranks have tens of thousands of
groups but only a handful of distinct partitions (one per mesh-axis combination the step reduces
over), so everything per rank is kept as one small integer table: rank x partition -> group id.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

import numpy as np

Partition = tuple[tuple[int, ...], ...]


class GroupTable:
    """Every distinct rank group of the trace, numbered from 1 in order of first use.

    Ids are what `pg_name` holds and what the communicator-group file maps back to ranks.
    `uses` are the collectives as `(node, groups)` in program order: `partition_of[node]` names the
    partition a collective node runs over, `first_node[p]` the first node to run over partition p;
    `ids_of_rank[rank, p]` is the id of the rank's group in partition p (0 where the rank is in none
    of its groups).
    """

    def __init__(self, uses: Iterable[tuple[Hashable, Partition]], num_ranks: int):
        self.ids: dict[tuple[int, ...], int] = {}
        self.partition_of: dict[Hashable, int] = {}
        self.first_node: list[Hashable] = []
        partitions: dict[Partition, int] = {}
        for node, groups in uses:
            index = partitions.get(groups)
            if index is None:  # a partition seen before already numbered all its groups
                index = partitions[groups] = len(partitions)
                self.first_node.append(node)
                for group in groups:
                    self.ids.setdefault(group, len(self.ids) + 1)
            self.partition_of[node] = index
        self.ids_of_rank = np.zeros((num_ranks, len(partitions)), dtype=np.int64)
        for groups, index in partitions.items():
            column = self.ids_of_rank[:, index]
            for group in groups:
                column[list(group)] = self.ids[group]

    def as_json(self) -> dict[str, list[int]]:
        return {str(gid): list(group) for group, gid in self.ids.items()}

"""The nodes of one rank class's trace, in file order, with their dependencies.

A trace plan says which ranks share a file's shape (`RankClasses`), their communicator groups
(`GroupTable`) and, per class, the nodes of its file (`Planned`). `GraphPlan` plans them from a whole
workload graph; a pipelined step plans each stage's file from its piece (`flint.emit.pipelined`).

A `collective_permute` becomes, on each rank, a SEND to its target and/or a RECV from its source
(ranks outside the pairs get neither). Dependents of a permute depend on the RECV where the rank
receives, else on the SEND, else on what the permute itself depended on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple, Protocol

import numpy as np

from flint.emit.classes import RankClasses, rank_classes
from flint.emit.first_nodes import taking_time
from flint.emit.groups import GroupTable
from flint.graph import WorkloadGraph
from flint.schema import et_def_pb2 as pb
from flint.trace.vocabulary import RECV, SEND

COMPUTE, COLLECTIVE = "compute", "collective"

COMM_TYPE = {
    "all_reduce": pb.ALL_REDUCE,
    "all_gather": pb.ALL_GATHER,
    "reduce_scatter": pb.REDUCE_SCATTER,
    "all_to_all": pb.ALL_TO_ALL,
    "ragged_all_to_all": pb.ALL_TO_ALL,
    "collective_broadcast": pb.BROADCAST,
}
"""The Chakra type of each collective (a ragged all-to-all is an all-to-all)."""


class Planned(NamedTuple):
    """One Chakra node of a class's files: what it is, its own id, its data deps, its control deps
    (the compiler's schedule, or a pipeline's), its attributes and name; a collective's partition
    of the group table; a SEND's or RECV's peer of each rank and the tag pairing them."""

    kind: str
    id: int
    deps: tuple[int, ...]
    ctrl: tuple[int, ...]
    data: Mapping
    name: str
    partition: int = -1
    peer_of: Mapping[int, int] | None = None
    tag: int = 0


class TracePlan(Protocol):
    """What the emitter writes a trace from."""

    num_ranks: int
    classes: RankClasses
    groups: GroupTable

    def planned(self, cls: int) -> Iterator[Planned]:
        """The nodes every rank of class `cls` writes, in file order."""

    def pair_sets(self) -> Iterator[tuple[int, Sequence[tuple[int, int]]]]:
        """Each point-to-point transfer's (source, target) rank pairs, with the tag it goes by."""


def planned_compute(id: int, deps: tuple, ctrl: tuple, data: Mapping, name: str) -> Planned:
    """A compute node; one that waits for nothing takes time (`first_nodes`)."""
    return Planned(COMPUTE, id, deps, ctrl, data if deps or ctrl else taking_time(data), name)


class GraphPlan:
    """A workload graph's trace, every node on every rank: the graph's node ids are the files' ids
    (a RECV gets one past the graph's, and a permute's node id is its tag)."""

    def __init__(self, graph: WorkloadGraph):
        self.graph = graph
        self.num_ranks = graph.num_ranks
        self.classes = rank_classes(graph)
        self.groups = GroupTable(
            ((node, data["groups"]) for node, data in graph.nodes() if "groups" in data), graph.num_ranks
        )
        pairs = {node: graph.graph.nodes[node]["pairs"] for node in self.classes.permutes}
        self._target_of = {node: {s: t for s, t in p} for node, p in pairs.items()}
        self._source_of = {node: {t: s for s, t in p} for node, p in pairs.items()}
        missing = np.argwhere(self.groups.ids_of_rank == 0)
        if len(missing):  # every rank runs every collective, so it is in one of its groups
            rank, partition = missing[0]
            node = self.groups.first_node[partition]
            raise AssertionError(f"rank {rank} is in no group of collective node {node}")

    def pair_sets(self) -> Iterator[tuple[int, Sequence[tuple[int, int]]]]:
        for node in self.classes.permutes:
            yield node, self.graph.graph.nodes[node]["pairs"]

    def planned(self, cls: int) -> Iterator[Planned]:
        graph, classes = self.graph, self.classes
        role = classes.roles[cls]
        column = {node: i for i, node in enumerate(classes.permutes)}
        past_graph = graph.graph.number_of_nodes()
        recv_id = {node: past_graph + i for i, node in enumerate(classes.permutes)}
        stands_for: dict[int, tuple[int, ...]] = {}  # permute node -> ids that stand for it here
        partition_of = self.groups.partition_of
        for node, data in graph.nodes():
            found: set[int] = set()
            ordered: set[int] = set()
            for pred, edge in graph.graph.pred[node].items():
                (ordered if edge.get("ctrl") else found).update(stands_for.get(pred, (pred,)))
            deps, ctrl = tuple(sorted(found)), tuple(sorted(ordered - found))
            name = data["name"]
            if data["kind"] != "collective":
                yield planned_compute(node, deps, ctrl, data, name)
            elif node in column:
                stands_for[node] = tuple(sorted(found | ordered))  # a rank outside the pairs does nothing
                if role.sends[column[node]]:
                    stands_for[node] = (node,)
                    yield Planned(SEND, node, deps, ctrl, data, name, peer_of=self._target_of[node], tag=node)
                if role.receives[column[node]]:
                    stands_for[node] = (recv_id[node],)  # the data has arrived: what dependents wait for
                    yield Planned(RECV, recv_id[node], deps, ctrl, data, name, peer_of=self._source_of[node],
                                  tag=node)
            else:
                yield Planned(COLLECTIVE, node, deps, ctrl, data, name, partition_of[node])

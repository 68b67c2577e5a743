"""The nodes of one rank class's trace, in file order, with their dependencies.

A `collective_permute` becomes, on each rank, a SEND to its target and/or a RECV from its source
(ranks outside the pairs get neither). The SEND keeps the graph node's id, the RECV gets an id past
the graph's; both use the node id as tag, so every pair matches. Dependents of a permute depend on
the RECV where the rank receives, else on the SEND, else on what the permute itself depended on.
A rank of a pipeline stage writes only its stage's nodes (and the permutes it takes part in);
dependencies on another stage's nodes, which only permutes have, are left out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from flint.emit.classes import RankClasses
from flint.graph import WorkloadGraph

COMPUTE, COLLECTIVE, SEND, RECV = "compute", "collective", "send", "recv"


@dataclass(frozen=True)
class Planned:
    """One Chakra node of a class's files: what it is, its graph node, its own id, its data deps
    and its control deps (the compiler's schedule, for the optimised stage)."""

    kind: str
    node: int
    id: int
    deps: tuple[int, ...]
    ctrl: tuple[int, ...] = ()


def plan_class(graph: WorkloadGraph, classes: RankClasses, cls: int) -> Iterator[Planned]:
    """The nodes every rank of class `cls` writes, in program order."""
    role = classes.roles[cls]
    column = {node: i for i, node in enumerate(classes.permutes)}
    past_graph = graph.graph.number_of_nodes()
    recv_id = {node: past_graph + i for i, node in enumerate(classes.permutes)}
    stands_for: dict[int, tuple[int, ...]] = {}  # permute node -> ids that stand for it here
    nodes = graph.nodes_of_stage(role.stage)
    here = None if role.stage is None else {node for node, _ in nodes}  # None: every node
    for node, data in nodes:
        found: set[int] = set()
        ordered: set[int] = set()
        for pred, edge in graph.graph.pred[node].items():
            if here is not None and pred not in here:
                continue  # another stage's node: not in this rank's file
            (ordered if edge.get("ctrl") else found).update(stands_for.get(pred, (pred,)))
        deps, ctrl = tuple(sorted(found)), tuple(sorted(ordered - found))
        if data["kind"] != "collective":
            yield Planned(COMPUTE, node, node, deps, ctrl)
        elif node in column:
            stands_for[node] = tuple(sorted(found | ordered))  # a rank outside the pairs does nothing
            if role.sends[column[node]]:
                stands_for[node] = (node,)
                yield Planned(SEND, node, node, deps, ctrl)
            if role.receives[column[node]]:
                stands_for[node] = (recv_id[node],)  # the data has arrived: what dependents wait for
                yield Planned(RECV, node, recv_id[node], deps, ctrl)
        else:
            yield Planned(COLLECTIVE, node, node, deps, ctrl)

"""Stage 5: the workload graph of one rank, as a networkx DiGraph.

Nodes are the ops that cost something: `compute` (FLOPs and bytes), `memory` (pure data movement,
bytes) and `collective` (kind, bytes, rank groups). Free ops (constants, reshapes, tuple plumbing) are
dropped and their consumers depend directly on whatever produced their inputs, so dependencies stay
exact. Node keys are consecutive integers in program order, which is a topological order.

All ranks run the same SPMD program, so one graph serves every rank; only the group a rank belongs to
differs, and emission resolves that per rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from flint import collectives
from flint.costs import COLLECTIVE, FREE, cost_of
from flint.errors import FlintError
from flint.parse import FUSION, Op, Program, Region

NODE_KINDS = ("compute", "memory", "collective")


@dataclass(frozen=True)
class WorkloadGraph:
    """One rank's graph, the rank count it was partitioned for, and op kinds that had no cost rule."""

    graph: nx.DiGraph
    num_ranks: int
    unknown_ops: tuple[str, ...]

    def nodes(self):
        """`(id, attributes)` in program (topological) order."""
        return sorted(self.graph.nodes(data=True))


class _Builder:
    def __init__(self, num_ranks: int):
        self.graph = nx.DiGraph()
        self.num_ranks = num_ranks
        self.producers: dict[int, frozenset[int]] = {}
        self.unknown: set[str] = set()

    def deps(self, op: Op) -> frozenset[int]:
        found: frozenset[int] = frozenset()
        for value in op.operands:
            found |= self.producers.get(value, frozenset())
        return found

    def passthrough(self, op: Op) -> None:
        deps = self.deps(op)
        for value in op.results:
            self.producers[value] = deps

    def add(self, op: Op, attributes: dict) -> None:
        node = self.graph.number_of_nodes()
        self.graph.add_node(node, name=op.name, op=op.opcode, **attributes)
        for dep in sorted(self.deps(op)):
            self.graph.add_edge(dep, node)
        for value in op.results:
            self.producers[value] = frozenset((node,))

    def region(self, region: Region) -> None:
        for op in region.ops:
            if op.regions and op.opcode != FUSION:
                raise FlintError(
                    f"{op.opcode} ({op.name}) is control flow, which this version of Flint cannot "
                    "unroll yet: rewrite the step without it"
                )
            cost = cost_of(op)
            if cost.kind == FREE:
                self.passthrough(op)
            elif cost.kind == COLLECTIVE:
                info = collectives.describe(op, self.num_ranks)
                if info.group_size <= 1:
                    self.passthrough(op)  # a collective over one rank moves nothing
                    continue
                self.add(
                    op,
                    dict(
                        kind="collective",
                        collective=info.kind,
                        comm_bytes=info.comm_bytes,
                        groups=info.groups,
                        bytes=cost.bytes,
                        flops=0,
                        transcendentals=0,
                    ),
                )
            else:
                if not cost.known:
                    self.unknown.add(op.opcode)
                self.add(
                    op,
                    dict(
                        kind=cost.kind,
                        flops=cost.flops,
                        transcendentals=cost.transcendentals,
                        bytes=cost.bytes,
                    ),
                )


def build_graph(program: Program, num_ranks: int) -> WorkloadGraph:
    """Turn the parsed program into the workload graph every rank runs."""
    builder = _Builder(num_ranks)
    builder.region(program.body)
    return WorkloadGraph(builder.graph, num_ranks, tuple(sorted(builder.unknown)))

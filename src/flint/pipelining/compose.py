"""One graph for the whole mesh: copies of the piece's regions, ordered by each stage's schedule."""

from __future__ import annotations

import networkx as nx
import numpy as np

from flint.graph import WorkloadGraph
from flint.ir.parse import Program
from flint.layout import Layout
from flint.mesh import MeshSpec
from flint.pipelining.piece import stage_ranks
from flint.pipelining.regions import (
    BWD,
    FWD,
    GRAD,
    GRAD_FIRST,
    GRAD_LAST,
    LOCAL,
    MID,
    POST,
    POST_FIRST,
    POST_LAST,
    PRE,
    REGIONS,
    Regions,
    find_regions,
)
from flint.pipelining.schedules import (
    BACKWARD,
    FORWARD,
    PipelineRequest,
    Work,
    schedule,
    update_label,
)

UNIT_START = "unit_start"
"""The `op` of the node each unit starts with (`_Composer.open_unit`)."""

Copy = dict[int, tuple[int, ...]]
"""A region's copy: node of the piece -> nodes of the pipelined graph that stand for it."""


class _Composer:
    """Builds the pipelined graph unit by unit, in an order where every node follows its inputs."""

    def __init__(self, piece: WorkloadGraph, regions: Regions, request: PipelineRequest, ranks: np.ndarray):
        self.piece = piece.graph
        self.regions = regions
        self.request = request
        self.ranks = ranks
        self.out = nx.DiGraph()
        self.units: dict[tuple[int, Work], dict[str, Copy]] = {}  # (stage, work) -> region copies
        self.permutes: dict[tuple[str, int, int], int] = {}  # (kind, microbatch, virtual stage) -> node
        self.last: dict[int, list[int]] = {}  # stage -> nodes of its previous unit
        self.by_region = {r: regions.nodes(r) for r in REGIONS}
        self._groups: dict[tuple, tuple] = {}

    def on_stage(self, ranks_of_piece: tuple[tuple[int, ...], ...], stage: int) -> tuple:
        """Groups (or the sources and targets of pairs) of the piece's ranks as `stage`'s ranks."""
        key = (ranks_of_piece, stage)
        if key not in self._groups:
            self._groups[key] = tuple(tuple(int(self.ranks[stage, q]) for q in g) for g in ranks_of_piece)
        return self._groups[key]

    def copy(
        self, regions: tuple[str, ...], stage: int, label: str, context: dict, skip=frozenset()
    ) -> None:
        """Copy regions onto `stage`, their nodes in the piece's order; a data edge of the piece
        from another region resolves through `context` (region -> its copy here, or the nodes
        standing for all of it), else is dropped. A control edge (the compiler's schedule, on the
        optimised stage) is kept only between nodes of this copy: between units the pipeline's
        schedule orders them (`open_unit`)."""
        first = self.out.number_of_nodes()
        for region in regions:
            context[region] = {}
        for node in sorted(n for region in regions for n in self.by_region[region]):
            copied = context[self.regions.region_of[node]]
            data_deps: set[int] = set()
            ctrl_deps: set[int] = set()
            for pred, edge in self.piece.pred[node].items():
                where = context.get(self.regions.region_of[pred], ())
                found = where if isinstance(where, tuple) else where.get(pred, ())
                if edge.get("ctrl"):
                    ctrl_deps.update(n for n in found if n >= first)
                else:
                    data_deps.update(found)
            if node in skip:
                copied[node] = tuple(sorted(data_deps | ctrl_deps))
                continue
            data = dict(self.piece.nodes[node], stage=stage)
            data["name"] = f"{label} {data['name']}"
            if "groups" in data:
                data["groups"] = self.on_stage(data["groups"], stage)
            if "pairs" in data:
                data["pairs"] = tuple(zip(*self.on_stage(tuple(zip(*data["pairs"])), stage)))
            copied[node] = (self.add(data, data_deps, ctrl_deps - data_deps),)

    def add(self, data: dict, deps, ctrl=()) -> int:
        node = self.out.number_of_nodes()
        self.out.add_node(node, **data)
        for dep in sorted(deps):
            self.out.add_edge(dep, node)
        for dep in sorted(ctrl):
            self.out.add_edge(dep, node, ctrl=True)
        return node

    def open_unit(self, stage: int, label: str, received: tuple[int, ...] = ()) -> int | None:
        """The node a unit starts with: it waits (`ctrl`) for the ends of the stage's previous unit
        (its nodes no other node of it follows) and for what the unit receives, and the unit's
        first nodes wait for it. A boundary so costs one edge per end and per first node, where
        tying every end to every first node would cost their product. It does nothing (one FLOP,
        one byte: a simulator's roofline gives it no time); None when the unit waits for nothing."""
        previous = set(self.last.get(stage, ()))
        ends = [n for n in sorted(previous) if not any(s in previous for s in self.out.succ[n])]
        if not ends and not received:
            return None
        data = dict(
            name=f"{label} start", op=UNIT_START, kind="compute", stage=stage,
            flops=0, transcendentals=0, bytes=0,
        )
        return self.add(data, (), ends + list(received))

    def close_unit(self, stage: int, start: int | None, nodes: list[int]) -> None:
        """Make the unit's first nodes (those that follow none of its others) wait for its start
        node: the unit starts as a whole, as the schedule has it."""
        inside = set(nodes)
        if start is not None:
            for node in nodes:
                if not any(p in inside for p in self.out.pred[node]):
                    self.out.add_edge(start, node, ctrl=True)
        self.last[stage] = nodes

    def incoming(self, stage: int, work: Work) -> tuple[str, int, int] | None:
        """The key of the permute bringing the unit its input: the activation from the virtual
        stage before, or the gradient from the one after (None for the first forward and the last
        backward, which receive nothing)."""
        v = work.chunk * self.request.stages + stage
        if work.kind == FORWARD:
            return None if v == 0 else (FORWARD, work.microbatch, v - 1)
        return None if v == self.last_virtual else (BACKWARD, work.microbatch, v + 1)

    def ready(self, stage: int, work: Work) -> bool:
        """Whether what the unit receives from another stage has been sent."""
        key = self.incoming(stage, work)
        return key is None or key in self.permutes

    @property
    def last_virtual(self) -> int:
        return self.request.stages * self.request.virtual_stages - 1

    def send(
        self, work: Work, stage: int, to: int, sources: frozenset[int], context: dict, nbytes: int
    ) -> None:
        """The permute carrying a unit's output from every rank of `stage` to its peer on `to`."""
        deps = set()
        for node in sources:
            deps.update(context[self.regions.region_of[node]].get(node, ()))
        what = "activation" if work.kind == FORWARD else "gradient"
        data = dict(
            name=f"{what} of {work.label}",
            op="collective_permute",
            kind="collective",
            collective="collective_permute",
            flops=0,
            transcendentals=0,
            bytes=2 * nbytes,
            comm_bytes=nbytes,
            pairs=tuple(zip(self.ranks[stage].tolist(), self.ranks[to].tolist())),
        )
        v = work.chunk * self.request.stages + stage
        self.permutes[work.kind, work.microbatch, v] = self.add(data, deps)

    def unit(self, stage: int, work: Work) -> None:
        S, M = self.request.stages, self.request.microbatches
        m, v = work.microbatch, work.chunk * S + stage
        label = work.label
        key = self.incoming(stage, work)
        received = () if key is None else (self.permutes[key],)
        start = self.open_unit(stage, label, received)
        first = self.out.number_of_nodes()
        if work.kind == FORWARD:
            context: dict = {}
            if received:
                context[PRE] = received  # the activation stands for the embedding's output
            regions = ((PRE,) if v == 0 else ()) + (LOCAL, FWD) + ((MID,) if v == self.last_virtual else ())
            self.copy(regions, stage, label, context)
            end = self.out.number_of_nodes()
            if v < self.last_virtual:
                sources, nbytes = self.regions.sends_forward, self.regions.activation_bytes
                self.send(work, stage, (stage + 1) % S, sources, context, nbytes)
        else:
            context = dict(self.units[stage, Work(FORWARD, m, work.chunk)])
            if received:
                context[MID] = received  # the gradient stands for the head's backward
            skip = self.regions.gradient_sync if m < M - 1 else frozenset()
            regions = (BWD, GRAD) + ((GRAD_FIRST,) if v == 0 else ())
            regions += (GRAD_LAST,) if v == self.last_virtual else ()
            self.copy(regions, stage, label, context, skip)
            end = self.out.number_of_nodes()
            if v > 0:
                sources, nbytes = self.regions.sends_backward, self.regions.gradient_bytes
                self.send(work, stage, (stage - 1) % S, sources, context, nbytes)
        self.units[stage, work] = context
        self.close_unit(stage, start, list(range(first, end)))

    def compose(self) -> nx.DiGraph:
        S, M, V = self.request.stages, self.request.microbatches, self.request.virtual_stages
        orders = [schedule(self.request, stage) for stage in range(S)]
        done = [0] * S
        while any(done[s] < len(orders[s]) for s in range(S)):
            before = sum(done)
            for s in range(S):
                while done[s] < len(orders[s]) and self.ready(s, orders[s][done[s]]):
                    self.unit(s, orders[s][done[s]])
                    done[s] += 1
            if sum(done) == before:
                raise AssertionError(f"the {self.request.schedule} schedule waits on itself")
        for stage in range(S):
            for chunk in range(V):
                label = update_label(chunk)
                start = self.open_unit(stage, label)
                first = self.out.number_of_nodes()
                v = chunk * S + stage
                regions = (POST,) + ((POST_FIRST,) if v == 0 else ())
                regions += (POST_LAST,) if v == self.last_virtual else ()
                context = dict(self.units[stage, Work(BACKWARD, M - 1, chunk)])
                self.copy(regions, stage, label, context)
                self.close_unit(stage, start, list(range(first, self.out.number_of_nodes())))
        return self.out


def pipeline_graph(
    piece: WorkloadGraph,
    program: Program,
    layout: Layout,
    request: PipelineRequest,
    mesh: MeshSpec,
    chunk_layers: int,
) -> tuple[WorkloadGraph, Regions]:
    """The pipelined graph of the whole mesh from the compiled piece of `chunk_layers` layers.
    The entry function takes the inputs in the layout's order unless the compiler dropped unused
    ones; then which arguments are the batch is not known."""
    axis = request.stage_axis(mesh)
    batch = None
    if len(program.body.arguments) == len(layout.inputs):
        batch = frozenset(i for i, item in enumerate(layout.inputs) if item.batch)
    regions = find_regions(piece, program, chunk_layers, batch)
    ranks = stage_ranks(mesh, axis)
    graph = _Composer(piece, regions, request, ranks).compose()
    stages = tuple(tuple(int(r) for r in row) for row in ranks)
    graph = WorkloadGraph(
        graph, mesh.size, piece.unknown_ops, stages=stages, costliest_branches=piece.costliest_branches
    )
    return graph, regions

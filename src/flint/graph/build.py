"""The workload graph of one step, as a networkx DiGraph.

Nodes are the ops that cost something: `compute` (FLOPs and bytes), `memory` (pure data movement,
bytes) and `collective` (kind, bytes, rank groups; `collective_permute` carries its source-target
pairs instead). Free ops (constants, reshapes, tuple plumbing) are dropped and their consumers depend
directly on whatever produced their inputs, so dependencies stay exact. Node keys are consecutive
integers in program order, which is a topological order. Every node has a readable `name`, the op
path it came from (`source_op`) and, where the compiler kept it, its source line (`source`): see
`flint.graph.names`.

Control flow is resolved while building, so the graph is straight-line code:
- `while` loops are unrolled by their static trip count (`flint.ir.loops`), or by `loop_trips` when the
  count is not static; iteration i+1 depends on iteration i through the carried values;
- `case`/`if` run the branch their selector picks when it is known at that point of the unrolled
  program (`flint.ir.folding`: constants, loop counters and integer arithmetic on them), else the most
  expensive branch (most FLOPs, then most bytes), the same on every rank; the loop condition and the
  branch selector are not emitted (they are scalar bookkeeping);
- an `async_start`/`async_done` pair becomes the one collective it wraps, issued at the start; its
  users depend on it through the done;
- an all-reduce whose only use is each rank's own piece of the sum becomes the reduce-scatter the
  GPU and TPU compilers make of it (`flint.graph.reduce_scatter`).

Edges are data dependencies, each with the values it carries (`values`: (SSA id, type) pairs), so
a later stage can tell what one part of the step hands another (pipelining sums the gradients a
backward hands the update). When the program is the compiler's schedule (the optimised module),
edges marked `ctrl=True` add the schedule's order: each node follows the one scheduled before it,
except that work after an async start does not wait for the collective until its done.

All ranks run the same SPMD program, so one graph serves every rank; emission resolves per rank the
group of a collective and the peers of a permute. A pipelined step (`flint.pipelining`) runs copies
of one stage's graph on every stage.

Nodes unrolled from a top-level `while` are recorded with the loop and the iteration they come from,
each such loop with the nodes that produce its results, and every node with the entry arguments it
reads, so later stages can find the layer loops of a step and what reads the batch or the
optimizer state (pipelining splits a step by them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from flint.errors import FlintError
from flint.graph.collectives import comm_bytes, describe
from flint.graph.names import collective_name, op_name
from flint.graph.reduce_scatter import ReduceScatter, reduce_scatters
from flint.ir.costs import COLLECTIVE, FREE, cost_of, kernel_of
from flint.ir.folding import Value, fold
from flint.ir.loops import trip_count
from flint.ir.parse import CONTROL_FLOW, Op, Program, Region, TensorType
from flint.mesh import MeshSpec


@dataclass(frozen=True)
class LoopRun:
    """A top-level `while` as unrolled: its trip count and, per result, the nodes producing it."""

    trips: int
    results: tuple[frozenset[int], ...]


@dataclass(frozen=True)
class WorkloadGraph:
    """One step's graph, the rank count it was partitioned for, and op kinds without a cost rule.

    `costliest_branches` counts the conditionals reached whose selector depends on data or on the
    rank, each traced as its costliest branch (a run may take another).

    `loops` are the top-level loops in program order; `loop_of[node]` is `(loop, iteration)` for a
    node unrolled from one. `reads[node]` are the positions of the entry arguments a node reads
    directly or through free ops (nodes that read none are left out).
    """

    graph: nx.DiGraph
    num_ranks: int
    unknown_ops: tuple[str, ...]
    loops: tuple[LoopRun, ...] = ()
    loop_of: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    reads: Mapping[int, frozenset[int]] = field(default_factory=dict)
    costliest_branches: int = 0

    def nodes(self):
        """`(id, attributes)` in program (topological) order."""
        return sorted(self.graph.nodes(data=True))


def _union(table: Mapping[int, frozenset[int]], values) -> frozenset[int]:
    """Everything `table` holds for any of `values`."""
    found: frozenset[int] = frozenset()
    for value in values:
        found |= table.get(value, frozenset())
    return found


def _static_cost(region: Region) -> tuple[int, int]:
    """(FLOPs, bytes) of a region's ops with nested regions counted once: enough to rank branches."""
    flops = nbytes = 0
    for op in region.ops:
        if op.opcode in CONTROL_FLOW:
            for inner in op.regions:
                f, b = _static_cost(inner)
                flops, nbytes = flops + f, nbytes + b
        else:
            cost = cost_of(op)
            flops, nbytes = flops + cost.flops, nbytes + cost.bytes
    return flops, nbytes


class _Builder:
    def __init__(self, num_ranks: int, loop_trips: int | None, scheduled: bool):
        self.graph = nx.DiGraph()
        self.num_ranks = num_ranks
        self.loop_trips = loop_trips
        self.producers: dict[int, frozenset[int]] = {}
        self.known: dict[int, Value] = {}  # integer values known in this iteration
        self.unknown: set[str] = set()
        self.costliest_branches = 0
        self.scheduled = scheduled
        self.last: frozenset[int] = frozenset()  # what the next scheduled node must follow
        self.in_flight: dict[int, tuple[tuple[int, ...], frozenset[int]]] = {}
        # per region: its reduce-scatters by all_reduce result, and the results they absorb
        self.scatters: dict[int, tuple[dict[int, ReduceScatter], frozenset[int]]] = {}
        self.loops: list[LoopRun] = []
        self.loop_of: dict[int, tuple[int, int]] = {}
        self.top_loop: tuple[int, int] | None = None  # (loop, iteration) being unrolled
        self.inputs: dict[int, frozenset[int]] = {}  # value -> entry arguments it passes on
        self.reads: dict[int, frozenset[int]] = {}
        self.combining: dict[str, tuple[int, set[int]]] = {}  # combined op -> its node, pieces

    def deps(self, values) -> frozenset[int]:
        """The nodes that produced `values`."""
        return _union(self.producers, values)

    def read(self, values) -> frozenset[int]:
        """The entry arguments `values` pass on."""
        return _union(self.inputs, values)

    def bind(self, targets, sources) -> None:
        """Make each target value stand for what produced the matching source value."""
        bound = [
            (self.producers.get(v, frozenset()), self.inputs.get(v, frozenset()), self.known.get(v))
            for v in sources
        ]
        for target, (deps, read, value) in zip(targets, bound):
            self.producers[target] = deps
            self.inputs[target] = read
            if value is None:
                self.known.pop(target, None)
            else:
                self.known[target] = value

    def passthrough(self, op: Op) -> None:
        deps, read = self.deps(op.operands), self.read(op.operands)
        for value in op.results:
            self.producers[value] = deps
            self.inputs[value] = read

    def add(self, op: Op, attributes: dict, opcode: str | None = None) -> None:
        node = self.graph.number_of_nodes()
        opcode = opcode or op.opcode
        name = op_name(attributes.get("kernel", opcode), op.name, op.source)
        self.graph.add_node(node, name=name, op=opcode, source_op=op.name, **attributes)
        if op.source:
            self.graph.nodes[node]["source"] = op.source
        data = self.wire(op, node)
        if self.scheduled:
            for dep in sorted(self.last - data):
                self.graph.add_edge(dep, node, ctrl=True)
            self.last = frozenset((node,))
        if self.top_loop is not None:
            self.loop_of[node] = self.top_loop

    def wire(self, op: Op, node: int) -> frozenset[int]:
        """Make `node` read `op`'s operands and stand for its results; the nodes it now follows."""
        data = self.deps(op.operands)
        carried: dict[int, list[tuple[int, TensorType]]] = {}  # producer -> the values it hands over
        for value, kind in dict(zip(op.operands, op.operand_types)).items():
            for dep in self.producers.get(value, ()):
                carried.setdefault(dep, []).append((value, kind))
        for dep in sorted(data):
            self.graph.add_edge(dep, node, values=tuple(carried[dep]))
        for value in op.results:
            self.producers[value] = frozenset((node,))
        read = self.read(op.operands)
        if read:
            self.reads[node] = self.reads.get(node, frozenset()) | read
        return data

    def track_value(self, op: Op) -> None:
        """Fold `op` if it is integer arithmetic on known values (`flint.ir.folding`): loop bounds and
        branch selectors are made of them."""
        value = fold(op, self.known)
        for result in op.results:
            self.known.pop(result, None)
        if value is not None:
            self.known[op.results[0]] = value

    def unroll(self, loop: Op) -> None:
        trips = trip_count(loop, self.known)
        if trips is None:
            if self.loop_trips is None:
                raise FlintError(
                    f"loop {loop.name} has no static trip count: pass --loop-trips N to unroll it N times"
                )
            trips = self.loop_trips
        _, body = loop.regions
        top = self.top_loop is None
        self.bind(body.arguments, loop.operands)
        for iteration in range(trips):
            if top:
                self.top_loop = (len(self.loops), iteration)
            self.region(body)
            self.bind(body.arguments, body.results)
        self.bind(loop.results, body.arguments)
        if top:
            self.top_loop = None
            self.loops.append(LoopRun(trips, tuple(self.deps((v,)) for v in loop.results)))

    def branch(self, op: Op) -> None:
        """The branch the selector picks where it is known here, else the costliest one. `if`
        lists its true branch first; `case` runs its last branch for an index out of range."""
        selector = self.known.get(op.operands[0])
        if selector is None:
            chosen = max(op.regions, key=_static_cost)
            self.costliest_branches += 1
        elif op.opcode == "if":
            chosen = op.regions[0 if selector else 1]
        else:
            chosen = op.regions[selector if 0 <= selector < len(op.regions) else -1]
        self.region(chosen)
        self.bind(op.results, chosen.results)

    def async_start(self, op: Op) -> None:
        (body,) = op.regions
        before, issued = self.last, self.graph.number_of_nodes()
        self.bind(body.arguments, op.operands)
        self.region(body)
        started = frozenset(range(issued, self.graph.number_of_nodes()))
        self.in_flight[op.results[0]] = (body.results, started)
        if self.scheduled and started:
            self.last = before  # the next op is scheduled while the collective is in flight

    def async_done(self, op: Op) -> None:
        results, started = self.in_flight.pop(op.operands[0])
        self.bind(op.results, results)
        if self.scheduled:
            self.last |= started

    def collective(self, op: Op, cost, scatter: ReduceScatter | None = None) -> None:
        attributes = dict(kind="collective", bytes=cost.bytes, flops=0, transcendentals=0)
        if op.opcode == "collective_permute":
            pairs = tuple((int(s), int(t)) for s, t in op.attrs["source_target_pairs"] if s != t)
            if not pairs:
                self.passthrough(op)
                return
            comm = dict(collective=op.opcode, comm_bytes=comm_bytes(op), pairs=pairs)
            self.add(op, attributes | comm)
            return
        info = describe(op, self.num_ranks)
        if info.group_size <= 1:
            self.passthrough(op)  # a collective over one rank moves nothing
            return
        comm = dict(collective=info.kind, comm_bytes=info.comm_bytes, groups=info.groups)
        if scatter is None:
            if not self.joined(op, attributes | comm):
                self.add(op, attributes | comm)
            return
        attributes["bytes"] = info.comm_bytes + scatter.piece.result_types[0].nbytes
        self.add(op, attributes | comm | dict(collective="reduce_scatter"), opcode="reduce_scatter")
        for absorbed in (*scatter.copies, scatter.piece):
            self.bind(absorbed.results, op.results)

    def joined(self, op: Op, attributes: dict) -> bool:
        """Join a piece of a combined collective (`flint.compile.gpu_module`) to the node of the
        first piece met: the compiler issues them as one, with the bytes of all of them. A piece
        met again starts the next walk of the region (a loop's next trip)."""
        if "combined" not in op.attrs:
            return False
        name, piece = op.attrs["combined"]
        last, pieces = self.combining.get(name, (None, {piece}))
        if piece in pieces:  # the first piece met, in this walk of its region
            self.combining[name] = (self.graph.number_of_nodes(), {piece})
            return False
        if any(dep > last for dep in self.deps(op.operands)):  # keep node keys a topological order
            return False
        pieces.add(piece)
        node = self.graph.nodes[last]
        node["bytes"] += attributes["bytes"]
        node["comm_bytes"] += attributes["comm_bytes"]
        self.wire(op, last)
        return True

    def region(self, region: Region) -> None:
        if id(region) not in self.scatters:  # a loop body is walked once per trip: find them once
            found = {s.reduce.results[0]: s for s in reduce_scatters(region, self.num_ranks)}
            absorbed = {o.results[0] for s in found.values() for o in (*s.copies, s.piece)}
            self.scatters[id(region)] = (found, frozenset(absorbed))
        scatters, absorbed = self.scatters[id(region)]
        for op in region.ops:
            if op.results and op.results[0] in absorbed:
                continue  # bound to its reduce-scatter
            if op.opcode == "while":
                self.unroll(op)
                continue
            if op.opcode in ("case", "if"):
                self.branch(op)
                continue
            if op.opcode == "async_start":
                self.async_start(op)
                continue
            if op.opcode == "async_done":
                self.async_done(op)
                continue
            self.track_value(op)
            cost = cost_of(op)
            if cost.kind == FREE:
                self.passthrough(op)
            elif cost.kind == COLLECTIVE:
                self.collective(op, cost, scatters.get(op.results[0]) if op.results else None)
            else:
                if not cost.known:  # a custom call by its target: what it runs
                    target = op.attrs.get("target")
                    self.unknown.add(f"custom_call {target}" if target else op.opcode)
                attributes = dict(
                    kind=cost.kind,
                    flops=cost.flops,
                    transcendentals=cost.transcendentals,
                    bytes=cost.bytes,
                )
                if kernel := kernel_of(op):
                    attributes["kernel"] = kernel
                if cost.gemm is not None:
                    attributes["gemm"] = cost.gemm.as_list()
                if "instruction" in op.attrs:
                    attributes["instruction"] = op.attrs["instruction"]
                if "kernel_name" in op.attrs:
                    attributes["kernel_name"] = op.attrs["kernel_name"]
                self.add(op, attributes)


def build_graph(
    program: Program, num_ranks: int, loop_trips: int | None = None, mesh: MeshSpec | None = None
) -> WorkloadGraph:
    """Turn the parsed program into the straight-line workload graph every rank runs. `mesh` (of
    `num_ranks` ranks) names the axes a collective runs over in its name (`flint.graph.names`)."""
    builder = _Builder(num_ranks, loop_trips, program.scheduled)
    builder.inputs = {value: frozenset((i,)) for i, value in enumerate(program.body.arguments)}
    builder.region(program.body)
    for _, data in builder.graph.nodes(data=True):
        if data["kind"] == "collective":  # named once complete: combined pieces add their bytes
            data["name"] = collective_name(data, mesh)
    return WorkloadGraph(
        builder.graph,
        num_ranks,
        tuple(sorted(builder.unknown)),
        tuple(builder.loops),
        builder.loop_of,
        builder.reads,
        costliest_branches=builder.costliest_branches,
    )

"""The compiled piece's nodes by region: what runs per microbatch, per step, on which stage."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import networkx as nx

from flint.errors import FlintError
from flint.graph import WorkloadGraph
from flint.ir.parse import FUSION, Op, Program, Region, TensorType

PRE, LOCAL, FWD, MID, BWD = "pre", "local", "fwd", "mid", "bwd"
POST, POST_FIRST, POST_LAST = "post", "post-first", "post-last"
GRAD, GRAD_FIRST, GRAD_LAST = "grad", "grad-first", "grad-last"
PER_MICROBATCH = {POST: GRAD, POST_FIRST: GRAD_FIRST, POST_LAST: GRAD_LAST}
REGIONS = (PRE, LOCAL, FWD, MID, BWD, POST, POST_FIRST, POST_LAST, GRAD, GRAD_FIRST, GRAD_LAST)
SYNCS = ("all_reduce", "reduce_scatter")
BACKWARD_SIDE = frozenset((BWD, GRAD, GRAD_FIRST, GRAD_LAST))
RUNS_WITH = {POST: BWD, POST_FIRST: GRAD_FIRST, POST_LAST: GRAD_LAST}
"""The backward region that runs on every virtual stage whose update runs a region's nodes."""


@dataclass(frozen=True)
class Regions:
    """The compiled piece's nodes by region, and what crosses stages.

    `sends_forward` produce the activation the forward layer loop carries out (`activation_bytes`),
    `sends_backward` the gradient the backward loop carries out (`gradient_bytes`);
    `gradient_sync` are BWD collectives that do not lead to that gradient; `accumulated` the
    backward's nodes whose values the update (or a sync) reads, with the type of each value and the
    backward regions of which one must run for its reader to run (the embedding's update reads
    the first virtual stage's alone): the gradients a step sums over its microbatches.
    """

    region_of: Mapping[int, str]
    chunk_layers: int
    sends_forward: frozenset[int]
    sends_backward: frozenset[int]
    activation_bytes: int
    gradient_bytes: int
    gradient_sync: frozenset[int]
    accumulated: Mapping[int, tuple[tuple[frozenset[str], TensorType], ...]]

    def nodes(self, region: str) -> list[int]:
        return sorted(n for n, r in self.region_of.items() if r == region)


def _carried(loop: Op) -> list[int]:
    """Results of a loop that carry a value from one iteration to the next: not a counter (scalar),
    not passed through unchanged, not a buffer the body writes one slice of (a scan's stacked
    outputs, which the optimised module updates in place inside a fusion, seen through bitcasts
    and conversions), not a value the body computes without reading the one before (a one-trip
    loop's stacked outputs, which the optimised module writes whole)."""
    _, body = loop.regions
    defined = _defined(body)
    reads = [(_reads(op), op.results) for op in body.ops]
    carried = []
    for k, (argument, result) in enumerate(zip(body.arguments, body.results)):
        if result == argument or not loop.operand_types[k].shape:
            continue
        if _slice_written_into(result, defined, {}) == argument:
            continue
        if result not in _follow(reads, argument):
            continue
        carried.append(k)
    return carried


def _follow(reads: list[tuple[set[int], tuple[int, ...]]], value: int) -> set[int]:
    """The values computed from `value`, directly or not, by ops given in program order as what
    each reads and what it defines."""
    found = {value}
    for read, results in reads:
        if not found.isdisjoint(read):
            found.update(results)
    return found


def _reads(op: Op) -> set[int]:
    """The values an op reads: its operands and those of the ops inside it."""
    values = set(op.operands)
    for region in op.regions:
        for inner in region.ops:
            values |= _reads(inner)
    return values


def _defined(region: Region) -> dict[int, Op]:
    return {value: op for op in region.ops for value in op.results}


_SAME_ELEMENTS = frozenset({"bitcast", "convert"})
"""Ops that keep a buffer's elements where they are: XLA:CPU's fusions widen bf16 to f32 around an
in-place update."""


def _alias(value: int, defined: Mapping[int, Op], outer: Mapping[int, int]) -> int:
    """The value `value` is a bitcast or conversion of, as a value of the loop body (`outer` maps
    the parameters of the fusions being looked into to their operands there)."""
    while value in defined and defined[value].opcode in _SAME_ELEMENTS:
        value = defined[value].operands[0]
    return outer.get(value, value)


def _slice_written_into(value: int, defined: Mapping[int, Op], outer: Mapping[int, int]) -> int | None:
    """The value of the loop body that `value` is with one slice overwritten (a
    `dynamic_update_slice`, seen through bitcasts, conversions, into fusions and through the
    asynchronous computations that wrap them), else None."""
    value = _alias(value, defined, {})
    op = defined.get(value)
    if op is None:
        return None
    if op.opcode == "dynamic_update_slice":
        return _alias(op.operands[0], defined, outer)
    wrapper = op
    if op.opcode == "async_done":  # the GPU compiler runs some in-place updates asynchronously
        wrapper = defined.get(op.operands[0])
        if wrapper is None or wrapper.opcode != "async_start":
            return None
    if wrapper.opcode in (FUSION, "async_start"):
        (inner,) = wrapper.regions
        parameters = {p: _alias(v, defined, outer) for p, v in zip(inner.arguments, wrapper.operands)}
        return _slice_written_into(inner.results[op.results.index(value)], _defined(inner), parameters)
    return None


def _reach(graph: nx.DiGraph, start, forward: bool) -> set[int]:
    """Every node reachable from `start` (excluded) along edges, or against them."""
    step = graph.successors if forward else graph.predecessors
    seen: set[int] = set()
    todo = list(start)
    while todo:
        for other in step(todo.pop()):
            if other not in seen:
                seen.add(other)
                todo.append(other)
    return seen


def find_regions(
    graph: WorkloadGraph, program: Program, chunk_layers: int, batch: frozenset[int] | None
) -> Regions:
    """Split the compiled piece at its forward and backward layer loops (module docstring);
    `batch` are the positions of the batch's entry arguments (None: not known)."""
    loops = [op for op in program.body.ops if op.opcode == "while"]
    layer_loops = [i for i, run in enumerate(graph.loops) if run.trips == chunk_layers]
    if len(loops) != len(graph.loops) or len(layer_loops) < 2:
        raise FlintError(
            f"--pipeline-stages splits the step at its layer loops, but the compiled step has no "
            f"forward and backward top-level loop of {chunk_layers} layers (its loops: "
            f"{[run.trips for run in graph.loops]} trips): keep the layers under one lax.scan"
        )
    forward, backward = layer_loops[0], layer_loops[-1]
    fwd = {n for n, (loop, _) in graph.loop_of.items() if loop == forward}
    bwd = {n for n, (loop, _) in graph.loop_of.items() if loop == backward}
    # Regions follow data alone: the optimised module's schedule (ctrl edges) orders every kernel
    # after the one before it, whatever it computes
    g = nx.subgraph_view(graph.graph, filter_edge=lambda u, v: not graph.graph.edges[u, v].get("ctrl"))
    pre = _reach(g, fwd, forward=False) - fwd - bwd
    after_forward = _reach(g, fwd, forward=True)  # MID's nodes are in it, so what follows them too
    mid = (after_forward & _reach(g, bwd, forward=False)) - fwd - bwd - pre
    local: set[int] = set()
    if batch is not None:  # what before the layers does not follow the batch is every stage's
        embedding = {n for n in pre if graph.reads.get(n, frozenset()) & batch}
        embedding |= _reach(g.subgraph(pre), embedding, forward=True)
        pre, local = embedding, pre - embedding
    post = set(g) - pre - local - mid - fwd - bwd
    region_of = {n: POST for n in post}
    region_of.update({n: PRE for n in pre} | {n: LOCAL for n in local} | {n: MID for n in mid})
    region_of.update({n: FWD for n in fwd} | {n: BWD for n in bwd})

    def crossing(loop: int) -> tuple[frozenset[int], int]:
        carried = _carried(loops[loop])
        nbytes = sum(loops[loop].operand_types[k].nbytes for k in carried)
        nodes = frozenset().union(*(graph.loops[loop].results[k] for k in carried))
        if not nodes:
            raise FlintError(f"loop {loops[loop].name} carries no activation from layer to layer")
        return nodes, nbytes

    sends_forward, activation_bytes = crossing(forward)
    sends_backward, gradient_bytes = crossing(backward)
    on_path = _reach(g, sends_backward, forward=False) | sends_backward
    # After the layers, the embedding's work follows the gradient out of the layers and no weight
    # gradient of theirs; the head's follows the forward or the head but not the layers' backward
    after_weights = _reach(g, bwd - on_path, forward=True)
    embedding_tail = (_reach(g, sends_backward, forward=True) & post) - after_weights
    head_tail = (after_forward & post) - _reach(g, bwd, forward=True)
    region_of.update({n: POST_FIRST for n in embedding_tail} | {n: POST_LAST for n in head_tail})
    # The update reads the optimizer state or the parameters (or follows what does); the rest of
    # POST is per microbatch. Reductions of BWD and of that rest which lead to the update, but not
    # to the gradient sent back, are gradient syncs.
    syncs_of = (BWD,)
    leads_to_update = set(g)
    if batch is not None:
        update = {n for n in post if graph.reads.get(n, frozenset()) - batch}
        update |= _reach(g.subgraph(post), update, forward=True)
        region_of.update({n: PER_MICROBATCH[region_of[n]] for n in post - update})
        syncs_of += (GRAD, GRAD_FIRST, GRAD_LAST)
        leads_to_update = _reach(g, update, forward=False)
    sync = {
        n for n, region in region_of.items()
        if region in syncs_of
        and g.nodes[n].get("collective") in SYNCS
        and n in leads_to_update
        and n not in on_path
    }
    return Regions(
        region_of, chunk_layers, sends_forward, sends_backward, activation_bytes, gradient_bytes,
        frozenset(sync), _accumulated(g, region_of, sync, after_forward),
    )


def _accumulated(
    graph: nx.DiGraph, region_of: Mapping[int, str], sync: set[int], after_forward: set[int]
) -> dict[int, tuple[tuple[frozenset[str], TensorType], ...]]:
    """The backward's nodes that hand the update or a gradient sync values computed from the
    forward (gradients; not constants the optimizer broadcasts, nor zeroed buffers), and the
    types of those values (each once, however many nodes read it). A step sums a gradient before
    it syncs it, so what follows a sync (its slices of a combined buffer) is not summed again."""
    synced = _reach(graph, sync, forward=True) | sync
    handed: dict[int, dict[int, tuple[set[str], TensorType]]] = {}
    for u, v, values in graph.edges(data="values"):
        if region_of.get(u) not in BACKWARD_SIDE or u not in after_forward or u in synced:
            continue
        runs_with = region_of[v] if v in sync else RUNS_WITH.get(region_of.get(v))
        if runs_with is not None:
            for value, kind in values:
                handed.setdefault(u, {}).setdefault(value, (set(), kind))[0].add(runs_with)
    return {
        node: tuple((frozenset(regions), kind) for regions, kind in by_value.values())
        for node, by_value in sorted(handed.items())
    }

"""Pipeline parallelism with a schedule, for a step whose layers are a `lax.scan`.

`flint extract --pipeline-stages S --microbatches M --schedule gpipe|1f1b|interleaved
[--virtual-stages V]` on a mesh with a stage axis (named `pp` or `stage`, of size S). Flint never
re-derives what the compiler knows; it compiles one piece and arranges copies of it:

1. One microbatch of one chunk is compiled for the mesh without the stage axis: the batch (the
   step's last argument) keeps 1/M of its rows, and the stacked layer parameters (with their
   optimizer state: every pytree group whose arrays share one leading size) 1/(S·V) of their
   layers. Partitioning, parsing and graph building are as usual, so data and tensor parallelism
   and FSDP on the other mesh axes are the compiler's.
2. That graph is split at its layer loops: the first and the last top-level `while` with the
   chunk's trip count are the forward (FWD) and the backward (BWD) layers. Of the other ancestors
   of FWD, those that follow the batch are PRE (the embedding), the rest LOCAL (the causal mask,
   zeroed stash buffers, copies of the chunk's parameters). MID is what follows FWD and leads to
   BWD (final layernorm, head, loss and their backward down to the layers' output gradient). The
   rest is split twice. By what it follows: after the gradient leaving the layers and no weight
   gradient of theirs, the embedding's (FIRST); after FWD or MID but not BWD, the head's (LAST);
   else the layers'. And by when it runs: what reads the optimizer state or the parameters (any
   entry argument but the batch), or follows what does, is the per-step update (POST, POST_FIRST,
   POST_LAST); the rest runs with every backward (GRAD, GRAD_FIRST, GRAD_LAST: weight gradients of
   the embedding and the head, zeroed gradient buffers). If the compiler dropped unused entry
   arguments, which of them is the batch is not known: all of PRE and POST are then per step.
3. One graph for the whole mesh joins copies, each run only by one stage's ranks (node attribute
   `stage`). Chunk c of stage s is virtual stage c·S + s. Per microbatch m: F(m, c) is a copy of
   LOCAL and FWD (with PRE before them on virtual stage 0, MID after them on the last); B(m, c) one
   of BWD and GRAD (with GRAD_FIRST on virtual stage 0, GRAD_LAST on the last). Once per step and
   chunk each stage then runs POST (with POST_FIRST, POST_LAST likewise). A virtual stage sends its
   forward output to the next and its input gradient back to the one before (chunk boundaries wrap
   from the last stage to the first): a `collective_permute` from each rank of one stage to the rank
   at the same position of the other mesh axes on the other, of the bytes the compiled forward loop
   carries from layer to layer (the backward loop's for gradients). Each stage's units follow its
   schedule: every unit's first nodes wait (`ctrl`) for the last nodes of the unit before it and for
   what the unit receives, so a unit starts as a whole and a simulator reproduces the schedule's
   bubble. Nodes are named after their unit: `F3.0 <op>`, `B3.0 <op>`, `U.0 <op>` for the update.

Gradient syncs: a one-microbatch compile reduces each weight gradient over the data group in every
backward; a real step accumulates gradients over microbatches and syncs once. All-reduces and
reduce-scatters of B units that lead to the update but not to the gradient sent to the previous
stage are kept only in each chunk's last B (microbatch M-1, where Megatron overlaps them with the
backward too).

Approximate, and said so in the README:
- the adds that accumulate weight gradients over microbatches are not modelled;
- the optimizer's elementwise work on a gradient alone, before it meets the optimizer state
  (AdamW's g² and (1 - β)·g), runs with every backward; its step-count scalars repeat for every
  chunk;
- a POST node that BWD depends on (none in the bundled models) is not waited for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import NamedTuple

import networkx as nx
import numpy as np

from flint.errors import FlintError
from flint.frontend import Workload
from flint.graph import WorkloadGraph
from flint.layout import Layout, stacked_paths
from flint.mesh import MeshSpec
from flint.parse import Op, Program

SCHEDULES = ("gpipe", "1f1b", "interleaved")
STAGE_AXES = ("pp", "stage")
FORWARD, BACKWARD = "F", "B"
PRE, LOCAL, FWD, MID, BWD = "pre", "local", "fwd", "mid", "bwd"
POST, POST_FIRST, POST_LAST = "post", "post-first", "post-last"
GRAD, GRAD_FIRST, GRAD_LAST = "grad", "grad-first", "grad-last"
PER_MICROBATCH = {POST: GRAD, POST_FIRST: GRAD_FIRST, POST_LAST: GRAD_LAST}
REGIONS = (PRE, LOCAL, FWD, MID, BWD, POST, POST_FIRST, POST_LAST, GRAD, GRAD_FIRST, GRAD_LAST)
SYNCS = ("all_reduce", "reduce_scatter")


class Work(NamedTuple):
    """One unit of a stage's schedule: the forward or backward of one microbatch on one chunk."""

    kind: str
    microbatch: int
    chunk: int


@dataclass(frozen=True)
class PipelineRequest:
    """What `--pipeline-stages`, `--microbatches`, `--schedule` and `--virtual-stages` ask for."""

    stages: int
    microbatches: int
    schedule: str = "1f1b"
    virtual_stages: int = 1

    def stage_axis(self, mesh: MeshSpec) -> int:
        """The index of the mesh's stage axis, after checking that the request fits the mesh."""
        S, M, V = self.stages, self.microbatches, self.virtual_stages
        if self.schedule not in SCHEDULES:
            raise FlintError(f"unknown schedule {self.schedule!r}: choose one of {', '.join(SCHEDULES)}")
        if S < 2 or M < 1 or V < 1:
            raise FlintError(
                "--pipeline-stages needs 2 or more stages, --microbatches and --virtual-stages 1 or more"
            )
        if self.schedule == "interleaved" and (V < 2 or M % S):
            raise FlintError(
                f"--schedule interleaved needs --virtual-stages 2 or more and microbatches divisible "
                f"by the stages (got {V} virtual stages, {M} microbatches, {S} stages)"
            )
        if self.schedule != "interleaved" and V != 1:
            raise FlintError(f"--virtual-stages {V} needs --schedule interleaved")
        named = [i for i, name in enumerate(mesh.axis_names) if name in STAGE_AXES]
        if not named:
            raise FlintError(
                f"--pipeline-stages needs a mesh axis named pp or stage (the mesh has "
                f"{', '.join(mesh.axis_names)}): e.g. --mesh pp={S},data=2"
            )
        if mesh.shape[named[0]] != S:
            raise FlintError(
                f"mesh axis {mesh.axis_names[named[0]]} has {mesh.shape[named[0]]} ranks but "
                f"--pipeline-stages is {S}: make them equal"
            )
        return named[0]


# ------------------------------------------------------------------------------ schedules


def _one_forward_one_backward(forwards: list[Work], backwards: list[Work], warmup: int) -> list[Work]:
    """`warmup` forwards, then one forward and one backward in turn, then the backwards left."""
    steady = len(forwards) - warmup
    order = forwards[:warmup]
    for i in range(steady):
        order += [forwards[warmup + i], backwards[i]]
    return order + backwards[steady:]


def gpipe(stages: int, microbatches: int, stage: int) -> list[Work]:
    """GPipe: every forward in microbatch order, then every backward in the same order."""
    return [Work(FORWARD, m, 0) for m in range(microbatches)] + [
        Work(BACKWARD, m, 0) for m in range(microbatches)
    ]


def one_f_one_b(stages: int, microbatches: int, stage: int) -> list[Work]:
    """1F1B (PipeDream-flush, Megatron's non-interleaved schedule): stage s warms up with
    min(S - s - 1, M) forwards, then alternates one forward and one backward, then cools down with
    the remaining backwards; at most S - s microbatches' activations are held at once."""
    warmup = min(stages - stage - 1, microbatches)
    return _one_forward_one_backward(
        [Work(FORWARD, m, 0) for m in range(microbatches)],
        [Work(BACKWARD, m, 0) for m in range(microbatches)],
        warmup,
    )


def interleaved(stages: int, microbatches: int, virtual: int, stage: int) -> list[Work]:
    """Megatron's interleaved schedule (Narayanan et al., 2021) with V chunks per stage.

    Microbatches go in groups of S: the k-th forward of a stage runs chunk (k // S) mod V on
    microbatch (k // (S·V))·S + k mod S, so a group passes through chunk 0, then chunk 1, and so on;
    the k-th backward does the same with the chunks in reverse order. Warm-up is
    (S - s - 1)·2 + (V - 1)·S forwards (all of them if that is more), then one forward and one
    backward in turn, then the remaining backwards.
    """
    total = microbatches * virtual

    def unit(kind: str, k: int) -> Work:
        chunk = (k // stages) % virtual
        microbatch = (k // (stages * virtual)) * stages + k % stages
        return Work(kind, microbatch, chunk if kind == FORWARD else virtual - 1 - chunk)

    warmup = min((stages - stage - 1) * 2 + (virtual - 1) * stages, total)
    return _one_forward_one_backward(
        [unit(FORWARD, k) for k in range(total)], [unit(BACKWARD, k) for k in range(total)], warmup
    )


def schedule(request: PipelineRequest, stage: int) -> list[Work]:
    """Stage `stage`'s units in the order it runs them."""
    S, M = request.stages, request.microbatches
    if request.schedule == "gpipe":
        return gpipe(S, M, stage)
    if request.schedule == "1f1b":
        return one_f_one_b(S, M, stage)
    return interleaved(S, M, request.virtual_stages, stage)


# ------------------------------------------------------------------------------ the piece compiled


def stage_mesh(mesh: MeshSpec, axis: int) -> MeshSpec:
    """The mesh of one stage: every axis but the stage axis (one rank if there is none)."""
    shape = mesh.shape[:axis] + mesh.shape[axis + 1 :]
    names = mesh.axis_names[:axis] + mesh.axis_names[axis + 1 :]
    return MeshSpec(shape, names) if shape else MeshSpec((1,), ("data",))


def stage_ranks(mesh: MeshSpec, axis: int) -> np.ndarray:
    """`[stage, q]`: the rank at row-major position q of the stage mesh on each stage."""
    ranks = np.arange(mesh.size).reshape(mesh.shape)
    return np.moveaxis(ranks, axis, 0).reshape(mesh.shape[axis], -1)


def one_microbatch(
    workload: Workload, layout: Layout, request: PipelineRequest, mesh
) -> tuple[Workload, int]:
    """The step on one microbatch (1/M of the batch's rows) and one chunk (1/(S·V) of the stacked
    layers, optimizer state included), shardings as laid out; and the layers of a chunk."""
    import jax

    chunks = request.stages * request.virtual_stages
    stacked = stacked_paths(layout)
    if not stacked:
        raise FlintError(
            "--pipeline-stages splits stacked layers (parameters sharing one leading size, as under "
            "lax.scan), and the step's inputs have none"
        )
    leaves, treedef = jax.tree_util.tree_flatten(workload.args)
    resized, chunk_layers = [], 0
    for item, leaf in zip(layout.inputs, leaves):
        shape = list(item.shape)
        if item.batch and shape:
            parts, what = request.microbatches, f"batch input {item.path} ({shape[0]} rows)"
            pieces = f"{parts} microbatches"
        elif item.path in stacked:
            parts, what = chunks, f"{item.path} ({shape[0]} layers)"
            pieces = f"{parts} chunks ({request.stages} stages x {request.virtual_stages} virtual stages)"
        else:
            resized.append(leaf)
            continue
        if shape[0] % parts:
            raise FlintError(f"{what} does not divide into {pieces}")
        shape[0] //= parts
        if item.path in stacked:
            chunk_layers = shape[0]
        ways = int(np.prod([mesh.shape[a] for a in item.spec[0]])) if item.spec else 1
        if shape[0] % ways:
            raise FlintError(
                f"{what}: one piece of {shape[0]} does not split over mesh axis "
                f"{'+'.join(item.spec[0])} ({ways} ways): use fewer microbatches or another layout"
            )
        resized.append(jax.ShapeDtypeStruct(tuple(shape), leaf.dtype, sharding=leaf.sharding))
    return replace(workload, args=tuple(jax.tree_util.tree_unflatten(treedef, resized))), chunk_layers


# ------------------------------------------------------------------------------ regions


@dataclass(frozen=True)
class Regions:
    """The compiled piece's nodes by region, and what crosses stages.

    `sends_forward` produce the activation the forward layer loop carries out (`activation_bytes`),
    `sends_backward` the gradient the backward loop carries out (`gradient_bytes`);
    `gradient_sync` are BWD collectives that do not lead to that gradient.
    """

    region_of: Mapping[int, str]
    chunk_layers: int
    sends_forward: frozenset[int]
    sends_backward: frozenset[int]
    activation_bytes: int
    gradient_bytes: int
    gradient_sync: frozenset[int]

    def nodes(self, region: str) -> list[int]:
        return sorted(n for n, r in self.region_of.items() if r == region)


def _carried(loop: Op) -> list[int]:
    """Results of a loop that carry a value from one iteration to the next: not a counter (scalar),
    not passed through unchanged, not a buffer the body writes one slice of (a scan's stacked
    outputs)."""
    _, body = loop.regions
    defined = {value: op for op in body.ops for value in op.results}
    carried = []
    for k, (argument, result) in enumerate(zip(body.arguments, body.results)):
        op = defined.get(result)
        if result == argument or not loop.operand_types[k].shape:
            continue
        if op is not None and op.opcode == "dynamic_update_slice" and op.operands[0] == argument:
            continue
        carried.append(k)
    return carried


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
    g = graph.graph
    pre = _reach(g, fwd, forward=False) - fwd - bwd
    mid = (_reach(g, fwd, forward=True) & _reach(g, bwd, forward=False)) - fwd - bwd - pre
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
    head_tail = (_reach(g, fwd | mid, forward=True) & post) - _reach(g, bwd, forward=True)
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
        frozenset(sync),
    )


# ------------------------------------------------------------------------------ the pipelined graph


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
        """Copy regions onto `stage`, their nodes in the piece's order; an edge of the piece from
        another region resolves through `context` (region -> its copy here, or the nodes standing
        for all of it), else is dropped."""
        for region in regions:
            context[region] = {}
        for node in sorted(n for region in regions for n in self.by_region[region]):
            copied = context[self.regions.region_of[node]]
            data_deps: set[int] = set()
            ctrl_deps: set[int] = set()
            for pred, edge in self.piece.pred[node].items():
                where = context.get(self.regions.region_of[pred], ())
                found = where if isinstance(where, tuple) else where.get(pred, ())
                (ctrl_deps if edge.get("ctrl") else data_deps).update(found)
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

    def order_after_previous(self, stage: int, nodes: list[int], received: tuple[int, ...] = ()) -> None:
        """The unit's first nodes wait for the last nodes of the stage's previous unit and for
        what the unit receives: a unit starts as a whole, as the schedule has it."""
        previous, inside = set(self.last.get(stage, ())), set(nodes)
        ends = [n for n in sorted(previous) if not any(s in previous for s in self.out.succ[n])]
        starts = [n for n in nodes if not any(p in inside for p in self.out.pred[n])]
        for end in ends + list(received):
            for start in starts:
                if not self.out.has_edge(end, start):
                    self.out.add_edge(end, start, ctrl=True)
        self.last[stage] = nodes

    def ready(self, stage: int, work: Work) -> bool:
        """Whether what the unit receives from another stage has been sent."""
        v, last = work.chunk * self.request.stages + stage, self.last_virtual
        if work.kind == FORWARD:
            return v == 0 or (FORWARD, work.microbatch, v - 1) in self.permutes
        return v == last or (BACKWARD, work.microbatch, v + 1) in self.permutes

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
            name=f"{what} of {work.kind}{work.microbatch}.{work.chunk}",
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
        label = f"{work.kind}{m}.{work.chunk}"
        first = self.out.number_of_nodes()
        if work.kind == FORWARD:
            context: dict = {}
            if v > 0:
                context[PRE] = (self.permutes[FORWARD, m, v - 1],)
            regions = ((PRE,) if v == 0 else ()) + (LOCAL, FWD) + ((MID,) if v == self.last_virtual else ())
            self.copy(regions, stage, label, context)
            end = self.out.number_of_nodes()
            if v < self.last_virtual:
                sources, nbytes = self.regions.sends_forward, self.regions.activation_bytes
                self.send(work, stage, (stage + 1) % S, sources, context, nbytes)
        else:
            context = dict(self.units[stage, Work(FORWARD, m, work.chunk)])
            if v < self.last_virtual:
                context[MID] = (self.permutes[BACKWARD, m, v + 1],)
            skip = self.regions.gradient_sync if m < M - 1 else frozenset()
            regions = (BWD, GRAD) + ((GRAD_FIRST,) if v == 0 else ())
            regions += (GRAD_LAST,) if v == self.last_virtual else ()
            self.copy(regions, stage, label, context, skip)
            end = self.out.number_of_nodes()
            if v > 0:
                sources, nbytes = self.regions.sends_backward, self.regions.gradient_bytes
                self.send(work, stage, (stage - 1) % S, sources, context, nbytes)
        self.units[stage, work] = context
        received = () if v == (0 if work.kind == FORWARD else self.last_virtual) else (
            self.permutes[work.kind, m, v - 1 if work.kind == FORWARD else v + 1],
        )
        self.order_after_previous(stage, list(range(first, end)), received)

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
                first = self.out.number_of_nodes()
                v = chunk * S + stage
                regions = (POST,) + ((POST_FIRST,) if v == 0 else ())
                regions += (POST_LAST,) if v == self.last_virtual else ()
                context = dict(self.units[stage, Work(BACKWARD, M - 1, chunk)])
                self.copy(regions, stage, f"U.{chunk}", context)
                self.order_after_previous(stage, list(range(first, self.out.number_of_nodes())))
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
    return WorkloadGraph(graph, mesh.size, piece.unknown_ops, stages=stages), regions

"""Stage 6, pipelining (optional): pipeline parallelism with a schedule, for a step whose layers are a
`lax.scan`.

In: the `WorkloadGraph` of one microbatch of one chunk of layers, compiled on the mesh without the
stage axis. Out: a `PipelinedStep`: that piece, its regions, and the units each stage runs in order
(`flint.emit` writes each stage's file from them, holding only the copies later units read). Imports: `flint.graph`, `flint.ir`, `flint.layout`, the frontend and the foundation modules.

`flint extract --pipeline-stages S --microbatches M --schedule gpipe|1f1b|interleaved
[--virtual-stages V]` on a mesh with a stage axis (named `pp` or `stage`, of size S). Flint never
re-derives what the compiler knows; it compiles one piece and arranges copies of it:

1. One microbatch of one chunk is compiled for the mesh without the stage axis: every batch input
   (`flint.layout.batch`) keeps 1/M of its rows, and the stacked layer parameters (with their
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
3. Each stage's ranks run copies of the piece, unit by unit (`PipelinedStep.units`). Chunk c of
   stage s is virtual stage c·S + s. Per microbatch m: F(m, c) is a copy of LOCAL and FWD (with PRE
   before them on virtual stage 0, MID after them on the last); B(m, c) one of BWD and GRAD (with
   GRAD_FIRST on virtual stage 0, GRAD_LAST on the last). Once per step and chunk each stage then
   runs POST (with POST_FIRST, POST_LAST likewise). A virtual stage sends its forward output to the
   next and its input gradient back to the one before (chunk boundaries wrap from the last stage to
   the first): a `collective_permute` from each rank of one stage to the rank at the same position
   of the other mesh axes on the other, of the bytes the compiled forward loop carries from layer to
   layer (the backward loop's for gradients). Each stage's units follow its schedule: a unit begins
   with a start node (`F3.0 start`, op `unit_start`, one FLOP and one byte) that waits (`ctrl`) for
   the ends of the unit before it (its nodes that none of its others follow) and for what the unit
   receives, and the unit's first nodes wait for it. So a unit starts as a whole and a simulator
   reproduces the schedule's bubble, at one control edge per end and per first node of a boundary
   (not their product). Nodes are named after their unit: `F3.0 <name>`, `B3.0 <name>`, `U.0 <name>`
   for the update.

On the compiler's optimised module (a GPU backend's default stage) the piece is its kernels: a
scan's stacked outputs are updated in place inside fusions, some of them run asynchronously (seen
through both, so they are not taken for the activation), the regions follow data edges alone (the compiler's schedule chains every
kernel to the one before), and that schedule is kept inside each copy only: between units the
pipeline's schedule orders them. The compiler would inline a loop of one trip, so for one layer per
chunk the piece's compile keeps its loops (`flint.compile.capture.ONE_TRIP_LOOPS`); a one-trip
loop's stacked outputs are then written whole, not by slice, and are told from the activation by
not reading their previous value.

Gradient syncs: a one-microbatch compile reduces each weight gradient over the data group in every
backward; a real step accumulates gradients over microbatches and syncs once. All-reduces and
reduce-scatters of B units that lead to the update but not to the gradient sent to the previous
stage are left out of every B and run once per chunk at the head of its update, which reads them
from the chunk's last B: after the pipeline has flushed, as Megatron-LM's train step all-reduces
gradients before its optimizer steps. Kept in the last B, they held each stage's communication
stream and kernel order while the gradient the stage before waited for was still being computed,
so the drain paid every stage's syncs in turn: on Megatron-LM's 530B GPT run 1F1B (S = 35,
M = 280, 9-way data parallel) the first stage idled 14.1 s of a 59.8 s step, and idles 5.3 s of
51.0 s with the syncs in the update, about its bubble of S - 1 microbatches (5.5 s).

Gradient sums: what a B unit computes from the forward and hands its update (through a sync or
directly) is summed over the microbatches, in the type the compiler gives it
(`Regions.accumulated`); constants the optimizer broadcasts, which also run with every B, are not.
Every B of a chunk but its first ends with one element-wise kernel per such buffer (`B3.0 accumulate
<name>`, op `accumulate`) that reads the sum and the new gradient and writes the sum: 3 times its
bytes, one add per element. The update reads the last B's sums; the gradient sent back does not wait
for them. A value only the first (or the last) virtual stage's update reads, such as the embedding's
gradient, is summed there alone. Megatron-LM's PyTorch does the same, an `AccumulateGrad` add per
parameter and microbatch. The compiler never compiled these adds, so `--durations xla` refuses a
pipelined step.

Approximate:
- a buffer written by a kernel that also writes a synced one (the compiler fuses the layer
  norms' small gradients with the slices of a combined sync) counts as synced, so it is not summed;
- the optimizer's elementwise work on a gradient alone, before it meets the optimizer state
  (AdamW's g² and (1 - β)·g), runs with every backward; its step-count scalars repeat for every
  chunk;
- a POST node that BWD depends on (none in the bundled models) is not waited for.
"""

from flint.pipelining.compose import PipelinedStep, pipeline_step
from flint.pipelining.piece import one_microbatch, stage_mesh
from flint.pipelining.regions import Regions
from flint.pipelining.schedules import (
    SCHEDULES,
    UNIT_NAME,
    PipelineRequest,
    gpipe,
    interleaved,
    one_f_one_b,
)

__all__ = [
    "SCHEDULES",
    "UNIT_NAME",
    "PipelineRequest",
    "PipelinedStep",
    "Regions",
    "gpipe",
    "interleaved",
    "one_f_one_b",
    "one_microbatch",
    "pipeline_step",
    "stage_mesh",
]

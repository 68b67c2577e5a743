"""The pipelined step: the piece, and the units each stage runs in its schedule's order.

A pipelined trace repeats one forward and one backward of the piece per microbatch on every stage:
thousands of copies on the largest published layouts (64 stages of 512 microbatches). So the step
is held as the piece plus, per stage, a list of units that say what each copies and exchanges;
`flint.emit` writes each stage's file unit by unit from them, never holding the copies.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

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
"""The `op` of the node each unit starts with: it waits for the ends of the stage's previous unit
and for what the unit receives, and the unit's first nodes wait for it."""

PermuteKey = tuple[str, int, int]
"""A transfer between stages: (`FORWARD` or `BACKWARD`, microbatch, the sending virtual stage)."""


@dataclass(frozen=True)
class Transfer:
    """An activation (forward) or a gradient (backward) one stage's ranks send to another's."""

    key: PermuteKey
    source: int
    """The sending stage."""
    target: int
    """The receiving stage."""
    nbytes: int
    tag: int
    """The same on both ends and unique in the step: what pairs the SEND with its RECV."""
    name: str


@dataclass(frozen=True)
class Unit:
    """One unit of a stage: copies of the piece's `regions` (in the piece's order), named `label`.

    `reads` is the unit whose copies this one's data dependencies resolve through (a backward's
    forward, an update's last backward); `stands_in` the region that the received transfer stands
    for (the embedding's output for a forward, the head's backward for a backward); `skip` the
    piece nodes not run in this copy (a backward's gradient syncs), which stand for their own
    inputs; `syncs` the gradient syncs an update runs before its regions (see
    `PipelinedStep.units`); `accumulates` whether a backward adds its weight gradients to those of
    the chunk's earlier microbatches (every backward but the chunk's first)."""

    label: str
    regions: tuple[str, ...]
    receives: Transfer | None = None
    sends: Transfer | None = None
    reads: Work | None = None
    stands_in: str | None = None
    skip: frozenset[int] = frozenset()
    work: Work | None = None
    syncs: tuple[int, ...] = ()
    accumulates: bool = False


@dataclass(frozen=True)
class PipelinedStep:
    """The piece (one microbatch of one chunk of layers on one stage's mesh), its regions, the
    request, and the ranks of every stage: `ranks[stage, q]` runs what the piece's rank q runs."""

    piece: WorkloadGraph
    regions: Regions
    request: PipelineRequest
    ranks: np.ndarray

    @property
    def num_ranks(self) -> int:
        return self.ranks.size

    @property
    def last_virtual(self) -> int:
        return self.request.stages * self.request.virtual_stages - 1

    def virtual(self, stage: int, work: Work) -> int:
        return work.chunk * self.request.stages + stage

    def transfer(self, key: PermuteKey) -> Transfer:
        """The transfer `key` sends: to the next virtual stage for a forward, else the one before."""
        kind, microbatch, v = key
        S, M = self.request.stages, self.request.microbatches
        forward = kind == FORWARD
        target = (v + 1 if forward else v - 1) % S
        nbytes = self.regions.activation_bytes if forward else self.regions.gradient_bytes
        tag = ((0 if forward else M) + microbatch) * (self.last_virtual + 1) + v
        name = f"{'activation' if forward else 'gradient'} of {Work(kind, microbatch, v // S).label}"
        return Transfer(key, v % S, target, nbytes, tag, name)

    def incoming(self, stage: int, work: Work) -> PermuteKey | None:
        """What a unit receives: the activation from the virtual stage before, or the gradient
        from the one after (nothing for the first forward and the last backward)."""
        v = self.virtual(stage, work)
        if work.kind == FORWARD:
            return None if v == 0 else (FORWARD, work.microbatch, v - 1)
        return None if v == self.last_virtual else (BACKWARD, work.microbatch, v + 1)

    def backward_regions(self, v: int) -> tuple[str, ...]:
        return (BWD, GRAD) + ((GRAD_FIRST,) if v == 0 else ()) + ((GRAD_LAST,) if v == self.last_virtual else ())

    def units(self, stage: int) -> Iterator[Unit]:
        """The stage's units in the order it runs them: its schedule, then each chunk's update.

        A chunk's gradients are synced once per step, by its update, before the optimizer reads
        them: after the pipeline has flushed, as Megatron-LM's train step all-reduces them. Left
        in the chunk's last backward, the syncs would hold each stage's communication (and the
        compiler's kernel order) while the input gradient the stage before waits for is still
        being computed, so the pipeline's drain would pay every stage's syncs in turn."""
        M, V = self.request.microbatches, self.request.virtual_stages
        last = self.last_virtual
        syncs = self.regions.gradient_sync
        backward_chunks: set[int] = set()
        for work in schedule(self.request, stage):
            v = self.virtual(stage, work)
            key = self.incoming(stage, work)
            receives = None if key is None else self.transfer(key)
            if work.kind == FORWARD:
                regions = ((PRE,) if v == 0 else ()) + (LOCAL, FWD) + ((MID,) if v == last else ())
                sends = self.transfer((FORWARD, work.microbatch, v)) if v < last else None
                yield Unit(work.label, regions, receives, sends, None, PRE, work=work)
            else:
                sends = self.transfer((BACKWARD, work.microbatch, v)) if v > 0 else None
                yield Unit(work.label, self.backward_regions(v), receives, sends,
                           Work(FORWARD, work.microbatch, work.chunk), MID, syncs, work,
                           accumulates=work.chunk in backward_chunks)
                backward_chunks.add(work.chunk)
        for chunk in range(V):
            v = chunk * self.request.stages + stage
            regions = (POST,) + ((POST_FIRST,) if v == 0 else ()) + ((POST_LAST,) if v == last else ())
            synced = self.backward_regions(v)
            yield Unit(update_label(chunk), regions, reads=Work(BACKWARD, M - 1, chunk),
                       syncs=tuple(sorted(n for n in syncs if self.regions.region_of[n] in synced)))

    @cached_property
    def regions_on(self) -> tuple[frozenset[str], ...]:
        """Per stage, the regions any of its units copies."""
        return tuple(frozenset(r for unit in self.units(stage) for r in unit.regions)
                     for stage in range(self.request.stages))

    def check_schedules(self) -> None:
        """Every stage's units can run: each receives only what another stage has sent by then."""
        S = self.request.stages
        orders = [schedule(self.request, stage) for stage in range(S)]
        done, sent = [0] * S, set()
        while any(done[s] < len(orders[s]) for s in range(S)):
            before = sum(done)
            for s in range(S):
                while done[s] < len(orders[s]):
                    work = orders[s][done[s]]
                    key = self.incoming(s, work)
                    if key is not None and key not in sent:
                        break
                    sent.add((work.kind, work.microbatch, self.virtual(s, work)))
                    done[s] += 1
            if sum(done) == before:
                raise AssertionError(f"the {self.request.schedule} schedule waits on itself")


def pipeline_step(
    piece: WorkloadGraph,
    program: Program,
    layout: Layout,
    request: PipelineRequest,
    mesh: MeshSpec,
    chunk_layers: int,
) -> PipelinedStep:
    """The pipelined step of the whole mesh from the compiled piece of `chunk_layers` layers.
    The entry function takes the inputs in the layout's order unless the compiler dropped unused
    ones; then which arguments are the batch is not known."""
    batch = None
    if len(program.body.arguments) == len(layout.inputs):
        batch = frozenset(i for i, item in enumerate(layout.inputs) if item.batch)
    regions = find_regions(piece, program, chunk_layers, batch)
    step = PipelinedStep(piece, regions, request, stage_ranks(mesh, request.stage_axis(mesh)))
    step.check_schedules()
    return step

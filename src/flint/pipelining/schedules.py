"""The request and the schedules: which unit each stage runs, in what order."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from flint.errors import FlintError
from flint.mesh import MeshSpec

SCHEDULES = ("gpipe", "1f1b", "interleaved")
STAGE_AXES = ("pp", "stage")
FORWARD, BACKWARD = "F", "B"
UNIT_NAME = re.compile(r"^((?:[FB]\d+|U)\.\d+) ")
"""A pipelined node's name starts with its unit's label: `F3.0` (the forward of microbatch 3 on
chunk 0), `B3.0` (its backward), `U.0` (chunk 0's per-step update); group 1 is the label."""


class Work(NamedTuple):
    """One unit of a stage's schedule: the forward or backward of one microbatch on one chunk."""

    kind: str
    microbatch: int
    chunk: int

    @property
    def label(self) -> str:
        return f"{self.kind}{self.microbatch}.{self.chunk}"


def update_label(chunk: int) -> str:
    """The label of a chunk's per-step update unit."""
    return f"U.{chunk}"


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

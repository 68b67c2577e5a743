"""Write every rank's file, several ranks at a time.

Rendering a rank from its class's template is a few list appends (it holds the GIL); opening and
writing the file is kernel work (it does not), and that is where the time goes. Threads overlap the
writes of one process; forked processes would also overlap rendering, but measured here they were not
faster (the disk, or the kernel's copying, is the bottleneck) and forking a process that runs JAX's
threads risks deadlocks. Which thread writes a file does not change its bytes.

Ranks are written class by class; the templates `trace_bytes` built to measure the files are kept up to
`KEPT_TEMPLATE_BYTES` in all, and any others are built again one at a time, whatever the rank count.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from flint.emit.chakra import ChakraEmitter
from flint.emit.template import RankTemplate

CHUNK = 256
"""Ranks per task: enough to amortise a task's overhead, few enough for a live progress bar."""


def _write_chunk(template: RankTemplate, directory: Path, prefix: str, ranks: Sequence[int]) -> int:
    """Render and write `ranks` (all of the template's class); the bytes written."""
    written = 0
    for rank in ranks:
        data = b"".join(template.render(rank))
        with open(directory / f"{prefix}.{rank}.et", "wb") as handle:
            handle.write(data)
        written += len(data)
    return written


KEPT_TEMPLATE_BYTES = 2**32
"""Templates measured before writing are kept for writing up to this many bytes in all (a class's
template is about one rank's file); beyond it they are built again, one at a time. A pipelined
trace of 64 stages and 512 microbatches has about 2 GB of them, which building twice would
cost minutes."""


@dataclass(frozen=True)
class TraceSize:
    """How many bytes the rank files take: every rank's, and one per class's (each class's first
    rank, what `--rank-files classes` writes). Measured from the rendered files; where only the
    classes' files were rendered, every rank's is their size times the class's rank count."""

    every_rank: int
    one_per_class: int


def trace_bytes(
    emitter: ChakraEmitter, kept: dict[int, RankTemplate] | None = None, one_per_class: bool = False
) -> TraceSize:
    """The bytes the rank files will take, rendered class by class without being written: said
    before writing and checked against the free disk space, since a pipelined trace of a thousand
    ranks runs to tens of gigabytes. Templates go into `kept` (for `write_ranks`) while they fit in
    `KEPT_TEMPLATE_BYTES`. With `one_per_class`, only each class's first rank is rendered."""
    every = firsts = held = 0
    for cls in range(len(emitter.classes.roles)):
        template = emitter.template(cls)
        ranks = emitter.classes.ranks(cls).tolist()
        first = sum(map(len, template.render(ranks[0])))
        firsts += first
        if one_per_class:
            every += first * len(ranks)
        else:
            every += first + sum(sum(map(len, template.render(rank))) for rank in ranks[1:])
        if kept is not None and held + first <= KEPT_TEMPLATE_BYTES:
            kept[cls] = template
            held += first
    return TraceSize(every, firsts)


def write_ranks(
    emitter: ChakraEmitter,
    directory: Path,
    prefix: str,
    progress: Callable[[int], None] | None = None,
    workers: int | None = None,
    kept: dict[int, RankTemplate] | None = None,
    one_per_class: bool = False,
) -> int:
    """Write `<prefix>.<rank>.et` for every rank (with `one_per_class`, for each class's first
    rank) into `directory`; the bytes written.

    `progress(done)` is called with the number of files written so far; `kept` holds templates
    already built (`trace_bytes`), which are used and let go.
    """
    kept = kept if kept is not None else {}
    workers = workers or len(os.sched_getaffinity(0))
    classes = emitter.classes
    done = written = 0
    with ThreadPoolExecutor(workers, thread_name_prefix="flint-emit") as pool:
        for cls in range(len(classes.roles)):
            template = kept.pop(cls, None) or emitter.template(cls)
            ranks = classes.ranks(cls).tolist()[: 1 if one_per_class else None]
            chunks = [ranks[start : start + CHUNK] for start in range(0, len(ranks), CHUNK)]
            futures = [
                pool.submit(_write_chunk, template, directory, prefix, chunk) for chunk in chunks
            ]
            for chunk, future in zip(chunks, futures):
                written += future.result()
                done += len(chunk)
                if progress:
                    progress(done)
    return written

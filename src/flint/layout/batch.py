"""Which step arguments hold the batch: the rows the presets split over the data axes and
`--pipeline-stages` cuts into microbatches.

A model file may say so itself, as it names donated arguments: a module-level
`batch_argnums = (2, 3)` (positions of the step's arguments). Without it the batch is the last
argument and, going back from it, every argument that is laid out like it: each of its arrays has
the batch's rows first and is either integer (token ids, labels) or split along those rows as the
model splits the last argument's. So `step(params, opt, tokens, targets)` has tokens and targets as
its batch, and `step(params, opt, batch)` the whole pytree `batch`.

Where that cannot tell (an argument with the batch's rows that is neither integer nor split like
it could be a weight [B, D] as well as a batch [B, D]; the batch's arrays do not share one number
of rows), the layout keeps the last argument alone and records why: pipelining, which must cut
every batch input alike, then stops with that line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BATCH_ARGNUMS = "batch_argnums"
"""The model file's declaration of its batch arguments (`flint.frontend.model_file`)."""


@dataclass(frozen=True)
class Argument:
    """One step argument as the batch search sees it: its name and its arrays' (shape, dtype,
    the model's split of the first dimension)."""

    name: str
    arrays: Sequence[tuple[tuple[int, ...], np.dtype, tuple[str, ...]]]

    def rows(self) -> set[int]:
        return {shape[0] for shape, _, _ in self.arrays if shape}

    def described(self) -> str:
        shape, dtype, _ = self.arrays[0]
        more = f" and {len(self.arrays) - 1} more arrays" if len(self.arrays) > 1 else ""
        return f"'{self.name}' ({dtype}{list(shape)}{more})"


@dataclass(frozen=True)
class BatchArguments:
    """The positions of the step's batch arguments, and why Flint is unsure of them (None: sure)."""

    positions: frozenset[int]
    doubt: str | None = None


def _declare(positions: Sequence[int]) -> str:
    return f"declare them in the model file, e.g. {BATCH_ARGNUMS} = {tuple(positions)!r}"


def find_batch(arguments: Sequence[Argument], declared: tuple[int, ...] | None) -> BatchArguments:
    """The batch arguments: the model's declaration, else the last argument and those before it
    laid out like it (module docstring)."""
    last = len(arguments) - 1
    if declared is not None:
        positions = frozenset(declared)
        return BatchArguments(positions, _mixed_rows(arguments, sorted(positions)))
    if last < 0:
        return BatchArguments(frozenset())
    positions = [last]
    doubt = _mixed_rows(arguments, positions)
    if doubt:
        return BatchArguments(frozenset(positions), doubt)
    (rows,) = arguments[last].rows() or {None}
    split = {first for shape, _, first in arguments[last].arrays if shape}
    for k in range(last - 1, -1, -1):
        arrays = arguments[k].arrays
        if rows is None or not arrays or any(not shape or shape[0] != rows for shape, _, _ in arrays):
            break
        integer = all(np.issubdtype(dtype, np.integer) for _, dtype, _ in arrays)
        same_split = split != {()} and all(first in split for _, _, first in arrays)
        if not (integer or same_split):
            return BatchArguments(
                frozenset(positions),
                f"step argument {arguments[k].described()} has the batch's {rows} rows but Flint "
                f"cannot tell whether it is batch or parameters: "
                f"{_declare([k, *positions])} (the step arguments that hold the batch)",
            )
        positions.insert(0, k)
    return BatchArguments(frozenset(positions))


def _mixed_rows(arguments: Sequence[Argument], positions: Sequence[int]) -> str | None:
    """Why the batch arguments' arrays do not share one number of rows, or None where they do."""
    rows = {k: arguments[k].rows() for k in positions if arguments[k].rows()}
    if len(set().union(*rows.values())) <= 1:
        return None
    listed = ", ".join(f"{arguments[k].name}: {sorted(r)}" for k, r in rows.items())
    return (
        f"the batch arguments' arrays do not share one number of rows ({listed}), so Flint cannot "
        f"tell which hold the batch's: pass the others as separate step arguments and "
        f"{_declare(positions)} (the step arguments that hold the batch)"
    )

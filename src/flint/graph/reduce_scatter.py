"""All-reduces that are reduce-scatters: every rank keeps only its own piece of the sum.

XLA's SPMD partitioner writes a reduce-scatter (FSDP gradients, sequence-parallel activations) as an
all-reduce followed by a `dynamic_slice` whose offset is computed from the partition id. The GPU and
TPU pipelines then fuse the pair into a reduce-scatter (XLA's reduce-scatter creator), which moves
half the bytes of a ring all-reduce; the CPU pipeline never does. Traces are for the real machine,
so Flint makes the same fusion, but only where the partition-id arithmetic proves it:

- the slice is the all-reduce's only use, in the same region (possibly through copies, which the
  fused op does not make);
- it cuts exactly one dimension into group-size pieces and keeps the others whole;
- evaluated for every rank, its offsets give the ranks of each group distinct pieces.

The offsets are evaluated for all ranks at once (a vector per value) over the handful of integer ops
XLA uses for them: constants, `partition_id`, table lookups, reshapes, converts and arithmetic.
Anything else leaves the pair as it is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from flint.graph.collectives import Groups, resolve_groups
from flint.ir.folding import ARITHMETIC
from flint.ir.parse import Op, Region


def _uses(region: Region) -> Counter[int]:
    """How often each value is used in `region`, nested regions and results included."""
    counts: Counter[int] = Counter(region.results)

    def visit(ops) -> None:
        for op in ops:
            counts.update(op.operands)
            for inner in op.regions:
                counts.update(inner.results)
                visit(inner.ops)

    visit(region.ops)
    return counts


class _PartitionArithmetic:
    """Integer scalars of one region as vectors over ranks (None where not computable)."""

    def __init__(self, region: Region, num_ranks: int):
        self.defs = {value: op for op in region.ops for value in op.results}
        self.ranks = np.arange(num_ranks, dtype=np.int64)
        self.memo: dict[int, np.ndarray | None] = {}

    def scalar(self, value: int) -> np.ndarray | None:
        if value not in self.memo:
            self.memo[value] = self._evaluate(value)
        return self.memo[value]

    def _evaluate(self, value: int) -> np.ndarray | None:
        op = self.defs.get(value)
        if op is None or len(op.results) != 1 or op.result_types[0].elements != 1:
            return None
        if op.opcode == "constant":
            known = op.attrs.get("value", op.attrs.get("array"))
            return None if known is None else np.full(len(self.ranks), int(np.ravel(known)[0]))
        if op.opcode == "partition_id":
            return self.ranks
        if op.opcode in ("reshape", "convert", "bitcast_convert"):
            return self.scalar(op.operands[0])
        if op.opcode == "dynamic_slice" and len(op.operands) == 2:
            table = self.defs.get(op.operands[0])
            index = self.scalar(op.operands[1])
            if table is None or "array" not in table.attrs or index is None:
                return None
            entries = np.ravel(table.attrs["array"]).astype(np.int64)
            return entries[np.clip(index, 0, len(entries) - 1)]
        if op.opcode == "subtract" and op.operands[0] == op.operands[1]:
            return np.zeros_like(self.ranks)
        if op.opcode in ARITHMETIC and len(op.operands) == 2:
            lhs, rhs = (self.scalar(v) for v in op.operands)
            if lhs is None or rhs is None:
                return None
            return ARITHMETIC[op.opcode](lhs, rhs)
        return None


def _takes_distinct_pieces(slice_op: Op, arithmetic: _PartitionArithmetic, groups: Groups) -> bool:
    full, piece = slice_op.operand_types[0].shape, slice_op.result_types[0].shape
    group_size = len(groups[0])
    cut = [d for d, (f, p) in enumerate(zip(full, piece)) if f != p]
    if len(cut) != 1 or piece[cut[0]] * group_size != full[cut[0]]:
        return False
    offsets = [arithmetic.scalar(v) for v in slice_op.operands[1:]]
    if any(o is None for o in offsets):
        return False
    if any(np.any(offsets[d] != 0) for d in range(len(full)) if d != cut[0]):
        return False
    pieces = offsets[cut[0]]
    if np.any(pieces % piece[cut[0]]):
        return False
    for group in groups:
        if sorted(pieces[list(group)] // piece[cut[0]]) != list(range(group_size)):
            return False
    return True


@dataclass(frozen=True)
class ReduceScatter:
    """An all-reduce, the copies of its sum and the slice that together are one reduce-scatter."""

    reduce: Op
    copies: tuple[Op, ...]
    piece: Op


def reduce_scatters(region: Region, num_ranks: int) -> Iterator[ReduceScatter]:
    """The all-reduces of `region` that are reduce-scatters."""
    uses = _uses(region)
    users = {op.operands[0]: op for op in region.ops if op.opcode in ("copy", "dynamic_slice")}
    arithmetic = _PartitionArithmetic(region, num_ranks)
    for op in region.ops:
        if op.opcode != "all_reduce" or len(op.results) != 1:
            continue
        copies, user = [], op
        while uses[user.results[0]] == 1 and (user := users.get(user.results[0])) is not None:
            if user.opcode == "dynamic_slice":
                if _takes_distinct_pieces(user, arithmetic, resolve_groups(op, num_ranks)):
                    yield ReduceScatter(op, tuple(copies), user)
                break
            copies.append(user)

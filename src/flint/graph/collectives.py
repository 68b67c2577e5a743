"""Who takes part in a collective, and how many bytes it moves, from the compiler's own attributes.

JAX programs run with one replica and N partitions, so a rank is a partition id (the row-major position
in the mesh). Replica groups are read the way XLA defines them for that case:

- `use_global_device_ids` (flattened ids) or a channel without it (cross-partition): the ids in the
  groups are partition ids, i.e. ranks;
- no channel (cross-replica): the ids are replica ids; with one replica every group is a single rank
  and the collective moves nothing;
- no groups at all means one group of every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flint.ir.parse import Op

Groups = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class CollectiveInfo:
    """A collective resolved to explicit rank groups, with `comm_bytes` in Chakra's convention."""

    kind: str
    comm_bytes: int
    groups: Groups

    @property
    def group_size(self) -> int:
        return len(self.groups[0])


def resolve_groups(op: Op, num_ranks: int) -> Groups:
    """Explicit rank lists of `op`'s replica groups (see the module docstring for the id spaces)."""
    groups = op.attrs.get("replica_groups")
    if groups is None or groups.size == 0:
        return (tuple(range(num_ranks)),)
    if "channel_id" not in op.attrs and not op.attrs.get("use_global_device_ids"):
        return tuple((rank,) for rank in range(num_ranks))
    groups = np.asarray(groups).reshape(groups.shape[0], -1)
    return tuple(tuple(int(r) for r in row if r >= 0) for row in groups)


def comm_bytes(op: Op) -> int:
    """Bytes as ASTRA-sim reads `comm_size`.

    The full buffer for all-reduce (all operands of a variadic one) and reduce-scatter (its input); the
    per-rank input for all-gather and all-to-all. A ragged all-to-all sends as many rows of its input
    as its size operands say, which are data: its whole input is the most it can send.
    """
    if op.opcode == "ragged_all_to_all":
        return op.operand_types[0].nbytes
    return sum(t.nbytes for t in op.operand_types)


def describe(op: Op, num_ranks: int) -> CollectiveInfo:
    return CollectiveInfo(kind=op.opcode, comm_bytes=comm_bytes(op), groups=resolve_groups(op, num_ranks))

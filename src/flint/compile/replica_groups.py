"""Mesh-axes replica groups, resolved to explicit device-id lists.

Besides explicit lists, XLA may write a collective's groups as axes of a mesh declared in the module
(`sdy.mesh @mesh = <["axis_0"=8, "axis_2"=8]>` and `replica_groups = mesh_axes<@mesh, [axis_0]>`):
one group per combination of the *other* axes, its members running over the named axes. A named
sub-axis `"x":(p)k` is the middle factor when axis x of size n is viewed as [p, k, n/(p*k)].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ModuleMesh:
    """A mesh declared in the module: axis names and sizes, and the device ids in row-major order."""

    axes: tuple[tuple[str, int], ...]
    device_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class AxisRef:
    """A mesh axis named by a collective, or the sub-axis `(pre_size)size` of it."""

    name: str
    sub_axis: tuple[int, int] | None = None


def mesh_axes_groups(mesh: ModuleMesh, refs: tuple[AxisRef, ...]) -> np.ndarray:
    """`[groups, group_size]` device ids of the groups spanned by `refs` over `mesh`."""
    sizes = [size for _, size in mesh.axes]
    total = int(np.prod(sizes, dtype=np.int64))
    ids = np.arange(total) if mesh.device_ids is None else np.asarray(mesh.device_ids)
    by_axis = {ref.name: ref for ref in refs}
    split_sizes: list[int] = []
    member_dims: dict[str, int] = {}
    for name, size in mesh.axes:
        ref = by_axis.get(name)
        if ref is None:
            split_sizes.append(size)
        elif ref.sub_axis is None:
            member_dims[name] = len(split_sizes)
            split_sizes.append(size)
        else:
            pre, sub = ref.sub_axis
            split_sizes.append(pre)
            member_dims[name] = len(split_sizes)
            split_sizes += [sub, size // (pre * sub)]
    grid = ids.reshape(split_sizes)
    members = [member_dims[ref.name] for ref in refs]
    others = [d for d in range(grid.ndim) if d not in members]
    group_size = int(np.prod([split_sizes[d] for d in members], dtype=np.int64))
    return grid.transpose(others + members).reshape(-1, group_size)

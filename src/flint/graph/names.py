"""Node names a person can read: what a node is and where it came from, the same on every run.

- A kernel or op is named by its opcode (a fusion by its kernel kind, `gemm`) and the model's
  source line the compiler kept for it: `dot_general gpt.py:137`. Where the compiler kept none
  (ops XLA made up), by its opcode and its location's name: `copy params['layers']['wq']`.
- A collective by its kind, the mesh axes its groups span with their size, and the bytes it moves
  (`comm_size`): `all_reduce tensor/2 4.0 MiB`, `all_gather data+tensor/8 512.0 KiB`; groups that
  are not whole sub-meshes of some axes show their size alone (`all_reduce /6 12 B`). A permute by
  the axes its pairs step along: `collective_permute pp 256.0 KiB`.

The JAX op path a node came from (`jit(step)/jvp(jit(_take))/gather`) stays with the node as
`source_op`, and its source line as `source`. Names depend only on the compiled program and the
mesh, so reruns give byte-identical traces.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from flint.mesh import MeshSpec

_UNITS = ("KiB", "MiB", "GiB", "TiB")


def size_text(nbytes: int) -> str:
    """Bytes in binary units with one decimal: `12 B`, `4.0 MiB`."""
    if nbytes < 1024:
        return f"{nbytes} B"
    value = float(nbytes)
    for unit in _UNITS:
        value /= 1024
        if round(value, 1) < 1024 or unit == _UNITS[-1]:
            break
    return f"{value:.1f} {unit}"


def _varying(groups: np.ndarray, mesh: MeshSpec) -> np.ndarray:
    """`[groups, axes]`: whether the ranks of each group (a row of row-major positions) differ
    along each mesh axis. One array operation for all groups: a trace of 131,072 ranks has
    collectives over 16,384 groups."""
    coords = np.stack(np.unravel_index(groups, mesh.shape), axis=-1)
    return (coords != coords[:, :1]).any(axis=1)


def _varying_axes(group: Sequence[int], mesh: MeshSpec) -> tuple[int, ...]:
    """The mesh axes along which the ranks of `group` differ."""
    return tuple(int(a) for a in np.flatnonzero(_varying(np.asarray([group]), mesh)[0]))


def _axes_text(axes: tuple[int, ...], mesh: MeshSpec) -> str:
    return "+".join(mesh.axis_names[a] for a in axes)


def group_axes(groups: Sequence[Sequence[int]], mesh: MeshSpec | None) -> str:
    """The mesh axes every group spans whole (`tensor`, `data+tensor`), or '' where the groups are
    not the sub-meshes of one set of axes (or the mesh is not known)."""
    if mesh is None or not groups or len({len(group) for group in groups}) != 1:
        return ""  # groups of different sizes are not the sub-meshes of one set of axes
    varying = _varying(np.asarray(groups), mesh)
    if (varying != varying[0]).any():
        return ""
    axes = tuple(int(a) for a in np.flatnonzero(varying[0]))
    whole = len(groups[0]) == math.prod(mesh.shape[a] for a in axes)
    return _axes_text(axes, mesh) if whole else ""


def pair_axes(pairs: Sequence[tuple[int, int]], mesh: MeshSpec | None) -> str:
    """The mesh axes along which a permute's source-target pairs step."""
    if mesh is None:
        return ""
    return _axes_text(tuple(sorted({a for pair in pairs for a in _varying_axes(pair, mesh)})), mesh)


def op_name(opcode: str, location_name: str, source: str) -> str:
    """A kernel's or op's name: `dot_general gpt.py:137`, else `copy params['layers']['wq']`."""
    where = source or location_name
    return opcode if where == opcode else f"{opcode} {where}"


def collective_name(data: Mapping, mesh: MeshSpec | None) -> str:
    """A collective node's name from its kind, groups (or pairs) and `comm_bytes`."""
    size = size_text(data["comm_bytes"])
    if "pairs" in data:
        return " ".join(filter(None, (data["collective"], pair_axes(data["pairs"], mesh), size)))
    groups = data["groups"]
    return f"{data['collective']} {group_axes(groups, mesh)}/{len(groups[0])} {size}"

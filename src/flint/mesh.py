"""The `--mesh` grammar, and the roles a mesh's axis names give its axes.

A mesh is written either positionally (`8x8`, `2x4x8`), taking documented default axis names, or with
names (`data=16,tensor=8`). The result is a plain description; `flint.compile.backend` turns it into
devices. Every stage speaks of meshes, so this module sits below them all, beside `flint.sharding`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from flint.errors import FlintError

TENSOR_AXIS_NAMES = ("tensor", "tp", "model")
EXPERT_AXIS_NAMES = ("expert", "ep")
CONTEXT_AXIS_NAMES = ("context", "cp")

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SIZE = re.compile(r"^[0-9]+$")


def default_axis_names(ndim: int) -> tuple[str, ...]:
    """Names for a positional mesh: `data` first, `tensor` last, `axis<i>` in between.

    A 1-D mesh is pure data parallelism (`data`); a 2-D mesh is `data` x `tensor`, the Megatron layout.
    """
    if ndim == 1:
        return ("data",)
    return ("data", *(f"axis{i}" for i in range(1, ndim - 1)), "tensor")


@dataclass(frozen=True)
class MeshSpec:
    """Axis names and sizes of the virtual device mesh, row-major over ranks."""

    shape: tuple[int, ...]
    axis_names: tuple[str, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __str__(self) -> str:
        return ",".join(f"{n}={s}" for n, s in zip(self.axis_names, self.shape))


def _parse_size(text: str, spec: str, option: str) -> int:
    if not _SIZE.match(text) or int(text) < 1:
        raise FlintError(
            f"invalid {option} {spec!r}: axis size {text!r} is not a positive integer "
            "(write e.g. 8x8 or data=8,tensor=8)"
        )
    return int(text)


def parse_mesh(spec: str, option: str = "--mesh") -> MeshSpec:
    """Parse `8x8`, `2x4x8` or `data=16,tensor=8` into a `MeshSpec`; `option` is where the user wrote
    it, for the error."""
    text = spec.strip()
    if not text:
        raise FlintError(f"invalid {option} '': give axis sizes such as 8x8 or data=8,tensor=8")
    if "=" in text:
        names, sizes = [], []
        for part in text.split(","):
            name, eq, size = part.partition("=")
            name = name.strip()
            if not eq or not _NAME.match(name):
                raise FlintError(
                    f"invalid {option} {spec!r}: {part!r} is not NAME=SIZE (write e.g. data=8,tensor=8)"
                )
            if name in names:
                raise FlintError(f"invalid {option} {spec!r}: axis {name!r} is named twice")
            names.append(name)
            sizes.append(_parse_size(size.strip(), spec, option))
        return MeshSpec(tuple(sizes), tuple(names))
    sizes = tuple(_parse_size(part.strip(), spec, option) for part in text.lower().split("x"))
    return MeshSpec(sizes, default_axis_names(len(sizes)))


def axis_named(names: tuple[str, ...], wanted: tuple[str, ...], default: str) -> str:
    """The first of a mesh's axis `names` that is one of `wanted`, else `default`."""
    return next((n for n in names if n in wanted), default)


def tensor_axis(names: tuple[str, ...]) -> str:
    """The tensor axis of a mesh: the one named `tensor`, `tp` or `model`, else the last."""
    return axis_named(names, TENSOR_AXIS_NAMES, names[-1])


def ways(mesh, axes: tuple[str, ...]) -> int:
    """How many pieces splitting over the mesh axes `axes` makes."""
    return math.prod(mesh.shape[axis] for axis in axes)

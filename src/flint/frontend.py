"""Stage 1: load the user's model file into a step function and its abstract inputs.

A model file is ordinary Python that imports JAX and defines::

    def workload(mesh: jax.sharding.Mesh) -> tuple[Callable, tuple]:
        return step, (params, batch)

`step` is the function to extract (a training or inference step) and the tuple holds its positional
arguments as pytrees of `jax.ShapeDtypeStruct` carrying `NamedSharding`s over `mesh`. Nothing is
allocated: shapes and shardings are all the compiler needs, so a 70B-parameter step fits anywhere.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flint.errors import FlintError

ENTRY_POINT = "workload"


@dataclass(frozen=True)
class Workload:
    """What the model file describes, ready to be lowered."""

    name: str
    path: Path
    step: Callable[..., Any]
    args: tuple[Any, ...]


def _where(exc: BaseException, path: Path) -> str:
    """`model.py:12` for the deepest frame inside the model file, so the user knows where to look."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    return f"{path.name}:{frames[-1].lineno}" if frames else path.name


def _import(path: Path):
    if not path.is_file():
        raise FlintError(f"model file {str(path)!r} not found: give the path of a Python file")
    if path.suffix != ".py":
        raise FlintError(f"model file {str(path)!r} is not a Python file (.py): give the model's .py file")
    module_name = f"flint_model_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise FlintError(
            f"model file {path.name} is not valid Python: {exc.msg} at line {exc.lineno}"
        ) from exc
    except Exception as exc:
        raise FlintError(
            f"model file {path.name} raised {type(exc).__name__} on import at {_where(exc, path)}: "
            f"{exc}"
        ) from exc
    finally:
        sys.path.remove(str(path.parent))
    return module


def _check_inputs(args: tuple[Any, ...], path: Path, mesh) -> None:
    """Reject real arrays and shardings that do not divide, naming the offending input."""
    import jax
    from jax.sharding import NamedSharding

    for keypath, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
        name = "args" + jax.tree_util.keystr(keypath)
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            raise FlintError(
                f"{path.name}: input {name} is a {type(leaf).__name__}, not a jax.ShapeDtypeStruct: "
                "describe inputs by shape, dtype and sharding (no real arrays)"
            )
        sharding = leaf.sharding
        if not isinstance(sharding, NamedSharding):
            continue
        for dim, entry in enumerate(sharding.spec):
            axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
            for axis in axes:
                if axis not in mesh.shape:
                    raise FlintError(
                        f"{path.name}: input {name} is sharded over axis {axis!r}, which the mesh "
                        f"does not have (axes: {', '.join(mesh.axis_names)})"
                    )
            ways = 1
            for axis in axes:
                ways *= mesh.shape[axis]
            if dim >= len(leaf.shape):
                raise FlintError(
                    f"{path.name}: input {name} has rank {len(leaf.shape)} but its sharding names "
                    f"dimension {dim}: shorten the PartitionSpec"
                )
            if leaf.shape[dim] % ways:
                raise FlintError(
                    f"{path.name}: input {name} dimension {dim} (size {leaf.shape[dim]}) does not "
                    f"divide over mesh axis {'x'.join(axes)} ({ways} ways): change the size or sharding"
                )


def load_workload(path: Path, mesh) -> Workload:
    """Run the model file and call its `workload(mesh)`."""
    path = Path(path).resolve()
    module = _import(path)
    entry = getattr(module, ENTRY_POINT, None)
    if not callable(entry):
        raise FlintError(
            f"model file {path.name} defines no {ENTRY_POINT}(mesh) function: add one returning "
            "(step, args) with args as jax.ShapeDtypeStructs (see examples/mlp.py)"
        )
    try:
        result = entry(mesh)
    except Exception as exc:
        raise FlintError(
            f"{path.name}: {ENTRY_POINT}(mesh) raised {type(exc).__name__} at {_where(exc, path)}: {exc}"
        ) from exc
    if not (isinstance(result, tuple) and len(result) == 2 and callable(result[0])):
        raise FlintError(
            f"{path.name}: {ENTRY_POINT}(mesh) must return (step, args), got {type(result).__name__}"
        )
    step, args = result
    args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
    _check_inputs(args, path, mesh)
    return Workload(name=path.stem, path=path, step=step, args=args)

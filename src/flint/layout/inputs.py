"""The inputs of a workload by path, with the sharding each has so far and where it came from."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flint.frontend import Workload, input_path
import flint.layout.flax_names as flax_names
from flint.layout.batch import Argument, BatchArguments, find_batch
from flint.layout.request import Spec
from flint.sharding import LogicalArray, LogicalRules, axes_of, resolve


@dataclass(frozen=True)
class InputLayout:
    """The final sharding of one input, and which source decided it."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    spec: Spec
    origin: str
    batch: bool = False


@dataclass(frozen=True)
class Layout:
    """The layout the step is lowered with: every input's sharding and the logical rules."""

    inputs: tuple[InputLayout, ...]
    rules: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    batch_doubt: str | None = None
    """Why Flint cannot tell which step arguments hold the batch (`flint.layout.batch`); None
    where it can. Pipelining, which cuts every batch input, stops with it."""


@dataclass
class Input:
    """One input leaf while the layout is decided: its path, shape, sharding and origin."""

    path: str
    shape: tuple[int, ...]
    dtype: Any
    spec: Spec
    origin: str
    in_batch: bool
    leaf: Any


def listing(paths: list[str], shown: int = 4) -> str:
    """Input paths for a one-line message: the first few, then how many more."""
    more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
    return ", ".join(paths[:shown]) + more


def argument_names(step, count: int) -> list[str]:
    """The names of the step's first `count` positional arguments (`argN` where it has none)."""
    try:
        parameters = [
            p.name
            for p in inspect.signature(step).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        parameters = []
    return [parameters[i] if i < len(parameters) else f"arg{i}" for i in range(count)]


def _sharding_spec(array, rank: int) -> Spec:
    """The spec of an abstract array's own NamedSharding, one entry per dimension (unsplit: none)."""
    spec = tuple(axes_of(e) for e in array.sharding.spec) if placed_by_model(array) else ()
    return spec + ((),) * (rank - len(spec))


def placed_by_model(array) -> bool:
    """Whether the model gave this abstract array a NamedSharding of its own."""
    from jax.sharding import NamedSharding

    return isinstance(getattr(array, "sharding", None), NamedSharding)


def logical_names(leaf) -> set[str]:
    """The logical names a rule can lay an input leaf out by (Flint's `logical`, a Flax box)."""
    if isinstance(leaf, LogicalArray):
        return {name for name in leaf.names if name is not None}
    return flax_names.logical_names(leaf) if flax_names.is_box(leaf) else set()


def model_spec(leaf, rules: LogicalRules, mesh_axes) -> Spec:
    """What the model gives: its NamedSharding, or its logical names under `rules`. A Flint
    `logical` name without a rule is unsplit; a Flax box's dimension whose name has no rule keeps
    the sharding of the array inside the box (see `flint.layout.flax_names`)."""
    if isinstance(leaf, LogicalArray):
        return tuple(axes_of(e) for e in resolve(leaf.names, rules, None))
    if not flax_names.is_box(leaf):
        return _sharding_spec(leaf, 0)
    array = flax_names.array_of(leaf)
    own = _sharding_spec(array, len(array.shape))
    named = flax_names.named_spec(leaf, rules, mesh_axes)
    return tuple(
        own[d] if d >= len(named) or named[d] is None else named[d] for d in range(len(array.shape))
    )


def is_input_leaf(x) -> bool:
    """Where flattening the step's arguments stops above their arrays: a Flint `logical` array, a
    Flax box (one input each)."""
    return isinstance(x, LogicalArray) or flax_names.is_box(x)


def read_inputs(workload: Workload, mesh_axes) -> tuple[list[Input], Any, BatchArguments]:
    """Every input leaf with its path and the sharding the model gives it (logical names unsplit
    until the rules are known), and the step arguments that hold the batch. A Flax box is one
    input, named by its own path."""
    import jax

    names = argument_names(workload.step, len(workload.args))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(workload.args, is_leaf=is_input_leaf)
    inputs, argument_of = [], []
    for keypath, leaf in leaves:
        array = flax_names.array_of(leaf) if flax_names.is_box(leaf) else leaf
        inputs.append(
            Input(
                input_path(names, keypath),
                tuple(array.shape),
                np.dtype(array.dtype),
                model_spec(leaf, {}, mesh_axes),
                "model",
                False,
                leaf,
            )
        )
        argument_of.append(keypath[0].idx)
    arguments = [
        Argument(
            name,
            [(i.shape, i.dtype, i.spec[0] if i.spec else ()) for i, k in zip(inputs, argument_of) if k == a],
        )
        for a, name in enumerate(names)
    ]
    batch = find_batch(arguments, workload.batch)
    for item, k in zip(inputs, argument_of):
        item.in_batch = k in batch.positions
    return inputs, treedef, batch

"""The inputs of a workload by path, with the sharding each has so far and where it came from."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flint.frontend import Workload, input_path
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


def _argument_names(step, count: int) -> list[str]:
    try:
        parameters = [
            p.name
            for p in inspect.signature(step).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        parameters = []
    return [parameters[i] if i < len(parameters) else f"arg{i}" for i in range(count)]


def model_spec(leaf, rules: LogicalRules) -> Spec:
    """What the model gives: its NamedSharding, or its logical names under `rules` (unsplit
    where a name has no rule)."""
    from jax.sharding import NamedSharding

    if isinstance(leaf, LogicalArray):
        return tuple(axes_of(e) for e in resolve(leaf.names, rules, None))
    if not isinstance(leaf.sharding, NamedSharding):
        return ()
    return tuple(axes_of(e) for e in leaf.sharding.spec)


def read_inputs(workload: Workload) -> tuple[list[Input], Any]:
    """Every input leaf with its path and the sharding the model gives it (logical names unsplit
    until the rules are known)."""
    import jax

    names = _argument_names(workload.step, len(workload.args))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(
        workload.args, is_leaf=lambda x: isinstance(x, LogicalArray)
    )
    inputs = []
    for keypath, leaf in leaves:
        inputs.append(
            Input(
                input_path(names, keypath),
                tuple(leaf.shape),
                np.dtype(leaf.dtype),
                model_spec(leaf, {}),
                "model",
                keypath[0].idx == len(workload.args) - 1,
                leaf,
            )
        )
    return inputs, treedef

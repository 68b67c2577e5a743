"""Which step arguments the compile donates, as a real training step does.

A training step returns new parameters and optimizer state in place of the ones it was given, and
the program that runs it donates them (`jax.jit(step, donate_argnums=...)`): each new value may then
reuse the buffer of the old one, so a rank holds one copy of its training state, not two. Flint
compiles the step the same way. By default an argument is donated where an output replaces it:
a top-level output (the step's result, or one element of the tuple it returns) with the argument's
tree structure and the shape and dtype of every leaf, each output replacing one argument at most.
Arguments of scalars only (a step count, a learning rate) are left alone: any scalar loss would
match them. XLA then aliases each donated buffer to an output of the same per-rank shape, which
is what `alias_size_in_bytes` of the compiled executable counts.

A model file may say what it donates instead (`donate_argnums`, see `flint.frontend.model_file`),
and `--no-donate` donates nothing.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def donated_arguments(workload, donate: bool = True) -> tuple[int, ...]:
    """The positions of the arguments to donate: none without `donate`, else the model's own
    declaration where it has one, else the arguments an output replaces. Call under the mesh."""
    if not donate:
        return ()
    if workload.donate is not None:
        return tuple(workload.donate)
    return replaced_arguments(workload.step, workload.args)


def _signature(tree) -> tuple[Any, tuple[tuple[tuple[int, ...], np.dtype], ...]]:
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple((tuple(leaf.shape), np.dtype(leaf.dtype)) for leaf in leaves)


def replaced_arguments(step, args: tuple[Any, ...]) -> tuple[int, ...]:
    """The positions of the arguments of `step` that one of its top-level outputs replaces."""
    return tuple(replacements(step, args))


def replacements(step, args: tuple[Any, ...]) -> dict[int, int]:
    """Argument position -> the position of the top-level output of `step` that replaces it (same
    tree, leaf shapes and dtypes), matched in argument order, one output per argument; a program
    that runs the step again passes that output in the argument's place."""
    import jax

    out = jax.eval_shape(step, *args)
    outputs = list(out) if isinstance(out, (tuple, list)) else [out]
    free = {index: _signature(output) for index, output in enumerate(outputs)}
    found = {}
    for position, arg in enumerate(args):
        leaves = jax.tree_util.tree_leaves(arg)
        if not leaves or all(len(leaf.shape) == 0 for leaf in leaves):
            continue
        signature = _signature(arg)
        match = next((index for index, candidate in free.items() if candidate == signature), None)
        if match is not None:
            del free[match]
            found[position] = match
    return found


def donated_bytes(args: tuple[Any, ...], donated: tuple[int, ...]) -> int:
    """Bytes one rank holds of the donated arguments: each leaf's shard under its sharding."""
    import jax

    total = 0
    for position in donated:
        for leaf in jax.tree_util.tree_leaves(args[position]):
            sharding = getattr(leaf, "sharding", None)
            shape = sharding.shard_shape(tuple(leaf.shape)) if sharding is not None else leaf.shape
            total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
    return total

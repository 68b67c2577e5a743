"""Flax's own logical axis names on a model's inputs, read so that `--rule` lays them out.

A Flax model names the dimensions of its parameters itself and leaves where they live to a rule
table set where it runs (`nn.logical_axis_rules`). Its parameters arrive boxed with the names:

- linen: `nn.with_logical_partitioning(init, ("embed", "mlp"))` makes each parameter an
  `nn.LogicallyPartitioned` box. Its names are logical axes, resolved as Flax resolves them
  (`nn.logical_to_mesh_axes`: the table's order decides, a mesh axis splits one dimension at most);
  a name without a rule is not split. `nn.with_partitioning` (`nn.Partitioned`) names mesh axes.
- nnx: `nnx.with_partitioning(init, names)` or `nnx.Param(value, out_sharding=names)` keep the names
  in the variable's metadata (`out_sharding`; `sharding` or `sharding_names` in other releases). A
  rule renames a name; a name without one is taken as the mesh axis of that name, as in Flax.

A box is a pytree holding one array, so a model file gives `jax.eval_shape(model.init, ...)` or an
`nnx.split` state as it is. The inputs keep their boxes (the step unboxes them, and linen constrains
each parameter to its names under the same rules while the step is traced, see `flint.sharding`);
the layout names each box's array by the box's path and reads its names as it reads Flint's own
`logical` arrays. A box's own rules (Flax's `rules`, `sharding_rules`) take precedence, as in Flax.

Flax is no dependency of Flint: a model whose inputs hold Flax boxes has imported it, so it is looked
up among the loaded modules.
"""

from __future__ import annotations

import sys
from typing import Any

from flint.sharding import LogicalRules, axes_of, flax_rule_table

NNX_NAME_KEYS = ("out_sharding", "sharding_names", "sharding")
"""Where an nnx variable keeps its axis names, newest release first."""


def _module(name: str):
    return sys.modules.get(name)


def _linen_box(leaf) -> bool:
    meta = _module("flax.core.meta")
    return meta is not None and isinstance(leaf, meta.Partitioned)


def _nnx_variable(leaf) -> bool:
    variables = _module("flax.nnx.variablelib")
    return variables is not None and isinstance(leaf, variables.Variable)


def is_box(leaf) -> bool:
    """A Flax box around one input array: a linen `Partitioned` or an nnx `Variable`."""
    return _linen_box(leaf) or _nnx_variable(leaf)


def array_of(box):
    """The abstract array a box holds."""
    import jax

    (value,) = jax.tree_util.tree_leaves(box)
    return value


def reboxed(box, value):
    """`box` holding `value` instead (its names and other metadata kept)."""
    import jax

    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(box), [value])


def _axes(entry) -> tuple[str, ...]:
    """The mesh axes of one resolved name (None, an axis, several; anything else: unsplit)."""
    return axes_of(entry) if entry is None or isinstance(entry, (str, tuple, list)) else ()


def _nnx_metadata(variable) -> dict[str, Any]:
    return dict(variable.get_metadata())


def names_of(box) -> tuple[Any, ...] | None:
    """The box's axis names, one per dimension (None for an unnamed one), or None if it has none."""
    if _linen_box(box):
        return tuple(box.names)
    metadata = _nnx_metadata(box)
    names = next((metadata[key] for key in NNX_NAME_KEYS if metadata.get(key)), None)
    return None if names is None else tuple(names)


def _mesh_names_only(box) -> bool:
    """linen's plain `Partitioned` names mesh axes, not logical ones."""
    linen = _module("flax.linen.spmd")
    return _linen_box(box) and not (linen is not None and isinstance(box, linen.LogicallyPartitioned))


def logical_names(box) -> set[str]:
    """The names of `box` a rule can lay out (all but a plain `Partitioned`'s mesh axes)."""
    if _mesh_names_only(box):
        return set()
    return {name for name in names_of(box) or () if isinstance(name, str)}


def named_spec(box, rules: LogicalRules, mesh_axes) -> list[tuple[str, ...] | None]:
    """Per dimension, the mesh axes the box's names give it under `rules` (`()`: unsplit), or None
    where a name has no rule and names no mesh axis either, so the names do not decide it."""
    names = names_of(box) or ()
    if _mesh_names_only(box):
        return [_axes(name) for name in names]
    if _linen_box(box):
        table = box.rules or flax_rule_table(rules)
        named = {name for name, _ in table}
        resolved = _module("flax.linen.spmd").logical_to_mesh_axes(names, table)
        return [
            _axes(entry) if not isinstance(name, str) or name in named else None
            for name, entry in zip(names, resolved)
        ]
    own = dict(_nnx_metadata(box).get("sharding_rules") or ())
    spec: list[tuple[str, ...] | None] = []
    for name in names:
        if not isinstance(name, str):
            spec.append(_axes(name))
        elif name in own:
            spec.append(_axes(own[name]))
        elif name in rules:
            spec.append(tuple(rules[name]))
        else:
            spec.append((name,) if name in mesh_axes else None)
    return spec

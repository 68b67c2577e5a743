"""Stage 2, layout: the parallel layout, chosen on the command line instead of in the model file.

Design-space exploration runs one model under many layouts, so the sharding of every input and the
logical-axis rules the step's `flint.sharding.constrain` calls resolve with can be replaced without
editing the model. Four sources, each overriding the one before (per input, per logical name):

1. the model: the shardings its `workload(mesh)` gives and the rules of its optional
   `logical_rules(mesh)`;
2. a preset (`--strategy`): a complete layout that replaces the model's (`flint.layout.presets`);
3. the config file (`--config layout.toml`): `strategy`, `[rules]` and `[shard]` tables;
4. the command line: `--rule NAME=AXES` and `--shard PATTERN=SPEC`, later ones winning.
"""

from __future__ import annotations

import re
from dataclasses import replace

from flint.errors import FlintError
from flint.frontend import Workload
from flint.layout.inputs import Input, InputLayout, Layout, model_spec, read_inputs
from flint.layout.presets import apply_preset
from flint.layout.request import LayoutRequest, Spec
from flint.mesh import ways
from flint.sharding import LogicalArray, entry_of


def _check_axes(axes, mesh, what: str) -> None:
    for axis in axes:
        if axis not in mesh.shape:
            raise FlintError(
                f"{what}: unknown mesh axis {axis!r} (the mesh has {', '.join(mesh.axis_names)})"
            )


def _check_spec(item: Input, mesh) -> None:
    spec = tuple(item.spec)
    if len(spec) > len(item.shape):
        raise FlintError(
            f"input {item.path} has rank {len(item.shape)} but its sharding (from {item.origin}) names "
            f"{len(spec)} dimensions: shorten the spec"
        )
    seen: set[str] = set()
    for dim, axes in enumerate(spec):
        _check_axes(axes, mesh, f"input {item.path} (from {item.origin})")
        for axis in axes:
            if axis in seen:
                raise FlintError(
                    f"input {item.path} (from {item.origin}) uses mesh axis {axis!r} twice: an axis "
                    "can split only one dimension"
                )
            seen.add(axis)
        pieces = ways(mesh, axes)
        if item.shape[dim] % pieces:
            raise FlintError(
                f"input {item.path} dimension {dim} (size {item.shape[dim]}) does not divide over "
                f"mesh axis {'+'.join(axes)} ({pieces} ways, from {item.origin}): change the size or sharding"
            )


def _partition_spec(spec: Spec):
    from jax.sharding import PartitionSpec as P

    return P(*(entry_of(axes) for axes in spec))


def apply_layout(workload: Workload, mesh, request: LayoutRequest) -> tuple[Workload, Layout]:
    """The workload with every input resharded as requested, and the layout that was applied."""
    import jax
    from jax.sharding import NamedSharding

    rules: dict[str, tuple[str, ...]] = dict(workload.rules or {})
    inputs, treedef = read_inputs(workload)
    if request.strategy:
        rules = apply_preset(request.strategy, inputs, mesh, workload.tensor_parallel or {})
    for name, axes, origin in request.rules:
        _check_axes(axes, mesh, f"rule {name}={'+'.join(axes)} ({origin})")
        rules[name] = axes
    for item in inputs:
        if isinstance(item.leaf, LogicalArray) and item.origin == "model":
            item.spec = model_spec(item.leaf, rules)
    warnings = []
    for rule in request.shards:
        _check_axes({a for axes in rule.spec for a in axes}, mesh, f"--shard {rule.pattern} ({rule.origin})")
        matched = [item for item in inputs if re.fullmatch(rule.pattern, item.path)]
        if not matched:
            warnings.append(f"--shard {rule.pattern} ({rule.origin}) matches no input")
        for item in matched:
            item.spec, item.origin = rule.spec, rule.origin
    for item in inputs:
        _check_spec(item, mesh)
    leaves = [
        jax.ShapeDtypeStruct(item.shape, item.dtype, sharding=NamedSharding(mesh, _partition_spec(item.spec)))
        for item in inputs
    ]
    layout = Layout(
        inputs=tuple(
            InputLayout(
                item.path, item.shape, str(item.dtype), tuple(item.spec), item.origin, item.in_batch
            )
            for item in inputs
        ),
        rules=rules,
        warnings=tuple(warnings),
    )
    args = jax.tree_util.tree_unflatten(treedef, leaves)
    return replace(workload, args=tuple(args), rules=rules or workload.rules), layout

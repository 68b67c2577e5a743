"""Stage 2, layout: the parallel layout, chosen on the command line instead of in the model file.

Design-space exploration runs one model under many layouts, so the sharding of every input and the
logical-axis rules the step's `flint.sharding.constrain` calls resolve with can be replaced without
editing the model. Four sources, each overriding the one before (per input, per logical name):

1. the model: the shardings its `workload(mesh)` gives and the rules of its optional
   `logical_rules(mesh)`;
2. a preset (`--strategy`): a complete layout that replaces the model's (`flint.layout.presets`);
3. the config file (`--config layout.toml`): `strategy`, `[rules]` and `[shard]` tables;
4. the command line: `--rule NAME=AXES` and `--shard PATTERN=SPEC`, later ones winning.

Logical names come from Flint's own `logical` inputs and `constrain` calls and from Flax's (boxed
linen parameters, nnx sharding metadata, `nn.with_logical_constraint`; `flint.layout.flax_names`).
What would silently do nothing is a warning: a `--shard` that matches no input, a `--rule` whose name
no input or constraint uses, a Flax name the model's inputs carry that no rule maps, a mesh axis
that splits no input and no constraint of the step (its ranks would all run the same work).
"""

from __future__ import annotations

import re
from dataclasses import replace

from flint.errors import FlintError
from flint.frontend import Workload
import flint.layout.flax_names as flax_names
from flint.layout.constraints import axes_in_step, constrained_names
from flint.layout.inputs import (
    Input,
    InputLayout,
    Layout,
    listing,
    logical_names,
    model_spec,
    placed_by_model,
    read_inputs,
)
from flint.layout.presets import apply_preset, strategies_using
from flint.layout.request import LayoutRequest, Spec
from flint.mesh import ways
from flint.sharding import entry_of


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


def _rules_naming_nothing(
    request: LayoutRequest, inputs: list[Input], workload: Workload, mesh, rules
) -> list[str]:
    """`--rule`s (and `[rules]`) whose name no input carries and no constraint in the step uses."""
    on_inputs = set().union(*(logical_names(item.leaf) for item in inputs))
    asked = {name: origin for name, _, origin in request.rules if name not in on_inputs}
    used = constrained_names(workload, mesh, rules, set(asked)) if asked else set()
    return [
        f"--rule {name} ({origin}) names no logical axis of any input or constraint"
        for name, origin in asked.items()
        if name not in used
    ]


def _flax_names_without_rules(inputs: list[Input], rules, mesh) -> list[str]:
    """Flax logical names the model's inputs are laid out by that no rule maps (left unsplit)."""
    missing: dict[str, list[str]] = {}
    for item in inputs:
        if item.origin != "model" or not flax_names.is_box(item.leaf):
            continue
        if placed_by_model(flax_names.array_of(item.leaf)):
            continue  # the model placed the array itself
        named = flax_names.named_spec(item.leaf, rules, mesh.axis_names)
        for name, axes in zip(flax_names.names_of(item.leaf), named):
            if axes is None:
                missing.setdefault(name, []).append(item.path)
    return [
        f"logical axis {name!r} of {listing(paths)} has no rule: left unsplit "
        f"(give --rule {name}=AXES, or {name}=None to keep it whole)"
        for name, paths in missing.items()
    ]


def _unused_axes(
    inputs: list[Input], workload: Workload, mesh, rules, strategy: str | None, meant: set[str]
) -> list[str]:
    """Mesh axes (of more than one rank) that split no input and no constraint in the step (the
    step is lowered once more only if some axis splits no input), but those a preset meant for a
    batch that does not divide (already a warning); each offers the presets that would use it."""
    named = {axis for item in inputs for axes in item.spec for axis in axes}
    idle = [a for a in mesh.axis_names if mesh.shape[a] > 1 and a not in named and a not in meant]
    if idle:
        used = axes_in_step(workload, mesh, rules)
        idle = [a for a in idle if a not in used]
    warnings = []
    for axis in idle:
        options = [s for s in strategies_using(axis, mesh) if s != strategy]
        offer = ""
        if options:
            listed = f"{', '.join(options[:-1])} or {options[-1]}" if len(options) > 1 else options[0]
            offer = f": --strategy {listed} would use it"
        warnings.append(
            f"mesh axis {axis!r} splits no input and no constraint of the step, so its "
            f"{mesh.shape[axis]} ranks repeat each other's work{offer}"
        )
    return warnings


def _leaf(item: Input, sharding):
    import jax

    array = jax.ShapeDtypeStruct(item.shape, item.dtype, sharding=sharding)
    return flax_names.reboxed(item.leaf, array) if flax_names.is_box(item.leaf) else array


def apply_layout(workload: Workload, mesh, request: LayoutRequest) -> tuple[Workload, Layout]:
    """The workload with every input resharded as requested, and the layout that was applied."""
    import jax
    from jax.sharding import NamedSharding

    rules: dict[str, tuple[str, ...]] = dict(workload.rules or {})
    inputs, treedef, batch = read_inputs(workload, mesh.axis_names)
    warnings = []
    meant: set[str] = set()
    if request.strategy:
        rules, preset_warnings, meant = apply_preset(
            request.strategy, inputs, mesh, workload.tensor_parallel or {}, workload.expert_parallel or {}
        )
        warnings += preset_warnings
    for name, axes, origin in request.rules:
        _check_axes(axes, mesh, f"rule {name}={'+'.join(axes)} ({origin})")
        rules[name] = axes
    for item in inputs:
        if item.origin == "model":
            item.spec = model_spec(item.leaf, rules, mesh.axis_names)
    for rule in request.shards:
        _check_axes({a for axes in rule.spec for a in axes}, mesh, f"--shard {rule.pattern} ({rule.origin})")
        matched = [item for item in inputs if re.fullmatch(rule.pattern, item.path)]
        if not matched:
            warnings.append(f"--shard {rule.pattern} ({rule.origin}) matches no input")
        for item in matched:
            item.spec, item.origin = rule.spec, rule.origin
    warnings += _flax_names_without_rules(inputs, rules, mesh)
    for item in inputs:
        _check_spec(item, mesh)
    leaves = [_leaf(item, NamedSharding(mesh, _partition_spec(item.spec))) for item in inputs]
    laid_out = replace(workload, args=tuple(jax.tree_util.tree_unflatten(treedef, leaves)))
    warnings += _rules_naming_nothing(request, inputs, laid_out, mesh, rules)
    warnings += _unused_axes(inputs, laid_out, mesh, rules, request.strategy, meant)
    layout = Layout(
        inputs=tuple(
            InputLayout(
                item.path, item.shape, str(item.dtype), tuple(item.spec), item.origin, item.in_batch
            )
            for item in inputs
        ),
        rules=rules,
        warnings=tuple(warnings),
        batch_doubt=batch.doubt,
    )
    return replace(laid_out, rules=rules or workload.rules), layout

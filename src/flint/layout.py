"""Stage 1b: the parallel layout, chosen on the command line instead of in the model file.

Design-space exploration runs one model under many layouts, so the sharding of every input and the
logical-axis rules the step's `flint.sharding.constrain` calls resolve with can be replaced without
editing the model. Four sources, each overriding the one before (per input, per logical name):

1. the model: the shardings its `workload(mesh)` gives and the rules of its optional
   `logical_rules(mesh)`;
2. a preset (`--strategy`): a complete layout that replaces the model's, by the rules below;
3. the config file (`--config layout.toml`): `strategy`, `[rules]` and `[shard]` tables;
4. the command line: `--rule NAME=AXES` and `--shard PATTERN=SPEC`, later ones winning.

Inputs are named by path: the step's parameter name, then the pytree keys, joined by `/`
(`params/layers/w_in`, `opt/m/embed`, `batch/tokens`). A `--shard` pattern is a regular expression
that must match a whole path; its SPEC gives one entry per leading dimension: a mesh axis, several
joined by `+`, or `None`/`_`/nothing for an unsplit one (`'params/.*/w_in=None,data,tensor'`).

Presets apply by shape and position, so they need no annotations at all:

- the step's last positional argument is the batch; the others hold parameters and optimizer state;
- mesh roles: the tensor axis is the one named `tensor`, `tp` or `model`, else the last axis; every
  other axis is a data axis (on a one-axis mesh that axis serves either role);
- `dp`: the batch is split along its first dimension over every mesh axis; parameters replicated;
- `fsdp`: as `dp`, and each parameter is split over every mesh axis along its largest dimension
  that divides (ZeRO-3);
- `tp`: Megatron tensor parallelism over the tensor axis; the batch is replicated;
- `dp+tp`, `fsdp+tp`: the batch (and FSDP) over the data axes, tensor parallelism over the tensor axis;
- `tp+sp`, `dp+tp+sp`: as `tp`, `dp+tp`, plus Megatron sequence parallelism: the logical axis `seq`
  (the residual stream between a model's sublayers, where it names it) is split over the tensor
  axis, so the sublayers' all-reduces become all-gathers of their inputs and reduce-scatters of
  their outputs; every other preset keeps `seq` whole;
- `ep`: expert parallelism over the expert axis (named `expert` or `ep`, else the first): a
  parameter group stacked along its first dimension (experts `[E, D, F]`) is split along it, other
  parameters are replicated, the batch is split over every axis (the others first). Logical names:
  `expert` to the expert axis, `groups` (the token groups of tokens dispatched to experts) to the
  other axes. Meant for mixture-of-experts models (on a dense model it splits stacked layers);
- FSDP splits over the axis named `fsdp` when there is one (`--mesh dp=2,fsdp=4,tp=2`), else over
  all the data axes.

Tensor parallelism by shape: the model width D is the dimension size most common among the
parameters and the batch's last dimensions (the smaller one on a tie). A parameter group whose
arrays all share one leading size (stacked layers under `lax.scan`) keeps that dimension whole. Of
the remaining dimensions, a parameter that starts with D is column-parallel (the next dimension is
split: `w_in [D, F]`, `wq [D, H, k]`, the LM head `[D, V]`); one that ends with D is row-parallel (its
first dimension is split: `w_out [F, D]`, `wo [H, k, D]`, the embedding `[V, D]`); vectors stay whole.
Presets map the logical names `batch` to the batch axes, `vocab`, `heads`, `mlp` to the tensor axis
and `seq` as above.

PyTorch weights: `nn.Linear` stores [out, in], the transpose of the JAX [in, out], and the shape rule
still splits the right dimension of a non-square weight (fc1 [F, D] ends with D: its F rows, the
output features, are split: column-parallel; fc2 [D, F] starts with D: F, its input features:
row-parallel). A square [D, D] weight cannot be placed by shape (q, k, v are column-parallel, the
attention output row-parallel), so a model's declared split (`Workload.tensor_parallel`, from a
PyTorch `tp_plan`) takes precedence over the shape rule for the inputs it names.
"""

from __future__ import annotations

import inspect
import math
import re
import tomllib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from flint.errors import FlintError
from flint.frontend import Workload
from flint.sharding import LogicalArray, LogicalRules, axes_of, entry_of, resolve

STRATEGIES = ("dp", "fsdp", "tp", "dp+tp", "fsdp+tp", "tp+sp", "dp+tp+sp", "ep")
TENSOR_AXIS_NAMES = ("tensor", "tp", "model")
EXPERT_AXIS_NAMES = ("expert", "ep")
TP_LOGICAL_NAMES = ("vocab", "heads", "mlp")
SEQUENCE_LOGICAL_NAME = "seq"
EXPERT_LOGICAL_NAME, GROUPS_LOGICAL_NAME = "expert", "groups"

Spec = tuple[tuple[str, ...], ...]
"""One entry per leading dimension: the mesh axes it is split over (empty: unsplit)."""


@dataclass(frozen=True)
class ShardRule:
    """`--shard PATTERN=SPEC`: inputs whose path fully matches `pattern` get `spec`."""

    pattern: str
    spec: Spec
    origin: str


@dataclass(frozen=True)
class LayoutRequest:
    """The user's layout choices, config file and command line merged (command line last)."""

    strategy: str | None = None
    rules: tuple[tuple[str, tuple[str, ...], str], ...] = ()
    shards: tuple[ShardRule, ...] = ()


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


# ------------------------------------------------------------------------------ parsing


def parse_spec(text: str) -> Spec:
    """`data,None,tensor+fsdp` -> (("data",), (), ("tensor", "fsdp"))."""
    entries = []
    for entry in text.split(","):
        entry = entry.strip()
        if entry in ("", "None", "none", "_"):
            entries.append(())
        else:
            entries.append(tuple(axis.strip() for axis in entry.split("+")))
    return tuple(entries)


def _split_assignment(text: str, flag: str, example: str) -> tuple[str, str]:
    key, sep, value = text.rpartition("=")
    if not sep or not key.strip():
        raise FlintError(f"{flag} {text!r} is not NAME=VALUE: write it like {example}")
    return key.strip(), value.strip()


def parse_shard(text: str, origin: str = "cli") -> ShardRule:
    pattern, spec = _split_assignment(text, "--shard", "'params/.*/w_in=None,data,tensor'")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise FlintError(f"--shard {text!r}: the pattern is not a regular expression ({exc})") from None
    return ShardRule(pattern, parse_spec(spec), origin)


def parse_rule(text: str, origin: str = "cli") -> tuple[str, tuple[str, ...], str]:
    name, axes = _split_assignment(text, "--rule", "batch=data or mlp=tensor")
    return name, tuple(a.strip() for a in axes.split("+") if a.strip() not in ("", "None")), origin


def read_config(path: Path) -> LayoutRequest:
    """A TOML layout: `strategy = "..."`, `[rules] name = "axes"`, `[shard] "pattern" = "spec"`."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FlintError(f"config file {str(path)!r} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise FlintError(f"config file {path}: not valid TOML ({exc})") from None
    unknown = set(data) - {"strategy", "rules", "shard"}
    if unknown:
        raise FlintError(
            f"config file {path}: unknown key {sorted(unknown)[0]!r} (use strategy, rules, shard)"
        )
    origin = f"config {Path(path).name}"
    return LayoutRequest(
        strategy=data.get("strategy"),
        rules=tuple(parse_rule(f"{k}={v}", origin) for k, v in data.get("rules", {}).items()),
        shards=tuple(parse_shard(f"{k}={v}", origin) for k, v in data.get("shard", {}).items()),
    )


def merge(config: LayoutRequest | None, cli: LayoutRequest) -> LayoutRequest:
    """Command-line choices on top of the config file's."""
    if config is None:
        return cli
    return LayoutRequest(
        strategy=cli.strategy or config.strategy,
        rules=config.rules + cli.rules,
        shards=config.shards + cli.shards,
    )


def recorded(layout: Mapping, origin: str) -> LayoutRequest:
    """The layout a trace's manifest records (its final rules and every input's sharding), as a
    request that reproduces it exactly."""
    return LayoutRequest(
        rules=tuple((name, tuple(axes), origin) for name, axes in layout.get("rules", {}).items()),
        shards=tuple(
            ShardRule(re.escape(path), tuple(tuple(axes) for axes in spec), origin)
            for path, spec in layout.get("inputs", {}).items()
        ),
    )


# ------------------------------------------------------------------------------ inputs


@dataclass
class _Input:
    path: str
    shape: tuple[int, ...]
    dtype: Any
    spec: Spec
    origin: str
    in_batch: bool
    leaf: Any


def _key_name(key) -> str:
    for attribute in ("key", "name", "idx"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


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


def _model_spec(leaf, rules: LogicalRules) -> Spec:
    """What the model gives: its NamedSharding, or its logical names under `rules` (unsplit
    where a name has no rule)."""
    from jax.sharding import NamedSharding

    if isinstance(leaf, LogicalArray):
        return tuple(axes_of(e) for e in resolve(leaf.names, rules, None))
    if not isinstance(leaf.sharding, NamedSharding):
        return ()
    return tuple(axes_of(e) for e in leaf.sharding.spec)


def input_path(arguments: list[str], keypath) -> str:
    """An input's path: its step argument's name, then its pytree keys, joined by `/`."""
    return "/".join([arguments[keypath[0].idx], *(_key_name(k) for k in keypath[1:])])


def _inputs(workload: Workload) -> tuple[list[_Input], Any]:
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
            _Input(
                input_path(names, keypath),
                tuple(leaf.shape),
                np.dtype(leaf.dtype),
                _model_spec(leaf, {}),
                "model",
                keypath[0].idx == len(workload.args) - 1,
                leaf,
            )
        )
    return inputs, treedef


# ------------------------------------------------------------------------------ presets


@dataclass(frozen=True)
class _Roles:
    batch: tuple[str, ...]
    fsdp: tuple[str, ...]
    tensor: tuple[str, ...]
    sequence: tuple[str, ...]
    expert: tuple[str, ...] = ()


def _named(names: tuple[str, ...], wanted: tuple[str, ...], default: str) -> str:
    return next((n for n in names if n in wanted), default)


def tensor_axis(names: tuple[str, ...]) -> str:
    """The tensor axis of a mesh: the one named `tensor`, `tp` or `model`, else the last."""
    return _named(names, TENSOR_AXIS_NAMES, names[-1])


def _roles(strategy: str, mesh) -> _Roles:
    names = tuple(mesh.axis_names)
    tensor = tensor_axis(names)
    parts = set(strategy.split("+"))
    if "ep" in parts:
        expert = _named(names, EXPERT_AXIS_NAMES, names[0])
        rest = tuple(n for n in names if n != expert)
        # tokens over the other axes first: an expert group then holds consecutive token groups,
        # so dispatching to the experts is one all_to_all per group
        return _Roles(batch=rest + (expert,), fsdp=(), tensor=(), sequence=(), expert=(expert,))
    if "tp" not in parts:
        data = names
    else:
        data = tuple(n for n in names if n != tensor) if parts & {"dp", "fsdp"} else ()
    fsdp = (tuple(n for n in data if n == "fsdp") or data) if "fsdp" in parts else ()
    return _Roles(
        batch=data,
        fsdp=fsdp,
        tensor=(tensor,) if "tp" in parts else (),
        sequence=(tensor,) if "sp" in parts else (),
    )


def _stacked(items: Iterable[tuple[str, tuple[int, ...]]]) -> set[str]:
    """Paths of parameters whose leading dimension stacks layers (shared by their whole group),
    from the `(path, shape)` of every input outside the batch."""
    groups: dict[str, list[tuple[str, tuple[int, ...]]]] = defaultdict(list)
    for path, shape in items:
        groups[path.rpartition("/")[0]].append((path, shape))
    stacked = set()
    for group in groups.values():
        leading = {shape[0] if len(shape) >= 2 else None for _, shape in group}
        if len(group) >= 2 and len(leading) == 1 and None not in leading:
            stacked.update(path for path, _ in group)
    return stacked


def stacked_paths(layout: Layout) -> set[str]:
    """Paths of the inputs that stack layers along their leading dimension (as under `lax.scan`)."""
    return _stacked((item.path, item.shape) for item in layout.inputs if not item.batch)


def _model_width(inputs: list[_Input], stacked: set[str]) -> int | None:
    sizes: Counter[int] = Counter()
    for item in inputs:
        if item.in_batch:
            sizes.update(item.shape[-1:])
        else:
            sizes.update(item.shape[1:] if item.path in stacked else item.shape)
    if not sizes:
        return None
    return min(sizes, key=lambda size: (-sizes[size], size))


def ways(mesh, axes: tuple[str, ...]) -> int:
    """How many pieces splitting over the mesh axes `axes` makes."""
    return math.prod(mesh.shape[axis] for axis in axes)


def _tensor_split(item: _Input, dims: list[int], width, declared: Mapping[str, int | None]) -> int | None:
    """The dimension tensor parallelism splits: the model's declared one, else by shape."""
    if item.path in declared:
        return declared[item.path]
    if len(dims) < 2:
        return None
    shape = [item.shape[d] for d in dims]
    return dims[1] if shape[0] == width else dims[0] if shape[-1] == width else None


def _preset_spec(
    item: _Input, roles: _Roles, mesh, width, stacked: set[str], declared: Mapping[str, int | None]
) -> Spec:
    rank = len(item.shape)
    spec: list[tuple[str, ...]] = [()] * rank
    if item.in_batch:
        if rank and roles.batch and item.shape[0] % ways(mesh, roles.batch) == 0:
            spec[0] = roles.batch
        return tuple(spec)
    first = 1 if item.path in stacked else 0
    if first and roles.expert and item.shape[0] % ways(mesh, roles.expert) == 0:
        spec[0] = roles.expert
    dims = list(range(first, rank))
    if roles.tensor:
        split = _tensor_split(item, dims, width, declared)
        if split is not None and item.shape[split] % ways(mesh, roles.tensor) == 0:
            spec[split] = roles.tensor
    if roles.fsdp:
        pieces = ways(mesh, roles.fsdp)
        free = [d for d in dims if not spec[d] and item.shape[d] % pieces == 0]
        if free:
            spec[max(free, key=lambda d: (item.shape[d], -d))] = roles.fsdp
    return tuple(spec)


def _apply_preset(
    strategy: str, inputs: list[_Input], mesh, declared: Mapping[str, int | None]
) -> dict[str, tuple[str, ...]]:
    if strategy not in STRATEGIES:
        raise FlintError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    roles = _roles(strategy, mesh)
    stacked = _stacked((item.path, item.shape) for item in inputs if not item.in_batch)
    width = _model_width(inputs, stacked)
    for item in inputs:
        item.spec = _preset_spec(item, roles, mesh, width, stacked, declared)
        item.origin = f"strategy {strategy}"
    rules = {"batch": roles.batch} if roles.batch else {}
    rules.update({name: roles.tensor for name in TP_LOGICAL_NAMES if roles.tensor})
    rules[SEQUENCE_LOGICAL_NAME] = roles.sequence
    if roles.expert:
        rules[EXPERT_LOGICAL_NAME] = roles.expert
        rules[GROUPS_LOGICAL_NAME] = tuple(a for a in roles.batch if a not in roles.expert)
    return rules


# ------------------------------------------------------------------------------ checks


def _check_axes(axes, mesh, what: str) -> None:
    for axis in axes:
        if axis not in mesh.shape:
            raise FlintError(
                f"{what}: unknown mesh axis {axis!r} (the mesh has {', '.join(mesh.axis_names)})"
            )


def _check_spec(item: _Input, mesh) -> None:
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


# ------------------------------------------------------------------------------ the stage


def _partition_spec(spec: Spec):
    from jax.sharding import PartitionSpec as P

    return P(*(entry_of(axes) for axes in spec))


def apply_layout(workload: Workload, mesh, request: LayoutRequest) -> tuple[Workload, Layout]:
    """The workload with every input resharded as requested, and the layout that was applied."""
    import jax
    from jax.sharding import NamedSharding

    rules: dict[str, tuple[str, ...]] = dict(workload.rules or {})
    inputs, treedef = _inputs(workload)
    if request.strategy:
        rules = _apply_preset(request.strategy, inputs, mesh, workload.tensor_parallel or {})
    for name, axes, origin in request.rules:
        _check_axes(axes, mesh, f"rule {name}={'+'.join(axes)} ({origin})")
        rules[name] = axes
    for item in inputs:
        if isinstance(item.leaf, LogicalArray) and item.origin == "model":
            item.spec = _model_spec(item.leaf, rules)
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

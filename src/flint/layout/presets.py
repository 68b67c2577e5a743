"""The presets of `--strategy`: complete layouts derived from the inputs' shapes and positions.

Presets apply by shape and position, so they need no annotations at all:

- the batch is the step's last positional argument and those before it laid out like it, or what the
  model declares (`flint.layout.batch`); the others hold parameters and optimizer state;
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
  other axes. Meant for mixture-of-experts models (on a dense model it splits stacked layers). A
  model's declared expert split (`Workload.expert_parallel`, a `transformers` `ep_plan`) decides
  for the weights it names instead of the stacking rule. Where neither splits any weight (PyTorch's
  dotted names form no group under one path), a warning says so;
- `dp+cp`, `fsdp+cp`, `dp+cp+tp`, `fsdp+cp+tp`, `dp+cp+tp+sp`: context parallelism beside them: the
  mesh axis named `context` (or `cp`) splits each batch input's second dimension (the sequence)
  and is no data axis; the logical names `context` (the sequence of the sublayers' activations and
  queries) and `seq` (the residual stream) map to it, `seq` also to the tensor axis with `sp`. A
  model that names its keys' and values' sequence whole (`examples/llama.py`) gathers them over
  the axis in each attention, as Llama 3's all-gather context parallelism does; every other
  preset keeps `context` whole. FSDP then shards the weights over the data and context axes;
- FSDP splits over the axis named `fsdp` when there is one (`--mesh dp=2,fsdp=4,tp=2`), else over
  all the data axes.

Tensor parallelism by shape: the model width D is the dimension size most common among the
parameters and the batch's last dimensions (the smaller one on a tie). Stacked layers (under
`lax.scan`) keep their leading dimension whole: a subtree of two or more parameters (any path
prefix: `params/layers`, `params/experts`) that all share one leading size L, at least one of them
a stack of matrices (rank >= 3; the layers' vectors ride along as [L, D]), where L is not D. Plain
matrices sharing a size are no stack (an MLP's w_in [D, F] and w_out [F, D] with F = D), nor are
projections [D, H, k] kept together. Of the remaining dimensions, a parameter that starts with D is
column-parallel (the next dimension is split: `w_in [D, F]`, `wq [D, H, k]`, the LM head `[D, V]`);
one that ends with D is row-parallel (its first dimension is split: `w_out [F, D]`, `wo [H, k, D]`,
the embedding `[V, D]`); vectors stay whole. Presets map the logical names `batch` to the batch
axes, `vocab`, `heads`, `mlp` to the tensor axis and `seq` as above.

Weights that start and end with D (square [D, D]: q, k, v are column-parallel, the attention output
and a square MLP's w_out row-parallel; Equinox's and PyTorch's [out, in] reverse them) cannot be
placed by shape. The model's declared split decides: its `Workload.tensor_parallel` (a PyTorch
`tp_plan`), else the one dimension its own layout splits over the tensor axis (its sharding, or its
logical names under the preset's rules: ("embed", "mlp") is column-parallel, ("mlp", "embed")
row-parallel). Without one the weight is split column-parallel and the preset warns, naming the
inputs (`--shard PATTERN=SPEC` or the model's declared split fixes it). A declared split
(`tp_plan`) takes precedence over the shape rule for any weight it names.

PyTorch weights: `nn.Linear` stores [out, in], the transpose of the JAX [in, out], and the shape rule
still splits the right dimension of a non-square weight (fc1 [F, D] ends with D: its F rows, the
output features, are split: column-parallel; fc2 [D, F] starts with D: F, its input features:
row-parallel).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from flint.errors import FlintError
from flint.layout.inputs import Input, Layout, listing, model_spec
from flint.layout.request import Spec
from flint.mesh import CONTEXT_AXIS_NAMES, EXPERT_AXIS_NAMES, axis_named, tensor_axis, ways

STRATEGIES = (
    "dp", "fsdp", "tp", "dp+tp", "fsdp+tp", "tp+sp", "dp+tp+sp", "ep",
    "dp+cp", "fsdp+cp", "dp+cp+tp", "fsdp+cp+tp", "dp+cp+tp+sp",
)
TP_LOGICAL_NAMES = ("vocab", "heads", "mlp")
SEQUENCE_LOGICAL_NAME, CONTEXT_LOGICAL_NAME = "seq", "context"
EXPERT_LOGICAL_NAME, GROUPS_LOGICAL_NAME = "expert", "groups"


@dataclass(frozen=True)
class _Roles:
    batch: tuple[str, ...]
    fsdp: tuple[str, ...]
    tensor: tuple[str, ...]
    sequence: tuple[str, ...]
    expert: tuple[str, ...] = ()
    context: tuple[str, ...] = ()


def _roles(strategy: str, mesh) -> _Roles:
    names = tuple(mesh.axis_names)
    tensor = tensor_axis(names)
    parts = set(strategy.split("+"))
    if "ep" in parts:
        expert = axis_named(names, EXPERT_AXIS_NAMES, names[0])
        rest = tuple(n for n in names if n != expert)
        # tokens over the other axes first: an expert group then holds consecutive token groups,
        # so dispatching to the experts is one all_to_all per group
        return _Roles(batch=rest + (expert,), fsdp=(), tensor=(), sequence=(), expert=(expert,))
    context = ()
    if "cp" in parts:
        found = [n for n in names if n in CONTEXT_AXIS_NAMES]
        if not found:
            raise FlintError(
                f"--strategy {strategy} splits the sequence over a mesh axis named context or cp, "
                f"and the mesh has {', '.join(names)}: e.g. --mesh data=2,context=2,tensor=2"
            )
        context = (found[0],)
    if "tp" not in parts:
        data = tuple(n for n in names if n not in context)
    else:
        data = tuple(n for n in names if n != tensor and n not in context) if parts & {"dp", "fsdp"} else ()
    # The weights are whole on every context rank, as on every data rank: ZeRO shards them over both
    fsdp = (tuple(n for n in data if n == "fsdp") or data + context) if "fsdp" in parts else ()
    return _Roles(
        batch=data,
        fsdp=fsdp,
        tensor=(tensor,) if "tp" in parts else (),
        sequence=context + ((tensor,) if "sp" in parts else ()),
        context=context,
    )


def _groups(paths: list[str]) -> dict[str, list[int]]:
    """Every subtree of the inputs (a path prefix, the step's argument names included): the
    positions of the inputs under it."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, path in enumerate(paths):
        parts = path.split("/")
        for k in range(1, len(parts)):
            groups["/".join(parts[:k])].append(i)
    return groups


def _looks_stacked(shapes: list[tuple[int, ...]]) -> bool:
    """Two or more arrays, all sharing one leading size, at least one a stack of matrices or more
    (rank >= 3): the layers' vectors ride along as [L, D], but a group of plain matrices sharing a
    size (an MLP's [D, F] and [F, D] when F = D) is no stack."""
    return (
        len(shapes) >= 2
        and all(len(shape) >= 2 for shape in shapes)
        and len({shape[0] for shape in shapes}) == 1
        and any(len(shape) >= 3 for shape in shapes)
    )


def _width(items: list[tuple[str, tuple[int, ...], bool]], stacked: set[str]) -> int | None:
    """The model width D: the dimension size most common among the parameters (stacked layer
    dimensions left out) and the batch's last dimensions, the smaller one on a tie."""
    sizes: Counter[int] = Counter()
    for path, shape, in_batch in items:
        if in_batch:
            sizes.update(shape[-1:])
        else:
            sizes.update(shape[1:] if path in stacked else shape)
    if not sizes:
        return None
    return min(sizes, key=lambda size: (-sizes[size], size))


def _stacked(items: list[tuple[str, tuple[int, ...], bool]]) -> tuple[set[str], int | None]:
    """Paths of the parameters whose leading dimension stacks layers (as under `lax.scan`), and the
    model width, from the `(path, shape, in_batch)` of every input.

    A subtree of parameters that looks stacked (`_looks_stacked`) is one, unless its shared leading
    size is the model width itself: three projections [D, H, k] kept together are not D layers."""
    params = [(path, shape) for path, shape, in_batch in items if not in_batch]
    paths = [path for path, _ in params]
    candidates: dict[str, int] = {}
    for members in _groups(paths).values():
        shapes = [params[i][1] for i in members]
        if _looks_stacked(shapes):
            candidates.update((paths[i], shapes[0][0]) for i in members)
    width = _width(items, set(candidates))
    stacked = {path for path, leading in candidates.items() if leading != width}
    return stacked, _width(items, stacked)


def stacked_paths(layout: Layout) -> set[str]:
    """Paths of the inputs that stack layers along their leading dimension (as under `lax.scan`)."""
    return _stacked([(item.path, item.shape, item.batch) for item in layout.inputs])[0]


def _own_split(spec: Spec, roles: _Roles) -> int | None:
    """The one dimension a model's own layout splits over the tensor axis, if there is one."""
    dims = [d for d, axes in enumerate(spec) if set(axes) & set(roles.tensor)]
    return dims[0] if len(dims) == 1 else None


@dataclass
class _Plan:
    """What a preset knows while it lays out each input."""

    roles: _Roles
    mesh: object
    width: int | None
    stacked: set[str]
    declared: Mapping[str, int | None]
    """Input path -> the dimension the model's plan (`tp_plan`) splits over the tensor axis."""
    own: Mapping[str, int | None]
    """Input path -> the dimension the model's own layout splits over the tensor axis."""
    experts: Mapping[str, int] = field(default_factory=dict)
    """Input path -> the dimension the model's plan (`ep_plan`) splits by expert."""
    ambiguous: list[str] = field(default_factory=list)
    """Weights whose first and last dimensions are both D, placed by shape for want of a plan."""
    whole_batch: list[str] = field(default_factory=list)
    """Batch inputs whose rows do not divide over the batch axes, so every rank holds them all."""
    whole_sequence: list[str] = field(default_factory=list)
    """Batch inputs whose second dimension does not divide over the context axis."""


def _tensor_split(item: Input, dims: list[int], plan: _Plan) -> int | None:
    """The dimension tensor parallelism splits: the model's declared one, else by shape. Where
    shape cannot tell (the first and the last dimension are both D), the model's own layout
    decides, else the weight is taken as column-parallel and listed as ambiguous."""
    if item.path in plan.declared:
        return plan.declared[item.path]
    if len(dims) < 2:
        return None
    first, last = item.shape[dims[0]], item.shape[dims[-1]]
    if first == plan.width and last == plan.width:
        if plan.own.get(item.path) in dims:
            return plan.own[item.path]
        plan.ambiguous.append(item.path)
    return dims[1] if first == plan.width else dims[0] if last == plan.width else None


def _preset_spec(item: Input, plan: _Plan) -> Spec:
    roles, mesh = plan.roles, plan.mesh
    rank = len(item.shape)
    spec: list[tuple[str, ...]] = [()] * rank
    if item.in_batch:
        if rank and roles.batch and item.shape[0] % ways(mesh, roles.batch) == 0:
            spec[0] = roles.batch
        elif rank and roles.batch:
            plan.whole_batch.append(f"{item.path} ({item.shape[0]} rows)")
        if rank >= 2 and roles.context and item.shape[1] % ways(mesh, roles.context) == 0:
            spec[1] = roles.context
        elif rank >= 2 and roles.context:
            plan.whole_sequence.append(f"{item.path} ({item.shape[1]} positions)")
        return tuple(spec)
    first = 1 if item.path in plan.stacked else 0
    if roles.expert and item.path in plan.experts:
        split = plan.experts[item.path]
        if item.shape[split] % ways(mesh, roles.expert) == 0:
            spec[split] = roles.expert
    elif first and roles.expert and item.shape[0] % ways(mesh, roles.expert) == 0:
        spec[0] = roles.expert
    dims = list(range(first, rank))
    if roles.tensor:
        split = _tensor_split(item, dims, plan)
        if split is not None and item.shape[split] % ways(mesh, roles.tensor) == 0:
            spec[split] = roles.tensor
    if roles.fsdp:
        pieces = ways(mesh, roles.fsdp)
        free = [d for d in dims if not spec[d] and item.shape[d] % pieces == 0]
        if free:
            spec[max(free, key=lambda d: (item.shape[d], -d))] = roles.fsdp
    return tuple(spec)


def _preset_rules(roles: _Roles) -> dict[str, tuple[str, ...]]:
    rules = {"batch": roles.batch} if roles.batch else {}
    rules.update({name: roles.tensor for name in TP_LOGICAL_NAMES if roles.tensor})
    rules[SEQUENCE_LOGICAL_NAME] = roles.sequence
    rules[CONTEXT_LOGICAL_NAME] = roles.context
    if roles.expert:
        rules[EXPERT_LOGICAL_NAME] = roles.expert
        rules[GROUPS_LOGICAL_NAME] = tuple(a for a in roles.batch if a not in roles.expert)
    return rules


def strategies_using(axis: str, mesh) -> list[str]:
    """The data-parallel and tensor-parallel presets that lay something out over mesh axis `axis`:
    the batch, parameters (FSDP) or the tensor-parallel split."""
    return [
        strategy
        for strategy in ("dp", "fsdp", "dp+tp")
        if axis in set().union(*(vars(_roles(strategy, mesh)).values()))
    ]


def _not_dividing(strategy: str, inputs: list[str], axes, mesh, whole: str, advice: str) -> str:
    """The warning for batch inputs that do not divide over `axes`, which so hold them whole."""
    pieces = ways(mesh, axes)
    return (
        f"--strategy {strategy}: {listing(inputs)} do not divide over {'+'.join(axes)} ({pieces} "
        f"ways): every rank holds the whole {whole}; use a {advice.format(pieces)}"
    )


def apply_preset(
    strategy: str,
    inputs: list[Input],
    mesh,
    declared: Mapping[str, int | None],
    experts: Mapping[str, int] | None = None,
) -> tuple[dict[str, tuple[str, ...]], list[str], set[str]]:
    """Lay every input out by `strategy`; return its logical rules, its warnings and the mesh axes
    it meant to split the batch over but could not (a warning says so)."""
    if strategy not in STRATEGIES:
        raise FlintError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    roles = _roles(strategy, mesh)
    rules = _preset_rules(roles)
    stacked, width = _stacked([(item.path, item.shape, item.in_batch) for item in inputs])
    own = {
        item.path: _own_split(model_spec(item.leaf, rules, mesh.axis_names), roles)
        for item in inputs
        if item.origin == "model"
    }
    plan = _Plan(roles, mesh, width, stacked, declared, own, dict(experts or {}))
    for item in inputs:
        item.spec = _preset_spec(item, plan)
        item.origin = f"strategy {strategy}"
    warnings = []
    if plan.ambiguous:
        warnings.append(
            f"--strategy {strategy}: {listing(plan.ambiguous)} start and end with the model width "
            f"D = {width}, so shape cannot tell column- from row-parallel: split as column-parallel "
            "(the dimension after the first D); declare the split in the model (its own sharding, "
            "logical names or tp_plan) or give --shard PATTERN=SPEC"
        )
    if roles.expert and not any(
        axis in dim for item in inputs if not item.in_batch for dim in item.spec for axis in roles.expert
    ):
        warnings.append(
            f"--strategy {strategy}: no weight is split over the expert axis {roles.expert[0]}: no "
            "parameters under one path ('/'-separated: PyTorch's dotted names form no group) share "
            "a first dimension of experts, and the model declares no expert split; every rank holds "
            "every weight: declare the split (an ep_plan, or --shard PATTERN=SPEC)"
        )
    if plan.whole_batch:
        warnings.append(_not_dividing(
            strategy, plan.whole_batch, roles.batch, mesh, "batch",
            "batch divisible by {}, or a mesh whose batch axes divide it",
        ))
    if plan.whole_sequence:
        warnings.append(_not_dividing(
            strategy, plan.whole_sequence, roles.context, mesh, "sequence", "sequence divisible by {}"
        ))
    meant = (set(roles.batch) if plan.whole_batch else set()) | (
        set(roles.context) if plan.whole_sequence else set()
    )
    return rules, warnings, meant

"""The presets of `--strategy`: complete layouts derived from the inputs' shapes and positions.

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

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from flint.errors import FlintError
from flint.layout.inputs import Input, Layout
from flint.layout.request import Spec
from flint.mesh import axis_named, tensor_axis, ways

STRATEGIES = ("dp", "fsdp", "tp", "dp+tp", "fsdp+tp", "tp+sp", "dp+tp+sp", "ep")
EXPERT_AXIS_NAMES = ("expert", "ep")
TP_LOGICAL_NAMES = ("vocab", "heads", "mlp")
SEQUENCE_LOGICAL_NAME = "seq"
EXPERT_LOGICAL_NAME, GROUPS_LOGICAL_NAME = "expert", "groups"


@dataclass(frozen=True)
class _Roles:
    batch: tuple[str, ...]
    fsdp: tuple[str, ...]
    tensor: tuple[str, ...]
    sequence: tuple[str, ...]
    expert: tuple[str, ...] = ()


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


def _model_width(inputs: list[Input], stacked: set[str]) -> int | None:
    sizes: Counter[int] = Counter()
    for item in inputs:
        if item.in_batch:
            sizes.update(item.shape[-1:])
        else:
            sizes.update(item.shape[1:] if item.path in stacked else item.shape)
    if not sizes:
        return None
    return min(sizes, key=lambda size: (-sizes[size], size))


def _tensor_split(item: Input, dims: list[int], width, declared: Mapping[str, int | None]) -> int | None:
    """The dimension tensor parallelism splits: the model's declared one, else by shape."""
    if item.path in declared:
        return declared[item.path]
    if len(dims) < 2:
        return None
    shape = [item.shape[d] for d in dims]
    return dims[1] if shape[0] == width else dims[0] if shape[-1] == width else None


def _preset_spec(
    item: Input, roles: _Roles, mesh, width, stacked: set[str], declared: Mapping[str, int | None]
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


def apply_preset(
    strategy: str, inputs: list[Input], mesh, declared: Mapping[str, int | None]
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

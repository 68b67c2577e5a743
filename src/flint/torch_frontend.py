"""Stage 1 for PyTorch: a model file defining an `nn.Module` becomes the same `Workload` as a JAX one.

A PyTorch model file defines (see `examples/torch_mlp.py`, `examples/torch_gpt.py`)::

    def model() -> nn.Module: ...          # built by Flint under torch.device("meta"): no weights
    def example_inputs() -> dict: ...      # the batch, name -> tensor (also built on "meta")
    def loss_fn(model, batch): ...         # optional: a scalar loss; present -> training step
    def forward(model, batch): ...         # optional: the inference output (default model(**batch))
    optimizer = "adamw"                    # or "sgd" (training step only)
    optimizer_options = {"lr": 3e-4}       # optional, see OPTIMIZER_DEFAULTS
    tp_plan = {"layers.*.fc1": "colwise"}  # optional, PyTorch's tensor-parallel idiom
    mode = "train"                         # or "forward" (default: "train" when loss_fn exists)

The training step is `step(params, opt, batch) -> (params, opt, loss)` (SGD: no `opt`) and the
inference step `step(params, batch) -> output`; a model with buffers gets a `buffers` argument
before `batch`. Inputs are named by module path: `params/layers.0.fc1.weight`, `opt/m/...`,
`opt/v/...`, `opt/count`, `batch/x`, so `--shard`, `--strategy` and `--rule` work as for JAX models.

The model's own layout, used without `--strategy`/`--shard`: every batch input split along its
first dimension over the data axes (every mesh axis but the tensor axis), and the modules of
`tp_plan` split Megatron style over the tensor axis (the one named `tensor`, `tp` or `model`, else
the last; a 1-D mesh is all data). Presets follow `tp_plan` for the weights it names, since square
weights (q, k, v and output projections are all [D, D]) cannot be told apart by shape.

Integer batch inputs cross into JAX as int32 (JAX's default width) and are cast back to the
example's dtype before the model sees them; int64 outputs leave as int32.
"""

from __future__ import annotations

import fnmatch
import inspect
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flint.errors import FlintError
from flint.layout import TENSOR_AXIS_NAMES
from flint.torch_bridge import require_torch, to_exported, trace_to_stablehlo

MODEL_ENTRY, INPUTS_ENTRY = "model", "example_inputs"
OPTIMIZER_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "sgd": {"lr": 0.01},
    "adamw": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
}
PLAN_STYLES = ("colwise", "rowwise")


def is_torch_model(module) -> bool:
    """A model file following the PyTorch convention (and not the JAX one)."""
    return not hasattr(module, "workload") and callable(getattr(module, MODEL_ENTRY, None))


@dataclass(frozen=True)
class TorchModel:
    """What a PyTorch model file declares, with the module and batch on the meta device."""

    module: Any
    batch: Mapping[str, Any]
    loss_fn: Callable | None
    forward: Callable | None
    optimizer: str
    optimizer_options: Mapping[str, Any]
    tp_plan: Mapping[str, str] = field(default_factory=dict)

    @property
    def training(self) -> bool:
        return self.loss_fn is not None


# ------------------------------------------------------------------------------ the convention


def _call(module, name: str, path: Path, where: Callable[[BaseException, Path], str]):
    import torch

    try:
        with torch.device("meta"):
            return getattr(module, name)()
    except Exception as exc:
        raise FlintError(
            f"{path.name}: {name}() raised {type(exc).__name__} at {where(exc, path)}: {exc}"
        ) from exc


def read_model(module, path: Path, where) -> TorchModel:
    """The declarations of a PyTorch model file, checked."""
    import torch

    if not callable(getattr(module, INPUTS_ENTRY, None)):
        raise FlintError(
            f"{path.name} defines model() but no {INPUTS_ENTRY}(): add one returning the batch as "
            "{name: tensor} (see examples/torch_mlp.py)"
        )
    net = _call(module, MODEL_ENTRY, path, where)
    if not isinstance(net, torch.nn.Module):
        raise FlintError(f"{path.name}: model() must return a torch.nn.Module, got {type(net).__name__}")
    batch = _call(module, INPUTS_ENTRY, path, where)
    if not isinstance(batch, Mapping) or not all(isinstance(t, torch.Tensor) for t in batch.values()):
        raise FlintError(f"{path.name}: {INPUTS_ENTRY}() must return a dict of name -> torch.Tensor")
    loss_fn = getattr(module, "loss_fn", None)
    mode = getattr(module, "mode", "train" if loss_fn else "forward")
    if mode not in ("train", "forward") or (mode == "train" and loss_fn is None):
        raise FlintError(
            f"{path.name}: mode = {mode!r}: use 'forward', or 'train' with a loss_fn(model, batch)"
        )
    optimizer = getattr(module, "optimizer", "adamw")
    if optimizer not in OPTIMIZER_DEFAULTS:
        raise FlintError(
            f"{path.name}: optimizer = {optimizer!r}: choose one of {', '.join(OPTIMIZER_DEFAULTS)}"
        )
    options = dict(OPTIMIZER_DEFAULTS[optimizer])
    unknown = set(getattr(module, "optimizer_options", {})) - set(options)
    if unknown:
        raise FlintError(
            f"{path.name}: unknown {optimizer} option {sorted(unknown)[0]!r} (use {', '.join(options)})"
        )
    options.update(getattr(module, "optimizer_options", {}))
    return TorchModel(
        module=net,
        batch=dict(batch),
        loss_fn=loss_fn if mode == "train" else None,
        forward=getattr(module, "forward", None),
        optimizer=optimizer,
        optimizer_options=options,
        tp_plan=dict(getattr(module, "tp_plan", {})),
    )


# ------------------------------------------------------------------------------ tensor parallelism


def plan_dims(net, plan: Mapping[str, str], path: Path) -> dict[str, int | None]:
    """Parameter name -> the dimension the tensor axis splits (None: replicated), from `plan`.

    As in `torch.distributed.tensor.parallel`: a column-wise `nn.Linear` splits its output features
    (weight [out, in] dimension 0, and the bias), a row-wise one its input features (weight
    dimension 1, bias whole); a column-wise `nn.Embedding` splits the embedding dimension, a
    row-wise one the vocabulary. Module names match by `fnmatch` (`layers.*.fc1`).
    """
    import torch

    dims: dict[str, int | None] = {}
    modules = dict(net.named_modules())
    for pattern, style in plan.items():
        if style not in PLAN_STYLES:
            raise FlintError(f"{path.name}: tp_plan[{pattern!r}] = {style!r}: use colwise or rowwise")
        matched = [name for name in modules if name and fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            raise FlintError(f"{path.name}: tp_plan entry {pattern!r} matches no module of model()")
        for name in matched:
            layer = modules[name]
            if isinstance(layer, torch.nn.Linear):
                weight, bias = (0, 0) if style == "colwise" else (1, None)
            elif isinstance(layer, torch.nn.Embedding):
                weight, bias = (1 if style == "colwise" else 0), None
            else:
                raise FlintError(
                    f"{path.name}: tp_plan entry {pattern!r} matches {name}, a "
                    f"{type(layer).__name__}: only nn.Linear and nn.Embedding can be split"
                )
            dims[f"{name}.weight"] = weight
            if getattr(layer, "bias", None) is not None:
                dims[f"{name}.bias"] = bias
    return dims


def _mesh_roles(mesh) -> tuple[tuple[str, ...], str | None]:
    """(data axes, tensor axis) of the model's own layout."""
    names = tuple(mesh.axis_names)
    if len(names) == 1:
        return names, None
    named = [n for n in names if n in TENSOR_AXIS_NAMES]
    tensor = named[0] if named else names[-1]
    return tuple(n for n in names if n != tensor), tensor


# ------------------------------------------------------------------------------ the step


def _jax_dtype(dtype):
    import jax.numpy as jnp

    return jnp.dtype(str(dtype).removeprefix("torch."))


def _boundary_dtype(dtype):
    """The dtype a tensor has on the JAX side of the step (int64 -> int32)."""
    import torch

    return torch.int32 if dtype == torch.int64 else dtype


def _adamw(params, grads, opt, lr, betas, eps, weight_decay):
    """AdamW with f32 moments and decoupled weight decay; parameters updated in f32, rounded once."""
    import torch

    count = opt["count"] + 1
    step = count.to(torch.float32)
    correct1, correct2 = 1.0 - betas[0] ** step, 1.0 - betas[1] ** step
    m, v, new = {}, {}, {}
    for name, p in params.items():
        g = grads[name].to(torch.float32)
        m[name] = betas[0] * opt["m"][name] + (1.0 - betas[0]) * g
        v[name] = betas[1] * opt["v"][name] + (1.0 - betas[1]) * g * g
        pf = p.to(torch.float32)
        delta = (m[name] / correct1) / (torch.sqrt(v[name] / correct2) + eps) + weight_decay * pf
        new[name] = (pf - lr * delta).to(p.dtype)
    return new, {"m": m, "v": v, "count": count}


def _torch_step(spec: TorchModel, batch_dtypes: Mapping[str, Any]):
    """The step as torch code, over {argument name: dict of tensors}."""
    import torch
    from torch.func import functional_call

    class Objective(torch.nn.Module):
        """Runs the user's loss or forward with `model` as a submodule, for `functional_call`."""

        def __init__(self, net, fn):
            super().__init__()
            self.model, self.fn = net, fn

        def forward(self, batch):
            return self.fn(self.model, batch)

    forward = spec.forward or (lambda net, batch: net(**batch))
    objective = Objective(spec.module, spec.loss_fn or forward)

    def run(params, args):
        state = {f"model.{k}": v for k, v in {**params, **args.get("buffers", {})}.items()}
        batch = {name: t.to(batch_dtypes[name]) for name, t in args["batch"].items()}
        return functional_call(objective, state, (batch,))

    def infer(args):
        out = run(args["params"], args)
        return out.to(torch.int32) if out.dtype == torch.int64 else out

    def train(args):
        params = {name: p.detach().requires_grad_(True) for name, p in args["params"].items()}
        with torch.enable_grad():
            loss = run(params, args)
            grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        grads = {
            name: torch.zeros_like(p) if g is None else g for (name, p), g in zip(params.items(), grads)
        }
        params = {name: p.detach() for name, p in params.items()}
        options = spec.optimizer_options
        if spec.optimizer == "sgd":
            return {name: p - options["lr"] * grads[name] for name, p in params.items()}, loss.detach()
        new, opt = _adamw(params, grads, args["opt"], **options)
        return new, opt, loss.detach()

    return train if spec.training else infer


def _abstract_args(spec: TorchModel) -> tuple[list[str], list[dict]]:
    """(argument names, argument trees of torch meta tensors) of the step."""
    import torch

    params = dict(spec.module.named_parameters())
    names, trees = ["params"], [params]
    buffers = dict(spec.module.named_buffers())
    if buffers:
        names.append("buffers")
        trees.append(buffers)
    if spec.training and spec.optimizer == "adamw":
        moments = {n: torch.empty(p.shape, dtype=torch.float32, device="meta") for n, p in params.items()}
        names.append("opt")
        trees.append({"m": moments, "v": dict(moments), "count": torch.empty((), dtype=torch.int32, device="meta")})
    names.append("batch")
    trees.append({n: torch.empty(t.shape, dtype=_boundary_dtype(t.dtype), device="meta") for n, t in spec.batch.items()})
    return names, trees


def _signed(step: Callable, names: list[str]) -> Callable:
    """`step` with a signature naming its arguments, which name the inputs' paths."""
    step.__signature__ = inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_ONLY) for name in names]
    )
    return step


def build_step(spec: TorchModel, path: Path, where) -> tuple[Callable, list[str], tuple]:
    """(JAX step calling the traced torch step, argument names, abstract argument trees)."""
    import jax
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    names, trees = _abstract_args(spec)
    leaves, args_tree = jax.tree_util.tree_flatten(tuple(trees))
    with FakeTensorMode():  # on the CPU: torch-mlir lowers no "meta" device placements
        inputs = [torch.empty(t.shape, dtype=t.dtype) for t in leaves]
    step = _torch_step(spec, {n: t.dtype for n, t in spec.batch.items()})
    out_tree: list = []

    def flat(*tensors):
        args = dict(zip(names, jax.tree_util.tree_unflatten(args_tree, tensors)))
        leaves, tree = jax.tree_util.tree_flatten(step(args))
        out_tree.append(tree)
        return tuple(leaves)

    traced = _trace(flat, inputs, path, where)
    aval = lambda shape, dtype: jax.core.ShapedArray(shape, _jax_dtype(dtype))  # noqa: E731
    exported = to_exported(
        traced.stablehlo,
        [aval(tuple(t.shape), t.dtype) for t in leaves],
        [aval(shape, dtype) for shape, dtype in traced.out_shapes],
        jax.tree_util.tree_structure((tuple(jax.tree_util.tree_unflatten(args_tree, leaves)), {})),
        out_tree[0],
    )
    return _signed(lambda *args: exported.call(*args), names), names, tuple(trees)


def _trace(flat, inputs, path: Path, where):
    try:
        return trace_to_stablehlo(flat, inputs)
    except Exception as exc:
        if _data_dependent(exc):
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
            code = f" '{frames[-1].line}'" if frames and frames[-1].line else ""
            raise FlintError(
                f"{path.name}: data-dependent control flow at {where(exc, path)}{code}: torch.export "
                "cannot branch on a tensor's value; use torch.where or torch.cond"
            ) from exc
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise FlintError(
            f"{path.name}: torch cannot export the step: {type(exc).__name__} at {where(exc, path)}: "
            f"{message}"
        ) from exc


def _data_dependent(exc: BaseException) -> bool:
    from torch._subclasses.fake_tensor import DataDependentOutputException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    return isinstance(exc, (DataDependentOutputException, GuardOnDataDependentSymNode))


# ------------------------------------------------------------------------------ the workload


def _tensor_parallel(names: list[str], dims: Mapping[str, int | None]) -> dict[str, int | None]:
    """Input path -> planned tensor-parallel dimension, for parameters and their moments."""
    prefixes = ["params"] + (["opt/m", "opt/v"] if "opt" in names else [])
    return {f"{prefix}/{name}": dim for prefix in prefixes for name, dim in dims.items()}


def load_torch_workload(module, path: Path, mesh, where):
    """The `Workload` of a PyTorch model file: the traced step, its inputs and the model's layout."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from flint.frontend import Workload

    require_torch(path.name)
    spec = read_model(module, path, where)
    step, names, trees = build_step(spec, path, where)
    declared = _tensor_parallel(names, plan_dims(spec.module, spec.tp_plan, path))
    data, tensor = _mesh_roles(mesh)
    ways = 1
    for axis in data:
        ways *= mesh.shape[axis]

    def abstract(keypath, t):
        shape = tuple(t.shape)
        input_path = "/".join([names[keypath[0].idx], *(str(k.key) for k in keypath[1:])])
        entries = [None] * len(shape)
        if input_path.startswith("batch/") and shape and shape[0] % ways == 0:
            entries[0] = data
        if tensor is not None and declared.get(input_path) is not None:
            entries[declared[input_path]] = tensor
        sharding = NamedSharding(mesh, P(*entries))
        return jax.ShapeDtypeStruct(shape, _jax_dtype(t.dtype), sharding=sharding)

    args = jax.tree_util.tree_map_with_path(abstract, trees)
    return Workload(
        name=path.stem, path=path, step=step, args=tuple(args), tensor_parallel=declared
    )

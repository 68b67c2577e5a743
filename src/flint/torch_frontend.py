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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flint.errors import FlintError
from flint.layout import input_path, tensor_axis, ways
from flint.torch_bridge import require_torch
from flint.torch_step import build_step, jax_dtype

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
    tensor = tensor_axis(names)
    return tuple(n for n in names if n != tensor), tensor


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
    data_ways = ways(mesh, data)

    def abstract(keypath, t):
        shape = tuple(t.shape)
        path = input_path(names, keypath)
        entries = [None] * len(shape)
        if path.startswith("batch/") and shape and shape[0] % data_ways == 0:
            entries[0] = data
        if tensor is not None and declared.get(path) is not None:
            entries[declared[path]] = tensor
        sharding = NamedSharding(mesh, P(*entries))
        return jax.ShapeDtypeStruct(shape, jax_dtype(t.dtype), sharding=sharding)

    args = jax.tree_util.tree_map_with_path(abstract, trees)
    return Workload(
        name=path.stem, path=path, step=step, args=tuple(args), tensor_parallel=declared
    )

"""The PyTorch model-file convention: what a file defining an `nn.Module` declares, read and checked.

A PyTorch model file defines (see `examples/torch_mlp.py`, `examples/torch_gpt.py`)::

    def model() -> nn.Module: ...          # built by Flint under torch.device("meta"): no weights
    def example_inputs() -> dict: ...      # the batch, name -> tensor (also built on "meta")
    def loss_fn(model, batch): ...         # optional: a scalar loss; present -> training step
    def forward(model, batch): ...         # optional: the inference output (default model(**batch))
    optimizer = "adamw"                    # or "sgd" (training step only)
    optimizer_options = {"lr": 3e-4}       # optional, see OPTIMIZER_DEFAULTS
    tp_plan = {"layers.*.fc1": "colwise"}  # optional, PyTorch's tensor-parallel idiom (default:
                                           # a transformers model's own `tp_plan`)
    mode = "train"                         # or "forward" (default: "train" when loss_fn exists)

The training step is `step(params, opt, batch) -> (params, opt, loss)` (SGD: no `opt`) and the
inference step `step(params, batch) -> output`; a model with buffers gets a `buffers` argument
before `batch`. Inputs are named by module path: `params/layers.0.fc1.weight`, `opt/m/...`,
`opt/v/...`, `opt/count`, `batch/x`, so `--shard`, `--strategy` and `--rule` work as for JAX models.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flint.errors import FlintError

MODEL_ENTRY, INPUTS_ENTRY = "model", "example_inputs"
OPTIMIZER_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "sgd": {"lr": 0.01},
    "adamw": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
}
# Tensor-parallel styles, PyTorch's and Hugging Face's (`config.base_model_tp_plan`), by what they
# split in a weight: its output features ("colwise"), its input features ("rowwise"), or nothing
# (None: replicated; gradients are reduced over the tensor axis). How a style lays out activations
# (gathering an output, splitting an input) is the partitioner's to derive from the weights.
PLAN_STYLES: Mapping[str, str | None] = {
    **dict.fromkeys(
        ("colwise", "colwise_rep", "colwise_gather_output", "packed_colwise", "embedding_colwise"),
        "colwise",
    ),
    **dict.fromkeys(
        ("rowwise", "rowwise_rep", "rowwise_split_input", "packed_rowwise", "embedding_rowwise"),
        "rowwise",
    ),
    **dict.fromkeys(
        ("replicated_with_grad_allreduce", "replicate", "all_reduce", "sequence_parallel", "local",
         "local_params"),
        None,
    ),
}


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
        tp_plan=dict(_own_plan(net) if getattr(module, "tp_plan", None) is None else module.tp_plan),
    )


def _own_plan(net) -> Mapping[str, str]:
    """A `transformers` model's tensor-parallel plan (its `tp_plan`, keys from the model's root)."""
    plan = getattr(net, "tp_plan", None)
    return plan if isinstance(plan, Mapping) else {}

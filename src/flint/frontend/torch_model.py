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
    ep_plan = {"layers.*.experts.w": "grouped_gemm"}  # optional, experts split over an axis named
                                           # `ep` or `expert` (default: the model's own `ep_plan`)
    mode = "train"                         # or "forward" (default: "train" when loss_fn exists)

The model's knobs (layers, batch size, a decode or prefill phase) are keyword arguments of `model()`
and `example_inputs()`: `flint extract --model-arg NAME=VALUE` passes each to whichever of the two
names it (or takes `**kwargs`), as it passes a JAX file's to `workload(mesh, ...)`; a name neither
takes is refused before anything runs. `--model-arg mode=forward` (or `train`) replaces the file's
`mode`, so one file gives its training and its inference step.

The training step is `step(params, opt, batch) -> (params, opt, loss)` (SGD: no `opt`) and the
inference step `step(params, batch) -> output`; a model with buffers gets a `buffers` argument
before `batch`. Inputs are named by module path: `params/layers.0.fc1.weight`, `opt/m/...`,
`opt/v/...`, `opt/count`, `batch/x`, so `--shard`, `--strategy` and `--rule` work as for JAX models.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flint.errors import FlintError

MODEL_ENTRY, INPUTS_ENTRY, MODE = "model", "example_inputs", "mode"
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
# Styles of a module that split none of its parameters: they name the communication around a
# mixture-of-experts block (`moe_tp_experts`: every rank runs its shard of every expert and the
# outputs are summed; `ep_dispatch_experts`: tokens are sent to the ranks holding their experts),
# which the partitioner derives from the parameters' splits, as for the styles above. The stacked
# experts' own entries (`gate_up_proj`, `down_proj`) say what is split.
MODULE_STYLES = ("moe_tp_experts", "ep_dispatch_experts", "moe_identity_expert")
# Expert-parallel styles (`config.base_model_ep_plan`), by the dimension they split over the expert
# axis: `grouped_gemm` splits stacked experts' weights [E, ...] by expert.
EP_STYLES: Mapping[str, int] = {"grouped_gemm": 0}


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
    ep_plan: Mapping[str, str] = field(default_factory=dict)
    own_plans: frozenset[str] = frozenset()
    """Which of "tp_plan" and "ep_plan" are the model's own (a `transformers` config's), whose
    entries may name modules this configuration lacks (Qwen3-MoE's names the dense MLP of its
    `mlp_only_layers`)."""

    @property
    def training(self) -> bool:
        return self.loss_fn is not None


# ------------------------------------------------------------------------------ the convention


def _takes(entry: Callable, name: str) -> bool:
    """Whether `entry` accepts a keyword argument `name`."""
    params = inspect.signature(entry).parameters.values()
    return any((p.name == name and p.kind != p.POSITIONAL_ONLY) or p.kind == p.VAR_KEYWORD for p in params)


def arguments_for(entry: Callable, model_args: Mapping[str, Any]) -> dict[str, Any]:
    """The model arguments `entry` (`model` or `example_inputs`) takes: each argument goes to
    whichever of the two names it."""
    return {arg: value for arg, value in model_args.items() if _takes(entry, arg)}


def _check_model_args(module, path: Path, model_args: Mapping[str, Any]) -> None:
    """Refuse, before anything runs, a model argument that neither model() nor example_inputs() takes."""
    entries = [getattr(module, name) for name in (MODEL_ENTRY, INPUTS_ENTRY)]
    for arg in sorted(set(model_args) - {MODE}):
        if not any(_takes(entry, arg) for entry in entries):
            names = [p for entry in entries for p in inspect.signature(entry).parameters]
            takes = f"they take {', '.join(dict.fromkeys(names))}" if names else "they take none"
            raise FlintError(
                f"{path.name}: neither {MODEL_ENTRY}() nor {INPUTS_ENTRY}() has a model argument {arg!r}: {takes}"
            )


def _call(module, name: str, path: Path, where: Callable[[BaseException, Path], str], model_args):
    import torch

    entry = getattr(module, name)
    try:
        with torch.device("meta"):
            return entry(**arguments_for(entry, model_args))
    except Exception as exc:
        raise FlintError(
            f"{path.name}: {name}() raised {type(exc).__name__} at {where(exc, path)}: {exc}"
        ) from exc


def read_model(module, path: Path, where, model_args: Mapping[str, Any] | None = None) -> TorchModel:
    """The declarations of a PyTorch model file, checked, built with the given model arguments."""
    import torch

    model_args = dict(model_args or {})
    if not callable(getattr(module, INPUTS_ENTRY, None)):
        raise FlintError(
            f"{path.name} defines model() but no {INPUTS_ENTRY}(): add one returning the batch as "
            "{name: tensor} (see examples/torch_mlp.py)"
        )
    _check_model_args(module, path, model_args)
    net = _call(module, MODEL_ENTRY, path, where, model_args)
    if not isinstance(net, torch.nn.Module):
        raise FlintError(f"{path.name}: model() must return a torch.nn.Module, got {type(net).__name__}")
    batch = _call(module, INPUTS_ENTRY, path, where, model_args)
    if not isinstance(batch, Mapping) or not all(isinstance(t, torch.Tensor) for t in batch.values()):
        raise FlintError(f"{path.name}: {INPUTS_ENTRY}() must return a dict of name -> torch.Tensor")
    loss_fn = getattr(module, "loss_fn", None)
    mode = model_args.get(MODE, getattr(module, MODE, "train" if loss_fn else "forward"))
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
        tp_plan=dict(_own_plan(net, "tp_plan") if getattr(module, "tp_plan", None) is None else module.tp_plan),
        ep_plan=dict(_own_plan(net, "ep_plan") if getattr(module, "ep_plan", None) is None else module.ep_plan),
        own_plans=frozenset(name for name in ("tp_plan", "ep_plan") if getattr(module, name, None) is None),
    )


def _own_plan(net, name: str) -> Mapping[str, str]:
    """A `transformers` model's tensor- or expert-parallel plan (its `tp_plan` or `ep_plan`, keys
    from the model's root)."""
    plan = getattr(net, name, None)
    return plan if isinstance(plan, Mapping) else {}

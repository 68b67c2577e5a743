"""The training or inference step of a PyTorch model file, as torch code and as a JAX callable.

Flint writes the step around the user's module: `functional_call` runs it with the parameters
passed in (so they are step inputs, never constants), torch's autograd gives the gradients, and
SGD or AdamW updates the parameters. `build_step` traces it with `flint.frontend.torch_bridge` and returns a
JAX function over the same argument trees, which the JAX pipeline partitions like its own steps.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flint.errors import FlintError
from flint.frontend.torch_bridge import LoweringError, to_exported, trace_to_stablehlo
from flint.frontend.torch_experts import dense_experts
from flint.frontend.torch_model import TorchModel


def jax_dtype(dtype):
    """The JAX dtype of a torch dtype: they share names (float32, bfloat16, int32, bool)."""
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


def _tensors(value):
    """The output of a forward as plain containers of tensors.

    A `transformers` output object (a `ModelOutput`, a mapping of its non-None fields) becomes a
    dict, and its key/value cache the per-layer `keys` and `values` tensors it holds.
    """
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, Mapping):
        return {name: _tensors(v) for name, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_tensors(v) for v in value]
    layers = getattr(value, "layers", None)
    if isinstance(layers, list) and all(hasattr(layer, "keys") and hasattr(layer, "values") for layer in layers):
        return {"keys": [layer.keys for layer in layers], "values": [layer.values for layer in layers]}
    raise FlintError(
        f"the model's output holds an object of type {type(value).__name__}: return tensors (in dicts, "
        "lists or tuples) from forward(model, batch)"
    )


def _loss(value):
    """The scalar loss of `loss_fn`'s result: a tensor, or the `loss` of a `transformers` output."""
    import torch

    loss = value.get("loss") if isinstance(value, Mapping) else value
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise FlintError(
            f"loss_fn(model, batch) returned an object of type {type(value).__name__} without a scalar loss: "
            "return the loss (a transformers model computes one when the batch has labels)"
        )
    return loss


def packed_shape(shape: tuple[int, ...], dim: int) -> tuple[int, ...]:
    """The shape a parameter packing two parts along `dim` has as a step input: that dimension
    as (2, size / 2), so that splitting the second of them splits each part alike."""
    return (*shape[:dim], 2, shape[dim] // 2, *shape[dim + 1 :])


def _torch_step(spec: TorchModel, dtypes: Mapping[str, Mapping[str, Any]]):
    """The step as torch code, over {argument name: dict of tensors}; `dtypes` are the model's own
    dtypes of the batch and buffers, which cross as int32 where they are int64."""
    import jax
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
        # Copies: a module updating its buffers in place (BatchNorm's running statistics) updates
        # these, not the step's inputs, which the step never returns.
        own = {
            arg: {name: t.to(dtypes[arg][name], copy=True) for name, t in args[arg].items()}
            for arg in ("batch", "buffers") if arg in args
        }
        state = {f"model.{k}": v for k, v in {**params, **own.get("buffers", {})}.items()}
        return functional_call(objective, state, (own["batch"],))

    def infer(args):
        narrow = lambda t: t.to(torch.int32) if t.dtype == torch.int64 else t  # noqa: E731
        return jax.tree_util.tree_map(narrow, _tensors(run(args["params"], args)))

    def train(args):
        params = {name: p.detach().requires_grad_(True) for name, p in args["params"].items()}
        with torch.enable_grad():
            loss = _loss(run(params, args))
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


def _abstract_args(spec: TorchModel, packed: Mapping[str, int]) -> tuple[list[str], list[dict]]:
    """(argument names, argument trees of torch meta tensors) of the step; `packed` parameters
    (name -> packed dimension) as `packed_shape`."""
    import torch

    params = {
        name: torch.empty(packed_shape(tuple(p.shape), packed[name]), dtype=p.dtype, device="meta")
        if name in packed else p
        for name, p in spec.module.named_parameters()
    }
    names, trees = ["params"], [params]
    buffers = dict(spec.module.named_buffers())
    if buffers:
        names.append("buffers")
        trees.append({n: torch.empty(t.shape, dtype=_boundary_dtype(t.dtype), device="meta") for n, t in buffers.items()})
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


def build_step(
    spec: TorchModel, path: Path, where, packed: Mapping[str, int] | None = None
) -> tuple[Callable, list[str], tuple]:
    """(JAX step calling the traced torch step, argument names, abstract argument trees); the
    `packed` parameters (name -> the dimension packing two parts), weights of experts modules
    (`torch_experts`, which read them so), are inputs of `packed_shape`."""
    import jax
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    packed = dict(packed or {})
    names, trees = _abstract_args(spec, packed)
    leaves, args_tree = jax.tree_util.tree_flatten(tuple(trees))
    with FakeTensorMode():  # on the CPU: torch-mlir lowers no "meta" device placements
        inputs = [torch.empty(t.shape, dtype=t.dtype) for t in leaves]
    spec.module.train(spec.training)  # inference runs in eval mode: no dropout, BatchNorm's running stats
    dense = dense_experts(spec.module)  # mixture-of-experts blocks with static shapes (torch_experts)
    if any(name.rpartition(".")[0] not in dense for name in packed):
        raise FlintError(f"{path.name}: only experts' weights are packed: {sorted(packed)}")
    own = {"batch": spec.batch, "buffers": dict(spec.module.named_buffers())}
    step = _torch_step(spec, {arg: {n: t.dtype for n, t in tensors.items()} for arg, tensors in own.items()})
    out_tree: list = []

    def flat(*tensors):
        args = dict(zip(names, jax.tree_util.tree_unflatten(args_tree, tensors)))
        leaves, tree = jax.tree_util.tree_flatten(step(args))
        out_tree.append(tree)
        return tuple(leaves)

    traced = _trace(flat, inputs, path, where)
    aval = lambda shape, dtype: jax.core.ShapedArray(shape, jax_dtype(dtype))  # noqa: E731
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
    except FlintError as exc:
        raise FlintError(f"{path.name}: {exc}") from exc
    except LoweringError as exc:
        if exc.op is None:
            raise FlintError(f"{path.name}: torch-mlir cannot lower the step to StableHLO: {exc}") from exc
        at = f" (at {exc.source})" if exc.source else ""
        raise FlintError(
            f"{path.name}: torch-mlir cannot lower {exc.op}{at} to StableHLO: write that part of the "
            "model with other torch ops"
        ) from exc
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

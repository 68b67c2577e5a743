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
from flint.frontend.torch_bridge import to_exported, trace_to_stablehlo
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


def _torch_step(spec: TorchModel, batch_dtypes: Mapping[str, Any]):
    """The step as torch code, over {argument name: dict of tensors}."""
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
        state = {f"model.{k}": v for k, v in {**params, **args.get("buffers", {})}.items()}
        batch = {name: t.to(batch_dtypes[name]) for name, t in args["batch"].items()}
        return functional_call(objective, state, (batch,))

    def infer(args):
        narrow = lambda t: t.to(torch.int32) if t.dtype == torch.int64 else t  # noqa: E731
        return jax.tree_util.tree_map(narrow, run(args["params"], args))

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

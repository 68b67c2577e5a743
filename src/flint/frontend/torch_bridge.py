"""PyTorch to JAX: a traced torch function becomes a JAX-callable StableHLO module for one device.

The route, all of it maintained code (no table of ATen ops here):

1. `make_fx` traces the function over fake tensors (shapes and dtypes, no storage), running torch's
   own autograd, so a training step's backward is a plain ATen graph;
2. `torch.export` re-exports that graph and torch-mlir's FX importer lowers it to StableHLO, with
   every tensor argument a function argument (parameters included: they must stay shardable);
3. the text is parsed in jaxlib's MLIR context, the few `arith.constant`s torch-mlir leaves among
   the StableHLO ops become `stablehlo.constant`s (a portable artifact admits only stable
   dialects), and the module is wrapped as a 1-device
   `jax.export.Exported`. Calling it under `jax.jit` with sharded arguments lets XLA partition the
   module like any JAX step, so the later stages are the JAX path's, unchanged.

Text, not bytecode, crosses from torch-mlir's MLIR to jaxlib's: each wheel bundles its own MLIR and
StableHLO builds, whose bytecode versions need not agree, while the textual form of the ops used
here is stable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flint.errors import FlintError

TORCH_MODULES = ("torch", "torch_mlir")


def missing_torch(model: str, module: str) -> FlintError:
    """The one-line error for a PyTorch model file without the `torch` extra installed."""
    return FlintError(
        f"{model} is a PyTorch model and {module} is not installed: pip install 'flint-traces[torch]'"
    )


def require_torch(model: str) -> None:
    """Fail with `missing_torch` unless both torch and torch-mlir can be imported."""
    import importlib.util

    for module in TORCH_MODULES:
        if importlib.util.find_spec(module) is None:
            raise missing_torch(model, module)


@dataclass(frozen=True)
class TracedStep:
    """A torch function over a flat list of tensors, traced into StableHLO text."""

    stablehlo: str
    out_shapes: tuple[tuple[tuple[int, ...], Any], ...]


def trace_to_stablehlo(fn: Callable[..., Sequence[Any]], inputs: Sequence[Any]) -> TracedStep:
    """StableHLO of `fn(*inputs)`; `inputs` are fake tensors and `fn` returns a flat tuple."""
    import warnings

    import torch
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch_mlir import fx

    with warnings.catch_warnings():  # torch's deprecation notices are not the user's business
        warnings.simplefilter("ignore")
        graph = make_fx(fn, tracing_mode="fake")(*inputs)
        outputs = [node.meta["val"] for node in graph.graph.find_nodes(op="output")[0].all_input_nodes]
        program = torch.export.export(graph, tuple(inputs), strict=False)
        module = fx.export_and_import(program, output_type="stablehlo", func_name="main")
    return TracedStep(
        stablehlo=str(module),
        out_shapes=tuple((tuple(t.shape), t.dtype) for t in outputs),
    )


def _stablehlo_constants(module) -> None:
    """Replace every tensor `arith.constant` of `module` by the same `stablehlo.constant`."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import hlo

    found = []

    def visit(op):
        if op.name == "arith.constant":
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    for op in found:
        with ir.InsertionPoint(op), op.location:
            constant = hlo.ConstantOp(op.attributes["value"])
        op.results[0].replace_all_uses_with(constant.result)
        op.erase()


def to_exported(text: str, in_avals, out_avals, in_tree, out_tree):
    """A 1-device `jax.export.Exported` of the StableHLO module `text`.

    No input or output carries a sharding, so the module is device-polymorphic: called under
    `jax.jit` on a mesh, it is inlined and partitioned with the caller's shardings.
    """
    from jax import export
    from jax._src import xla_bridge
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib import _jax
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import hlo

    with jax_mlir.make_ir_context():
        module = ir.Module.parse(text)
        _stablehlo_constants(module)
        version = hlo.get_version_from_compatibility_requirement(
            hlo.StablehloCompatibilityRequirement.WEEK_4
        )
        serialized = _jax.mlir.serialize_portable_artifact(
            module, version, xla_bridge.get_backend().serialize_with_sdy
        )
    nothing_in, nothing_out = (None,) * len(in_avals), (None,) * len(out_avals)
    return export.Exported(
        fun_name="torch_step",
        in_tree=in_tree,
        in_avals=tuple(in_avals),
        out_tree=out_tree,
        out_avals=tuple(out_avals),
        _has_named_shardings=False,
        _in_named_shardings=nothing_in,
        _out_named_shardings=nothing_out,
        in_shardings_hlo=nothing_in,
        out_shardings_hlo=nothing_out,
        nr_devices=1,
        platforms=("cpu",),
        ordered_effects=(),
        unordered_effects=(),
        # Lowered for any backend (`--backend tpu:...` too): the module has no platform-specific ops.
        disabled_safety_checks=(export.DisabledSafetyCheck.platform(),),
        mlir_module_serialized=serialized,
        calling_convention_version=export.maximum_supported_calling_convention_version,
        module_kept_var_idx=tuple(range(len(in_avals))),
        uses_global_constants=False,
        _get_vjp=None,
    )

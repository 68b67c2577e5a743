"""PyTorch to JAX: a traced torch function becomes a JAX-callable StableHLO module for one device.

The route, maintained code but for the few decompositions of `flint.frontend.torch_decompositions`:

1. `make_fx` traces the function over fake tensors (shapes and dtypes, no storage), running torch's
   own autograd and the decompositions, so a training step's backward is a plain graph of core
   ATen ops; slices and their backwards get a bounded end (`_clamp_slice_ends`);
2. `torch.export` re-exports that graph and torch-mlir's FX importer lowers it to StableHLO, with
   every tensor argument a function argument (parameters included: they must stay shardable);
   torch-mlir's diagnostics are collected, not printed, and a failure becomes `LoweringError`;
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
from flint.frontend.torch_decompositions import decompositions

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


@dataclass
class LoweringError(Exception):
    """torch-mlir stopped at `op` (when its diagnostics name one), written at `source`."""

    diagnostic: str
    op: str | None = None
    source: str | None = None  # "file.py:LINE 'code'", the innermost frame that made the op

    def __str__(self) -> str:
        return self.diagnostic


def trace_to_stablehlo(fn: Callable[..., Sequence[Any]], inputs: Sequence[Any]) -> TracedStep:
    """StableHLO of `fn(*inputs)`; `inputs` are fake tensors and `fn` returns a flat tuple.

    Attention runs as its math form (matmuls and a softmax, which autograd differentiates), not as
    a fused CPU kernel whose backward torch-mlir has no lowering for; torch's core ATen
    decompositions then reduce every composite op (`silu_backward`, `slice_backward`, pooling
    backwards) to the core set that torch-mlir lowers. Raises `LoweringError` where torch-mlir
    cannot lower the graph.
    """
    import warnings

    import torch
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with warnings.catch_warnings(), sdpa_kernel(SDPBackend.MATH):
        warnings.simplefilter("ignore")  # torch's deprecation notices are not the user's business
        graph = make_fx(
            fn, decomposition_table=decompositions(), tracing_mode="fake", record_stack_traces=True
        )(*inputs)
        _clamp_slice_ends(graph)
        outputs = [node.meta["val"] for node in graph.graph.find_nodes(op="output")[0].all_input_nodes]
        program = torch.export.export(graph, tuple(inputs), strict=False)
        module = _lower(program, graph)
    return TracedStep(
        stablehlo=str(module),
        out_shapes=tuple((tuple(t.shape), t.dtype) for t in outputs),
    )


def _lower(program, graph):
    """torch-mlir's StableHLO of `program`, its diagnostics collected instead of printed."""
    from torch_mlir import fx, ir
    from torch_mlir.compiler_utils import TorchMlirCompilerError
    from torch_mlir.dialects import torch as torch_dialect
    from torch_mlir.extras.fx_importer import FxImporter

    context = ir.Context()
    torch_dialect.register_dialect(context)
    diagnostics: list[str] = []
    context.attach_diagnostic_handler(lambda d: diagnostics.append(d.message) or True)
    try:
        return fx.export_and_import(
            program, output_type="stablehlo", fx_importer=FxImporter(context=context), func_name="main"
        )
    except TorchMlirCompilerError as exc:
        raise _lowering_error(diagnostics, str(exc), graph) from None


def _lowering_error(diagnostics: list[str], report: str, graph) -> LoweringError:
    """The op torch-mlir stopped at and where the traced code made it, or its first diagnostic.

    An op without a lowering is a `torch.operator` carrying the ATen name, or an op of the torch
    dialect that stayed illegal; anything else (`std::bad_alloc`) is reported by torch-mlir as the
    Python exception of its pass pipeline.
    """
    import re

    text = "\n".join(diagnostics)
    named = re.search(r'name = "torch\.([\w.]+)"', text) or re.search(r"operation '([\w.]+)'", text)
    if named and named.group(1) != "torch.operator":
        op = named.group(1).removeprefix("torch.")
        return LoweringError(diagnostics[0].splitlines()[0], op, _source(graph, op))
    if diagnostics:
        return LoweringError(diagnostics[0].splitlines()[0])
    thrown = re.search(r"^python exception: (.+)$", report, re.MULTILINE)
    return LoweringError(thrown.group(1) if thrown else report.strip().splitlines()[0])


def _source(graph, op: str) -> str | None:
    """`file.py:LINE 'code'` of the innermost recorded frame that made a node calling `op`."""
    import re

    for node in graph.graph.nodes:
        trace = node.meta.get("stack_trace")
        if node.op == "call_function" and str(node.target).startswith(f"{op}.") and trace:
            frames = re.findall(r'File "([^"]+)", line (\d+), in \S+\n +(.+)', trace)
            if frames:
                file, line, code = frames[-1]
                return f"{file.rsplit('/', 1)[-1]}:{line} '{code.strip()}'"
    return None


def _clamp_slice_ends(graph) -> None:
    """Bound the end of every `slice` and `slice_scatter` by its dimension's size.

    `x[..., n:]` records its end as 2**63 - 1. torch-mlir's StableHLO lowering of a
    `slice_scatter` materializes its range, so a scatter with such an end allocates until memory
    runs out (`std::bad_alloc`). Two kinds of scatter carry it: the backward of such a slice
    scatters into zeros over the same range (rotary embeddings' `rotate_half` does this), and a write
    into a slice, `y[:, 1:] = x[:, :-1]`, traces as a `slice` view and a `copy_` into it, which
    `torch.export`'s functionalization (run when torch-mlir imports the program) turns into a
    `slice_scatter` with the view's end; encoder-decoder models shift their labels right into
    the decoder's inputs so (`T5ForConditionalGeneration._shift_right`, BART's
    `shift_tokens_right`). Bounding the view's end bounds the scatter made from it.
    """
    import torch

    aten = torch.ops.aten
    # slice(input, dim, start, end, step) and slice_scatter(input, src, dim, start, end, step)
    for target, dim_at, end_at in ((aten.slice.Tensor, 1, 3), (aten.slice_scatter.default, 2, 4)):
        for node in graph.graph.find_nodes(op="call_function", target=target):
            if len(node.args) <= end_at or node.args[end_at] is None:
                continue
            size = node.args[0].meta["val"].shape[node.args[dim_at]]
            if node.args[end_at] > size:
                node.update_arg(end_at, size)
    graph.recompile()


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
    import dataclasses

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
    # JAX 0.12 dropped this field, which earlier releases require
    fields = {field.name for field in dataclasses.fields(export.Exported)}
    older = {"_has_named_shardings": False} if "_has_named_shardings" in fields else {}
    return export.Exported(
        fun_name="torch_step",
        in_tree=in_tree,
        in_avals=tuple(in_avals),
        out_tree=out_tree,
        out_avals=tuple(out_avals),
        **older,
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

"""Walk the partitioned StableHLO with jaxlib's MLIR bindings into typed, MLIR-free ops.

Everything later (costing, graph building, emission) works on these plain dataclasses, so the MLIR
context lives only here. Calls are inlined while walking: every call site gets its own copy of the
callee's ops, which is what runs. Control-flow ops keep their regions as nested `Region`s; reducer
bodies (of reduce, all_reduce, scatter, sort, ...) are summarised by their op count, which is what their
cost depends on.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import PurePath
from types import MappingProxyType
from typing import Any, Iterator, Mapping

import numpy as np

from flint.compile.capture import PartitionedModule
from flint.compile.gpu_module import COMBINED, CONVOLUTION, EMITTER, INSTRUCTION, KERNEL_NAME, TRIP_COUNT
from flint.compile.replica_groups import AxisRef, ModuleMesh, mesh_axes_groups
from flint.errors import FlintError

CONTROL_FLOW = frozenset({"while", "case", "if", "async_start"})
"""Ops whose regions are program code, as opposed to reducer bodies applied per element."""

_TABLE_LIMIT = 1 << 20
"""Integer constants up to this many elements keep their values (lookup tables indexed by rank)."""
FOLDABLE = 4096
"""Integer tensors of up to this many elements are folded (`flint.ir.folding`); splat constants are
kept as arrays only up to this size."""

FUSION = "fusion"
"""A kernel of the optimised module: its region holds the ops it computes in one pass."""
CUSTOM_CALL_COLLECTIVES = frozenset({"ragged_all_to_all"})
"""Collectives StableHLO has no op for: the conversion writes them as custom calls whose backend
config holds the channel and the replica groups."""
LIBRARY_GEMMS = frozenset({"__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8"})
"""Custom calls in which the GPU compiler runs a matmul in cuBLAS instead of a fusion of its own
(`--xla_gpu_enable_triton_gemm=false`, or a dot its Triton emitter does not take). Their backend
config holds the dot's dimension numbers; their result is a tuple of the product and a scratch
workspace."""
LIBRARY_CONVOLUTIONS = MappingProxyType({
    "__cudnn$convForward": "forward",
    "__cudnn$convBiasActivationForward": "forward",
    "__cudnn$convForwardGraph": "forward",
    "__cudnn$convBackwardInput": "backward_input",
    "__cudnn$convBackwardFilter": "backward_filter",
})
"""Custom calls in which the GPU compiler runs a convolution in cuDNN, by kind. Their window and
dimension numbers (`flint.compile.gpu_module.CONVOLUTION`) are those of the forward convolution,
input * kernel -> output, whichever of the three a call computes: a forward call reads the input
and the kernel and writes the output; a backward-input call (the input gradient) reads the output
and the kernel and writes the input; a backward-filter call (the kernel gradient) reads the input
and the output and writes the kernel. Their result is a tuple of that and a scratch workspace."""


@dataclass(frozen=True)
class TensorType:
    """Shape and element type of one value. `bits` is 0 for tokens, which carry no data."""

    shape: tuple[int, ...]
    dtype: str
    bits: int

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes in memory: `i1` (pred) takes a byte per element as in XLA; other sub-byte types pack."""
        if self.bits == 1:
            return self.elements
        return (self.elements * self.bits + 7) // 8


@dataclass(frozen=True)
class Op:
    """One StableHLO operation with SSA value ids instead of MLIR handles.

    `name` is the location's name (for JAX, the op path `jit(step)/jvp()/dot_general`), `source`
    the innermost source line the compiler kept for it (`gpt.py:151`), empty when it kept none.
    """

    opcode: str
    name: str
    operands: tuple[int, ...]
    results: tuple[int, ...]
    operand_types: tuple[TensorType, ...]
    result_types: tuple[TensorType, ...]
    attrs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    regions: tuple["Region", ...] = ()
    source: str = ""


@dataclass(frozen=True)
class Region:
    """A block of ops: its arguments, its ops in program order, and the values it returns."""

    arguments: tuple[int, ...]
    ops: tuple[Op, ...]
    results: tuple[int, ...]


@dataclass(frozen=True)
class Program:
    """The entry function of the partitioned module, calls inlined: what every rank runs.

    `scheduled` says the op order is the compiler's execution schedule (the optimised module), not
    just some topological order.
    """

    body: Region
    input_types: tuple[TensorType, ...]
    num_values: int
    scheduled: bool = False


def _tensor_type(mlir_type) -> TensorType:
    from jaxlib.mlir import ir

    if isinstance(mlir_type, ir.RankedTensorType):
        shape, element = tuple(mlir_type.shape), mlir_type.element_type
    else:  # tokens and scalars outside tensors
        shape, element = (), mlir_type
    if isinstance(element, ir.ComplexType):
        bits = 2 * element.element_type.width
    else:
        bits = getattr(element, "width", 0)
    return TensorType(shape=shape, dtype=str(element), bits=bits)


def _ints(attr) -> tuple[int, ...]:
    return tuple(int(x) for x in attr)


def _optional_ints(attributes, name: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """An optional integer-array attribute (padding flattened as low, high pairs), else `default`."""
    return _ints(attributes[name]) if name in attributes else default


def _replica_groups(attr, channel: int | None, context: "_Walker") -> np.ndarray:
    """Explicit `[groups, size]` ids from either encoding XLA writes: a dense list or mesh axes.

    Mesh-axes groups come from the partition stage's HLO-side table when it has the channel, since
    the StableHLO mesh has lost any device order of its own.
    """
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    if stablehlo.ReplicaGroupMeshAxesAttr.isinstance(attr):
        if channel in context.groups_by_channel:
            return context.groups_by_channel[channel]
        attr = stablehlo.ReplicaGroupMeshAxesAttr(attr)
        refs = []
        for ref in (stablehlo.AxisRefAttr(a) for a in attr.axes):
            sub = ref.sub_axis_info
            if sub is not None:
                sub = stablehlo.SubAxisInfoAttr(sub)
                sub = (sub.pre_size, sub.size)
            refs.append(AxisRef(ref.name, sub))
        refs = tuple(refs)
        return mesh_axes_groups(context.meshes[ir.FlatSymbolRefAttr(attr.mesh).value], refs)
    return np.array(ir.DenseIntElementsAttr(attr), dtype=np.int64)


def _module_meshes(module) -> dict[str, ModuleMesh]:
    """The `sdy.mesh` declarations that mesh-axes replica groups refer to."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import sdy

    meshes = {}
    for op in module.body.operations:
        if op.operation.name != "sdy.mesh":
            continue
        mesh = sdy.MeshAttr(op.operation.attributes["mesh"])
        axes = tuple((axis.name, axis.size) for axis in (sdy.MeshAxisAttr(a) for a in mesh.axes))
        device_ids = tuple(mesh.device_ids) or None
        meshes[ir.StringAttr(op.operation.attributes["sym_name"]).value] = ModuleMesh(axes, device_ids)
    return meshes


def _channel_id(attr) -> int:
    """The channel of a collective; ops with no StableHLO form (tuple all_to_all) keep MHLO's."""
    from jaxlib.mlir.dialects import mhlo, stablehlo

    try:
        return stablehlo.ChannelHandle(attr).handle
    except ValueError:
        return mhlo.ChannelHandle(attr).handle


def _decode_attrs(opcode: str, op, context: "_Walker") -> dict[str, Any]:
    """The attributes cost rules and collective resolution need, as plain Python values."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    attributes = op.attributes
    out: dict[str, Any] = {}
    if opcode == "dot_general":
        dims = stablehlo.DotDimensionNumbers(attributes["dot_dimension_numbers"])
        out["lhs_contracting"] = tuple(dims.lhs_contracting_dimensions)
        out["lhs_batching"] = tuple(dims.lhs_batching_dimensions)
    elif opcode == "convolution":
        dims = stablehlo.ConvDimensionNumbers(attributes["dimension_numbers"])
        out["kernel_spatial"] = tuple(dims.kernel_spatial_dimensions)
        out["kernel_input_feature"] = dims.kernel_input_feature_dimension
        out["feature_group_count"] = ir.IntegerAttr(attributes["feature_group_count"]).value
        out["input_spatial"] = tuple(dims.input_spatial_dimensions)
        out["output_spatial"] = tuple(dims.output_spatial_dimensions)
        spatial = len(out["kernel_spatial"])
        out["strides"] = _optional_ints(attributes, "window_strides", (1,) * spatial)
        out["lhs_dilation"] = _optional_ints(attributes, "lhs_dilation", (1,) * spatial)
        out["rhs_dilation"] = _optional_ints(attributes, "rhs_dilation", (1,) * spatial)
        padding = _optional_ints(attributes, "padding", (0,) * (2 * spatial))
        out["padding_low"] = padding[0::2]
    elif opcode == "constant":
        value = ir.DenseElementsAttr(attributes["value"])
        if isinstance(value.type.element_type, ir.IntegerType):
            if value.is_splat and not value.type.shape:
                out["value"] = int(ir.IntegerAttr(value.get_splat_value()).value)
            elif value.is_splat and math.prod(value.type.shape) <= FOLDABLE:
                out["array"] = np.full(value.type.shape, ir.IntegerAttr(value.get_splat_value()).value)
            elif not value.is_splat and len(value) <= _TABLE_LIMIT:
                # lookup tables: partition-id offsets of reduce-scatters, layer indices of scans
                out["array"] = np.array(ir.DenseIntElementsAttr(value), dtype=np.int64)
    elif opcode == "slice":
        out["start"] = _ints(attributes["start_indices"])
        out["limit"] = _ints(attributes["limit_indices"])
        out["strides"] = _ints(attributes["strides"])
    elif opcode == "transpose":
        out["permutation"] = _ints(attributes["permutation"])
    elif opcode == "iota":
        out["iota_dimension"] = ir.IntegerAttr(attributes["iota_dimension"]).value
    elif opcode == "compare":
        out["direction"] = stablehlo.ComparisonDirectionAttr(attributes["comparison_direction"]).value
    elif opcode == "reduce_window":
        out["window"] = _ints(attributes["window_dimensions"])
    elif opcode == "select_and_scatter" and "window_dimensions" in attributes:
        out["window"] = _ints(attributes["window_dimensions"])
    elif opcode == "custom_call" and _call_target(op) in LIBRARY_GEMMS:
        out.update(_library_gemm(op))
    elif opcode == "custom_call" and _call_target(op) in LIBRARY_CONVOLUTIONS:
        out.update(_library_convolution(op))
    if opcode == FUSION and "fusion_kind" in attributes:  # `#mhlo<fusion_kind kLoop>`
        out["fusion_kind"] = str(attributes["fusion_kind"]).rstrip(">").rpartition(" ")[2]
    if opcode == "custom_call":
        out["target"] = _call_target(op)
    if "mhlo.frontend_attributes" in attributes:
        out.update(_marks(ir.DictAttr(attributes["mhlo.frontend_attributes"])))
    if opcode in CUSTOM_CALL_COLLECTIVES:  # its replica groups, below, are in the config too
        attributes = ir.DictAttr(attributes["backend_config"])
        out["channel_id"] = ir.IntegerAttr(attributes["channel_id"]).value
    if "channel_handle" in attributes:
        out["channel_id"] = _channel_id(attributes["channel_handle"])
    if "replica_groups" in attributes:
        out["replica_groups"] = _replica_groups(attributes["replica_groups"], out.get("channel_id"), context)
    if "use_global_device_ids" in attributes:
        out["use_global_device_ids"] = True
    if "source_target_pairs" in attributes:
        out["source_target_pairs"] = np.array(
            ir.DenseIntElementsAttr(attributes["source_target_pairs"]), dtype=np.int64
        ).reshape(-1, 2)
    return out


def _library_gemm(op) -> dict[str, Any]:
    """A cuBLAS call's dot as `dot_general`'s attributes, and its product (the tuple's first
    element; the workspace beside it is scratch) as `product`."""
    from jaxlib.mlir import ir

    config = json.loads(ir.StringAttr(op.attributes["backend_config"]).value)
    dims = config["gemm_backend_config"]["dot_dimension_numbers"]
    return {
        "lhs_contracting": tuple(int(d) for d in dims.get("lhs_contracting_dimensions", ())),
        "lhs_batching": tuple(int(d) for d in dims.get("lhs_batch_dimensions", ())),
        "product": _tensor_type(ir.TupleType(op.results[0].type).get_type(0)),
    }


def _library_convolution(op) -> dict[str, Any]:
    """A cuDNN call's convolution as `convolution`'s attributes, the forward convolution's
    (input, kernel, output) types as `convolution`, and the one it writes (the tuple's first
    element; the workspace beside it is scratch) as `product`. Without the recorded window (a
    module that did not pass through `flint.compile.gpu_module`), nothing: no cost rule applies."""
    from jaxlib.mlir import ir

    if "mhlo.frontend_attributes" not in op.attributes:
        return {}
    frontend = ir.DictAttr(op.attributes["mhlo.frontend_attributes"])
    if CONVOLUTION not in frontend:
        return {}
    conv = json.loads(ir.StringAttr(frontend[CONVOLUTION]).value)
    result = op.results[0].type  # a tuple: the array written, then the workspace
    written = _tensor_type(result.get_type(0) if isinstance(result, ir.TupleType) else result)
    first, second = (_tensor_type(v.type) for v in list(op.operands)[:2])
    kind = LIBRARY_CONVOLUTIONS[_call_target(op)]
    shapes = {
        "forward": (first, second, written),
        "backward_input": (written, second, first),
        "backward_filter": (first, written, second),
    }[kind]
    window = conv["window"]
    return {
        "kernel_spatial": tuple(conv["kernel"][2:]),
        "kernel_input_feature": conv["kernel"][0],
        "feature_group_count": conv["feature_group_count"],
        "input_spatial": tuple(conv["input"][2:]),
        "output_spatial": tuple(conv["output"][2:]),
        "strides": tuple(d[1] for d in window),
        "padding_low": tuple(d[2] for d in window),
        "rhs_dilation": tuple(d[4] for d in window),
        "lhs_dilation": tuple(d[5] for d in window),
        "convolution": shapes,
        "product": written,
    }


def _marks(frontend_attributes) -> dict[str, Any]:
    """What the compile stage wrote into an op's frontend attributes: a loop's known trip count,
    the scheduled instruction it comes from (its id, its name, a fusion's emitter), the combined
    collective it is a piece of."""
    from jaxlib.mlir import ir

    out: dict[str, Any] = {}
    if TRIP_COUNT in frontend_attributes:
        out["trip_count"] = int(ir.StringAttr(frontend_attributes[TRIP_COUNT]).value)
    if INSTRUCTION in frontend_attributes:
        out["instruction"] = int(ir.StringAttr(frontend_attributes[INSTRUCTION]).value)
    if KERNEL_NAME in frontend_attributes:
        out["kernel_name"] = ir.StringAttr(frontend_attributes[KERNEL_NAME]).value
    if EMITTER in frontend_attributes:
        out["emitter"] = ir.StringAttr(frontend_attributes[EMITTER]).value
    if COMBINED in frontend_attributes:
        name, _, place = ir.StringAttr(frontend_attributes[COMBINED]).value.rpartition(":")
        out["combined"] = (name, int(place))
    return out


def _op_name(op, opcode: str) -> str:
    """The JAX op path (`jit(step)/jvp()/dot_general`) the compiler kept as the location name."""
    try:
        return op.location.name_str
    except (ValueError, AttributeError):
        return opcode


_OWN_FILES = str(PurePath(__file__).parents[1]) + os.sep
_TRACING_FILES = str(PurePath(__file__).parents[1] / "compile") + os.sep
"""Flint's own package, and its compile stage, which traces the step. The frames inside the first
compile-stage frame are the step's own: the model's code, the libraries it calls and the Flint
helpers it calls back (`flint.sharding.constrain`, the torch bridge); outside it are Flint's
pipeline and the command line."""


def _frames(location) -> Iterator:
    """The file locations of an MLIR location, innermost frame first: through a name (`NameLoc`)
    to its child, a call site's callee before its caller, a fused location's parts in order."""
    from jaxlib.mlir import ir

    if isinstance(location, ir.FileLineColLoc):
        yield location
    elif isinstance(location, ir.NameLoc):
        yield from _frames(location.child_loc)
    elif isinstance(location, ir.CallSiteLoc):
        yield from _frames(location.callee)
        yield from _frames(location.caller)
    elif isinstance(location, ir.FusedLoc):
        for part in location.locations:
            yield from _frames(part)


def _source_line(location) -> str:
    """`file.py:line` of the innermost frame of the step's own code outside Flint that the
    compiler kept for an op (see `_TRACING_FILES`); empty when it kept none (ops XLA made up, or a
    torch model's ops, which keep only Flint's bridge)."""
    for frame in _frames(location):
        if frame.filename.startswith(_TRACING_FILES):
            break
        if not frame.filename.startswith(_OWN_FILES):
            return f"{PurePath(frame.filename).name}:{frame.start_line}"
    return ""


def _opcode(op) -> str:
    """The op's name without its dialect; a collective the conversion to StableHLO writes as a
    custom call (`ragged_all_to_all`) goes by its target's name."""
    opcode = op.name.split(".", 1)[1]
    if opcode == "custom_call" and _call_target(op) in CUSTOM_CALL_COLLECTIVES:
        return _call_target(op)
    return opcode


def _call_target(op) -> str:
    """A custom call's target name (empty where it has none)."""
    from jaxlib.mlir import ir

    if "call_target_name" not in op.attributes:
        return ""
    return ir.StringAttr(op.attributes["call_target_name"]).value


class _Walker:
    """Assigns a fresh integer id to every value, inlining calls as it meets them."""

    def __init__(self, functions: dict[str, Any], meshes: dict[str, ModuleMesh], groups_by_channel):
        self.functions = functions
        self.meshes = meshes
        self.groups_by_channel = groups_by_channel
        self.next_id = 0
        self.inline_depth = 0

    def fresh(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def region(self, block, env: dict, arguments: tuple[int, ...] | None = None) -> Region:
        if arguments is None:
            arguments = tuple(self.fresh() for _ in block.arguments)
        for value, vid in zip(block.arguments, arguments):
            env[value] = vid
        ops: list[Op] = []
        results: tuple[int, ...] = ()
        for mlir_op in block.operations:
            op = mlir_op.operation
            opcode = _opcode(op)
            if opcode == "return":
                results = tuple(env[v] for v in op.operands)
            elif op.name == "func.call":
                self.inline(op, env, ops)
            else:
                ops.append(self.op(op, opcode, env))
        return Region(arguments=arguments, ops=tuple(ops), results=results)

    def inline(self, call, env: dict, ops: list[Op]) -> None:
        from jaxlib.mlir import ir

        if self.inline_depth > 64:
            raise FlintError(
                f"call depth over 64 at @{ir.FlatSymbolRefAttr(call.attributes['callee']).value}: "
                "recursive functions cannot be unrolled"
            )
        self.inline_depth += 1
        body = self.region(self._callee(call, "callee"), {}, tuple(env[v] for v in call.operands))
        self.inline_depth -= 1
        ops.extend(body.ops)
        for value, vid in zip(call.results, body.results):
            env[value] = vid

    def _callee(self, op, attribute: str):
        """The body of the function `op` names in `attribute`."""
        from jaxlib.mlir import ir

        return self.functions[ir.FlatSymbolRefAttr(op.attributes[attribute]).value].regions[0].blocks[0]

    def op(self, op, opcode: str, env: dict) -> Op:
        operands = tuple(env[v] for v in op.operands)
        attrs = _decode_attrs(opcode, op, self)
        regions: tuple[Region, ...] = ()
        if opcode in CONTROL_FLOW or opcode == FUSION:
            regions = tuple(self.region(r.blocks[0], dict(env)) for r in op.regions)
            if not regions and "called_computation" in op.attributes:  # MHLO's async op (the
                # conversion's form of a custom-call collective) calls a function: its region
                regions = (self.region(self._callee(op, "called_computation"), {}),)
        elif len(op.regions):
            attrs["body_ops"] = sum(
                1
                for r in op.regions
                for b in r.blocks
                for o in b.operations
                if not o.operation.name.endswith(".return")
            )
        results = tuple(self.fresh() for _ in op.results)
        for value, vid in zip(op.results, results):
            env[value] = vid
        return Op(
            opcode=opcode,
            name=_op_name(op, opcode),
            operands=operands,
            results=results,
            operand_types=tuple(_tensor_type(v.type) for v in op.operands),
            result_types=tuple(_tensor_type(v.type) for v in op.results),
            attrs=MappingProxyType(attrs),
            regions=regions,
            source=_source_line(op.location),
        )


def parse_module(module: PartitionedModule) -> Program:
    """Parse the partitioned module's `main` into a `Program`."""
    from jax.interpreters import mlir as jax_mlir
    from jaxlib.mlir import ir

    with jax_mlir.make_ir_context():
        parsed = ir.Module.parse(module.stablehlo)
        functions = {
            ir.StringAttr(f.attributes["sym_name"]).value: f.operation
            for f in parsed.body.operations
            if f.operation.name == "func.func"
        }
        main = functions["main"]
        walker = _Walker(functions, _module_meshes(parsed), module.groups_by_channel)
        block = main.regions[0].blocks[0]
        body = walker.region(block, {})
        input_types = tuple(_tensor_type(a.type) for a in block.arguments)
    return Program(
        body=body,
        input_types=input_types,
        num_values=walker.next_id,
        scheduled=module.stage == "optimized",
    )

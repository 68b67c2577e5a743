"""Let XLA partition the step for the mesh and capture the module right after it does.

The module right after the SPMD partitioner is device-agnostic: per-rank shapes, explicit collectives,
dtypes exactly as the model wrote them. Later CPU passes (float normalisation, fusion for the host) would
leak the virtual devices' quirks into the trace, so the default stage stops there. XLA hands that module
out only through its dump facility, so compilation runs with a private dump directory.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np

from flint.compile.replica_groups import AxisRef, ModuleMesh, mesh_axes_groups
from flint.errors import FlintError
from flint.frontend import Workload
from flint.sharding import rules_in_effect

STAGES = ("partitioned", "optimized")
WHOLE_LOOPS = {"xla_disable_hlo_passes": "small-while-loop-hoisting"}
"""XLA:CPU would wrap small while loops in calls it runs as single kernels, whose instructions the
profiler cannot see. The graph unrolls a loop either way, so every compile of the step turns that
off: the optimised module Flint traces is then, instruction for instruction, the one `flint
validate` runs."""
_DUMP_FILE = {
    "partitioned": "*.after_*spmd-partitioning.*.hlo.pb",
    "optimized": "*after_optimizations.hlo.pb",
}


@dataclass(frozen=True)
class PartitionedModule:
    """The compiler's per-rank program as StableHLO bytecode, plus how long it took to get it.

    `groups_by_channel` holds the explicit groups of collectives that XLA wrote in its mesh-axes form
    with a device order of its own, which the conversion to StableHLO loses (keyed by channel id).
    """

    stage: str
    stablehlo: bytes
    num_partitions: int
    lower_seconds: float
    compile_seconds: float
    groups_by_channel: Mapping[int, np.ndarray] = field(default_factory=lambda: MappingProxyType({}))

    def text(self) -> str:
        """Readable StableHLO, for `--dump-ir`."""
        from jax.interpreters import mlir as jax_mlir
        from jaxlib.mlir import ir

        with jax_mlir.make_ir_context():
            module = ir.Module.parse(self.stablehlo)
            return module.operation.get_asm(large_elements_limit=16, enable_debug_info=False)


def _user_line(exc: BaseException, workload: Workload) -> str:
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == workload.path]
    return f" at {workload.path.name}:{frames[-1].lineno}" if frames else ""


def _hlo_module_proto(dump: Path, stage: str) -> bytes:
    from flint.schema.hlo_envelope_pb2 import HloProtoEnvelope

    found = sorted(dump.glob(_DUMP_FILE[stage]))
    if len(found) != 1:
        raise RuntimeError(f"expected one {stage} module in the XLA dump, found {len(found)}")
    return HloProtoEnvelope.FromString(found[0].read_bytes()).hlo_module


def for_conversion(module_proto: bytes) -> bytes:
    """The optimised module as the conversion to StableHLO must see it, parsed and written once:
    in schedule order, with the groups of its several-operand all-to-alls written out."""
    from flint.schema.hlo_envelope_pb2 import HloModule

    module = HloModule.FromString(module_proto)
    _in_schedule_order(module)
    _write_out_tuple_all_to_all_groups(module)
    return module.SerializeToString()


def _in_schedule_order(module) -> None:
    """List each scheduled computation's instructions in schedule order.

    Each instruction also gets the one scheduled before it as a control predecessor: the conversion
    to StableHLO orders ops by dependencies only, and this makes the schedule one of them. Modules
    without a schedule are left as they are.
    """
    for computation in module.computations:
        sequence = module.schedule.sequences.get(computation.id)
        if sequence is None:
            continue
        by_id = {instruction.id: instruction for instruction in computation.instructions}
        ordered = [by_id[i] for i in sequence.instruction_ids]
        for before, instruction in zip(ordered, ordered[1:]):
            if before.id not in instruction.operand_ids and before.id not in instruction.control_predecessor_ids:
                instruction.control_predecessor_ids.append(before.id)
        del computation.instructions[:]
        computation.instructions.extend(ordered)


def mesh_axes_groups_by_channel(module_proto: bytes) -> dict[int, np.ndarray]:
    """Explicit groups of every mesh-axes collective of an `HloModuleProto`, by channel id."""
    from flint.schema.hlo_envelope_pb2 import HloModule

    return {
        instruction.channel_id: _explicit_groups(instruction.mesh_axes_replica_groups)
        for computation in HloModule.FromString(module_proto).computations
        for instruction in computation.instructions
        if instruction.HasField("mesh_axes_replica_groups") and instruction.channel_id > 0
    }


def _write_out_tuple_all_to_all_groups(module) -> None:
    """Write out the mesh-axes groups of each all-to-all of several operands.

    The CPU compiler turns every all-to-all into that form; jaxlib's conversion to StableHLO keeps
    its mesh-axes groups, which MLIR's verifier then rejects on it.
    """
    for computation in module.computations:
        for instruction in computation.instructions:
            if instruction.opcode != "all-to-all" or len(instruction.operand_ids) < 2:
                continue
            if not instruction.HasField("mesh_axes_replica_groups"):
                continue
            groups = _explicit_groups(instruction.mesh_axes_replica_groups)
            instruction.ClearField("mesh_axes_replica_groups")
            for group in groups:
                instruction.collective_device_list.replica_groups.add(replica_ids=group.tolist())


def _explicit_groups(groups) -> np.ndarray:
    """`[groups, group_size]` device ids of a `MeshAxesReplicaGroups`."""
    axes = tuple((axis.name, axis.size) for axis in groups.mesh.axes)
    iota = groups.mesh.iota_device_ids
    device_ids = None
    if iota.reshape_dims:
        ids = np.arange(int(np.prod(iota.reshape_dims))).reshape(tuple(iota.reshape_dims))
        device_ids = tuple(int(i) for i in ids.transpose(tuple(iota.transpose_perm) or None).flat)
    refs = tuple(
        AxisRef(
            axes[ref.mesh_axis_index][0],
            (ref.sub_axis_info.pre_size, ref.sub_axis_info.size) if ref.HasField("sub_axis_info") else None,
        )
        for ref in groups.axes
    )
    return mesh_axes_groups(ModuleMesh(axes, device_ids), refs)


def partition(workload: Workload, mesh, stage: str = "partitioned") -> PartitionedModule:
    """Lower `workload` for `mesh` and compile it far enough to read the partitioned module."""
    import jax
    from jax._src.lib import _jax

    if stage not in STAGES:
        raise FlintError(f"unknown stage {stage!r}: choose one of {', '.join(STAGES)}")
    start = time.perf_counter()
    try:
        with jax.set_mesh(mesh), rules_in_effect(workload.rules):
            lowered = jax.jit(workload.step).lower(*workload.args)
    except Exception as exc:
        raise FlintError(
            f"{workload.path.name}: tracing the step failed{_user_line(exc, workload)}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    lowered_at = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="flint-xla-") as tmp:
        options = {
            **WHOLE_LOOPS,
            "xla_dump_to": tmp,
            "xla_dump_hlo_pass_re": "spmd-partitioning",
            "xla_dump_hlo_as_proto": True,
            "xla_dump_hlo_as_text": False,
        }
        try:
            lowered.compile(compiler_options=options)
        except Exception as exc:
            # The partitioned module is complete before code generation starts, so a backend that
            # cannot generate code for an op (XLA:CPU has no ragged all-to-all) has still written it.
            if stage != "partitioned" or len(list(Path(tmp).glob(_DUMP_FILE[stage]))) != 1:
                raise FlintError(
                    f"{workload.path.name}: XLA could not compile the step for mesh "
                    f"{dict(mesh.shape)}: {str(exc).splitlines()[0]}"
                ) from exc
        module_proto = _hlo_module_proto(Path(tmp), stage)
    compiled_at = time.perf_counter()
    if stage == "optimized":
        module_proto = for_conversion(module_proto)
    return PartitionedModule(
        stage=stage,
        stablehlo=bytes(_jax.mlir.hlo_to_stablehlo(module_proto)),
        num_partitions=mesh.size,
        lower_seconds=lowered_at - start,
        compile_seconds=compiled_at - lowered_at,
        groups_by_channel=MappingProxyType(mesh_axes_groups_by_channel(module_proto)),
    )

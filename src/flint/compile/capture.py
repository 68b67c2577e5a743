"""Let XLA partition the step for the mesh and capture the module right after it does.

The module right after the SPMD partitioner is device-agnostic: per-rank shapes, explicit collectives,
dtypes exactly as the model wrote them. Later CPU passes (float normalisation, fusion for the host) would
leak the virtual devices' quirks into the trace, so on the CPU and TPU backends the default stage
stops there; the GPU compiler's optimised module is its kernels, the default on GPU backends. XLA
hands these modules out only through its dump facility, so compilation runs with a private dump
directory.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

import numpy as np

from flint.compile.gpu_module import (
    latency_estimates,
    record_convolutions,
    record_instruction_ids,
    record_trip_counts,
    split_combined_collectives,
)
from flint.compile.memory import DeviceMemory
from flint.compile.native_stderr import native_stderr_held
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
ONE_TRIP_LOOPS = "simplify-while-loops"
"""XLA's while-loop simplifier inlines a loop of one trip. A pipelined piece of one layer per chunk
(Megatron-LM's 530B row runs 3 virtual stages of one layer) is split at its layer loops, so its
compile keeps them: the simplifier is left out of that compile alone."""
_DUMP_FILE = {
    "partitioned": "*.after_*spmd-partitioning.*.hlo.pb",
    "optimized": "*after_optimizations.hlo.pb",
}
UNPARTITIONED = "*.sharding-removal.*.hlo.pb"
"""On one device the SPMD partitioner does not run: XLA:CPU strips the shardings in a pipeline of
its own instead, whose start is always dumped and each pass only if it changed the module. The last
of those dumps (they are numbered in pass order) is the partitioned module of a 1-rank mesh."""


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
    memory: DeviceMemory | None = None
    """Device memory per rank from the compiled executable (None where compilation stopped early)."""
    estimates: Mapping[int, float] = field(default_factory=lambda: MappingProxyType({}))
    """Microseconds by scheduled instruction id, as XLA's latency-hiding scheduler estimated them
    (the GPU compiler's optimised module; empty elsewhere)."""
    donated: tuple[int, ...] = ()
    """The step arguments donated to the compile (`jax.jit`'s `donate_argnums`)."""
    compiler_fallback: str | None = None
    """`cublas_gemm` where the GPU compiler could not tile a Triton GEMM and compiled again with
    cuBLAS GEMMs; None where the first compile went through."""

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


def _dump_options(devices: int) -> dict[str, object]:
    """The passes after which XLA dumps the module: the SPMD partitioner, or on one device, where
    it does not run, those of the pipeline that strips the shardings instead."""
    if devices == 1:
        return {"xla_dump_hlo_pipeline_re": "sharding-removal", "xla_dump_hlo_pass_re": ".*"}
    return {"xla_dump_hlo_pass_re": "spmd-partitioning"}


def _module_files(dump: Path, stage: str, devices: int) -> list[Path]:
    """The dump files that hold the module `stage` asks for: one, or none where XLA wrote none."""
    if stage == "partitioned" and devices == 1:
        return sorted(dump.glob(UNPARTITIONED))[-1:]
    return list(dump.glob(_DUMP_FILE[stage]))


def _hlo_module_proto(dump: Path, stage: str, devices: int) -> bytes:
    """The module of the dump file. XLA only logs a dump file it could not write, which it leaves
    empty or cut short; a full temp directory is what does that."""
    from google.protobuf.message import DecodeError

    from flint.schema.hlo_envelope_pb2 import HloProtoEnvelope

    found = _module_files(dump, stage, devices)
    if len(found) != 1:
        raise RuntimeError(f"expected one {stage} module in the XLA dump, found {len(found)}")
    try:
        module = HloProtoEnvelope.FromString(found[0].read_bytes()).hlo_module
    except DecodeError:
        module = b""
    if not module:
        raise _temp_full(dump)
    return module


def _is_temp_full(message: str) -> bool:
    return tempfile.gettempdir() in message and any(
        errno in message for errno in ("No space left", "File too large", "Disk quota exceeded")
    )


def _temp_full(directory: Path | str) -> FlintError:
    return FlintError(
        f"XLA could not write into {directory} (is the disk full?): free space in the temp "
        "directory or set TMPDIR to a directory with room"
    )


def for_conversion(module_proto: bytes, optimized: bool = True) -> bytes:
    """The module as the conversion to StableHLO must see it, parsed and written once: each
    mesh-axes collective on a channel of its own and, for the optimised module, in schedule order,
    with the groups of its several-operand all-to-alls written out, its loops' known trip counts
    and its library convolutions recorded and its combined collectives split
    (`flint.compile.gpu_module`)."""
    from flint.schema.hlo_envelope_pb2 import HloModule

    module = HloModule.FromString(module_proto)
    _own_channels_for_mesh_axes_groups(module)
    if optimized:
        record_trip_counts(module)
        record_instruction_ids(module)
        record_convolutions(module)
        split_combined_collectives(module)
        _in_schedule_order(module)
        _write_out_tuple_all_to_all_groups(module)
    return module.SerializeToString()


def _own_channels_for_mesh_axes_groups(module) -> None:
    """Give each collective whose groups are written as mesh axes a channel id no other
    instruction has.

    The groups of those collectives are read by channel id (`mesh_axes_groups_by_channel`), and
    the XLA of JAX 0.12 gives several collectives one channel id (an all-to-all over one mesh axis
    and an all-reduce over two, both on channel 1, in `examples/moe.py`). Send and receive pairs
    share a channel on purpose and never have mesh-axes groups, so they keep theirs.
    """
    instructions = [i for c in module.computations for i in c.instructions]
    next_channel = max((i.channel_id for i in instructions), default=0) + 1
    for instruction in instructions:
        if instruction.channel_id > 0 and instruction.HasField("mesh_axes_replica_groups"):
            instruction.channel_id = next_channel
            next_channel += 1


def _in_schedule_order(module) -> None:
    """List each scheduled computation's instructions in schedule order.

    Each instruction also gets the one scheduled before it as a control predecessor: the conversion
    to StableHLO orders ops by dependencies only, and this makes the schedule one of them. Modules
    without a schedule are left as they are. The exception is a generic `async-done` (the GPU
    compiler's reduce-scatters), which the conversion refuses any predecessor but its start: work
    scheduled between such a start and its done may come to wait for the collective.
    """
    for computation in module.computations:
        sequence = module.schedule.sequences.get(computation.id)
        if sequence is None:
            continue
        by_id = {instruction.id: instruction for instruction in computation.instructions}
        ordered = [by_id[i] for i in sequence.instruction_ids]
        for before, instruction in zip(ordered, ordered[1:]):
            if instruction.opcode == "async-done":
                del instruction.control_predecessor_ids[:]  # the conversion allows its start only
                continue
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


TRITON_CANNOT_TILE = "Couldn't find output tile sizes"
"""How the GPU compiler fails a GEMM that none of its Triton tilings fits (`bf16[32768,2304]` on an
A100, for one): the real compiler then runs the program with cuBLAS GEMMs, as XLA does with
`--xla_gpu_enable_triton_gemm=false`."""
CUBLAS_GEMM = {"xla_gpu_enable_triton_gemm": False}
"""The per-compile debug option that makes the GPU compiler call cuBLAS for every GEMM."""


def compile_with_fallback(compile_once, options: Mapping[str, object], restart=lambda: None):
    """`compile_once(options)`, or where the GPU compiler could not tile a Triton GEMM, after
    `restart()` (which empties the dump directory), `compile_once` again with cuBLAS GEMMs: (the
    compiled executable, None or `cublas_gemm`)."""
    try:
        return compile_once(dict(options)), None
    except Exception as exc:
        if TRITON_CANNOT_TILE not in str(exc):
            raise
    restart()
    return compile_once({**options, **CUBLAS_GEMM}), "cublas_gemm"


def _emptied(directory: Path) -> None:
    for entry in directory.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def partition(
    workload: Workload, mesh, stage: str = "partitioned", donate: bool = True, one_trip_loops: bool = False
) -> PartitionedModule:
    """Lower `workload` for `mesh` and compile it far enough to read the partitioned module.

    With `donate`, the arguments `flint.compile.donation` picks are donated to the compile, as a
    training step donates its parameters and optimizer state. With `one_trip_loops`, loops of one
    trip stay loops (`ONE_TRIP_LOOPS`)."""
    import jax
    from jax._src.lib import _jax

    from flint.compile.donation import donated_arguments, donated_bytes

    if stage not in STAGES:
        raise FlintError(f"unknown stage {stage!r}: choose one of {', '.join(STAGES)}")
    start = time.perf_counter()
    try:
        with jax.set_mesh(mesh), rules_in_effect(workload.rules), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Some donated buffers were not usable")
            donated = donated_arguments(workload, donate)
            lowered = jax.jit(workload.step, donate_argnums=donated).lower(*workload.args)
    except Exception as exc:
        raise FlintError(
            f"{workload.path.name}: tracing the step failed{_user_line(exc, workload)}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    lowered_at = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="flint-xla-") as tmp:
        passes = WHOLE_LOOPS["xla_disable_hlo_passes"] + ("," + ONE_TRIP_LOOPS if one_trip_loops else "")
        options = {
            "xla_disable_hlo_passes": passes,
            **_dump_options(mesh.size),
            "xla_dump_to": tmp,
            "xla_dump_hlo_as_proto": True,
            "xla_dump_hlo_as_text": False,
            "xla_dump_latency_hiding_schedule": stage == "optimized",
        }
        memory, fallback = None, None
        try:
            with native_stderr_held(replay_on_error=False):
                compiled, fallback = compile_with_fallback(
                    lambda opts: lowered.compile(compiler_options=opts), options, lambda: _emptied(Path(tmp))
                )
                memory = DeviceMemory.of(compiled)
        except Exception as exc:
            if _is_temp_full(str(exc)):  # the GPU compiler writes temporary files of its own
                raise _temp_full(tempfile.gettempdir()) from exc
            # The partitioned module is complete before code generation starts, so a backend that
            # cannot generate code for an op (XLA:CPU has no ragged all-to-all) has still written it.
            if stage != "partitioned" or len(_module_files(Path(tmp), stage, mesh.size)) != 1:
                raise FlintError(
                    f"{workload.path.name}: XLA could not compile the step for mesh "
                    f"{dict(mesh.shape)}: {str(exc).splitlines()[0]}"
                ) from exc
        module_proto = _hlo_module_proto(Path(tmp), stage, mesh.size)
        schedules = list(Path(tmp).glob("*.schedule.pb"))
        estimates = latency_estimates(schedules[0].read_bytes()) if len(schedules) == 1 else {}
    compiled_at = time.perf_counter()
    module_proto = for_conversion(module_proto, optimized=stage == "optimized")
    return PartitionedModule(
        stage=stage,
        stablehlo=bytes(_jax.mlir.hlo_to_stablehlo(module_proto)),
        num_partitions=mesh.size,
        lower_seconds=lowered_at - start,
        compile_seconds=compiled_at - lowered_at,
        groups_by_channel=MappingProxyType(mesh_axes_groups_by_channel(module_proto)),
        memory=memory if memory is None else replace(memory, donated=donated_bytes(workload.args, donated)),
        estimates=MappingProxyType(estimates),
        donated=donated,
        compiler_fallback=fallback,
    )

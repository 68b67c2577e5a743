"""Stage 3: let XLA partition the step for the mesh and capture the module right after it does.

The module right after the SPMD partitioner is device-agnostic: per-rank shapes, explicit collectives,
dtypes exactly as the model wrote them. Later CPU passes (float normalisation, fusion for the host) would
leak the virtual devices' quirks into the trace, so the default stage stops there. XLA hands that module
out only through its dump facility, so compilation runs with a private dump directory.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from flint.errors import FlintError
from flint.frontend import Workload

STAGES = ("partitioned", "optimized")
_DUMP_FILE = {
    "partitioned": "*.after_spmd-partitioning.*.hlo.pb",
    "optimized": "*after_optimizations.hlo.pb",
}


@dataclass(frozen=True)
class PartitionedModule:
    """The compiler's per-rank program as StableHLO bytecode, plus how long it took to get it."""

    stage: str
    stablehlo: bytes
    num_partitions: int
    lower_seconds: float
    compile_seconds: float

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


def partition(workload: Workload, mesh, stage: str = "partitioned") -> PartitionedModule:
    """Lower `workload` for `mesh` and compile it far enough to read the partitioned module."""
    import jax
    from jax._src.lib import _jax

    if stage not in STAGES:
        raise FlintError(f"unknown stage {stage!r}: choose one of {', '.join(STAGES)}")
    start = time.perf_counter()
    try:
        with jax.set_mesh(mesh):
            lowered = jax.jit(workload.step).lower(*workload.args)
    except Exception as exc:
        raise FlintError(
            f"{workload.path.name}: tracing the step failed{_user_line(exc, workload)}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    lowered_at = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="flint-xla-") as tmp:
        options = {
            "xla_dump_to": tmp,
            "xla_dump_hlo_pass_re": "spmd-partitioning",
            "xla_dump_hlo_as_proto": True,
            "xla_dump_hlo_as_text": False,
        }
        try:
            lowered.compile(compiler_options=options)
        except Exception as exc:
            raise FlintError(
                f"{workload.path.name}: XLA could not compile the step for mesh "
                f"{dict(mesh.shape)}: {str(exc).splitlines()[0]}"
            ) from exc
        module_proto = _hlo_module_proto(Path(tmp), stage)
    compiled_at = time.perf_counter()
    return PartitionedModule(
        stage=stage,
        stablehlo=bytes(_jax.mlir.hlo_to_stablehlo(module_proto)),
        num_partitions=mesh.size,
        lower_seconds=lowered_at - start,
        compile_seconds=compiled_at - lowered_at,
    )

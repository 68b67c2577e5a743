"""Run a step for real on the virtual devices and read back, from JAX's profiler, what ran where.

The step is compiled exactly as the extraction compiles it (its logical rules in effect, small loops
left whole: see `flint.compile.capture.WHOLE_LOOPS`) and called with random inputs: floats
from a standard normal distribution, integers and booleans as zeros (so any index is in range). One
warm-up call, then one call under `jax.profiler.trace`. The profiler writes an XSpace protobuf
(`plugins/profile/<run>/<host>.xplane.pb`, read with `jax.profiler.ProfileData`); on the CPU backend
every executed HLO instruction is an event with the stats `hlo_op` (instruction name), `hlo_module`
and `device_ordinal`, and each collective waits in a `Rendezvous` event, nested in it on the same
thread, whose name lists the `global_devices` that met there: the group, as measured.

Opcodes, result shapes and permute pairs come from the executable's own HLO module, read as a
protobuf (the profile names instructions but does not describe them), so the executable that ran is
also the one that is described.
"""

from __future__ import annotations

import functools
import glob
import re
import tempfile
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from flint.compile.capture import WHOLE_LOOPS
from flint.errors import FlintError
from flint.ir.parse import TensorType
from flint.sharding import rules_in_effect

_GLOBAL_DEVICES = re.compile(r"global_devices=\[(?P<ids>[0-9, ]*)\]")


@dataclass(frozen=True)
class Instruction:
    """What the executable's HLO says of one instruction: opcode, result bytes, permute pairs, the
    id of the computation it belongs to, and whether that computation is a loop's condition."""

    name: str
    opcode: str
    result_bytes: int
    pairs: tuple[tuple[int, int], ...] = ()
    computation: int = 0
    in_loop_condition: bool = False


@dataclass(frozen=True)
class ExecutedOp:
    """One instruction as it ran on one rank; `group` is the ranks its rendezvous gathered."""

    rank: int
    instruction: Instruction
    duration_ns: int
    group: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Execution:
    """Every instruction that ran during one profiled call of the step, on every rank."""

    ops: list[ExecutedOp] = field(default_factory=list)
    seconds: float = 0.0


def run_profiled(workload, mesh, donated: tuple[int, ...] = ()) -> Execution:
    """Compile `workload` for `mesh` donating the arguments at `donated` (as the extraction did),
    call it once to warm up, then once under the profiler (each call on inputs of its own: a call
    consumes what it is donated)."""
    import jax

    try:
        with jax.set_mesh(mesh), rules_in_effect(workload.rules), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Some donated buffers were not usable")
            jitted = jax.jit(workload.step, donate_argnums=donated)
            compiled = jitted.lower(*workload.args).compile(compiler_options=WHOLE_LOOPS)
    except Exception as exc:
        raise FlintError(f"{workload.path.name}: could not compile the step to run it: {exc}") from exc
    (module,) = compiled.runtime_executable().hlo_modules()
    jax.block_until_ready(compiled(*random_inputs(workload.args, mesh)))
    args = random_inputs(workload.args, mesh)
    with tempfile.TemporaryDirectory(prefix="flint-profile-") as tmp:
        started = time.perf_counter()
        with jax.profiler.trace(tmp):
            jax.block_until_ready(compiled(*args))
        seconds = time.perf_counter() - started
        found = glob.glob(f"{tmp}/plugins/profile/*/*.xplane.pb")
        if len(found) != 1:
            raise RuntimeError(f"expected one .xplane.pb from the profiler, found {len(found)}")
        profile = jax.profiler.ProfileData.from_file(found[0])
        ranks = {device.id: rank for rank, device in enumerate(mesh.devices.flat)}
        ops = read_profile(profile, describe(module.as_serialized_hlo_module_proto()), module.name, ranks)
    return Execution(ops=ops, seconds=seconds)


def random_inputs(args: Any, mesh) -> Any:
    """Concrete arrays for abstract inputs, placed with the inputs' shardings."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    rng = np.random.default_rng(0)

    def make(leaf):
        dtype = np.dtype(leaf.dtype)
        if np.issubdtype(dtype, np.floating) or dtype.kind == "V":  # bfloat16 and fp8 are "V"
            value = rng.standard_normal(leaf.shape, dtype=np.float32).astype(dtype)
        else:
            value = np.zeros(leaf.shape, dtype)
        sharding = leaf.sharding if leaf.sharding is not None else NamedSharding(mesh, PartitionSpec())
        return jax.device_put(value, sharding)

    return jax.tree.map(make, args)


def describe(module_proto: bytes) -> dict[str, Instruction]:
    """Instructions of a serialized `HloModuleProto` by name (names are unique within a module)."""
    from flint.schema.hlo_envelope_pb2 import HloModule

    computations = HloModule.FromString(module_proto).computations
    conditions = {
        instruction.called_computation_ids[1]
        for computation in computations
        for instruction in computation.instructions
        if instruction.opcode == "while"
    }
    return {
        instruction.name: Instruction(
            name=instruction.name,
            opcode=instruction.opcode,
            result_bytes=_shape_bytes(instruction.shape),
            pairs=tuple((pair.source, pair.target) for pair in instruction.source_target_pairs),
            computation=computation.id,
            in_loop_condition=computation.id in conditions,
        )
        for computation in computations
        for instruction in computation.instructions
    }


def _shape_bytes(shape) -> int:
    """Bytes of an array (or of a tuple's arrays) as XLA stores it, by the trace's rule."""
    if shape.tuple_shapes:
        return sum(_shape_bytes(element) for element in shape.tuple_shapes)
    return TensorType(tuple(shape.dimensions), "", _element_bits(shape.element_type)).nbytes


@functools.cache
def _element_bits(element_type: int) -> int:
    """Bits of one element of an XLA `PrimitiveType`; 0 for tokens and other non-arrays, and 1
    for `pred`, as the MLIR types of the parse stage count it."""
    import jax.numpy as jnp
    from jaxlib import xla_client

    primitive = xla_client.PrimitiveType(element_type)
    if primitive.name in ("TOKEN", "TUPLE", "OPAQUE_TYPE", "PRIMITIVE_TYPE_INVALID"):
        return 0
    dtype = xla_client.Shape.array_shape(primitive, ()).numpy_dtype()
    if dtype == np.bool_:
        return 1
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.iinfo(dtype).bits
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.finfo(dtype).bits
    return dtype.itemsize * 8


def read_profile(
    profile, instructions: dict[str, Instruction], module: str, ranks: dict[int, int]
) -> list[ExecutedOp]:
    """The executions of `module`'s instructions, each with its rank and, if it met others, its group."""
    events_of: dict[tuple[int, str], list[tuple[int, ExecutedOp]]] = defaultdict(list)
    for plane in profile.planes:
        for line in plane.lines:
            events = sorted(line.events, key=lambda e: e.start_ns)
            for index, event in enumerate(events):
                stats = dict(event.stats)
                if stats.get("hlo_module") != module or stats.get("hlo_op") not in instructions:
                    continue
                op = ExecutedOp(
                    rank=ranks[stats["device_ordinal"]],
                    instruction=instructions[stats["hlo_op"]],
                    duration_ns=int(event.duration_ns),
                    group=_rendezvous_group(events, index, ranks),
                )
                events_of[op.rank, op.instruction.name].append((event.start_ns, op))
    return _one_op_per_execution(events_of)


def _one_op_per_execution(
    events_of: dict[tuple[int, str], list[tuple[int, ExecutedOp]]],
) -> list[ExecutedOp]:
    """One op per execution of each instruction, from its events.

    XLA:CPU may run one instruction as several thunks, each an event of that instruction (a `sort`
    copies its operands into its results, then sorts them in place), and other instructions may run
    between them. Every instruction of a computation runs as often as the computation does, so the
    computation's runs are its fewest events of one instruction, and an instruction with k times as
    many events ran as k thunks: each k of them, in start order, are one execution.
    """
    runs: dict[tuple[int, int], int] = {}
    for (rank, _), events in events_of.items():
        key = (rank, events[0][1].instruction.computation)
        runs[key] = min(runs.get(key, len(events)), len(events))
    ops = []
    for (rank, _), events in sorted(events_of.items()):
        events.sort(key=lambda started: started[0])
        thunks, uneven = divmod(len(events), runs[rank, events[0][1].instruction.computation])
        if uneven or thunks == 1:
            ops += [op for _, op in events]
            continue
        for first in range(0, len(events), thunks):
            parts = [op for _, op in events[first:first + thunks]]
            ops.append(replace(
                parts[0],
                duration_ns=sum(op.duration_ns for op in parts),
                group=next((op.group for op in parts if op.group), None),
            ))
    return ops


def _rendezvous_group(events, index: int, ranks: dict[int, int]) -> tuple[int, ...] | None:
    """The ranks of the first rendezvous nested in `events[index]` (on the same thread), if any."""
    outer = events[index]
    for event in events[index + 1:]:
        if event.start_ns > outer.end_ns:
            return None
        match = _GLOBAL_DEVICES.search(str(dict(event.stats).get("name", "")))
        if event.name == "Rendezvous" and match:
            return tuple(sorted(ranks[int(i)] for i in match["ids"].split(",")))
    return None

"""What the GPU compiler's optimised module needs before jaxlib converts it to StableHLO.

Four things of that module do not survive the conversion as they are:

- a loop's trip count, which XLA has worked out and written into the `while`'s backend config
  (`known_trip_count`), while its condition reads the counter through fusions the trip-count rules
  of `flint.ir.loops` do not look into. It is copied into a frontend attribute, which the
  conversion keeps, as `TRIP_COUNT`;
- which scheduled instruction an op comes from: its id, as `INSTRUCTION`, which XLA's own time
  estimates are keyed by (`--durations xla`); its name, as `KERNEL_NAME`, which a GPU profile
  names the kernel after; and a fusion's emitter (its backend config's `kind`), as `EMITTER`,
  which tells a Triton block-level fusion from XLA's own;
- the convolution a cuDNN custom call runs (`__cudnn$convForward`, ...): the conversion keeps its
  operands and backend config but drops its window, dimension numbers and group counts. They are
  written, as JSON, into `CONVOLUTION`;
- a combined asynchronous collective (one `all-gather-start`, or one `async-start` of a
  reduce-scatter or all-reduce, of several operands: how XLA's combiners batch FSDP's parameter
  gathers and gradient reduce-scatters), which the conversion refuses ("Async tuple all-gather is
  not supported in StableHLO", "expected async done to have exactly one operand"). It is split
  into one start and done per operand, issued together where the combined one was, each marked
  `COMBINED` with its place among them (`all-gather-start.4:1`); the graph stage joins the marked
  pieces back into the one collective the compiler made (`flint.graph.build`). A combined
  collective the compiler made synchronous (the gradients of the keys and values that context
  parallelism gathers, at Llama 3 405B's sizes: "'stablehlo.reduce_scatter' op requires a single
  operand") is split alike, into one collective per operand and a tuple of their results.

The CPU compiler's optimised module goes through the same steps, harmlessly: it has no combined
asynchronous collectives, and its loops' counts agree with what `flint.ir.loops` reads.
"""

from __future__ import annotations

import json

TRIP_COUNT = "flint_trip_count"
COMBINED = "flint_combined"
INSTRUCTION = "flint_instruction"
"""The id of the scheduled instruction an op comes from, which XLA's time estimates are keyed by."""
KERNEL_NAME = "flint_kernel_name"
"""The scheduled instruction's name (`fusion.103`): a GPU profile's kernel of that instruction is
named alike, with `_` for `.` and `-` (`fusion_103`)."""
EMITTER = "flint_emitter"
"""A fusion's backend kind: `__triton` for a Triton block-level fusion (softmax- and norm-like rows),
`__triton_gemm` for a Triton GEMM; absent for XLA's own loop and reduction emitters."""
CONVOLUTION = "flint_convolution"
"""A custom call's convolution: `window` (per spatial dimension: size, stride, low and high padding,
kernel (window) dilation, input (base) dilation), `input`, `kernel` and `output` (the dimension
numbers: input batch, feature, spatial...; kernel input feature, output feature, spatial...; output
batch, feature, spatial...), `feature_group_count` and `batch_group_count`."""
_BOOKKEEPING = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast"})
_TUPLE = 13
"""`PrimitiveType.TUPLE` of XLA's shapes."""


def record_trip_counts(module) -> None:
    """Copy each `while`'s known trip count into its frontend attributes."""
    for computation in module.computations:
        for instruction in computation.instructions:
            if instruction.opcode != "while" or not instruction.backend_config:
                continue
            known = json.loads(instruction.backend_config).get("known_trip_count")
            if known is not None:
                instruction.frontend_attributes.map[TRIP_COUNT] = str(known["n"])


def record_convolutions(module) -> None:
    """Copy the convolution of each custom call that has one (cuDNN's) into its frontend
    attributes, as `CONVOLUTION`."""
    for computation in module.computations:
        for instruction in computation.instructions:
            if instruction.opcode != "custom-call" or not instruction.HasField("convolution_dimension_numbers"):
                continue
            dims = instruction.convolution_dimension_numbers
            instruction.frontend_attributes.map[CONVOLUTION] = json.dumps({
                "window": [
                    [d.size, d.stride, d.padding_low, d.padding_high, d.window_dilation or 1, d.base_dilation or 1]
                    for d in instruction.window.dimensions
                ],
                "input": [dims.input_batch_dimension, dims.input_feature_dimension,
                          *dims.input_spatial_dimensions],
                "kernel": [dims.kernel_input_feature_dimension, dims.kernel_output_feature_dimension,
                           *dims.kernel_spatial_dimensions],
                "output": [dims.output_batch_dimension, dims.output_feature_dimension,
                           *dims.output_spatial_dimensions],
                "feature_group_count": instruction.feature_group_count or 1,
                "batch_group_count": instruction.batch_group_count or 1,
            })


def record_instruction_ids(module) -> None:
    """Mark each scheduled instruction that can become a trace node with its id, its name and, for
    a fusion the compiler hands to an emitter of its own, that emitter: the node can then be timed
    with XLA's estimate for it (`--durations xla`), matched to a profile's kernel by name
    (`flint calibrate`) and timed by its emitter's efficiency (`flint.ir.costs.kernel_of`)."""
    for instruction in scheduled_instructions(module):
        if instruction.opcode in _BOOKKEEPING:
            continue
        marks = instruction.frontend_attributes.map
        marks[INSTRUCTION] = str(instruction.id)
        marks[KERNEL_NAME] = instruction.name
        emitter = emitter_of(instruction)
        if emitter:
            marks[EMITTER] = emitter


def scheduled_instructions(module):
    """The instructions of the module's scheduled computations (the entry, loop bodies and
    conditions, called computations): the ones that run as kernels or calls, not those inside a
    fusion's body."""
    for computation in module.computations:
        if computation.id in module.schedule.sequences:
            yield from computation.instructions


def emitter_of(instruction) -> str | None:
    """The emitter the compiler handed a fusion to (its backend config's `kind`, see `EMITTER`);
    None for XLA's own emitters and for what is not a fusion."""
    if instruction.opcode != "fusion" or not instruction.backend_config:
        return None
    return json.loads(instruction.backend_config).get("fusion_backend_config", {}).get("kind") or None


def latency_estimates(schedule: bytes) -> dict[int, float]:
    """Microseconds XLA's latency-hiding scheduler expects each instruction to take, from the
    schedule it dumps (`--xla_dump_latency_hiding_schedule`)."""
    from flint.schema.hlo_envelope_pb2 import LatencySchedule

    return {
        instruction.id: (instruction.end_timestamp_cycles - instruction.start_timestamp_cycles)
        / (computation.cycles_per_microsecond or 1)
        for computation in LatencySchedule.FromString(schedule).computation_schedules
        for instruction in computation.instructions
    }


def split_combined_collectives(module) -> None:
    """Rewrite every collective of several operands as one per operand: an asynchronous one as a
    start and done per operand, a synchronous one as a collective per operand."""
    computations = {c.id: c for c in module.computations}
    next_computation = max(computations, default=0) + 1
    added: dict[int, list] = {}  # wrapped computation -> the bodies of its pieces
    wrapped_ids = {
        called
        for computation in module.computations
        for instruction in computation.instructions
        if instruction.opcode == "async-start"
        for called in instruction.called_computation_ids
    }
    for computation in list(module.computations):
        pieces: dict[int, list] = {}
        rewritten = []
        next_id = max((i.id for i in computation.instructions), default=0) + 1
        for instruction in computation.instructions:
            if _combined(instruction, computations):
                if instruction.opcode == "async-start":
                    wrapped = computations[instruction.called_computation_ids[0]]
                    bodies = _split_body(wrapped, next_computation, instruction.name)
                    added.setdefault(wrapped.id, []).extend(bodies)
                    next_computation += len(bodies)
                else:
                    bodies = None
                pieces[instruction.id] = _start_pieces(instruction, next_id, bodies)
                next_id += 2 * len(instruction.operand_ids)  # the dones' ids follow the starts'
            elif (
                instruction.opcode in _SPLITTABLE
                and len(instruction.operand_ids) >= 2
                and computation.id not in wrapped_ids  # an async start's: split with it
            ):
                pieces[instruction.id] = _collective_pieces(instruction, next_id)
                next_id += len(instruction.operand_ids)
            elif instruction.opcode.endswith("-done") and instruction.operand_ids[0] in pieces:
                pieces[instruction.id] = _done_pieces(instruction, pieces[instruction.operand_ids[0]])
            else:
                rewritten.append(instruction)
                continue
            rewritten.extend(pieces[instruction.id])
        if pieces:
            del computation.instructions[:]
            computation.instructions.extend(rewritten)
            _reschedule(module, computation.id, pieces)
    if added:  # the bodies take the place of the computation they split (its start's alone)
        ordered = [
            body for c in module.computations for body in (added[c.id] if c.id in added else (c,))
        ]
        for split in added:
            del module.schedule.sequences[split]
        del module.computations[:]
        module.computations.extend(ordered)
        for body in (b for bodies in added.values() for b in bodies):
            module.schedule.sequences[body.id].instruction_ids.extend(i.id for i in body.instructions)


def _combined(instruction, computations) -> bool:
    """An all-gather start, or an async start wrapping a collective, of several operands."""
    if len(instruction.operand_ids) < 2:
        return False
    if instruction.opcode == "all-gather-start":
        return True
    if instruction.opcode != "async-start":
        return False
    wrapped = computations[instruction.called_computation_ids[0]]
    return _root(wrapped).opcode in _SPLITTABLE


_SPLITTABLE = frozenset({"all-gather", "reduce-scatter", "all-reduce"})


def _root(computation):
    return next(i for i in computation.instructions if i.id == computation.root_id)


def _copy(instruction, new_id: int, name: str):
    piece = type(instruction)()
    piece.CopyFrom(instruction)
    piece.id, piece.name = new_id, name
    del piece.operand_ids[:]
    return piece


def _split_body(wrapped, first_id: int, combined: str) -> list:
    """One computation per operand of the collective `wrapped` runs: its parameter and the
    collective of that operand alone, marked as piece k of `combined`."""
    root = _root(wrapped)
    parameters = {i.id: i for i in wrapped.instructions if i.opcode == "parameter"}
    bodies = []
    for k, operand in enumerate(root.operand_ids):
        body = type(wrapped)()
        body.CopyFrom(wrapped)
        body.id, body.name = first_id + k, f"{wrapped.name}.piece{k}"
        parameter = _copy(parameters[operand], body.id << 32, f"{parameters[operand].name}.piece{k}")
        parameter.parameter_number = 0
        collective = _copy(root, (body.id << 32) + 1, f"{root.name}.piece{k}")
        collective.operand_ids.append(parameter.id)
        collective.shape.CopyFrom(root.shape.tuple_shapes[k])
        collective.frontend_attributes.map[COMBINED] = f"{combined}:{k}"
        del body.instructions[:]
        body.instructions.extend([parameter, collective])
        body.root_id = collective.id
        body.program_shape.Clear()
        body.program_shape.parameters.add().CopyFrom(parameter.shape)
        body.program_shape.result.CopyFrom(collective.shape)
        body.program_shape.parameter_names.append(parameter.name)
        bodies.append(body)
    return bodies


def _start_pieces(start, first_id: int, bodies: list | None) -> list:
    """One single-operand start per operand, each shaped `(operand, result)`; an async start calls
    the body of its piece, an all-gather start carries the mark itself."""
    operands, results = start.shape.tuple_shapes[:2]
    pieces = []
    for k, operand in enumerate(start.operand_ids):
        piece = _copy(start, first_id + k, f"{start.name}.piece{k}")
        piece.operand_ids.append(operand)
        # every piece after every operand, as the combined start was: the pieces stay together
        piece.control_predecessor_ids.extend(o for o in start.operand_ids if o != operand)
        piece.shape.Clear()
        piece.shape.element_type = _TUPLE
        if bodies is None:
            piece.shape.tuple_shapes.add().CopyFrom(operands.tuple_shapes[k])
            piece.frontend_attributes.map[COMBINED] = f"{start.name}:{k}"
        else:
            piece.shape.tuple_shapes.add().tuple_shapes.add().CopyFrom(operands.tuple_shapes[k])
            piece.shape.tuple_shapes[0].element_type = _TUPLE
            del piece.called_computation_ids[:]
            piece.called_computation_ids.append(bodies[k].id)
        piece.shape.tuple_shapes.add().CopyFrom(results.tuple_shapes[k])
        pieces.append(piece)
    return pieces


def _done_pieces(done, starts: list) -> list:
    """A done per start, then a tuple of their results under the combined done's id, so the
    instructions that read the combined result read the same values."""
    pieces = []
    for start in starts:
        piece = _copy(done, start.id + len(starts), f"{start.name}.done")
        piece.operand_ids.append(start.id)
        piece.shape.CopyFrom(start.shape.tuple_shapes[-1])
        del piece.called_computation_ids[:]
        piece.called_computation_ids.extend(start.called_computation_ids[:1] if done.called_computation_ids else [])
        pieces.append(piece)
    joined = _copy(done, done.id, done.name)
    joined.opcode = "tuple"
    joined.ClearField("backend_config")
    del joined.called_computation_ids[:]
    joined.operand_ids.extend(p.id for p in pieces)
    return [*pieces, joined]


def _collective_pieces(collective, first_id: int) -> list:
    """A synchronous collective of several operands as one per operand, each marked as piece k of
    it, then a tuple of their results under its id, which its users read as before."""
    pieces = []
    for k, operand in enumerate(collective.operand_ids):
        piece = _copy(collective, first_id + k, f"{collective.name}.piece{k}")
        piece.operand_ids.append(operand)
        # every piece after every operand, as the combined collective was: the pieces stay together
        piece.control_predecessor_ids.extend(o for o in collective.operand_ids if o != operand)
        piece.shape.CopyFrom(collective.shape.tuple_shapes[k])
        piece.frontend_attributes.map[COMBINED] = f"{collective.name}:{k}"
        pieces.append(piece)
    joined = type(collective)(name=collective.name, opcode="tuple", id=collective.id)
    joined.shape.CopyFrom(collective.shape)
    joined.operand_ids.extend(p.id for p in pieces)
    return [*pieces, joined]


def _reschedule(module, computation_id: int, pieces: dict[int, list]) -> None:
    """Put the pieces where the instruction they replace was in the computation's schedule."""
    sequence = module.schedule.sequences.get(computation_id)
    if sequence is None:
        return
    ordered = [p for i in sequence.instruction_ids for p in ([q.id for q in pieces[i]] if i in pieces else [i])]
    del sequence.instruction_ids[:]
    sequence.instruction_ids.extend(ordered)

"""Integer values known while the graph is built: constants, loop counters, and arithmetic on them.

Loops are unrolled, so in each iteration a loop's counter is a number, and so is anything computed
from it with integer ops: the layer index a `scan` reads from `arange`, `i % 2 == 0`, a table lookup.
A `case` or `if` whose selector is known that way runs the branch the compiler would run in that
iteration (interleaved layers: every other one a mixture of experts, local and global attention),
instead of the costliest branch every time.

Values are Python ints for scalars and int64 arrays for small tensors (booleans as 0 and 1). Only
ops with integer results are folded (also inside the optimised module's fusions), in StableHLO's
semantics: `divide` truncates, `remainder` takes the sign of the dividend, `dynamic_slice` clamps
its start. Anything else is unknown.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from flint.ir.parse import FOLDABLE, FUSION, Op

Value = int | np.ndarray

ARITHMETIC: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": lambda a, b: np.trunc(np.divide(a, np.where(b == 0, 1, b))).astype(np.int64),
    "remainder": lambda a, b: np.fmod(a, np.where(b == 0, 1, b)),
    "minimum": np.minimum,
    "maximum": np.maximum,
    "and": np.bitwise_and,
    "or": np.bitwise_or,
    "xor": np.bitwise_xor,
}
_COMPARE = {
    "EQ": np.equal,
    "NE": np.not_equal,
    "LT": np.less,
    "LE": np.less_equal,
    "GT": np.greater,
    "GE": np.greater_equal,
}
_SAME_VALUE = ("copy", "reshape", "bitcast", "convert", "optimization_barrier")


def fold(op: Op, known: Mapping[int, Value]) -> Value | None:
    """The value of `op`'s one result, if it is an integer op whose operands are all known."""
    result = op.result_types[0] if len(op.results) == 1 else None
    if result is None or result.elements > FOLDABLE or not result.dtype.startswith(("i", "ui", "si")):
        return None
    if op.opcode == "constant":
        found = op.attrs.get("value", op.attrs.get("array"))
        return None if found is None else _shaped(np.asarray(found), op)
    if op.opcode == "iota":
        shape = op.result_types[0].shape
        return _shaped(np.indices(shape)[op.attrs["iota_dimension"]], op)
    operands = [known.get(v) for v in op.operands]
    if any(value is None for value in operands):
        return None
    if op.opcode == FUSION:
        return _fused(op, operands)
    values = [np.asarray(value, dtype=np.int64) for value in operands]
    return None if (result := _apply(op, values)) is None else _shaped(result, op)


def _fused(op: Op, operands: list[Value]) -> Value | None:
    """A fusion (optimised module) of integer ops, folded op by op over its body."""
    (body,) = op.regions
    inside: dict[int, Value] = dict(zip(body.arguments, operands))
    for inner in body.ops:
        if (value := fold(inner, inside)) is not None:
            inside[inner.results[0]] = value
    return inside.get(body.results[0]) if len(body.results) == 1 else None


def _apply(op: Op, values: list[np.ndarray]) -> np.ndarray | None:
    boolean = op.result_types[0].dtype == "i1"
    if op.opcode in _SAME_VALUE and len(values) == 1:
        return (values[0] != 0) if boolean else values[0]
    if op.opcode == "broadcast_in_dim" and values[0].ndim == 0:
        return np.broadcast_to(values[0], op.result_types[0].shape)
    if op.opcode in ARITHMETIC and len(values) == 2:
        return ARITHMETIC[op.opcode](*values)
    if op.opcode == "compare":
        return _COMPARE[op.attrs["direction"]](*values)
    if op.opcode == "not":
        return (values[0] == 0) if boolean else np.invert(values[0])
    if op.opcode == "negate":
        return np.negative(values[0])
    if op.opcode == "abs":
        return np.abs(values[0])
    if op.opcode == "select":
        return np.where(values[0] != 0, values[1], values[2])
    if op.opcode == "clamp":  # lax.switch clamps its index
        return np.clip(values[1], values[0], values[2])
    if op.opcode == "slice":
        return values[0][tuple(map(slice, op.attrs["start"], op.attrs["limit"], op.attrs["strides"]))]
    if op.opcode == "dynamic_slice":
        table, starts = values[0], [int(v) for v in values[1:]]
        sizes = op.result_types[0].shape
        starts = [min(max(s, 0), dim - size) for s, dim, size in zip(starts, table.shape, sizes)]
        return table[tuple(slice(s, s + size) for s, size in zip(starts, sizes))]
    return None


def _shaped(value: np.ndarray, op: Op) -> Value:
    shape, boolean = op.result_types[0].shape, op.result_types[0].dtype == "i1"
    value = (value != 0 if boolean else value).astype(np.int64)
    value = value.reshape(shape) if value.size == math.prod(shape) else np.broadcast_to(value, shape)
    return int(value) if not shape else value

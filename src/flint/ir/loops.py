"""Static trip counts of `while` loops, read from the loop itself.

JAX's `scan` and `fori_loop` lower to a while loop whose condition compares one carried value (the
induction variable) with a constant, and whose body adds a constant step to it. The trip count follows
from the initial value, the bound, the step and the comparison; anything else has no static count.
In the optimised module the same loop reads through copies of the counter and one-op fusions around
the comparison and the increment, so both are looked through.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from flint.ir.parse import FUSION, Op, Region

_SWAPPED = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "NE": "NE", "EQ": "EQ"}


def _definitions(region: Region) -> dict[int, Op]:
    return {value: op for op in region.ops for value in op.results}


def _through_copies(value: int, defs: Mapping[int, Op]) -> int:
    op = defs.get(value)
    while op is not None and op.opcode == "copy":
        value = op.operands[0]
        op = defs.get(value)
    return value


def _defining(value: int, defs: Mapping[int, Op]) -> Op | None:
    """The op computing `value`; a fusion of one op over its arguments stands for that op."""
    op = defs.get(_through_copies(value, defs))
    if op is None or op.opcode != FUSION:
        return op
    (body,) = op.regions
    inner = _definitions(body).get(body.results[0]) if len(body.results) == 1 else None
    if inner is None or not all(v in body.arguments for v in inner.operands):
        return op
    outer = tuple(op.operands[body.arguments.index(v)] for v in inner.operands)
    return replace(inner, operands=outer, results=op.results)


def _constant(value: int, defs: Mapping[int, Op], outer: Mapping[int, int]) -> int | None:
    value = _through_copies(value, defs)
    op = defs.get(value)
    if op is not None:
        return op.attrs.get("value") if op.opcode == "constant" else None
    return outer.get(value)


def _count(init: int, bound: int, step: int, direction: str) -> int | None:
    if step == 0:
        return None
    if direction in ("LT", "LE") and step > 0:
        span = bound - init + (1 if direction == "LE" else 0)
        return max(0, -(-span // step))
    if direction in ("GT", "GE") and step < 0:
        span = init - bound + (1 if direction == "GE" else 0)
        return max(0, -(-span // -step))
    if direction == "NE" and (bound - init) % step == 0 and (bound - init) // step >= 0:
        return (bound - init) // step
    return None


def trip_count(loop: Op, constants: Mapping[int, int]) -> int | None:
    """Iterations of `loop` (a `while` op), or None when they are not static.

    `constants` maps value ids to the integers they are known to hold where the loop starts (its
    initial values; `flint.ir.folding`). The bound is a constant, or a value the loop carries unchanged
    (an inner loop running `i` times for the counter `i` of an outer one). A count the compiler
    worked out itself (`flint.compile.gpu_module`) is taken as it is.
    """
    if "trip_count" in loop.attrs:
        return loop.attrs["trip_count"]
    cond, body = loop.regions
    cond_defs, body_defs = _definitions(cond), _definitions(body)
    compare = _defining(cond.results[0], cond_defs) if cond.results else None
    if compare is None or compare.opcode != "compare":
        return None
    lhs, rhs = (_through_copies(v, cond_defs) for v in compare.operands)
    direction = compare.attrs["direction"]
    for counter, limit, towards in ((lhs, rhs, direction), (rhs, lhs, _SWAPPED[direction])):
        if counter not in cond.arguments:
            continue
        index = cond.arguments.index(counter)
        step = _step(body, index, body_defs, constants)
        bound = _constant(limit, cond_defs, constants)
        if bound is None and limit in cond.arguments:
            bound = _carried(loop, cond.arguments.index(limit), body_defs, constants)
        init = constants.get(loop.operands[index])
        if step is not None and bound is not None and init is not None:
            return _count(init, bound, step, towards)
    return None


def _step(body: Region, index: int, defs: Mapping[int, Op], constants: Mapping[int, int]) -> int | None:
    """How much the body adds to its `index`th argument, if it adds or subtracts a constant."""
    update = _defining(body.results[index], defs)
    if update is None or update.opcode not in ("add", "subtract"):
        return None
    counter, other = (_through_copies(v, defs) for v in update.operands)
    if counter != body.arguments[index]:
        if update.opcode == "subtract" or other != body.arguments[index]:
            return None
        counter, other = other, counter
    step = _constant(other, defs, constants)
    return None if step is None else -step if update.opcode == "subtract" else step


def _carried(loop: Op, index: int, defs: Mapping[int, Op], constants: Mapping[int, int]) -> int | None:
    """The initial value of a loop-carried value the body passes on unchanged."""
    _, body = loop.regions
    if _through_copies(body.results[index], defs) != body.arguments[index]:
        return None
    return constants.get(loop.operands[index])

"""Integer folding (`flint.ir.folding`) in StableHLO's semantics, on ops built by hand."""

from __future__ import annotations

import numpy as np

from flint.ir.folding import fold
from flint.ir.parse import Op, TensorType


def op(opcode: str, *operands: int, shape=(), dtype="i32", **attrs) -> Op:
    result = TensorType(tuple(shape), dtype, 1 if dtype == "i1" else 32)
    return Op(opcode, opcode, operands, (100,), (), (result,), attrs)


KNOWN = {1: -7, 2: 2, 3: np.arange(6), 4: 10, 5: 0}


def test_divide_truncates_and_remainder_takes_the_dividend_sign():
    assert fold(op("divide", 1, 2), KNOWN) == -3  # Python's // would give -4
    assert fold(op("remainder", 1, 2), KNOWN) == -1  # Python's % would give 1


def test_dynamic_slice_clamps_its_start():
    assert list(fold(op("dynamic_slice", 3, 4, shape=(2,)), KNOWN)) == [4, 5]  # start 10 -> 4


def test_clamp_takes_min_operand_max():
    assert fold(op("clamp", 5, 4, 2), KNOWN) == 2  # clamp(0, 10, 2)


def test_compare_select_and_booleans():
    less = fold(op("compare", 1, 5, dtype="i1", direction="LT"), KNOWN)
    assert less == 1
    assert fold(op("select", 5, 1, 2), KNOWN) == 2  # 0 is false
    assert fold(op("not", 5, dtype="i1"), KNOWN) == 1


def test_unknown_operands_and_large_results_stay_unknown():
    assert fold(op("add", 1, 99), KNOWN) is None
    assert fold(op("broadcast_in_dim", 2, shape=(8192,)), KNOWN) is None
    assert fold(op("sine", 2), KNOWN) is None

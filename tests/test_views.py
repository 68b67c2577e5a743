"""`flint inspect`'s tables at the width of a small terminal or a pipe (80 columns): every number
whole, counts with the right plural.

The numbers come from examples/mlp.py on a 2x4 mesh (dp 2, tp 4), derived as in test_mlp: per rank
b = BATCH/2 rows and h = D_HIDDEN/4 hidden units, five matmuls of 2*b*D_MODEL*h FLOPs; all-reduces of
the output over the tensor group (4 ranks, b*D_MODEL bf16) and of the two weight gradients
(D_MODEL*h bf16 each) and the f32 loss over the data group (2 ranks).
"""

from __future__ import annotations

import re

from click.testing import CliRunner
from conftest import load_example

from flint.cli import main
from flint.schema import et_def_pb2 as pb
from flint.trace.reader import attr_value, read_trace

mlp = load_example("mlp")

BF16, F32 = 2, 4


def inspect(*args: str, columns: int) -> str:
    # Rich reads the terminal width from COLUMNS when it renders, as in a pipe.
    result = CliRunner().invoke(main, ["inspect", *map(str, args)], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


def test_numbers_are_whole_at_80_columns(mlp_traces):
    directory = mlp_traces("2x4")
    b, h = mlp.BATCH // 2, mlp.D_HIDDEN // 4
    matmul = 2 * b * mlp.D_MODEL * h
    rank0 = read_trace(directory / "mlp.0.et").nodes
    compute = [attr_value(n, "num_ops") for n in rank0
               if n.type == pb.COMP_NODE and attr_value(n, "op") not in ("dot", "dot_general")]
    dots = [attr_value(n, "num_ops") for n in rank0 if attr_value(n, "op") in ("dot", "dot_general")]
    assert dots == [matmul] * 5
    # The matmuls by hand; every other op's FLOPs as the trace says (elementwise ops; a data
    # movement node's num_ops of 1 is no FLOP).
    flops = 5 * matmul + sum(ops for ops in compute if ops > 1)
    assert flops > 10**9  # 13 characters printed

    out = inspect(directory, columns=80)
    assert max(len(line) for line in out.splitlines() if line[:1] in "┏┃┡│└") <= 80  # tables fit
    assert not re.search(r"\d…", out), out  # no number cut short
    assert re.search(rf"│ +0 │ +{len(rank0)} │ +{flops:,} │", out), out  # rank, nodes, FLOPs
    # Collective bytes by group size: the tensor group's one, the data group's three.
    assert re.search(rf"│ all_reduce +│ +4 │ +1 │ +{b * mlp.D_MODEL * BF16:,} │", out), out
    data_bytes = 2 * mlp.D_MODEL * h * BF16 + F32
    assert re.search(rf"│ all_reduce +│ +2 │ +3 │ +{data_bytes:,} │", out), out
    assert "all_reduce 4x" in out  # the per-rank collectives, words whole
    assert "(8 ranks)" in out and "spread across 8 ranks" in out


def test_one_rank_is_singular_and_wide_terminals_keep_one_table(mlp_traces):
    directory = mlp_traces("2x4")
    one = inspect(directory / "mlp.3.et", columns=80)
    assert one.splitlines()[0] == f"{directory / 'mlp.3.et'} (1 rank)"
    assert "1 ranks" not in one
    wide = inspect(directory, columns=200)
    header = next(line for line in wide.splitlines() if "FLOPs" in line)
    assert "by type" in header and "collectives" in header  # one table of every column
    narrow = inspect(directory, columns=80)
    header = next(line for line in narrow.splitlines() if "FLOPs" in line)
    assert "by type" not in header  # two tables: numbers, then node types and collectives
    assert "nodes by type and collectives" in narrow

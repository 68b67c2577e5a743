"""A ragged all-to-all (tests/models/ragged.py) on `--mesh 4`: one ALL_TO_ALL per rank over all ranks."""

from __future__ import annotations

import pytest
from conftest import MODELS, extract, flint
from models import ragged

from flint.schema import et_def_pb2 as pb
from flint.trace.reader import attr_value, read_trace, read_trace_set
from flint.trace.timing import group_id


@pytest.mark.parametrize("backend", ["cpu", "gpu:h100"])
def test_ragged_all_to_all_is_an_all_to_all_of_its_whole_input(tmp_path, backend):
    """XLA:CPU stops after partitioning (it has no code for the op) and the partitioned module is
    traced; the GPU compiler compiles it, as an asynchronous call of the collective. Each rank's
    all-to-all may send all of its [ROWS, COLS] f32 block: that is its size."""
    out = tmp_path / "t"
    extract(MODELS / "ragged.py", "4", out, "--backend", backend)
    _, groups = read_trace_set(out)
    for rank in range(4):
        nodes = read_trace(out / f"ragged.{rank}.et").nodes
        (node,) = [n for n in nodes if n.type == pb.COMM_COLL_NODE]
        assert attr_value(node, "comm_type") == pb.ALL_TO_ALL
        assert attr_value(node, "comm_size") == ragged.ROWS * ragged.COLS * 4
        assert sorted(groups[group_id(node)]) == [0, 1, 2, 3]


def test_the_optimised_stage_says_the_cpu_cannot_compile_it(tmp_path):
    out = tmp_path / "t"
    run = flint("extract", MODELS / "ragged.py", "--mesh", "4", "--backend", "cpu", "--stage", "optimized", "-o", out)
    assert run.returncode != 0
    assert "ragged-all-to-all" in run.stderr and "could not compile" in run.stderr
    assert not out.exists()

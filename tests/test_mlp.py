"""The MLP example's traces against numbers derived by hand from its shapes and shardings.

Layout (see examples/mlp.py): batch split over the data axes (dp ways), hidden split over the last
axis (tp ways); rank r sits at row-major mesh position, so on a (dp, tp) mesh r = d * tp + t.
Per rank, with b = BATCH/dp and h = D_HIDDEN/tp, the five matmuls of forward and backward are
    x @ w_in, hidden @ w_out                      (forward)
    d_out @ w_out^T, hidden^T @ d_out, x^T @ d_pre (backward)
each 2*b*D_MODEL*h FLOPs. Collectives: the row-parallel output is summed over the tensor group
(b*D_MODEL bf16); each weight gradient is summed over the data group (D_MODEL*h bf16); the f32 loss
is summed over the data group (4 bytes).
"""

from __future__ import annotations

import json

import pytest
from conftest import load_example, matmuls_and_collectives

from flint.schema import et_def_pb2 as pb
from flint.trace.contract import check_traces
from flint.trace.reader import attr_value, read_comm_groups, read_trace

mlp = load_example("mlp")

BF16, F32 = 2, 4


def expected(dp_axes: tuple[int, ...], tp: int, rank: int):
    """(matmul FLOPs, sorted [(comm_type, comm_size, group ranks)]) for `rank`, by hand."""
    dp = 1
    for size in dp_axes:
        dp *= size
    b, h = mlp.BATCH // dp, mlp.D_HIDDEN // tp
    flops = 5 * 2 * b * mlp.D_MODEL * h
    d, t = divmod(rank, tp)
    tensor_group = tuple(d * tp + u for u in range(tp))
    data_group = tuple(e * tp + t for e in range(dp))
    colls = []
    if tp > 1:
        colls.append((pb.ALL_REDUCE, b * mlp.D_MODEL * BF16, tensor_group))
    if dp > 1:
        colls += [(pb.ALL_REDUCE, mlp.D_MODEL * h * BF16, data_group)] * 2
        colls.append((pb.ALL_REDUCE, F32, data_group))
    return flops, sorted(colls)


@pytest.mark.parametrize(
    "mesh, dp_axes, tp",
    [("8x8", (8,), 8), ("2x4", (2,), 4), ("2x2x2", (2, 2), 2), ("4", (4,), 1)],
)
def test_every_rank_matches_hand_derivation(mlp_traces, mesh, dp_axes, tp):
    directory = mlp_traces(mesh)
    ranks = tp
    for size in dp_axes:
        ranks *= size
    for rank in range(ranks):
        assert matmuls_and_collectives(directory, rank) == expected(dp_axes, tp, rank), f"rank {rank}"


@pytest.mark.parametrize("mesh", ["8x8", "2x2x2"])
def test_traces_satisfy_the_contract(mlp_traces, mesh):
    assert check_traces(mlp_traces(mesh)) == []


def test_output_files_and_manifest(mlp_traces):
    directory = mlp_traces("8x8")
    names = {p.name for p in directory.iterdir()}
    assert names == {f"mlp.{r}.et" for r in range(64)} | {
        "mlp.comm_groups.json",
        "mlp.graph.json",
        "manifest.json",
    }
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["mesh"] == {"shape": [8, 8], "axis_names": ["data", "tensor"]}
    assert manifest["ranks"] == 64
    totals = manifest["rank_totals"][0]
    assert totals["ranks"] == [[0, 63]]
    b, h = mlp.BATCH // 8, mlp.D_HIDDEN // 8
    assert totals["collectives"] == {
        "all_reduce": {
            "count": 4,
            "bytes": b * mlp.D_MODEL * BF16 + 2 * mlp.D_MODEL * h * BF16 + F32,
        }
    }
    assert manifest["command"].startswith("flint extract")


def test_groups_are_deduplicated_and_numbered_from_one(mlp_traces):
    groups = read_comm_groups(mlp_traces("8x8") / "mlp.comm_groups.json")
    # 8 tensor groups (rows of the mesh) and 8 data groups (columns), each listed once.
    assert sorted(groups) == list(range(1, 17))
    rows = {tuple(range(8 * d, 8 * d + 8)) for d in range(8)}
    cols = {tuple(range(t, 64, 8)) for t in range(8)}
    assert set(groups.values()) == rows | cols


def test_bf16_stays_two_bytes(mlp_traces):
    """The partitioned module keeps the model's bf16: the first matmul reads x and w_in in bf16."""
    trace = read_trace(mlp_traces("8x8") / "mlp.0.et")
    first_dot = next(n for n in trace.nodes if attr_value(n, "op") in ("dot", "dot_general"))
    b, h = mlp.BATCH // 8, mlp.D_HIDDEN // 8
    x, w_in, out = b * mlp.D_MODEL, mlp.D_MODEL * h, b * h
    assert attr_value(first_dot, "tensor_size") == (x + w_in + out) * BF16

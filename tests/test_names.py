"""Readable node names: collectives by kind, mesh axes, group size and bytes; kernels and ops by the
model line the compiler kept; the JAX op path in `source_op`.

Model: `examples/mlp.py` on 2x4 (axes data=2, tensor=4). Per rank: x [BATCH/2, D_MODEL], w_in
[D_MODEL, D_HIDDEN/4], w_out [D_HIDDEN/4, D_MODEL], all bf16. Its collectives, by hand:
- `hidden @ w_out` sums partial products over the tensor row: [128, 1024] bf16 = 262,144 B =
  256.0 KiB, `all_reduce tensor/4 256.0 KiB`;
- the gradients of w_in and w_out are averaged over the data column: 1024 x 1024 bf16 = 2.0 MiB
  each, `all_reduce data/2 2.0 MiB`, from the lines of `x @ w_in` and `hidden @ w_out`;
- the mean loss, one f32 over the data column: `all_reduce data/2 4 B`, from `jnp.mean`'s line.
Matmuls: `x @ w_in` runs forward and for w_in's gradient (2), `hidden @ w_out` forward, for
hidden's gradient and for w_out's (3).
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest
from conftest import EXAMPLES, extract

from flint.graph.names import group_axes, pair_axes, size_text
from flint.mesh import MeshSpec
from flint.schema import et_def_pb2 as pb
from flint.trace.reader import attr_value, find_traces, read_comm_groups, read_trace

MESH = MeshSpec((2, 4), ("data", "tensor"))


def line_of(code: str, path: Path = EXAMPLES / "mlp.py") -> int:
    """The (only) line of the model file holding `code`."""
    (line,) = [i for i, text in enumerate(path.read_text().splitlines(), 1) if code in text]
    return line


@pytest.mark.parametrize(
    "nbytes, text",
    [(4, "4 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (262_144, "256.0 KiB"),
     (4 * 2**20, "4.0 MiB"), (2**20 - 1, "1.0 MiB"), (3 * 2**30 // 2, "1.5 GiB")],
)
def test_sizes_are_binary_units_with_one_decimal(nbytes, text):
    assert size_text(nbytes) == text


def test_groups_are_named_by_the_mesh_axes_they_span():
    rows = ((0, 1, 2, 3), (4, 5, 6, 7))
    columns = ((0, 4), (1, 5), (2, 6), (3, 7))
    assert group_axes(rows, MESH) == "tensor"
    assert group_axes(columns, MESH) == "data"
    assert group_axes((tuple(range(8)),), MESH) == "data+tensor"
    # half of a tensor row is not a whole sub-mesh of any axis
    assert group_axes(((0, 1), (2, 3), (4, 5), (6, 7)), MESH) == ""
    assert group_axes(rows, None) == ""
    assert pair_axes(((0, 4), (1, 5)), MESH) == "data"


@pytest.fixture(scope="module")
def mlp(mlp_traces):
    directory = mlp_traces("2x4")
    prefix, _ = find_traces(directory)
    groups = read_comm_groups(directory / f"{prefix}.comm_groups.json")
    return directory, read_trace(directory / f"{prefix}.0.et"), groups


def test_collectives_are_named_by_kind_axes_size_and_bytes(mlp):
    _, trace, groups = mlp
    first, second, loss = line_of('batch["x"] @'), line_of('hidden @'), line_of("jnp.mean")
    found = Counter(
        (n.name, attr_value(n, "source"), groups[int(attr_value(n, "pg_name"))])
        for n in trace.nodes
        if n.type == pb.COMM_COLL_NODE
    )
    assert found == Counter({
        ("all_reduce tensor/4 256.0 KiB", f"mlp.py:{second}", (0, 1, 2, 3)): 1,
        ("all_reduce data/2 2.0 MiB", f"mlp.py:{first}", (0, 4)): 1,
        ("all_reduce data/2 2.0 MiB", f"mlp.py:{second}", (0, 4)): 1,
        ("all_reduce data/2 4 B", f"mlp.py:{loss}", (0, 4)): 1,
    })
    for node in trace.nodes:
        if node.type == pb.COMM_COLL_NODE:  # the op path stays: forward or backward, which op
            assert attr_value(node, "source_op").startswith("jit(step)/"), node.name


def test_kernels_and_ops_are_named_by_their_source_line(mlp):
    _, trace, _ = mlp
    first, second = line_of('batch["x"] @'), line_of("hidden @")
    matmuls = Counter(
        n.name.split(" ", 1)[1] for n in trace.nodes if attr_value(n, "op") in ("dot", "dot_general")
    )
    assert matmuls == {f"mlp.py:{first}": 2, f"mlp.py:{second}": 3}
    for node in trace.nodes:
        if node.type == pb.COMP_NODE:
            assert node.name.split(" ")[0] == attr_value(node, "op"), node.name


def test_names_do_not_depend_on_where_the_model_file_lies(mlp, tmp_path):
    """Only the file's name and line numbers enter a name: a copy elsewhere gives the same bytes."""
    directory, _, _ = mlp
    elsewhere = tmp_path / "some" / "other" / "place"
    elsewhere.mkdir(parents=True)
    shutil.copy(EXAMPLES / "mlp.py", elsewhere / "mlp.py")
    again = tmp_path / "again"
    extract(elsewhere / "mlp.py", "2x4", again)
    names = sorted(p.name for p in directory.glob("*.et"))
    assert names == sorted(p.name for p in again.glob("*.et")) and len(names) == 8
    for name in names:
        assert (directory / name).read_bytes() == (again / name).read_bytes(), name

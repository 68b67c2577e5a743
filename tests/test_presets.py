"""`--strategy` presets on shapes that do not tell the layout: stacked layers and square weights.

A preset keeps a stacked-layers dimension whole and splits weights by where the model width D is;
examples/mlp.py with width = hidden = 1024 has two [D, D] weights that are neither stacked nor
placeable by shape, and the model's own sharding (w_in by columns, w_out by rows) decides.
"""

from __future__ import annotations

import pytest
from conftest import EXAMPLES, MODELS, extract_warnings, flint, load_example, matmuls_and_collectives

from flint.layout import InputLayout, Layout, stacked_paths
from flint.schema import et_def_pb2 as pb

AR = pb.ALL_REDUCE
BF16, F32 = 2, 4


def assert_megatron_mlp(out, rows, d, h, size):
    """Every rank of a 2x4 Megatron MLP (w_in column-, w_out row-parallel, `size`-byte elements,
    `rows` per data rank, hidden h per tensor rank): five matmuls of 2*rows*d*h FLOPs, the output
    (rows x d) summed over the tensor group, both weight gradients (d x h) and the f32 loss over data."""
    for rank in range(8):
        tensor = tuple(range(rank // 4 * 4, rank // 4 * 4 + 4))
        data = (rank % 4, rank % 4 + 4)
        expected = sorted([(AR, rows * d * size, tensor)] + [(AR, d * h * size, data)] * 2 + [(AR, F32, data)])
        assert matmuls_and_collectives(out, rank) == (5 * 2 * rows * d * h, expected), f"rank {rank}"


def layout(**shapes):
    """A layout of parameters named by path (`__` for `/`) and a batch [16, 64]: D = 64."""
    inputs = [InputLayout(path.replace("__", "/"), shape, "float32", (), "model") for path, shape in shapes.items()]
    return Layout(inputs=(*inputs, InputLayout("batch/x", (16, 64), "float32", (), "model", True)))


@pytest.mark.parametrize(
    "shapes, stacked",
    [
        # gpt-like layers under lax.scan: 4 layers of [D, F], [F, D] and vectors, all [4, ...]
        (dict(params__layers__w_in=(4, 64, 256), params__layers__w_out=(4, 256, 64), params__layers__ln=(4, 64)),
         {"params/layers/w_in", "params/layers/w_out", "params/layers/ln"}),
        # two plain matrices that happen to share a size ([D, F], [F, D] with F = D) are no stack
        (dict(params__w_in=(64, 64), params__w_out=(64, 64)), set()),
        # three [D, H, k] projections kept together share D, the width, and are no stack either
        (dict(params__attn__wq=(64, 4, 16), params__attn__wk=(64, 4, 16), params__attn__wv=(64, 4, 16),
              params__mlp__w_in=(64, 256), params__mlp__w_out=(256, 64), params__norm=(64,)), set()),
        # a stack whose vectors sit in a sub-tree of their own is still one stack
        (dict(params__layers__mlp__w=(4, 64, 256), params__layers__norm__scale=(4, 64),
              params__layers__norm__bias=(4, 64)),
         {"params/layers/mlp/w", "params/layers/norm/scale", "params/layers/norm/bias"}),
        # experts [E, D, F] and [E, F, D] beside a router [D, E]
        (dict(params__router=(64, 8), params__experts__w_in=(8, 64, 256), params__experts__w_out=(8, 256, 64)),
         {"params/experts/w_in", "params/experts/w_out"}),
    ],
    ids=["scan-layers", "square-mlp", "qkv", "nested", "experts"],
)
def test_stacked_layers(shapes, stacked):
    assert stacked_paths(layout(**shapes)) == stacked


def test_square_mlp_follows_its_own_split(tmp_path):
    """mlp.py, width = hidden = D = 1024, `--strategy dp+tp` on 2x4 (data 2, tensor 4; rank
    r = 4d + t): w_in [D, D] split by columns and w_out [D, D] by rows, as the model's own
    shardings say, no warning. Per rank, b = 256/2 = 128 rows, h = 1024/4 = 256 hidden columns: five
    matmuls of 2*b*D*h FLOPs; the row-parallel output summed over the tensor group (b x D bf16);
    both TP-local weight gradients (D x h bf16) and the f32 loss summed over the data group. Before,
    the two [D, D] weights were taken for stacked layers and left whole (D x D gradients)."""
    mlp = load_example("mlp")
    d, h, rows = 1024, 256, mlp.BATCH // 2
    found = extract_warnings(EXAMPLES / "mlp.py", "2x4", tmp_path / "t", "--model-arg", "width=1024",
                             "--model-arg", "hidden=1024", "--strategy", "dp+tp")
    assert found == []
    assert_megatron_mlp(tmp_path / "t", rows, d, h, BF16)


def test_square_weights_without_a_declared_split_warn(tmp_path):
    """tests/models/flax_nnx.py built without names and with hidden = D = 256: nothing says how to
    split its two [D, D] weights, so the preset splits both by columns and says so."""
    pytest.importorskip("flax")
    run = flint("extract", MODELS / "flax_nnx.py", "--mesh", "2x4", "--backend", "cpu", "-o", tmp_path / "t",
                "--model-arg", "hidden=256", "--model-arg", "annotated=False", "--strategy", "dp+tp", "--explain")
    assert run.returncode == 0, run.stderr
    stderr = run.stderr
    assert [line for line in stderr.splitlines() if line.startswith("warning:")] == [
        "warning: --strategy dp+tp: state/w_in/kernel, state/w_out start and end with the model width "
        "D = 256, so shape cannot tell column- from row-parallel: split as column-parallel (the "
        "dimension after the first D); declare the split in the model (its own sharding, logical "
        "names or tp_plan) or give --shard PATTERN=SPEC"
    ]
    rows = {line.split()[0]: line.split()[4:6] for line in stderr.splitlines() if line.startswith("state/")}
    assert rows == {"state/w_in/kernel": ["(None,", "tensor)"], "state/w_out": ["(None,", "tensor)"]}


def test_square_weights_follow_their_logical_names(tmp_path):
    """The same model with its names (w_in ("embed", "mlp"), w_out ("mlp", "embed")): the preset
    maps `mlp` to the tensor axis, so w_in is column- and w_out row-parallel, with no warning.
    f32, b = 64/2 = 32 rows, D = 256, h = 256/4 = 64: five matmuls of 2*b*D*h FLOPs, the output
    (b x D) summed over the tensor group, the gradients (D x h) and the loss over data."""
    pytest.importorskip("flax")
    found = extract_warnings(MODELS / "flax_nnx.py", "2x4", tmp_path / "t", "--model-arg", "hidden=256",
                             "--strategy", "dp+tp")
    assert found == []
    assert_megatron_mlp(tmp_path / "t", 32, 256, 64, F32)


def test_a_batch_that_does_not_divide_is_a_warning(tmp_path):
    """mlp.py with a batch of 4 rows under --strategy dp on 2x4 (8 ways): the rows cannot be split,
    so every rank runs the whole step, its five [4, 1024] x [1024, 4096] matmuls in full, with
    nothing to reduce; the user is told."""
    mlp = load_example("mlp")
    found = extract_warnings(EXAMPLES / "mlp.py", "2x4", tmp_path / "t", "--model-arg", "batch=4",
                             "--strategy", "dp")
    assert found == [
        "warning: --strategy dp: batch/x (4 rows), batch/y (4 rows) do not divide over data+tensor "
        "(8 ways): every rank holds the whole batch; use a batch divisible by 8, or a mesh whose "
        "batch axes divide it"
    ]
    for rank in range(8):
        assert matmuls_and_collectives(tmp_path / "t", rank) == (5 * 2 * 4 * mlp.D_MODEL * mlp.D_HIDDEN, [])

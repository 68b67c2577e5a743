"""torch layers beyond Linear: convolutions, BatchNorm (its int64 counter buffer) and pooling.

`examples/torch_cnn.py` on a 4-way data mesh, b = 32 / 4 images per rank, by hand:

- convolutions: 2 · b · C_out · C_in · T² FLOPs each, T the (output, tap) pairs per spatial
  dimension that read a real pixel: a 3x3 window with padding 1 over a side of n gives 3n - 2 (the
  first output's first tap and the last output's last one read padding); conv1 (3 -> 16 channels
  at 32x32, T = 94) and conv2 (16 -> 32 at 16x16 after the max-pool, T = 46) forward, each one's
  weight gradient (the same pairs, seen from the weights) and conv2's input gradient (padding 1
  again; the images need none);
- matmuls: the classifier [2048 -> 10] forward, its weight and its input gradient;
- collectives: every parameter's gradient all-reduced in f32, and no activation gathered across
  the batch (the pooling backwards are decomposed without index gathers).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch_mlir")

from conftest import EXAMPLES, MODELS, extract, matmuls_and_collectives  # noqa: E402

from flint.schema import et_def_pb2 as pb  # noqa: E402
from flint.trace.contract import check_traces  # noqa: E402
from flint.trace.reader import attr_value, read_trace  # noqa: E402

AR, AG, RS = pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER
F32, I64 = 4, 8


def test_cnn_training_step_data_parallel(tmp_path):
    out = tmp_path / "t"
    extract(EXAMPLES / "torch_cnn.py", "4", out)
    b, group = 32 // 4, (0, 1, 2, 3)
    conv1 = 2 * b * 16 * 3 * (3 * 32 - 2) ** 2
    conv2 = 2 * b * 32 * 16 * (3 * 16 - 2) ** 2
    fc = 2 * b * 2048 * 10
    gradients = [16 * 3 * 9, 32 * 16 * 9, 16, 16, 32, 32, 10 * 2048, 10]  # conv, BatchNorm, fc
    for rank in range(4):
        flops, found = matmuls_and_collectives(out, rank)
        assert flops == 3 * fc, f"rank {rank}"
        trace = read_trace(out / f"torch_cnn.{rank}.et")
        convs = [attr_value(n, "num_ops") for n in trace.nodes if attr_value(n, "op") == "convolution"]
        assert sorted(convs) == sorted([conv1, conv1, conv2, conv2, conv2]), f"rank {rank}"
        reduced = [size for kind, size, g in found if kind == AR and g == group]
        for size in gradients:
            assert size * F32 in reduced, f"rank {rank}: gradient of {size} f32 values"
        # only cross-entropy's (row, label) index pairs are gathered, never an activation
        assert [c for c in found if c[0] == AG] == [(AG, b * 2 * I64, group)] * 2, f"rank {rank}"
    assert check_traces(out) == []


@pytest.mark.parametrize(
    "kernel, stride, padding, dilation, ceil_mode",
    [(2, None, 0, 1, False), (3, 2, 1, 1, False), (3, 1, 1, 2, False), (3, 2, 0, 1, True)],
)
def test_pooling_backwards_equal_torch(kernel, stride, padding, dilation, ceil_mode):
    """The decomposed max- and average-pool backwards give torch's own input gradients."""
    import torch
    import torch.nn.functional as F

    from flint.frontend.torch_decompositions import decompositions

    aten = torch.ops.aten
    table = decompositions()
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 8, requires_grad=True)
    strides = [] if stride is None else [stride]
    y, indices = F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode, return_indices=True)
    grad = torch.randn_like(y)
    expected, = torch.autograd.grad(y, x, grad)
    found = table[aten.max_pool2d_with_indices_backward.default](
        grad, x.detach(), [kernel], strides, [padding], [dilation], ceil_mode, indices
    )
    assert torch.allclose(found, expected, atol=1e-6)
    if dilation == 1 and not ceil_mode:
        y = F.avg_pool2d(x, kernel, stride, padding)
        grad = torch.randn_like(y)
        expected, = torch.autograd.grad(y, x, grad)
        found = table[aten.avg_pool2d_backward.default](
            grad, x.detach(), [kernel], strides, [padding], False, True, None
        )
        assert torch.allclose(found, expected, atol=1e-6)


def test_pooling_backwards_place_gradients_without_scatter():
    """A strided window's gradients are placed by interleaving zeros (a concatenation and a
    reshape), which XLA fuses with the padding and the sum: a scatter it does not fuse, and the
    ResNet-18 step at 224x224, batch 256, then held nine 770 MB buffers, one per window offset
    (bench/measured/torch: a real H200 peaks at 5.9 GB for that step)."""
    import torch
    import torch.nn.functional as F
    from torch.fx.experimental.proxy_tensor import make_fx

    from flint.frontend.torch_decompositions import decompositions

    aten = torch.ops.aten
    table = decompositions()
    x = torch.randn(2, 3, 9, 8)
    y, indices = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    grad = torch.randn_like(y)
    max_backward = table[aten.max_pool2d_with_indices_backward.default]
    avg_backward = table[aten.avg_pool2d_backward.default]
    backwards = {
        "max": lambda g, x, i: max_backward(g, x, [3], [2], [1], [1], False, i),
        "avg": lambda g, x, i: avg_backward(g, x, [3], [2], [1], False, True, None),
    }
    for kind, backward in backwards.items():
        graph = make_fx(backward)(grad, x, indices).graph
        ops = {str(node.target) for node in graph.nodes if node.op == "call_function"}
        assert not [op for op in ops if "scatter" in op], f"{kind}-pool backward: {sorted(ops)}"
        assert "aten.cat.default" in ops, f"{kind}-pool backward: {sorted(ops)}"


@pytest.mark.parametrize(
    "kernel, stride, padding, dilation, groups",
    [(3, 2, 1, 1, 1), (7, 2, 3, 1, 1), (1, 2, 0, 1, 1), (3, 3, 2, 2, 1), (3, 1, 1, 1, 1), (3, 1, 1, 1, 4),
     (3, 2, 1, 1, 4), (3, 2, 2, 2, 2)],
)
def test_convolution_weight_gradients_are_decomposed(kernel, stride, padding, dilation, groups):
    """A strided or grouped convolution's weight gradient is torch's, computed without feature
    groups: one plain convolution without groups (torch-mlir's own lowering has one group per
    image, which XLA runs as a cuDNN call per image), or for groups a product per kernel tap
    (torch-mlir's own lowering fails). An ungrouped stride-1 one keeps torch-mlir's lowering."""
    import torch
    import torch.nn.functional as F
    from torch.fx.experimental.proxy_tensor import make_fx

    from flint.frontend.torch_decompositions import decompositions

    aten = torch.ops.aten
    backward = decompositions()[aten.convolution_backward.default]
    torch.manual_seed(0)
    x = torch.randn(2, 4, 11, 12, requires_grad=True)
    w = torch.randn(8, 4 // groups, kernel, kernel, requires_grad=True)
    y = F.conv2d(x, w, None, stride, padding, dilation, groups)
    grad = torch.randn_like(y)
    expected = torch.autograd.grad(y, (x, w), grad)
    arguments = ([stride] * 2, [padding] * 2, [dilation] * 2, False, [0, 0], groups, [True, True, False])
    found = backward(grad, x.detach(), w.detach(), None, *arguments)
    if stride == 1 and groups == 1:
        assert found is NotImplemented
        return
    assert torch.allclose(found[0], expected[0], atol=1e-5) and torch.allclose(found[1], expected[1], atol=1e-4)
    graph = make_fx(lambda g, x, w: backward(g, x, w, None, *arguments)[1])(grad, x.detach(), w.detach()).graph
    convolutions = [n.args[-1] for n in graph.nodes if n.target == aten.convolution.default]
    assert convolutions == ([] if groups > 1 else [1])  # the groups of each convolution


def test_depthwise_training_step_data_parallel(tmp_path):
    """`tests/models/torch_depthwise.py` on a 4-way data mesh, batch B = 16, b = 4 per rank: every
    parameter's gradient all-reduced in f32 (pointwise 32 x 3, two depthwise 32 x 1 x 3 x 3 (a
    [32] sum per kernel tap), classifier 10 x 32 + 10), with the loss (f32) and cross-entropy's
    label count (int64); then cross-entropy's (row, label) index pairs gathered (b pairs of int64,
    twice) and its target pick's gradient reduce-scattered ([B] f32), as in ResNet's step: no
    activation gathered."""
    out = tmp_path / "t"
    extract(MODELS / "torch_depthwise.py", "4", out)
    gradients, batch, group = 32 * 3 + 2 * 32 * 9 + 10 * 32 + 10, 16, (0, 1, 2, 3)
    for rank in range(4):
        _, found = matmuls_and_collectives(out, rank)
        assert sum(size for kind, size, _ in found if kind == AR) == gradients * F32 + F32 + I64, f"rank {rank}"
        others = [c for c in found if c[0] != AR]
        assert others == sorted([(AG, batch // 4 * 2 * I64, group)] * 2 + [(RS, batch * F32, group)]), f"rank {rank}"
    assert check_traces(out) == []


@pytest.mark.parametrize(
    "dim, correction, keepdim, dtype",
    [([0, 2, 3], 0, True, "float32"), ([1], None, False, "float32"), (None, 1, False, "float32"),
     ([-1], 2, True, "bfloat16")],
)
def test_batch_statistics_equal_torch_in_f32(dim, correction, keepdim, dtype):
    """BatchNorm's `var_mean` (and `var`), decomposed so that torch-mlir does not widen the
    activation to f64, give torch's values, in the input's dtype."""
    import torch

    from flint.frontend.torch_decompositions import decompositions

    aten = torch.ops.aten
    table = decompositions()
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 4).to(getattr(torch, dtype))
    expected = torch.var_mean(x.float(), dim, correction=1 if correction is None else correction, keepdim=keepdim)
    var, mean = table[aten.var_mean.correction](x, dim, correction=correction, keepdim=keepdim)
    alone = table[aten.var.correction](x, dim, correction=correction, keepdim=keepdim)
    tolerance = 1e-6 if dtype == "float32" else 2e-2
    for found, value in ((var, expected[0]), (mean, expected[1]), (alone, expected[0])):
        assert found.dtype == x.dtype and found.shape == value.shape
        assert torch.allclose(found.float(), value, atol=tolerance, rtol=tolerance)

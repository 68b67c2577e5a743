"""The ATen decompositions a step is traced with: what torch-mlir lowers to StableHLO.

torch's core ATen decompositions reduce composite ops (`silu_backward`, `slice_backward`,
`nll_loss_backward`) to the core set. A few core ops have no StableHLO lowering in torch-mlir, or
one that XLA runs poorly, so they are decomposed further here, into ops it lowers and XLA
partitions along the batch:

- `max_pool2d_with_indices` gets every size spelled out as a pair (`F.max_pool2d(x, 2)` gives a
  kernel [2] and no stride), which torch-mlir's lowering needs; its backward and `avg_pool2d_backward` become, for each window
  offset, the output gradient's share (all of it where that offset held the maximum; 1/window of
  it for an average) padded into place at the input positions it came from. torch's own max-pool
  decompositions gather by computed indices instead, which the partitioner answers by gathering
  the whole activation across the batch;
- `convolution_backward` of a strided convolution computes its weight gradient as one plain
  convolution (the padded input read by the output gradient), which XLA's GPU compiler runs as
  cuDNN's backward-filter kernel; torch-mlir's lowering has one feature group per image, which XLA
  runs as a cuDNN call per image. A grouped (or depthwise) convolution's, whose lowering in
  torch-mlir fails, is a product per kernel tap;
- `empty_permuted` (dropout's random mask) becomes a plain `empty`: StableHLO has no memory layouts;
- `native_batch_norm` takes torch's own decomposition, so that its batch statistics are a
  `var_mean`, and `var_mean` and `var` become a sum, a centred sum of squares and their divisions,
  in f32 (a half-precision input is widened first, as torch's kernels accumulate): torch-mlir's
  own lowerings convert the whole activation to f64, which no GPU run does, and which would double
  the bytes of those reductions and send the statistics' all-reduces in f64.
"""

from __future__ import annotations


def decompositions() -> dict:
    """The decomposition table for `make_fx`."""
    import torch
    from torch._decomp import core_aten_decompositions, decomposition_table

    aten = torch.ops.aten
    return {
        **core_aten_decompositions(),
        aten.native_batch_norm.default: decomposition_table[aten.native_batch_norm.default],
        aten.max_pool2d_with_indices.default: _max_pool2d_with_indices,
        aten.max_pool2d_with_indices_backward.default: _max_pool2d_backward,
        aten.avg_pool2d_backward.default: _avg_pool2d_backward,
        aten.empty_permuted.default: _empty_permuted,
        aten.convolution_backward.default: _convolution_backward,
        aten.var_mean.correction: _var_mean,
        aten.var.correction: lambda *args, **options: _var_mean(*args, **options)[0],
    }


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    """(variance, mean) over `dim` (every dimension when None or empty), dividing the centred sum of squares
    by the count less `correction` (1 when None), as `torch.var_mean`; in f32 for half types."""
    import math

    import torch

    dims = [d % x.dim() for d in dim] if dim else list(range(x.dim()))  # None or [] reduce every dimension
    acc = x.to(torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else x
    count = math.prod(x.shape[d] for d in dims)
    mean = torch.sum(acc, dims, keepdim=True) / count
    centred = acc - mean
    var = torch.sum(centred * centred, dims, keepdim=keepdim) / (count - (1 if correction is None else correction))
    if not keepdim:
        mean = mean.squeeze(dims)
    return var.to(x.dtype), mean.to(x.dtype)


def _convolution_backward(grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
                          groups, output_mask):
    """A strided convolution's weight gradient as the plain convolution that XLA's GPU compiler
    runs as cuDNN's backward-filter kernel: the padded input, cut to what the forward's windows
    read, with its batch as channels, read by the output gradient with the forward's stride as the
    kernel's dilation, so that the result is the weight's shape (and so is its all-reduce across
    data-parallel ranks). torch-mlir lowers it as a convolution of one feature group per image,
    which XLA runs as that many cuDNN calls (256 for ResNet-18 at batch 256: its seven strided
    weight gradients took most of a real H200's 76.5 ms step, bench/measured/torch). A grouped
    convolution's (depthwise ones among them) is `_grouped_weight_gradient`'s. The input and bias
    gradients, and an ungrouped stride-1 convolution's weight gradient, stay torch-mlir's
    (NotImplemented)."""
    import torch

    aten = torch.ops.aten
    if not output_mask[1] or transposed or (groups == 1 and all(s == 1 for s in stride)):
        return NotImplemented
    grad_input, _, grad_bias = aten.convolution_backward.default(
        grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
        [output_mask[0], False, output_mask[2]],
    )
    padded = aten.constant_pad_nd.default(x, [side for p in reversed(padding) for side in (p, p)])
    for dim, (outputs, kernel, s, d) in enumerate(zip(grad.shape[2:], weight.shape[2:], stride, dilation), start=2):
        padded = padded.narrow(dim, 0, (outputs - 1) * s + (kernel - 1) * d + 1)  # what the windows read
    if groups > 1:
        return grad_input, _grouped_weight_gradient(grad, padded, weight, stride, dilation, groups), grad_bias
    zeros = [0] * len(stride)
    taps = aten.convolution.default(padded.transpose(0, 1), grad.transpose(0, 1), None, list(dilation), zeros,
                                    list(stride), False, zeros, 1)
    return grad_input, taps.transpose(0, 1), grad_bias


def _grouped_weight_gradient(grad, padded, weight, stride, dilation, groups):
    """A grouped (or depthwise) convolution's weight gradient, one kernel tap at a time: the
    padded input's strided window at that tap against the output gradient, a product per group
    over the images and output positions (one reduction per tap where each group has one channel).
    A convolution would have to take the images as its channels in groups, which torch's
    `convolution` lays out with the images inside each group, so that a batch split over ranks
    would be gathered; torch-mlir's own lowering of this gradient fails."""
    import itertools

    import torch

    images, channels = padded.shape[:2]
    outputs = grad.shape[2:]
    x = padded.reshape(images, groups, channels // groups, *padded.shape[2:])
    g = grad.reshape(images, groups, grad.shape[1] // groups, -1)
    taps = []
    for offsets in itertools.product(*(range(k) for k in weight.shape[2:])):
        window = x
        for axis, (offset, count, s, d) in enumerate(zip(offsets, outputs, stride, dilation), start=3):
            window = torch.ops.aten.slice.Tensor(window, axis, offset * d, offset * d + (count - 1) * s + 1, s)
        taps.append(torch.einsum("ngip,ngop->goi", window.flatten(3), g))
    return torch.stack(taps, -1).reshape(weight.shape)


def _empty_permuted(shape, physical_layout, **options):
    import torch

    return torch.empty(shape, dtype=options.get("dtype"), device=options.get("device"))


def _pair(value, default=(1,)) -> tuple[int, int]:
    value = list(value) or list(default)
    return (value[0], value[-1])


def _max_pool2d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    """The op itself (NotImplemented) once every size is a pair; `F.max_pool2d(x, 2)` gives [2] and
    no stride. The dispatcher drops a padding or dilation equal to its default, which stays so."""
    import torch

    pairs = (_pair(kernel_size), _pair(stride, kernel_size), _pair(padding, (0,)), _pair(dilation))
    given = tuple(tuple(size) for size in (kernel_size, stride, padding, dilation))
    if given[:2] == pairs[:2] and given[2] in (pairs[2], (0,)) and given[3] in (pairs[3], (1,)):
        return NotImplemented
    return torch.ops.aten.max_pool2d_with_indices.default(x, *pairs, ceil_mode)


def _scatter_windows(share, grad, x, kernel_size, stride, padding, dilation=(1,)):
    """Sum over window offsets (i, j) of `share(i, j)`, an output-shaped tensor, each element added
    at the input position that offset of its window reads (positions in padding are dropped)."""
    import torch
    import torch.nn.functional as F

    (kh, kw), (sh, sw) = _pair(kernel_size), _pair(stride, kernel_size)
    (ph, pw), (dh, dw) = _pair(padding, (0,)), _pair(dilation)
    height, width = x.shape[-2:]
    out_h, out_w = grad.shape[-2:]
    span_h, span_w = (out_h - 1) * sh + 1, (out_w - 1) * sw + 1
    rows = max(height + 2 * ph, span_h + (kh - 1) * dh)
    cols = max(width + 2 * pw, span_w + (kw - 1) * dw)
    total = None
    for i in range(kh):
        for j in range(kw):
            strided = _spread(_spread(share(i, j), sh, -2), sw, -1)
            placed = F.pad(strided, (j * dw, cols - span_w - j * dw, i * dh, rows - span_h - i * dh))
            total = placed if total is None else total + placed
    return total[..., ph : ph + height, pw : pw + width]


def _spread(t, stride: int, dim: int):
    """`t` with its elements along `dim` (-1 or -2) `stride` apart, zeros between: element k at
    k * stride. Interleaved by a concatenation and a reshape, which XLA fuses with the padding and
    the sum around them; a strided `slice_scatter` lowers to a scatter, which it does not, and each
    window offset's gradient would then be a buffer of its own."""
    import torch

    if stride == 1:
        return t
    count = t.shape[dim]
    zeros = t.new_zeros(*t.shape[: t.dim() + dim + 1], stride - 1, *t.shape[t.dim() + dim + 1 :])
    interleaved = torch.cat([t.unsqueeze(dim), zeros], dim).flatten(dim - 1, dim)
    return interleaved.narrow(dim, 0, (count - 1) * stride + 1)


def _max_pool2d_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """Each output gradient goes to the input position its window's maximum came from: `indices`
    holds it as row * width + column of the input."""
    import torch

    (sh, sw), (ph, pw) = _pair(stride, kernel_size), _pair(padding, (0,))
    (dh, dw), width = _pair(dilation), x.shape[-1]
    out_h, out_w = grad.shape[-2:]
    rows = torch.arange(out_h, device=grad.device) * sh - ph
    cols = torch.arange(out_w, device=grad.device) * sw - pw

    def share(i, j):
        read = (rows[:, None] + i * dh) * width + (cols[None, :] + j * dw)
        return torch.where(indices == read, grad, 0.0)

    return _scatter_windows(share, grad, x, kernel_size, stride, padding, dilation)


def _avg_pool2d_backward(
    grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override=None
):
    """Each output gradient, divided by the window size, goes to every input position of its
    window. Where the divisor varies by window (uncounted padding, `ceil_mode`), torch-mlir gets
    the op as it is (NotImplemented)."""
    if (ceil_mode or not count_include_pad and any(padding)) and divisor_override is None:
        return NotImplemented
    kh, kw = _pair(kernel_size)
    part = grad / (divisor_override or kh * kw)
    return _scatter_windows(lambda i, j: part, grad, x, kernel_size, stride, padding)

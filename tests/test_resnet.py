"""ResNet-18 in plain PyTorch (`examples/resnet_torch.py`): convolutions, BatchNorm and the
gradients of a data-parallel training step, every rank by hand.

Batch B = 8 of 64x64 images on a 2x4 mesh under `--strategy dp`: b = 1 image per rank.

- Convolutions: 2 · b · C_out · C_in · T² FLOPs each, T the (output position, kernel tap) pairs
  along one spatial dimension whose tap reads a real input element (padding excluded), counted
  here by enumerating them. The input gradient reads the same pairs (each is one real tap of the
  transposed convolution, whose stride shows as zeros between the output gradient's elements,
  which read nothing); the stem's is not computed (the images need none). A stride-1
  convolution's weight gradient reads the same pairs, seen from the weights. A strided one's is
  Flint's decomposition (`flint.frontend.torch_decompositions`): the input padded explicitly and
  cut to what the forward's windows read, then read by the stride-dilated output gradient, so each
  of the k · m pairs per dimension (m outputs) reads an element, the padding's zeros included.
- Matmuls: the classifier [512 -> 1000] forward, its weight and its input gradient.
- Collectives over all 8 ranks: each convolution weight's and the classifier's gradient all-reduced
  in f32; BatchNorm's statistics are those of the whole batch (as SyncBatchNorm), so each BatchNorm
  layer all-reduces four [C] f32 sums: in forward the sum (mean) and the centred sum of squares
  (variance), in backward the sums of the output gradient and of its product with the centred
  input, from which its bias and weight gradients are made (no reduction of their own). Where a
  block downsamples, its second BatchNorm and its shortcut's see the same output gradient, whose
  sum is reduced once. Then cross-entropy's: the loss (f32), the label count (int64), its (row,
  label) index pairs gathered across the batch (b pairs of int64, twice) and the target pick's
  gradient reduce-scattered ([B] f32). The running statistics are inputs the step never returns:
  nothing reduces them.

`flint validate` then runs the step and finds the same collectives executed; inference
(`--model-arg mode=forward`) has the forward convolutions and the classifier only.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch_mlir")

from conftest import EXAMPLES, extract, flint, load_example, matmuls_and_collectives  # noqa: E402

from flint.schema import et_def_pb2 as pb  # noqa: E402
from flint.trace.contract import check_traces  # noqa: E402
from flint.trace.reader import attr_value, read_trace  # noqa: E402

AR, AG, RS = pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER
F32, I64 = 4, 8
B, SIZE, CLASSES, RANKS = 8, 64, 1000, 8
GROUP = tuple(range(RANKS))


def taps(n: int, kernel: int, stride: int, padding: int) -> int:
    """(output position, tap) pairs along one dimension of side n whose tap reads a real element."""
    outputs = (n + 2 * padding - kernel) // stride + 1
    return sum(0 <= o * stride - padding + t < n for o in range(outputs) for t in range(kernel))


def convolutions() -> list[tuple[int, int, int, int, int, int]]:
    """(C_out, C_in, kernel, stride, padding, input side) of every convolution, in model order."""
    convs = [(64, 3, 7, 2, 3, SIZE)]
    side, cin = SIZE // 4, 64  # after the stem's stride and the max-pool's
    for stage, width in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage and not block else 1
            convs.append((width, cin, 3, stride, 1, side))
            convs.append((width, width, 3, 1, 1, side // stride))
            if stride == 2:
                convs.append((width, cin, 1, 2, 0, side))  # the shortcut
            side, cin = side // stride, width
    return convs


def batch_norms() -> list[int]:
    """The channels of every BatchNorm layer."""
    return [64] + [c for c, cin, *_ in convolutions()[1:]]


def test_structure_is_resnet18():
    """The hand-written structure matches the example's module, parameter by parameter."""
    import torch

    example = load_example("resnet_torch")
    with torch.device("meta"):
        net = example.model()
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(m.out_channels, m.in_channels, m.kernel_size[0], m.stride[0], m.padding[0]) for m in convs] == [
        c[:5] for c in convolutions()
    ]
    assert [m.num_features for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)] == batch_norms()
    assert sum(p.numel() for p in net.parameters()) == 11_689_512  # torchvision's resnet18


def reduced_sizes() -> list[int]:
    """Elements of every f32 all-reduce of the training step but the loss's: each convolution
    weight's and the classifier's gradient, and BatchNorm's statistics (four [C] sums per layer,
    one fewer per downsampling block)."""
    weights = [cout * cin * kernel**2 for cout, cin, kernel, *_ in convolutions()] + [CLASSES * 512, CLASSES]
    statistics = [c for c in batch_norms() for _ in range(4)]
    for cout, cin, kernel, stride, *_ in convolutions():
        if kernel == 1:  # a downsampling block: one output-gradient sum fewer
            statistics.remove(cout)
    return weights + statistics


def test_training_data_parallel_every_rank(tmp_path):
    out = tmp_path / "t"
    extract(EXAMPLES / "resnet_torch.py", "2x4", out, "--strategy", "dp")
    b = B // RANKS
    conv_flops = []
    for index, (cout, cin, kernel, stride, padding, side) in enumerate(convolutions()):
        flops = 2 * b * cout * cin * taps(side, kernel, stride, padding) ** 2
        outputs = (side + 2 * padding - kernel) // stride + 1
        weight_gradient = flops if stride == 1 else 2 * b * cout * cin * (kernel * outputs) ** 2
        conv_flops += [flops, weight_gradient] + ([flops] if index else [])  # and the input gradient
    fc = 2 * b * 512 * CLASSES
    expected = sorted(
        [(AR, n * F32, GROUP) for n in reduced_sizes()]
        + [(AR, F32, GROUP), (AR, I64, GROUP), (RS, B * F32, GROUP)]
        + [(AG, b * 2 * I64, GROUP)] * 2
    )
    for rank in range(RANKS):
        flops, found = matmuls_and_collectives(out, rank)
        assert (flops, found) == (3 * fc, expected), f"rank {rank}"
        trace = read_trace(out / f"resnet_torch.{rank}.et")
        convs = [attr_value(n, "num_ops") for n in trace.nodes if attr_value(n, "op") == "convolution"]
        assert sorted(convs) == sorted(conv_flops), f"rank {rank}"
    assert check_traces(out) == []


def test_inference_has_no_collectives(tmp_path):
    """`--model-arg mode=forward`: the forward convolutions and the classifier alone, BatchNorm on
    its running statistics, nothing reduced across the batch."""
    out = tmp_path / "t"
    extract(EXAMPLES / "resnet_torch.py", "2x4", out, "--strategy", "dp", "--model-arg", "mode=forward")
    b = B // RANKS
    conv_flops = [2 * b * cout * cin * taps(side, k, s, p) ** 2 for cout, cin, k, s, p, side in convolutions()]
    for rank in range(RANKS):
        assert matmuls_and_collectives(out, rank) == (2 * b * 512 * CLASSES, []), f"rank {rank}"
        trace = read_trace(out / f"resnet_torch.{rank}.et")
        convs = [attr_value(n, "num_ops") for n in trace.nodes if attr_value(n, "op") == "convolution"]
        assert sorted(convs) == sorted(conv_flops), f"rank {rank}"


def test_execution_matches_the_trace(tmp_path):
    """`flint validate` runs the step on the 8 virtual CPU devices: every executed collective
    matches the trace, and what each rank all-reduces adds up to the derivation's bytes (the CPU's
    optimised module reduces the target pick's [B] f32 gradient whole instead of scattering it)."""
    out = tmp_path / "t"
    extract(EXAMPLES / "resnet_torch.py", "2x4", out, "--strategy", "dp", "--stage", "optimized")
    run = flint("validate", EXAMPLES / "resnet_torch.py", "--mesh", "2x4", "--traces", out, "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] and report["disagreements"] == [] and report["compute_ops"]["agree"]
    for rank in range(RANKS):
        ran = [c for c in report["executed_communication"] if c["rank"] == rank]
        assert {tuple(c["ranks"]) for c in ran} == {GROUP}, f"rank {rank}"
        reduced = sum(c["bytes"] for c in ran if c["kind"] == "ALL_REDUCE")
        assert reduced == sum(reduced_sizes()) * F32 + F32 + I64 + B * F32, f"rank {rank}"
        others = [(c["kind"], c["bytes"]) for c in ran if c["kind"] != "ALL_REDUCE"]
        assert others == [("ALL_GATHER", B // RANKS * 2 * I64)] * 2, f"rank {rank}"

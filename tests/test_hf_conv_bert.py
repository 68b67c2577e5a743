"""Convolutions the GPU compiler hands to cuDNN, and a mesh axis that no layout uses.

On the GPU backend XLA runs a convolution as a cuDNN custom call: `__cudnn$convForward` (or
`convBiasActivationForward`, with a fused bias) for the forward convolution, `convBackwardInput`
for its input gradient, `convBackwardFilter` (or a forward call of the compiler's own rewrite) for
its kernel gradient. Each is a `conv` kernel with the FLOPs of the convolution it runs, derived
here from the model's shapes: 2 x batch x output channels x input channels x the (output position,
kernel tap) pairs that read a real input element (not padding), per spatial dimension. An input or
kernel gradient of a convolution pairs the same output positions with the same taps, so it has the
forward convolution's FLOPs.

`tests/models/conv_jax.py` on 2x4, the batch of 16 over all 8 ranks (b = 2 images of 16x16x8 per
rank): conv1 3x3, stride 2, padding 1, 8 -> 16 channels (8x8 outputs); conv2 3x3, stride 1,
padding 1, 16 -> 32 channels (8x8 -> 8x8). Backward: both kernels' gradients and conv2's input
gradient (the images need none). Kernels: conv1, conv2 forward; conv2 input and kernel gradients;
conv1 kernel gradient.

`tests/models/hf_vit.py` (ViTForImageClassification: 32x32 RGB images, 8x8 patches, hidden 64) on
2x4: no tensor-parallel plan, so the batch of 8 splits over `data` only (b = 4 per rank). Its
patch embedding is one convolution (kernel = stride = 8, no padding: 4x4 outputs, every tap real),
run forward and for its kernel gradient (pixel values need no gradient).

A mesh axis that splits no input and no constraint of the step replicates all work: BERT
(BertForMaskedLM, no tensor-parallel plan) on 2x4 leaves `tensor` unused and says so once; gpt.py,
which lays out both axes, says nothing.
"""

from __future__ import annotations

import re

import pytest
from conftest import EXAMPLES, MODELS, extract_warnings, flint

from flint.trace.reader import attr_value, read_trace

F32 = 4
RANKS = 8


def real_pairs(inputs: int, outputs: int, kernel: int, stride: int, padding: int) -> int:
    """(output position, kernel tap) pairs of one spatial dimension whose tap reads a real input
    element, counted one by one."""
    return sum(
        1
        for position in range(outputs)
        for tap in range(kernel)
        if 0 <= position * stride + tap - padding < inputs
    )


def conv_kernels(out, name: str, rank: int) -> list:
    return [n for n in read_trace(out / f"{name}.{rank}.et").nodes if attr_value(n, "kernel") == "conv"]


def unused_axis(axis: str, ranks: int, offer: str) -> str:
    return (
        f"warning: mesh axis {axis!r} splits no input and no constraint of the step, so its {ranks} "
        f"ranks repeat each other's work: --strategy {offer} would use it"
    )


def test_cudnn_convolutions_of_a_jax_model(tmp_path):
    out = tmp_path / "conv"
    warnings = extract_warnings(MODELS / "conv_jax.py", "2x4", out, "--backend", "gpu:h100")
    assert warnings == []  # every custom call has a cost rule; the batch uses both axes
    b = 16 // RANKS
    side, channels, hidden, outs = 16, 8, 16, 32
    conv1 = 2 * b * hidden * channels * real_pairs(side, side // 2, 3, 2, 1) ** 2
    conv2 = 2 * b * outs * hidden * real_pairs(side // 2, side // 2, 3, 1, 1) ** 2
    # by hand: 23 of the 8 x 3 pairs (the first output's first tap reads padding), 22 of 8 x 3
    assert (conv1, conv2) == (2 * b * hidden * channels * 23**2, 2 * b * outs * hidden * 22**2)
    conv1_bytes = (b * side * side * channels + 3 * 3 * channels * hidden + b * 8 * 8 * hidden) * F32
    for rank in range(RANKS):
        kernels = conv_kernels(out, "conv_jax", rank)
        assert sorted(attr_value(n, "num_ops") for n in kernels) == sorted([conv1, conv2, conv2, conv2, conv1])
        assert {attr_value(n, "op") for n in kernels} == {"custom_call"}  # cuDNN's, not a fusion
        # the first kernel is conv1 forward: the images, the kernel and the result, no workspace
        assert (attr_value(kernels[0], "num_ops"), attr_value(kernels[0], "tensor_size")) == (conv1, conv1_bytes)


def test_vit_patch_embedding_on_the_gpu(tmp_path):
    pytest.importorskip("torch_mlir")
    pytest.importorskip("transformers")
    out = tmp_path / "vit"
    warnings = extract_warnings(MODELS / "hf_vit.py", "2x4", out, "--backend", "gpu:h100")
    assert warnings == [unused_axis("tensor", 4, "dp, fsdp or dp+tp")]  # and no "no cost rule"
    b, channels, image, patch, hidden = 8 // 2, 3, 32, 8, 64
    patches = (image // patch) ** 2
    embedding = 2 * b * hidden * channels * patch * patch * patches
    for rank in range(RANKS):
        assert [attr_value(n, "num_ops") for n in conv_kernels(out, "hf_vit", rank)] == [embedding, embedding]


def test_a_custom_call_without_a_rule_names_its_target(tmp_path):
    """Cholesky (tests/models/no_cost_rule.py) runs in a LAPACK custom call on the CPU: the warning
    names the call's target, not just `custom_call`."""
    run = flint("extract", MODELS / "no_cost_rule.py", "--mesh", "2", "--backend", "cpu", "-o", tmp_path / "t")
    assert run.returncode == 0, run.stderr
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    target = re.fullmatch(r"warning: no cost rule for custom_call (\S+): emitted with bytes only \(--strict fails\)",
                          warnings[0])
    assert target and "potrf" in target.group(1)  # LAPACK's Cholesky factorisation


def test_bert_without_a_plan_warns_about_the_tensor_axis(tmp_path):
    pytest.importorskip("torch_mlir")
    pytest.importorskip("transformers")
    warnings = extract_warnings(MODELS / "hf_bert.py", "2x4", tmp_path / "t")
    assert warnings == [unused_axis("tensor", 4, "dp, fsdp or dp+tp")]


def test_gpt_uses_both_axes(tmp_path):
    assert extract_warnings(EXAMPLES / "gpt.py", "2x4", tmp_path / "t") == []


def test_an_axis_used_by_a_constraint_alone_is_used(tmp_path):
    """tests/models/constrained_only.py: replicated inputs, a constraint over `data` inside the
    step. `data` is used (no warning), `tensor` is not; on a mesh of `data` alone, nothing."""
    model = MODELS / "constrained_only.py"
    assert extract_warnings(model, "data=2,tensor=4", tmp_path / "a") == [
        unused_axis("tensor", 4, "dp, fsdp or dp+tp")
    ]
    assert extract_warnings(model, "data=8", tmp_path / "b") == []


def test_tensor_parallel_alone_leaves_the_data_axis(tmp_path):
    """mlp.py under --strategy tp on 2x4: the batch is replicated and only the weights split over
    `tensor`, so the 2 data ranks repeat each other's work."""
    assert extract_warnings(EXAMPLES / "mlp.py", "2x4", tmp_path / "t", "--strategy", "tp") == [
        unused_axis("data", 2, "dp, fsdp or dp+tp")
    ]

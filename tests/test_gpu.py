"""The GPU backend: XLA's GPU compiler for a virtual cluster of H100s, traced kernel by kernel.

`examples/mlp.py` on 2x4 (see tests/test_mlp.py for the layout): per rank b = BATCH/2 rows and
h = D_HIDDEN/4 hidden columns. The GPU compiler runs each of the five matmuls (two forward, three
backward) as one GEMM kernel of 2*b*D_MODEL*h FLOPs, with at most the element-wise work on its
input or output fused in. Its collectives stay bf16 as the model wrote them: the row-parallel
output all-reduced over the tensor group (b*D_MODEL elements), the f32 loss over the data group,
and the two weight gradients over the data group, which XLA's all-reduce combiner joins into one
all-reduce of both (2*D_MODEL*h elements). Each rank's arguments are its parameter shards and its
batch rows: 2*D_MODEL*h + 2*b*D_MODEL bf16 elements.
"""

from __future__ import annotations

import filecmp
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    EXAMPLES,
    MODELS,
    assert_sends_match_receives,
    extract,
    flint,
    load_example,
    matmuls_and_collectives,
    transfers,
)

from flint.schema import et_def_pb2 as pb
from flint.trace.reader import attr_value, read_trace

mlp = load_example("mlp")
BF16, F32 = 2, 4
DP, TP = 2, 4


@pytest.fixture(scope="module")
def mlp_gpu(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "mlp"
    summary = extract(EXAMPLES / "mlp.py", "2x4", out, "--backend", "gpu:h100")
    return out, summary


def test_kernels_are_one_gemm_per_matmul(mlp_gpu):
    out, _ = mlp_gpu
    b, h = mlp.BATCH // DP, mlp.D_HIDDEN // TP
    matmul = 2 * b * mlp.D_MODEL * h
    for rank in range(DP * TP):
        trace = read_trace(out / f"mlp.{rank}.et")
        gemms = [attr_value(n, "num_ops") for n in trace.nodes if attr_value(n, "kernel") == "gemm"]
        assert len(gemms) == 5
        # the matmul, plus at most one element-wise op per element of its [b, D] or [b, h] operand
        assert all(matmul <= flops <= matmul + b * max(mlp.D_MODEL, h) for flops in gemms)
        assert not [n for n in trace.nodes if attr_value(n, "op") in ("dot", "dot_general")]


def test_cublas_calls_cost_their_matmuls(tmp_path):
    """With its Triton GEMMs switched off (XLA_FLAGS, which Flint's compile honours), the GPU
    compiler calls cuBLAS for every matmul: still five GEMM kernels per rank, each exactly its
    matmul's FLOPs and the bf16 bytes of its two operands and its product, not of the scratch
    workspace cuBLAS gets beside it."""
    env = {**os.environ, "XLA_FLAGS": "--xla_gpu_enable_triton_gemm=false"}
    run = flint("extract", EXAMPLES / "mlp.py", "--mesh", "2x4", "--backend", "gpu:h100", "-o", tmp_path / "t",
                "--strict", env=env)
    assert run.returncode == 0, run.stderr
    b, d, h = mlp.BATCH // DP, mlp.D_MODEL, mlp.D_HIDDEN // TP
    # x·w_in, h·w_out and the three backward products each read two of [b, d], [d, h], [b, h]
    # and write the third
    gemm = (2 * b * d * h, BF16 * (b * d + d * h + b * h))
    for rank in range(DP * TP):
        trace = read_trace(tmp_path / "t" / f"mlp.{rank}.et")
        gemms = [(attr_value(n, "num_ops"), attr_value(n, "tensor_size")) for n in trace.nodes
                 if attr_value(n, "kernel") == "gemm"]
        assert gemms == [gemm] * 5, f"rank {rank}"
        assert all(n.name.startswith("gemm mlp.py:") for n in trace.nodes if attr_value(n, "kernel") == "gemm")


def test_collectives_bf16_and_combined(mlp_gpu):
    out, _ = mlp_gpu
    b, h = mlp.BATCH // DP, mlp.D_HIDDEN // TP
    for rank in range(DP * TP):
        d, t = divmod(rank, TP)
        tensor_group = tuple(d * TP + u for u in range(TP))
        data_group = tuple(e * TP + t for e in range(DP))
        _, found = matmuls_and_collectives(out, rank)
        assert found == sorted(
            [
                (pb.ALL_REDUCE, b * mlp.D_MODEL * BF16, tensor_group),
                (pb.ALL_REDUCE, 2 * mlp.D_MODEL * h * BF16, data_group),  # both gradients, combined
                (pb.ALL_REDUCE, F32, data_group),
            ]
        ), f"rank {rank}"


def test_schedule_is_kept(mlp_gpu):
    """The optimised module is the scheduled one: every node but the first follows another by a
    data or control dependency, so a simulator runs the kernels in the compiler's order."""
    out, _ = mlp_gpu
    trace = read_trace(out / "mlp.0.et")
    assert all(n.data_deps or n.ctrl_deps for n in trace.nodes[1:])
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["backend"], manifest["stage"]) == ("gpu:h100", "optimized")


def test_rerun_is_byte_identical_and_the_default(mlp_gpu, tmp_path):
    """A rerun with no --backend at all writes the same bytes: the GPU compiler for H100s is the
    default backend."""
    out, _ = mlp_gpu
    again = tmp_path / "mlp"
    run = flint("extract", EXAMPLES / "mlp.py", "--mesh", "2x4", "-o", again)
    assert run.returncode == 0, run.stderr
    names = sorted(p.name for p in out.iterdir() if p.name != "manifest.json")
    _, mismatch, errors = filecmp.cmpfiles(out, again, names, shallow=False)
    assert (mismatch, errors) == ([], [])
    assert json.loads((again / "manifest.json").read_text())["backend"] == "gpu:h100"


def test_validate_refuses_a_gpu_trace(mlp_gpu):
    """validate executes the step on the CPU, whose collectives are not the GPU compiler's."""
    out, _ = mlp_gpu
    run = flint("validate", EXAMPLES / "mlp.py", "--mesh", "2x4", "--traces", out)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "--backend cpu" in run.stderr


def _system_cuda() -> list[Path]:
    return [p.resolve() for p in Path("/usr/local").glob("cuda*") if p.is_dir() and not p.is_symlink()]


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare as root")
def test_extracts_with_the_system_cuda_out_of_reach(tmp_path):
    """libdevice comes from the CUDA compiler wheel, not from a CUDA toolkit the machine happens
    to have: with every /usr/local/cuda* hidden behind an empty mount, a step whose kernels call
    libdevice (exp, tanh) still compiles."""
    if subprocess.run(["unshare", "--mount", "--propagation", "private", "true"]).returncode != 0:
        pytest.skip("mount namespaces are not available here")
    hide = [f"mount -t tmpfs none {shlex.quote(str(p))}" for p in _system_cuda()]
    model = MODELS / "transcendental.py"
    run = [sys.executable, "-m", "flint", "extract", model, "--mesh", "2x4", "--backend", "gpu:h100"]
    command = " && ".join([*hide, shlex.join([*map(str, run), "-o", str(tmp_path / "out")])])
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", command],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    trace = read_trace(tmp_path / "out" / "transcendental.0.et")
    assert sum(attr_value(n, "transcendentals") or 0 for n in trace.nodes) == 2 * 32 * 128



def test_durations_add_up_to_the_roofline(tmp_path):
    """Kernels take a few microseconds each; their whole-microsecond durations still add up to the
    exact H100 roofline (989 TFLOP/s, 3,350 GB/s) of the rank, not to a 1 µs floor per kernel."""
    out = tmp_path / "roofline"
    extract(EXAMPLES / "mlp.py", f"{DP}x{TP}", out, "--backend", "gpu:h100", "--durations", "roofline")
    for rank in range(DP * TP):
        nodes = [n for n in read_trace(out / f"mlp.{rank}.et").nodes if n.type == pb.COMP_NODE]
        exact = sum(
            max(attr_value(n, "num_ops") / 989e12, attr_value(n, "tensor_size") / 3350e9) * 1e6 for n in nodes
        )
        assert abs(sum(n.duration_micros for n in nodes) - exact) <= 1
        assert sum(n.duration_micros == 0 for n in nodes) > 0  # sub-microsecond kernels exist


def test_the_roofline_is_the_backends_gpu(tmp_path):
    """On gpu:b200 with no --device, kernels are timed by the B200's roofline (2,250 TFLOP/s,
    8,000 GB/s), and the manifest says so."""
    extract(EXAMPLES / "mlp.py", "2x4", tmp_path / "b200", "--backend", "gpu:b200", "--durations", "roofline")
    assert json.loads((tmp_path / "b200" / "manifest.json").read_text())["device"]["name"] == "b200"
    nodes = [n for n in read_trace(tmp_path / "b200" / "mlp.0.et").nodes if n.type == pb.COMP_NODE]
    exact = sum(max(attr_value(n, "num_ops") / 2250e12, attr_value(n, "tensor_size") / 8000e9) * 1e6 for n in nodes)
    assert abs(sum(n.duration_micros for n in nodes) - exact) <= 1


def test_memory_per_rank(mlp_gpu):
    """The arguments are what the layout gives a rank: its two [D_MODEL, h] weight shards and its
    [b, D_MODEL] rows of x and y, all bf16; the peak adds outputs and temporaries."""
    out, summary = mlp_gpu
    b, h = mlp.BATCH // DP, mlp.D_HIDDEN // TP
    memory = summary["memory_per_rank"]
    assert memory["arguments"] == (2 * mlp.D_MODEL * h + 2 * b * mlp.D_MODEL) * BF16
    assert memory["peak"] == memory["arguments"] + memory["outputs"] + memory["temporaries"] - memory["aliased"]
    assert memory["device"] == 80 * 2**30
    assert json.loads((out / "manifest.json").read_text())["memory_per_rank"] == memory


def test_a_layout_that_does_not_fit_is_warned_about(tmp_path):
    """A GPU whose target config states 1 MB of device memory cannot hold a rank's 4.7 MB of
    arguments: the extraction still writes the trace, and says so."""
    from flint.compile.gpu import GPUS

    config = GPUS["h100"].config().replace(f"device_memory_size: {80 * 2**30}", "device_memory_size: 1000000")
    (tmp_path / "small.txtpb").write_text(config)
    run = flint(
        "extract", EXAMPLES / "mlp.py", "--mesh", "2x4", "--backend", f"gpu:{tmp_path / 'small.txtpb'}",
        "-o", tmp_path / "out",
    )
    assert run.returncode == 0, run.stderr
    assert "the layout does not fit" in run.stderr
    assert (tmp_path / "out" / "mlp.7.et").exists()


def test_xla_durations_change_only_durations(mlp_gpu, tmp_path):
    """`--durations xla` times each kernel with the GPU compiler's own estimate: the same nodes,
    dependencies and costs, other durations, and the manifest says which."""
    out, _ = mlp_gpu
    extract(EXAMPLES / "mlp.py", "2x4", tmp_path / "xla", "--backend", "gpu:h100", "--durations", "xla")
    roofline = read_trace(out / "mlp.0.et").nodes
    xla = read_trace(tmp_path / "xla" / "mlp.0.et").nodes
    assert len(roofline) == len(xla)
    for a, b in zip(roofline, xla):
        assert (a.name, list(a.data_deps), list(a.ctrl_deps)) == (b.name, list(b.data_deps), list(b.ctrl_deps))
        assert [(x.name, x.WhichOneof("value")) for x in a.attr] == [(x.name, x.WhichOneof("value")) for x in b.attr]
    gemms = [(a.duration_micros, b.duration_micros) for a, b in zip(roofline, xla) if attr_value(a, "kernel") == "gemm"]
    assert len(gemms) == 5 and any(r != x for r, x in gemms)
    assert json.loads((tmp_path / "xla" / "manifest.json").read_text())["durations"] == "xla"


def test_xla_durations_need_the_gpu_compiler(tmp_path):
    run = flint("extract", EXAMPLES / "mlp.py", "--mesh", "2x4", "--backend", "cpu", "--durations", "xla",
                "-o", tmp_path / "x")
    assert run.returncode == 2 and "--backend gpu" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_xla_durations_are_refused_for_a_pipelined_step(tmp_path):
    """XLA has no estimate for the adds that sum gradients over microbatches, which it never compiled."""
    run = flint("extract", EXAMPLES / "gpt.py", "--mesh", "pp=2,data=2", "--backend", "gpu:h100",
                "--pipeline-stages", "2", "--microbatches", "2", "--durations", "xla", "-o", tmp_path / "x")
    assert run.returncode == 2 and "--durations calibrated" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


gpt = load_example("gpt")
FSDP_DP, FSDP_TP = 4, 2
MATRICES = ("wq", "wk", "wv", "wo", "w_in", "w_out")
LAYERNORMS = ("ln1_scale", "ln1_bias", "ln2_scale", "ln2_bias")


def shard(name: str) -> int:
    """Elements of one rank's shard of parameter `name` (one layer's, for stacked ones) under
    fsdp.py's layout: matrices and the embedding and head split over both the data and the tensor
    axes, layernorm vectors over the data axis only."""
    full = gpt.shapes(gpt.LAYERS, gpt.VOCAB)
    stacked = name in full["layers"]
    elements = math.prod(full["layers"][name] if stacked else full[name]) // (gpt.LAYERS if stacked else 1)
    return elements // (FSDP_DP * FSDP_TP if name in (*MATRICES, "embed", "head") else FSDP_DP)


def fsdp_expected(rank: int):
    """Every collective of one rank, with what the GPU compiler's combiners put together:
    - over the data group, all-gathers of parameter shards (bf16): before the layers the embedding,
      the final layernorm and the head twice (its forward and its input gradient's gathers, joined);
      one per layer in forward (its ten parameters) and one per layer in backward (the six matrices
      and the two layernorm scales, which it gathers as f32);
    - over the data group, reduce-scatters of the gradients, each at its full (tensor-parallel)
      size: per layer one of the six matrices (bf16) and one of the four layernorm vectors (f32), then
      one of the embedding and the head (bf16) and one of the final layernorm (f32); the f32 loss
      is all-reduced (4 bytes);
    - over the tensor group, Megatron's all-reduces of [b, SEQ, D_MODEL] bf16 activations: the
      vocab-parallel lookup, two per layer in forward and two in backward, the head's input
      gradient; and the loss's three [b, SEQ] f32 reductions."""
    d, t = divmod(rank, FSDP_TP)
    data = tuple(e * FSDP_TP + t for e in range(FSDP_DP))
    tensor = tuple(d * FSDP_TP + u for u in range(FSDP_TP))
    b, L, D = gpt.BATCH // FSDP_DP, gpt.LAYERS, gpt.D_MODEL
    per_layer_params = sum(shard(n) for n in (*MATRICES, *LAYERNORMS)) * BF16
    backward_gather = sum(shard(n) for n in MATRICES) * BF16 + 2 * shard("ln1_scale") * F32
    top_gather = (shard("embed") + 2 * shard("head") + shard("ln_f_scale") + shard("ln_f_bias")) * BF16
    full = gpt.shapes(L, gpt.VOCAB)
    matrices_grad = sum(math.prod(full["layers"][n]) // L for n in MATRICES) // FSDP_TP * BF16
    return sorted(
        [(pb.ALL_GATHER, top_gather, data)]
        + [(pb.ALL_GATHER, per_layer_params, data)] * L
        + [(pb.ALL_GATHER, backward_gather, data)] * L
        + [(pb.REDUCE_SCATTER, matrices_grad, data)] * L
        + [(pb.REDUCE_SCATTER, len(LAYERNORMS) * D * F32, data)] * L
        + [(pb.REDUCE_SCATTER, (math.prod(full["embed"]) + math.prod(full["head"])) // FSDP_TP * BF16, data)]
        + [(pb.REDUCE_SCATTER, 2 * D * F32, data)]
        + [(pb.ALL_REDUCE, F32, data)]
        + [(pb.ALL_REDUCE, b * gpt.SEQ * D * BF16, tensor)] * (1 + 4 * L + 1)
        + [(pb.ALL_REDUCE, b * gpt.SEQ * F32, tensor)] * 3
    )


@pytest.fixture(scope="module")
def fsdp_gpu(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "fsdp"
    return out, extract(EXAMPLES / "fsdp.py", "4x2", out, "--backend", "gpu:h100")


def test_fsdp_collectives_as_the_compiler_combined_them(fsdp_gpu):
    out, _ = fsdp_gpu
    for rank in range(FSDP_DP * FSDP_TP):
        assert matmuls_and_collectives(out, rank)[1] == fsdp_expected(rank), f"rank {rank}"


def test_fsdp_argument_memory_is_the_shards(fsdp_gpu):
    """A rank holds its bf16 parameter shards, their two f32 AdamW moments, the int32 step count
    and its [b, SEQ] int32 tokens and targets."""
    _, summary = fsdp_gpu
    names = (*MATRICES, *LAYERNORMS)
    elements = sum(shard(n) for n in names) * gpt.LAYERS + sum(
        shard(n) for n in ("embed", "head", "ln_f_scale", "ln_f_bias")
    )
    batch = 2 * (gpt.BATCH // FSDP_DP) * gpt.SEQ * 4
    assert summary["memory_per_rank"]["arguments"] == elements * (BF16 + 2 * F32) + 4 + batch


def test_fsdp_matmul_flops_are_the_partitioned_modules(fsdp_gpu, tmp_path):
    """Fusion moves work into kernels but adds no matmul: the GEMM kernels of the optimised module
    hold the FLOPs of the matmuls the partitioned module of the same GPU compile has."""
    out, _ = fsdp_gpu
    extract(EXAMPLES / "fsdp.py", "4x2", tmp_path / "p", "--backend", "gpu:h100", "--stage", "partitioned")
    partitioned = sum(
        attr_value(n, "num_ops") for n in read_trace(tmp_path / "p" / "fsdp.0.et").nodes
        if attr_value(n, "op") in ("dot", "dot_general")
    )
    gemm = sum(attr_value(n, "num_ops") for n in read_trace(out / "fsdp.0.et").nodes if attr_value(n, "kernel") == "gemm")
    assert partitioned <= gemm <= partitioned * 1.02  # plus the element-wise work fused into them


def test_pipeline_stages_on_the_gpu_compiler(tmp_path):
    """`tests/models/pipeline_gpt.py` (16 layers, see tests/test_pipeline.py) on pp=4,tp=2 with the
    GPU compiler's partitioned module (`--stage partitioned`; the kernel-level default stage is
    tests/test_pipeline_gpu.py's): rank r = 2s + t sends M activations of bf16 [BATCH/M, SEQ,
    D_MODEL] to r + 2 unless on the last stage and M gradients back to r - 2 unless on the first;
    every send has its receive. No memory is reported: the compile is one microbatch of one chunk."""
    stages, micro, batch, seq, d_model = 4, 8, 16, 128, 256
    activation = batch // micro * seq * d_model * BF16
    model = MODELS / "pipeline_gpt.py"
    flags = ("--strategy", "tp", "--pipeline-stages", str(stages), "--microbatches", str(micro), "--backend", "gpu:h100",
             "--stage", "partitioned")
    summary = extract(model, "pp=4,tp=2", tmp_path / "pp", *flags)
    assert summary["memory_per_rank"] is None
    found = transfers(tmp_path / "pp")
    assert_sends_match_receives(found)
    for rank, moves in found.items():
        stage = rank // 2
        sends = sorted((t.dst, t.size) for t in moves if t.send)
        expected = [(rank - 2, activation)] * micro * (stage > 0) + [(rank + 2, activation)] * micro * (stage < stages - 1)
        assert sends == sorted(expected), f"rank {rank}"


def test_kernel_names_match_a_profile_one_by_one(mlp_gpu, fsdp_gpu):
    """Each kernel node keeps the GPU compiler's name for its instruction, which a profile's kernel
    is named after, and a fusion the compiler hands to Triton's block-level emitter is a `triton`
    kernel: mlp's five matmuls are Triton GEMM fusions (`gemm_fusion_dot*`), and the GPT of fsdp's
    softmax rows are the fusions the compiler names `triton_softmax*` (and any others it emits so)."""
    out, _ = mlp_gpu
    compute = [n for n in read_trace(out / "mlp.0.et").nodes if n.type == pb.COMP_NODE]
    names = {attr_value(n, "kernel_name"): attr_value(n, "kernel") for n in compute}
    assert None not in names and len(names) == len(compute)  # one kernel each, once a step
    assert sorted(kind for name, kind in names.items() if name.startswith("gemm_fusion_dot")) == ["gemm"] * 5
    assert all(kind != "gemm" for name, kind in names.items() if not name.startswith("gemm_fusion_dot"))
    out, _ = fsdp_gpu
    compute = [n for n in read_trace(out / "fsdp.0.et").nodes if n.type == pb.COMP_NODE]
    softmax = [n for n in compute if attr_value(n, "kernel_name").startswith("triton_softmax")]
    assert softmax and all(attr_value(n, "kernel") == "triton" for n in softmax)
    assert all(attr_value(n, "kernel_name").startswith(("fusion", "triton")) for n in compute
               if attr_value(n, "kernel") == "triton")

"""The kernel-time model, derived by hand from its formula on a device of round numbers
(`tests/models/round_device.toml`: 100 TFLOP/s, 10,000 GB/s, 10 TFLOP/s vector, 4 units of 64 x 64
tiles, GEMM efficiency 0.5, depth overhead 64, memory efficiency 0.25, transpose efficiency 0.1,
Triton efficiency 0.2, 2 µs a kernel), and every command timing a trace as the trace says unless told otherwise."""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import EXAMPLES, MODELS, device_table, flint, hand_kernel_micros
from flint.devices import load_device
from flint.devices.kernels import calibrated_micros, kernel_micros
from flint.ir.costs import kernel_of
from flint.ir.parse import Op, Region, TensorType
from flint.schema import et_def_pb2 as pb
from flint.trace.reader import attr_value, read_trace

ROUND = MODELS / "round_device.toml"


@pytest.fixture(scope="module")
def device():
    return load_device(str(ROUND))


def test_gemm_that_fills_one_wave(device):
    # [128 x 1024] x [1024 x 128]: 2 x 2 tiles of 64 x 64 on 4 units, one full wave.
    flops = 2 * 128 * 128 * 1024  # 33,554,432
    nbytes = 2 * (128 * 1024 + 1024 * 128 + 128 * 128)  # 557,056
    rate = 100e12 * 0.5 * 1.0 * (1024 / (1024 + 64))  # 47.06 TFLOP/s
    compute = flops / rate * 1e6  # 0.713 µs
    memory = nbytes / (10_000e9 * 0.5) * 1e6  # 0.111 µs, at the GEMM's efficiency
    assert calibrated_micros(device, flops, nbytes, [1, 128, 128, 1024, 16]) == pytest.approx(2.0 + compute)
    assert 2.0 + compute == pytest.approx(2.7130, abs=1e-4)
    assert memory < compute


def test_one_more_row_takes_a_second_wave(device):
    # 129 rows: 3 x 2 = 6 tiles on 4 units, two waves of 4 slots of 64 x 64 = 32,768 elements.
    flops = 2 * 129 * 128 * 1024
    fill = 129 * 128 / (2 * 4 * 64 * 64)  # 0.5039
    compute = flops / (100e12 * 0.5 * fill * 1024 / 1088) * 1e6
    assert calibrated_micros(device, flops, 1, [1, 129, 128, 1024, 16]) == pytest.approx(2.0 + compute)
    assert compute / (flops / (100e12 * 0.5 * 1024 / 1088) * 1e6) == pytest.approx(1 / fill)


def test_a_narrow_product_runs_on_a_narrow_tile(device):
    # 4 queries x 1024 cached keys x depth 64, batch 8 (a decode step's attention scores): the
    # 4-column side takes a 16-wide tile, not the 64-wide one; 1024 rows: 16 x 1 tiles of 64 x 16
    # per batch, 128 tiles on 4 units in 32 waves, each slot 64 x 16 = 1,024 elements.
    flops = 2 * 8 * 1024 * 4 * 64
    fill = 8 * 1024 * 4 / (32 * 4 * 64 * 16)  # 0.25
    compute = flops / (100e12 * 0.5 * fill * 64 / (64 + 64)) * 1e6
    assert calibrated_micros(device, flops, 1, [8, 1024, 4, 64, 16]) == pytest.approx(2.0 + compute)
    assert fill == 0.25


def test_operand_width_sets_the_matrix_peak(device):
    flops = 2 * 128 * 128 * 1024
    bf16 = calibrated_micros(device, flops, 1, [1, 128, 128, 1024, 16]) - 2.0
    assert calibrated_micros(device, flops, 1, [1, 128, 128, 1024, 32]) - 2.0 == pytest.approx(2 * bf16)
    assert calibrated_micros(device, flops, 1, [1, 128, 128, 1024, 8]) - 2.0 == pytest.approx(bf16 / 2)


def test_other_kernels_at_vector_peak_and_achievable_bandwidth(device):
    # 10^6 FLOPs at 10 TFLOP/s: 0.1 µs; 10^6 bytes at 0.25 x 10,000 GB/s: 0.4 µs.
    assert calibrated_micros(device, 10**6, 10**6) == pytest.approx(2.0 + 0.4)
    assert calibrated_micros(device, 10**7, 10**6) == pytest.approx(2.0 + 1.0)
    assert kernel_micros(device, "roofline", 10**7, 10**6) == pytest.approx(max(10**7 / 100e12, 10**6 / 10_000e9) * 1e6)


def test_an_untiled_transpose_moves_its_bytes_at_the_transpose_efficiency(device):
    # 10^6 bytes at 0.1 x 10,000 GB/s: 1 µs; any other fusion at 0.25 x 10,000 GB/s: 0.4 µs.
    assert calibrated_micros(device, 0, 10**6, None, "transpose") == pytest.approx(2.0 + 1.0)
    assert calibrated_micros(device, 0, 10**6, None, "fusion") == pytest.approx(2.0 + 0.4)
    assert kernel_micros(device, "roofline", 0, 10**6, None, "transpose") == pytest.approx(10**6 / 10_000e9 * 1e6)


def test_a_triton_fusion_moves_its_bytes_at_the_triton_efficiency(device):
    # 10^6 bytes at 0.2 x 10,000 GB/s: 0.5 µs; 10^7 FLOPs at the 10 TFLOP/s vector peak: 1 µs.
    assert calibrated_micros(device, 0, 10**6, None, "triton") == pytest.approx(2.0 + 0.5)
    assert calibrated_micros(device, 10**7, 10**6, None, "triton") == pytest.approx(2.0 + 1.0)
    # A device file without one times them at the memory efficiency: 10^6 bytes in 0.4 µs.
    without = replace(device, calibration=replace(device.calibration, triton_efficiency=None))
    assert calibrated_micros(without, 0, 10**6, None, "triton") == pytest.approx(2.0 + 0.4)


def _fusion(kind: str, permutation: tuple[int, ...], emitter: str | None = None) -> Op:
    """A fusion of one [4, 8, 3] f32 operand whose result is its transpose by `permutation`."""
    source = TensorType((4, 8, 3), "f32", 32)
    result = TensorType(tuple(source.shape[p] for p in permutation), "f32", 32)
    transpose = Op("transpose", "t", (0,), (1,), (source,), (result,), {"permutation": permutation})
    attrs = {"fusion_kind": kind} | ({"emitter": emitter} if emitter else {})
    return Op("fusion", "f", (9,), (10,), (source,), (result,), attrs, (Region((0,), (transpose,), (1,)),))


def test_loop_fusions_that_transpose_the_minor_dimension_are_transpose_kernels():
    assert kernel_of(_fusion("kLoop", (0, 2, 1))) == "transpose"  # the minor dimension moves
    assert kernel_of(_fusion("kInput", (0, 2, 1))) == "fusion"  # tiled through shared memory
    assert kernel_of(_fusion("kLoop", (1, 0, 2))) == "fusion"  # rows move whole


def test_fusions_the_compiler_gives_tritons_block_emitter_are_triton_kernels():
    assert kernel_of(_fusion("kCustom", (1, 0, 2), "__triton")) == "triton"
    assert kernel_of(_fusion("kCustom", (0, 2, 1), "__triton")) == "triton"  # Triton tiles its transposes
    assert kernel_of(_fusion("kCustom", (1, 0, 2), "__cudnn$fusion")) == "fusion"


def test_an_8bit_gemm_runs_at_twice_the_peak_and_its_own_efficiency(device):
    # The 128 x 128 x 1024 product of the first test in FP8: the 8-bit peak is 200 TFLOP/s; with
    # an 8-bit efficiency of 0.3 it runs at 200 x 0.3 x 1024 / 1088 = 56.47 TFLOP/s, without one
    # at the 16-bit 0.5: 94.12 TFLOP/s. Its bytes stream at the 16-bit efficiency either way.
    flops = 2 * 128 * 128 * 1024
    fp8 = replace(device, calibration=replace(device.calibration, gemm_efficiency_8bit=0.3))
    assert calibrated_micros(fp8, flops, 1, [1, 128, 128, 1024, 8]) == pytest.approx(
        2.0 + flops / (200e12 * 0.3 * 1024 / 1088) * 1e6)
    assert calibrated_micros(device, flops, 1, [1, 128, 128, 1024, 8]) == pytest.approx(
        2.0 + flops / (200e12 * 0.5 * 1024 / 1088) * 1e6)
    assert calibrated_micros(fp8, flops, 1, [1, 128, 128, 1024, 16]) == calibrated_micros(
        device, flops, 1, [1, 128, 128, 1024, 16])


def test_hopper_files_time_fp8_gemms_at_what_cublas_publishes():
    """Azure's ND H100 v5 and ND H200 v5 cuBLASLt FP8 GEMMs (bench/measured/gemms.toml): 8192^3 at
    1,290.1 and 1,300.6 TFLOP/s, 16384^3 at 1,377.3 and 1,366.3; the H100's fitted the 8-bit
    efficiency, the H200's are held out. At the 16-bit efficiency they came out 1.3x fast."""
    for name, published in (("h100", {8192: 1290.1, 16384: 1377.3}), ("h200", {8192: 1300.6, 16384: 1366.3})):
        gpu = load_device(name)
        for side, tflops in published.items():
            micros = calibrated_micros(gpu, 2 * side**3, 3 * side**2, [1, side, side, side, 8])
            assert 2 * side**3 / micros / 1e6 / tflops == pytest.approx(1.0, abs=0.06)


def test_h200_file_times_a_large_gemm_near_what_the_gpu_measured():
    """8192 x 4096 x 4096 bf16 ran in 361.0 µs on the H200 (../shared/calibration's microbenchmarks)."""
    h200 = load_device("h200")
    tiles = math.ceil(8192 / 128) * math.ceil(4096 / 256)  # 1,024 tiles, 8 waves of 132
    fill = 8192 * 4096 / (math.ceil(tiles / 132) * 132 * 128 * 256)
    assert fill == pytest.approx(0.9697, abs=1e-4)
    predicted = calibrated_micros(h200, 2 * 8192 * 4096 * 4096, 2 * (2 * 8192 * 4096 + 4096 * 4096),
                                  [1, 8192, 4096, 4096, 16])
    assert predicted / 361.0 == pytest.approx(1.0, abs=0.1)


def _running_durations(micros: list[float]) -> list[int]:
    """Whole microseconds by which the rounded running total grows (`flint.emit.durations`)."""
    out, exact, emitted = [], 0.0, 0
    for m in micros:
        exact += m
        out.append(round(exact) - emitted)
        emitted += out[-1]
    return out


@pytest.fixture(scope="module")
def mlp_round(tmp_path_factory):
    out = tmp_path_factory.mktemp("round") / "mlp"
    run = flint("extract", EXAMPLES / "mlp.py", "--mesh", "2x4", "-o", out, "--device", ROUND)
    assert run.returncode == 0, run.stderr
    return out


def test_gpu_extraction_writes_the_calibrated_times(mlp_round):
    manifest = json.loads((mlp_round / "manifest.json").read_text())
    assert manifest["durations"] == "calibrated" and manifest["device"]["calibration"]["kernel_overhead_us"] == 2.0
    nodes = [n for n in read_trace(mlp_round / "mlp.0.et").nodes if n.type == pb.COMP_NODE]
    gemms = [n for n in nodes if attr_value(n, "kernel") == "gemm"]
    assert gemms and all(any(a.name == "gemm" for a in n.attr) for n in gemms)
    hand = [hand_kernel_micros(n, device_table(ROUND)) for n in nodes]
    assert [n.duration_micros for n in nodes] == _running_durations(hand)


def test_timeline_reproduces_the_traces_compute(mlp_round, tmp_path):
    run = flint("timeline", mlp_round, "-o", tmp_path / "t.json", "--json")
    assert run.returncode == 0, run.stderr
    ranks = json.loads(run.stdout)["ranks"]
    for rank in ranks:
        trace = read_trace(mlp_round / f"mlp.{rank['rank']}.et")
        assert rank["compute_us"] == pytest.approx(sum(n.duration_micros for n in trace.nodes if n.type == pb.COMP_NODE))


def test_readers_time_again_only_when_asked(mlp_round, tmp_path):
    trace = read_trace(mlp_round / "mlp.0.et")
    h200 = load_device("h200")
    again = sum(
        kernel_micros(h200, "roofline", attr_value(n, "num_ops"), attr_value(n, "tensor_size"))
        for n in trace.nodes if n.type == pb.COMP_NODE
    )
    run = flint("timeline", mlp_round, "-o", tmp_path / "t.json", "--json", "--device", "h200", "--durations", "roofline")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["ranks"][0]["compute_us"] == pytest.approx(again)
    refused = flint("inspect", mlp_round, "--device", "h200", "--durations", "trace")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: --device times compute again: use it with --durations calibrated or roofline"]
    replay = flint("simulate", mlp_round, "--device", "h200", "--astra-sim", "/nonexistent")
    assert replay.returncode == 2 and "--roofline" in replay.stderr and len(replay.stderr.strip().splitlines()) == 1


def test_xla_durations_without_estimates_are_refused(tmp_path):
    run = flint("extract", MODELS / "stacked.py", "--mesh", "1", "-o", tmp_path / "x", "--durations", "xla")
    assert run.returncode == 2
    assert "--durations xla: XLA's scheduler gave no estimate" in run.stderr
    assert not (tmp_path / "x").exists()


def test_slices_and_in_place_updates_cost_what_they_touch(tmp_path):
    """A layer of [8, 256, 256] bf16 weights read by index, a [16, 256] row of an [8, 16, 256] cache
    written by index: the slice reads 256 x 256 x 2 bytes and writes as many, the update reads and
    writes 16 x 256 x 2; each also reads its three int32 start indices."""
    run = flint("extract", MODELS / "stacked.py", "--mesh", "1", "--backend", "cpu", "-o", tmp_path / "s", "--json")
    assert run.returncode == 0, run.stderr
    graph = json.loads((tmp_path / "s" / "stacked.graph.json").read_text())
    by_op = {n["op"]: n for n in graph["nodes"]}
    assert by_op["dynamic_slice"]["bytes"] == 2 * 256 * 256 * 2 + 3 * 4
    assert by_op["dynamic_update_slice"]["bytes"] == 2 * 16 * 256 * 2 + 3 * 4
    assert by_op["dot"]["gemm"] == [1, 16, 256, 256, 16]


def _profile(path: Path, gemm_us: list[float], other_us: list[float],
             named: list[tuple[str, float]] = ()) -> None:
    """A trace-event JSON like JAX's profiler's: a GPU process, its kernels back to back (GEMMs,
    then the `named` kernels, then the other kernels), and a host process's work beside them."""
    events = [{"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/device:GPU:0"}},
              {"ph": "M", "pid": 9, "name": "process_name", "args": {"name": "/host:CPU"}}]
    start = 0.0
    kernels = [("nvjet_hsh_128x256", d) for d in gemm_us] + list(named) + [("loop_add_fusion", d) for d in other_us]
    for name, dur in kernels:
        events.append({"ph": "X", "pid": 7, "tid": 1, "ts": start, "dur": dur, "name": name})
        start += dur
    events.append({"ph": "X", "pid": 9, "tid": 1, "ts": 0.0, "dur": 1e6, "name": "host work"})
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))


def _fit_one_profile(trace: Path, tmp_path: Path, gemms: int, others: int,
                     named: list[tuple[str, float]] = ()) -> tuple[dict, list[float]]:
    """`flint calibrate --json` on a profile of `trace`'s kernels: each GEMM 40 µs, the `named`
    kernels, the others 1.5 µs (the shortest tenth, so the fitted overhead) but one of 12 µs, no
    gaps. Returns the fit and the other kernels' times."""
    other_us = [1.5] * others
    other_us[-1] = 12.0
    _profile(tmp_path / "p.json.gz", [40.0] * gemms, other_us, named)
    run = flint("calibrate", tmp_path / "p.json.gz", trace, "-o", tmp_path / "fit.toml", "--json")
    assert run.returncode == 0, run.stderr
    fit = json.loads(run.stdout)
    assert fit["device"]["calibration"]["kernel_overhead_us"] == pytest.approx(1.5)
    return fit, other_us


def test_calibrate_fits_each_class_to_the_profile(mlp_round, tmp_path):
    trace = read_trace(mlp_round / "mlp.0.et")
    nodes = [n for n in trace.nodes if n.type == pb.COMP_NODE]
    gemms = [n for n in nodes if any(a.name == "gemm" for a in n.attr)]
    others = [n for n in nodes if n not in gemms]
    fit, other_us = _fit_one_profile(mlp_round, tmp_path, len(gemms), len(others))
    c = fit["device"]["calibration"]
    # The other kernels are bound by bytes here (vector peak 10 TFLOP/s): sum(1.5 + bytes / (bw e))
    # equals their measured sum, so e = sum(bytes) / (bw x (measured - n x 1.5)).
    other_bytes = sum(attr_value(n, "tensor_size") for n in others)
    measured = sum(other_us)
    expected = other_bytes / (10_000e3 * (measured - len(others) * 1.5))
    assert c["memory_efficiency"] == pytest.approx(expected, rel=1e-3)
    by_class = {k["kind"]: k for k in fit["classes"]}
    assert by_class["gemm"]["measured_ms"] == pytest.approx(40.0 * len(gemms) / 1e3)
    assert by_class["gemm"]["after_ms"] == pytest.approx(by_class["gemm"]["measured_ms"], rel=1e-3)
    written = load_device(str(tmp_path / "fit.toml"))
    assert written.name == "round-calibrated" and written.calibration.gemm_tile == (64, 64)
    assert written.calibration.memory_efficiency == pytest.approx(expected, rel=1e-3)


def test_calibrate_fits_one_device_to_several_steps(mlp_round, tmp_path):
    trace = read_trace(mlp_round / "mlp.0.et")
    nodes = [n for n in trace.nodes if n.type == pb.COMP_NODE]
    gemms = [n for n in nodes if any(a.name == "gemm" for a in n.attr)]
    others = [n for n in nodes if n not in gemms]
    # Two profiles of the same program, the other kernels 8 µs in one and 16 µs in the other (the
    # shortest tenth 1.5 µs in both): one device for both, as if it were one step twice as long.
    first, second = [1.5] * len(others), [1.5] * len(others)
    first[-1], second[-1] = 8.0, 16.0
    _profile(tmp_path / "a.trace.json.gz", [40.0] * len(gemms), first)
    _profile(tmp_path / "b.trace.json.gz", [40.0] * len(gemms), second)
    run = flint("calibrate", tmp_path / "a.trace.json.gz", mlp_round, tmp_path / "b.trace.json.gz", mlp_round,
                "-o", tmp_path / "fit.toml", "--json")
    assert run.returncode == 0, run.stderr
    fit = json.loads(run.stdout)
    other_bytes = sum(attr_value(n, "tensor_size") for n in others)
    measured = sum(first) + sum(second)
    expected = 2 * other_bytes / (10_000e3 * (measured - 2 * len(others) * 1.5))
    assert fit["device"]["calibration"]["memory_efficiency"] == pytest.approx(expected, rel=1e-3)
    steps = {s["name"]: s for s in fit["steps"]}
    assert set(steps) == {"a", "b"}
    assert steps["a"]["measured_ms"] == pytest.approx((40.0 * len(gemms) + sum(first)) / 1e3)
    # One fitted device over-predicts the faster step and under-predicts the slower by the same time.
    assert steps["a"]["after_ms"] == pytest.approx(steps["b"]["after_ms"])
    assert steps["a"]["after_ms"] - steps["a"]["measured_ms"] == pytest.approx(
        steps["b"]["measured_ms"] - steps["b"]["after_ms"], rel=1e-3)


def test_calibrate_needs_a_trace_for_each_profile(mlp_round, tmp_path):
    _profile(tmp_path / "a.json.gz", [40.0], [1.5])
    run = flint("calibrate", tmp_path / "a.json.gz", mlp_round, tmp_path / "a.json.gz", "-o", tmp_path / "f.toml")
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1].endswith("give a PROFILE and its TRACE for each step")
    assert not (tmp_path / "f.toml").exists()
    run = flint("calibrate", tmp_path / "a.json.gz", mlp_round / "mlp.0.et", "--rank", "1", "-o", tmp_path / "f.toml")
    assert run.returncode == 2 and "mlp.0.et holds rank 0, not rank 1: drop --rank" in run.stderr
    assert not (tmp_path / "f.toml").exists()


LLAMA = ["--model-arg", "arch=llama", "--model-arg", "layers=2", "--model-arg", "hidden=384", "--model-arg", "heads=12",
         "--model-arg", "kv_heads=4", "--model-arg", "seq=256", "--model-arg", "vocab=1024", "--model-arg", "batch=2"]
"""A small Llama-style training step whose attention (3 query heads per key head) the GPU compiler
writes with untiled transposes, as it does Llama 3.2 3B's."""


@pytest.fixture(scope="module")
def llama_round(tmp_path_factory):
    out = tmp_path_factory.mktemp("round") / "llama"
    run = flint("extract", EXAMPLES.parent / "bench" / "models" / "decoder.py", "--mesh", "data=1", "-o", out,
                "--device", ROUND, *LLAMA)
    assert run.returncode == 0, run.stderr
    return out


def test_transpose_kernels_are_timed_at_the_transpose_efficiency(llama_round):
    nodes = [n for n in read_trace(llama_round / "decoder.0.et").nodes if n.type == pb.COMP_NODE]
    transposes = [n for n in nodes if attr_value(n, "kernel") == "transpose"]
    assert transposes
    hand = [hand_kernel_micros(n, device_table(ROUND)) for n in nodes]
    assert [n.duration_micros for n in nodes] == _running_durations(hand)
    # Their bytes at 0.1 of the bandwidth, not 0.25, outweigh their element-wise FLOPs.
    exact = {id(n): h for n, h in zip(nodes, hand)}
    for n in transposes:
        assert exact[id(n)] - 2.0 == pytest.approx(attr_value(n, "tensor_size") / (10_000e9 * 0.1) * 1e6)
        assert attr_value(n, "num_ops") / 10e12 < attr_value(n, "tensor_size") / (10_000e9 * 0.1)


def test_calibrate_fits_the_transposes_apart(llama_round, tmp_path):
    nodes = [n for n in read_trace(llama_round / "decoder.0.et").nodes if n.type == pb.COMP_NODE]
    gemms = [n for n in nodes if any(a.name == "gemm" for a in n.attr)]
    transposes = [n for n in nodes if attr_value(n, "kernel") == "transpose"]
    others = [n for n in nodes if n not in gemms and n not in transposes]
    # Each untiled transpose 30 µs, named as XLA names them.
    fit, _ = _fit_one_profile(llama_round, tmp_path, len(gemms), len(others),
                              [("loop_transpose_fusion_3", 30.0)] * len(transposes))
    c = fit["device"]["calibration"]
    # The transposes move bytes only: n x 1.5 + bytes / (bw e) = n x 30.
    transpose_bytes = sum(attr_value(n, "tensor_size") for n in transposes)
    expected = transpose_bytes / (10_000e3 * len(transposes) * (30.0 - 1.5))
    assert c["transpose_efficiency"] == pytest.approx(expected, rel=1e-3)
    assert "transpose_efficiency" in fit["fitted"]
    by_class = {k["kind"]: k for k in fit["classes"]}
    assert by_class["transpose"]["measured_kernels"] == by_class["transpose"]["traced_kernels"] == len(transposes)
    assert load_device(str(tmp_path / "fit.toml")).calibration.transpose_efficiency == pytest.approx(expected, rel=1e-3)


def test_calibrate_fits_the_triton_fusions_apart(llama_round, tmp_path):
    nodes = [n for n in read_trace(llama_round / "decoder.0.et").nodes if n.type == pb.COMP_NODE]
    gemms = [n for n in nodes if any(a.name == "gemm" for a in n.attr)]
    triton = [n for n in nodes if attr_value(n, "kernel") == "triton"]
    names = sorted({attr_value(n, "kernel_name") for n in triton})
    assert len(names) >= 2
    # The first name's kernels run 20 µs each, as often as the trace has them; the second's run one
    # time more than the trace has them (another compiler's kernel of that name): compared with
    # the rest, as are its nodes.
    first = [n for n in triton if attr_value(n, "kernel_name") == names[0]]
    second = [n for n in triton if attr_value(n, "kernel_name") == names[1]]
    profiled = (len(first) * [(names[0].replace(".", "_"), 20.0)]
                + (len(second) + 1) * [(names[1].replace(".", "_"), 20.0)])
    others = [n for n in nodes if n not in gemms and n not in first]
    fit, other_us = _fit_one_profile(llama_round, tmp_path, len(gemms), len(others), profiled)
    c = fit["device"]["calibration"]
    # The matched kernels move bytes only: n x 1.5 + bytes / (bw e) = n x 20.
    first_bytes = sum(attr_value(n, "tensor_size") for n in first)
    expected = first_bytes / (10_000e3 * len(first) * (20.0 - 1.5))
    assert c["triton_efficiency"] == pytest.approx(expected, rel=1e-3)
    assert all(attr_value(n, "num_ops") / 10e12 < attr_value(n, "tensor_size") / (10_000e9 * expected) for n in first)
    assert "triton_efficiency" in fit["fitted"]
    by_class = {k["kind"]: k for k in fit["classes"]}
    assert by_class["triton"]["measured_kernels"] == by_class["triton"]["traced_kernels"] == len(first)
    assert by_class["triton"]["measured_ms"] == pytest.approx(len(first) * 20.0 / 1e3)
    assert by_class["other"]["measured_ms"] == pytest.approx((sum(other_us) + (len(second) + 1) * 20.0) / 1e3)
    assert by_class["other"]["traced_kernels"] == len(others) - len([n for n in others if attr_value(n, "kernel") == "transpose"])
    assert load_device(str(tmp_path / "fit.toml")).calibration.triton_efficiency == pytest.approx(expected, rel=1e-3)


def test_a_profiles_triton_fusions_are_known_by_the_traces_names():
    """A profile names a Triton fusion like XLA's own, or like an untiled transpose where a newer
    compiler handed one to Triton: only the trace's names tell."""
    from flint.analysis.calibrate import kernel_class

    triton = frozenset({"fusion_103", "loop_transpose_fusion_7"})
    assert [kernel_class(name, triton) for name in ("fusion_103", "fusion_104", "loop_transpose_fusion_7",
                                                    "loop_transpose_fusion_2", "nvjet_hsh_128x256")] == [
        "triton", "other", "triton", "transpose", "gemm"]


def test_layers_held_one_dict_each_do_the_same_gemms_without_slicing_a_stack(tmp_path):
    """bench/models/decoder.py with `scan=False` holds one parameter dict per layer (as PyTorch
    does) instead of stacking them under `lax.scan`: the same matrix products (equal GEMM FLOPs), and
    none of the copies that slice each layer's weights out of the stack. The forward's slices alone
    read and write every layer's weights once: at least 2 x layers x 12 h^2 bf16 bytes fewer."""
    layers, hidden = 3, 256
    args = ["--model-arg", "arch=gpt", "--model-arg", f"layers={layers}", "--model-arg", f"hidden={hidden}",
            "--model-arg", "heads=4", "--model-arg", "seq=128", "--model-arg", "vocab=512", "--model-arg", "batch=2"]
    totals = {}
    for scan in ("True", "False"):
        out = tmp_path / scan
        run = flint("extract", EXAMPLES.parent / "bench" / "models" / "decoder.py", "--mesh", "data=1", "-o", out,
                    *args, "--model-arg", f"scan={scan}")
        assert run.returncode == 0, run.stderr
        nodes = [n for n in read_trace(out / "decoder.0.et").nodes if n.type == pb.COMP_NODE]
        gemm = sum(attr_value(n, "num_ops") for n in nodes if attr_value(n, "kernel") == "gemm")
        totals[scan] = gemm, sum(attr_value(n, "tensor_size") for n in nodes)
    assert totals["False"][0] == totals["True"][0] > 0
    assert totals["True"][1] - totals["False"][1] >= 2 * layers * 12 * hidden**2 * 2


def test_a_fitted_device_file_keeps_the_8bit_efficiency(tmp_path):
    from flint.analysis.calibrate import Fit, device_toml

    path = tmp_path / "h100-mine.toml"
    path.write_text(device_toml(Fit(load_device("h100"), [], [], (), {}), "a profile"))
    kept = load_device(str(path)).calibration.gemm_efficiency_8bit
    assert kept == load_device("h100").calibration.gemm_efficiency_8bit == 0.695
    round_trip = tmp_path / "round.toml"
    round_trip.write_text(device_toml(Fit(load_device(str(ROUND)), [], [], (), {}), "a profile"))
    assert "gemm_efficiency_8bit" not in round_trip.read_text()

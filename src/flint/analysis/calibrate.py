"""Fit a device's kernel model to one profiled step: `flint calibrate`.

A user with one real GPU profiles one step of their model (JAX's profiler, Perfetto/Chrome JSON)
and extracts the same program with Flint on that GPU's backend. Kernel names and instruction
numbers differ between compiler versions, so kernels are compared by class, not one by one:

- GEMMs (cuBLAS, cuBLASLt and CUTLASS kernels, XLA's Triton GEMM fusions) against the trace's
  nodes that carry a `gemm`;
- everything else (fusions, copies, memsets) against the other compute nodes.

The fit keeps the device's peaks, tile and depth overhead, and sets:

- `kernel_overhead_us`: the idle time between the profile's kernels per kernel, plus the time of
  its shortest kernels (the median of its fastest tenth), which do next to no work;
- `memory_efficiency`, then `gemm_efficiency`: each the one value for which the model's time of
  its class, summed over the trace, equals the profile's (bisection: the model is monotone in
  both). A GEMM whose bytes outweigh its FLOPs is then timed at the fitted bandwidth.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from flint.devices import Device
from flint.devices.kernels import calibrated_micros
from flint.errors import FlintError
from flint.schema import et_def_pb2 as pb
from flint.trace.reader import RankTrace, attribute_value, attributes, gemm_shape

GEMM_KERNEL = re.compile(r"nvjet|gemm|cutlass|cublas|xmma|matmul|s\d{3,}_|sm\d\d_", re.IGNORECASE)
"""Names of GEMM kernels: cuBLAS(Lt)'s `nvjet_*`, `sm90_xmma_*`, CUTLASS's, XLA's `gemm_fusion_*`."""
GEMM, OTHER = "gemm", "other"
CLASSES = (GEMM, OTHER)


@dataclass(frozen=True)
class Profile:
    """One device's kernels of a profiled step: (name, duration µs) in start order, and the span
    from the first kernel's start to the last one's end."""

    kernels: list[tuple[str, float]]
    span_us: float

    def durations(self, kind: str) -> list[float]:
        return [d for name, d in self.kernels if kernel_class(name) == kind]


def kernel_class(name: str) -> str:
    return GEMM if GEMM_KERNEL.search(name) else OTHER


def read_profile(path: Path) -> Profile:
    """The first GPU's kernels of a Perfetto/Chrome trace-event JSON (gzip or not)."""
    try:
        raw = path.read_bytes()
        data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except FileNotFoundError:
        raise FlintError(f"profile {str(path)!r} not found") from None
    except (OSError, ValueError) as exc:
        raise FlintError(f"{str(path)!r} is not a trace-event JSON profile ({exc}): give the "
                         "*.trace.json.gz that jax.profiler writes") from None
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise FlintError(f"{str(path)!r} has no traceEvents list: give a trace-event JSON profile")
    gpus = sorted(
        (e["args"]["name"], e["pid"]) for e in events
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "process_name"
        and "GPU" in str(e.get("args", {}).get("name", ""))
    )
    if not gpus:
        raise FlintError(f"{str(path)!r} has no GPU process (/device:GPU:N): profile the step on a GPU")
    pid = gpus[0][1]
    kernels = sorted((e["ts"], e["dur"], e["name"]) for e in events
                     if isinstance(e, dict) and e.get("ph") == "X" and e.get("pid") == pid and "dur" in e)
    if not kernels:
        raise FlintError(f"{str(path)!r} has no kernels on {gpus[0][0]}: profile one whole step")
    span = max(ts + dur for ts, dur, _ in kernels) - kernels[0][0]
    return Profile([(name, float(dur)) for _, dur, name in kernels], float(span))


@dataclass(frozen=True)
class Kernel:
    """One compute node of a trace, as the kernel model sees it."""

    flops: int
    nbytes: int
    gemm: Sequence[int] | None

    @property
    def kind(self) -> str:
        return GEMM if self.gemm is not None else OTHER


def trace_kernels(trace: RankTrace) -> list[Kernel]:
    found = []
    for node in trace.nodes:
        if node.type != pb.COMP_NODE:
            continue
        attrs = attributes(node)
        if "num_ops" not in attrs or "tensor_size" not in attrs:
            continue
        found.append(Kernel(int(attribute_value(attrs["num_ops"])), int(attribute_value(attrs["tensor_size"])),
                            gemm_shape(node)))
    if not found:
        raise FlintError(f"{trace.path} has no compute nodes with num_ops and tensor_size: give a Flint trace")
    return found


def predicted_ms(device: Device, kernels: Sequence[Kernel], kind: str) -> float:
    return sum(calibrated_micros(device, k.flops, k.nbytes, k.gemm) for k in kernels if k.kind == kind) / 1e3


@dataclass(frozen=True)
class ClassFit:
    kind: str
    measured_kernels: int
    traced_kernels: int
    measured_ms: float
    before_ms: float
    after_ms: float


@dataclass(frozen=True)
class Fit:
    """The fitted device and, per class, the profile beside the model before and after the fit."""

    device: Device
    classes: list[ClassFit]
    measured_step_ms: float
    predicted_step_ms: float
    clamped: tuple[str, ...] = ()

    def as_json(self) -> dict:
        return {
            "device": self.device.as_json(),
            "classes": [c.__dict__ for c in self.classes],
            "measured_step_ms": self.measured_step_ms,
            "predicted_step_ms": self.predicted_step_ms,
            "clamped": list(self.clamped),
        }


def _efficiency(fit, target_ms: float) -> tuple[float, bool]:
    """The efficiency in (0, 1] at which `fit(e)` (decreasing in e) gives `target_ms`; 1 and True
    where even the peak is slower than measured."""
    if fit(1.0) >= target_ms:
        return 1.0, fit(1.0) > target_ms
    low, high = 1e-4, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if fit(middle) > target_ms else (low, middle)
    return float(f"{high:.6g}"), False


def calibrate(profile: Profile, trace: RankTrace, base: Device, name: str) -> Fit:
    kernels = trace_kernels(trace)
    shortest = sorted(d for _, d in profile.kernels)[: max(1, len(profile.kernels) // 10)]
    idle = max(0.0, profile.span_us - sum(d for _, d in profile.kernels)) / len(profile.kernels)
    overhead = round(shortest[len(shortest) // 2] + idle, 3)
    device = replace(base, name=name, calibration=replace(base.calibration, kernel_overhead_us=overhead))
    measured = {kind: sum(profile.durations(kind)) / 1e3 for kind in CLASSES}
    clamped = []
    # Other kernels first: a GEMM's time can be its bytes, at the bandwidth this fit finds.
    memory_e, over = _efficiency(
        lambda e: predicted_ms(replace(device, calibration=replace(device.calibration, memory_efficiency=e)),
                               kernels, OTHER), measured[OTHER])
    clamped += ["memory_efficiency"] if over else []
    device = replace(device, calibration=replace(device.calibration, memory_efficiency=memory_e))
    gemm_e, over = _efficiency(
        lambda e: predicted_ms(replace(device, calibration=replace(device.calibration, gemm_efficiency=e)),
                               kernels, GEMM), measured[GEMM])
    clamped += ["gemm_efficiency"] if over else []
    device = replace(device, calibration=replace(device.calibration, gemm_efficiency=gemm_e))
    traced = {kind: sum(1 for k in kernels if k.kind == kind) for kind in CLASSES}
    classes = [ClassFit(kind, len(profile.durations(kind)), traced[kind], measured[kind],
                        predicted_ms(base, kernels, kind), predicted_ms(device, kernels, kind))
               for kind in CLASSES]
    return Fit(device, classes, profile.span_us / 1e3, sum(c.after_ms for c in classes), tuple(clamped))


def device_toml(fit: Fit, profile_name: str) -> str:
    """The fitted device as a device file, its fitted numbers' source the profile."""
    device = fit.device
    c = device.calibration
    lines = [f"name = {json.dumps(device.name)}", f"peak_tflops = {device.peak_tflops}",
             f"mem_bw_gbps = {device.mem_bw_gbps}"]
    if device.vector_tflops is not None:
        lines.append(f"vector_tflops = {device.vector_tflops}")
    lines += [f"compute_units = {device.compute_units}", "", "[calibration]",
              f"gemm_efficiency = {c.gemm_efficiency}", f"gemm_tile = [{c.gemm_tile[0]}, {c.gemm_tile[1]}]",
              f"gemm_k_overhead = {c.gemm_k_overhead}", f"memory_efficiency = {c.memory_efficiency}",
              f"kernel_overhead_us = {c.kernel_overhead_us}", "", "[sources]"]
    fitted = {"gemm_efficiency", "memory_efficiency", "kernel_overhead_us"}
    sources = dict(device.sources)
    for key in sorted(fitted):
        sources[key] = f"flint calibrate on {profile_name}"
    lines += [f"{key} = {json.dumps(value)}" for key, value in sorted(sources.items())]
    return "\n".join(lines) + "\n"

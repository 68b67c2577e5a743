"""Fit a device's kernel model to profiled steps: `flint calibrate`.

A user with one real GPU profiles one step of their model, or of several (JAX's profiler,
Perfetto/Chrome JSON), and extracts the same programs with Flint on that GPU's backend. Kernel
names and instruction numbers can differ between compiler versions, so kernels are compared by
class, not one by one:

- GEMMs (cuBLAS, cuBLASLt and CUTLASS kernels, XLA's Triton GEMM fusions) against the trace's
  nodes that carry a `gemm`;
- untiled transposes (XLA's `loop_*transpose*` kernels) against the nodes of `kernel` transpose;
- Triton block-level fusions against the nodes of `kernel` triton: a profile names them like
  XLA's own fusions (`fusion_103`), so a profiled kernel is one where the trace's triton nodes
  carry its name (`kernel_name`, `.` and `-` as `_`) exactly as often as the profile has it;
  triton nodes whose name the profile lacks, or has a different number of times (another
  compiler's kernel of that name), are compared with the rest;
- everything else (fusions, copies, memsets) against the other compute nodes.

The fit keeps the device's peaks, tile and depth overhead, and sets:

- `kernel_overhead_us`: the idle time between the profiles' kernels per kernel, plus the time of
  their shortest kernels (the median of the fastest tenth), which do next to no work;
- `triton_efficiency`, `memory_efficiency`, `transpose_efficiency` (the first and last where both
  sides have such kernels), then `gemm_efficiency`: each the one value for which the model's time
  of its class, summed over the traces, equals the profiles' (bisection: the model is monotone in
  each). A GEMM whose bytes outweigh its FLOPs is then timed at the fitted bandwidth.

One program's kernels can be unlike most programs' (a compiler's choice of fusions, a slow
kernel that dominates): a device fitted to several programs carries over better.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from flint.devices import Device
from flint.devices.kernels import TRANSPOSE, TRITON, calibrated_micros
from flint.errors import FlintError
from flint.schema import et_def_pb2 as pb
from flint.step.network_files import toml_string
from flint.trace.reader import RankTrace, attribute_value, attributes, gemm_shape, kernel_kind, kernel_name

GEMM_KERNEL = re.compile(r"nvjet|gemm|cutlass|cublas|xmma|matmul|s\d{3,}_|sm\d\d_", re.IGNORECASE)
"""Names of GEMM kernels: cuBLAS(Lt)'s `nvjet_*`, `sm90_xmma_*`, CUTLASS's, XLA's `gemm_fusion_*`."""
TRANSPOSE_KERNEL = re.compile(r"loop_\w*transpose")
"""Names of XLA's untiled transpose kernels (`loop_transpose_fusion`): a trace's `transpose` nodes."""
GEMM, OTHER = "gemm", "other"
CLASSES = (GEMM, TRANSPOSE, TRITON, OTHER)


@dataclass(frozen=True)
class Profile:
    """One device's kernels of a profiled step: (name, duration µs) in start order, and the span
    from the first kernel's start to the last one's end."""

    kernels: list[tuple[str, float]]
    span_us: float

    def durations(self, kind: str, triton: frozenset[str] = frozenset()) -> list[float]:
        """The durations of the kernels of class `kind`, `triton` naming the Triton fusions."""
        return [d for name, d in self.kernels if kernel_class(name, triton) == kind]

    def class_ms(self) -> dict[str, float]:
        """The kernels' time per class by their names alone, in ms (as `traced_ms` gives a
        trace's; Triton fusions, which only a trace's names tell apart, count among the others)."""
        return {kind: sum(self.durations(kind)) / 1e3 for kind in CLASSES}


def kernel_class(name: str, triton: frozenset[str] = frozenset()) -> str:
    """A profiled kernel's class, by its name; `triton` holds the names of the Triton block-level
    fusions (`matched_triton`), which the names alone do not tell from XLA's own (a newer XLA
    hands some `loop_transpose_fusion`s to Triton)."""
    if name in triton:
        return TRITON
    if GEMM_KERNEL.search(name):
        return GEMM
    return TRANSPOSE if TRANSPOSE_KERNEL.search(name) else OTHER


def node_class(gemm: Sequence[int] | None, kernel: str | None) -> str:
    """A trace node's class, by its `gemm` and `kernel` attributes."""
    if gemm is not None:
        return GEMM
    return kernel if kernel in (TRANSPOSE, TRITON) else OTHER


def profile_name(name: str) -> str:
    """The name a GPU profile gives the kernel of instruction `name`: `fusion.103` runs as `fusion_103`."""
    return re.sub(r"[.\-]", "_", name)


def step_name(profile: Path) -> str:
    """A profile's file name without its trace-event suffixes: the step it profiled."""
    return re.sub(r"(\.trace|\.perfetto)?\.json(\.gz)?$", "", profile.name)


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
    """One compute node of a trace, as the kernel model sees it, and the name a profile gives it."""

    flops: int
    nbytes: int
    gemm: Sequence[int] | None
    kernel: str | None = None
    name: str | None = None

    @property
    def kind(self) -> str:
        return node_class(self.gemm, self.kernel)

    def fit_class(self, triton: frozenset[str]) -> str:
        """Its class in a fit against a profile whose Triton fusions are `triton`: a triton node
        the profile has no counterpart for is compared with the other kernels."""
        return OTHER if self.kind == TRITON and self.name not in triton else self.kind


def matched_triton(profile: Profile, kernels: Sequence[Kernel]) -> frozenset[str]:
    """The profile's kernel names that are the trace's Triton fusions: a name the trace's triton
    nodes carry exactly as often as the profile's kernels do (a profiling GPU's newer compiler
    may give the name to another kernel, or run it a different number of times)."""
    traced = Counter(k.name for k in kernels if k.kind == TRITON and k.name is not None)
    ran = Counter(name for name, _ in profile.kernels)
    return frozenset(name for name, count in traced.items() if ran[name] == count)


def trace_kernels(trace: RankTrace) -> list[Kernel]:
    found = []
    for node in trace.nodes:
        if node.type != pb.COMP_NODE:
            continue
        attrs = attributes(node)
        if "num_ops" not in attrs or "tensor_size" not in attrs:
            continue
        name = kernel_name(node)
        found.append(Kernel(int(attribute_value(attrs["num_ops"])), int(attribute_value(attrs["tensor_size"])),
                            gemm_shape(node), kernel_kind(node), profile_name(name) if name else None))
    if not found:
        raise FlintError(f"{trace.path} has no compute nodes with num_ops and tensor_size: give a Flint trace")
    return found


def traced_ms(trace: RankTrace) -> dict[str, float]:
    """The trace's own compute time per class (its nodes' `duration_micros`), in ms: what every
    reader of the trace reports by default."""
    found = dict.fromkeys(CLASSES, 0.0)
    for node in trace.nodes:
        if node.type == pb.COMP_NODE:
            found[node_class(gemm_shape(node), kernel_kind(node))] += node.duration_micros / 1e3
    return found


def predicted_ms(device: Device, kernels: Sequence[Kernel], kind: str, triton: frozenset[str]) -> float:
    """The model's time of the kernels of fit class `kind` (`Kernel.fit_class`), in ms."""
    return sum(calibrated_micros(device, k.flops, k.nbytes, k.gemm, k.kernel)
               for k in kernels if k.fit_class(triton) == kind) / 1e3


@dataclass(frozen=True)
class ClassFit:
    kind: str
    measured_kernels: int
    traced_kernels: int
    measured_ms: float
    before_ms: float
    after_ms: float


@dataclass(frozen=True)
class StepFit:
    """One profiled step: its measured span beside the model's sum before and after the fit."""

    name: str
    measured_ms: float
    before_ms: float
    after_ms: float


@dataclass(frozen=True)
class Fit:
    """The fitted device and, per class and per step, the profiles beside the model before and
    after the fit."""

    device: Device
    classes: list[ClassFit]
    steps: list[StepFit]
    clamped: tuple[str, ...] = ()
    fitted: tuple[str, ...] = ()

    def as_json(self) -> dict:
        return {
            "device": self.device.as_json(),
            "classes": [c.__dict__ for c in self.classes],
            "steps": [s.__dict__ for s in self.steps],
            "clamped": list(self.clamped),
            "fitted": list(self.fitted),
        }


@dataclass(frozen=True)
class ProfiledStep:
    """A profiled step and Flint's trace of the same program."""

    name: str
    profile: Profile
    trace: RankTrace


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


def _with(device: Device, **calibration) -> Device:
    """`device` with some calibration values replaced."""
    return replace(device, calibration=replace(device.calibration, **calibration))


def calibrate(steps: Sequence[ProfiledStep], base: Device, name: str) -> Fit:
    """One device for all `steps`: each class's modelled time, summed over the steps, equals the
    measured one. Several steps of different programs fit the device to what they have in common
    rather than to one program's kernels."""
    kernels = {step.name: trace_kernels(step.trace) for step in steps}
    triton = {step.name: matched_triton(step.profile, kernels[step.name]) for step in steps}
    measured_kernels = [d for step in steps for _, d in step.profile.kernels]
    shortest = sorted(measured_kernels)[: max(1, len(measured_kernels) // 10)]
    idle = sum(max(0.0, step.profile.span_us - sum(d for _, d in step.profile.kernels)) for step in steps)
    overhead = round(shortest[len(shortest) // 2] + idle / len(measured_kernels), 3)
    device = _with(replace(base, name=name), kernel_overhead_us=overhead)

    def count(kind: str) -> tuple[int, int]:
        """(profiled, traced) kernels of class `kind`."""
        return (sum(len(step.profile.durations(kind, triton[step.name])) for step in steps),
                sum(1 for step in steps for k in kernels[step.name] if k.fit_class(triton[step.name]) == kind))

    def modelled(device: Device, kind: str) -> float:
        return sum(predicted_ms(device, kernels[step.name], kind, triton[step.name]) for step in steps)

    measured = {kind: sum(sum(step.profile.durations(kind, triton[step.name])) for step in steps) / 1e3
                for kind in CLASSES}
    # Triton fusions first: a triton node without a profiled counterpart is timed among the other
    # kernels at this efficiency. Other kernels before GEMMs: a GEMM's time can be its bytes.
    order = [("triton_efficiency", TRITON), ("memory_efficiency", OTHER),
             ("transpose_efficiency", TRANSPOSE), ("gemm_efficiency", GEMM)]
    order = [(key, kind) for key, kind in order if kind in (OTHER, GEMM) or (measured[kind] and all(count(kind)))]
    clamped = []
    for key, kind in order:
        value, over = _efficiency(lambda e: modelled(_with(device, **{key: e}), kind), measured[kind])
        device = _with(device, **{key: value})
        clamped += [key] if over else []
    fitted = ("kernel_overhead_us", *(key for key, _ in order))
    classes = [ClassFit(kind, *count(kind), measured[kind], modelled(base, kind), modelled(device, kind))
               for kind in CLASSES]
    per_step = [StepFit(step.name, step.profile.span_us / 1e3,
                        sum(predicted_ms(base, kernels[step.name], kind, triton[step.name]) for kind in CLASSES),
                        sum(predicted_ms(device, kernels[step.name], kind, triton[step.name]) for kind in CLASSES))
                for step in steps]
    return Fit(device, classes, per_step, tuple(clamped), fitted)


def device_toml(fit: Fit, source: str) -> str:
    """The fitted device as a device file, its fitted numbers' source `source` (the profiles)."""
    device = fit.device
    c = device.calibration
    lines = [f"name = {toml_string(device.name)}", f"peak_tflops = {device.peak_tflops}",
             f"mem_bw_gbps = {device.mem_bw_gbps}"]
    if device.vector_tflops is not None:
        lines.append(f"vector_tflops = {device.vector_tflops}")
    lines += [f"compute_units = {device.compute_units}", "", "[calibration]",
              f"gemm_efficiency = {c.gemm_efficiency}"]
    if c.gemm_efficiency_8bit is not None:
        lines.append(f"gemm_efficiency_8bit = {c.gemm_efficiency_8bit}")
    lines += [f"gemm_tile = [{c.gemm_tile[0]}, {c.gemm_tile[1]}]", f"gemm_k_overhead = {c.gemm_k_overhead}",
              f"memory_efficiency = {c.memory_efficiency}"]
    if c.transpose_efficiency is not None:
        lines.append(f"transpose_efficiency = {c.transpose_efficiency}")
    if c.triton_efficiency is not None:
        lines.append(f"triton_efficiency = {c.triton_efficiency}")
    lines += [f"kernel_overhead_us = {c.kernel_overhead_us}", "", "[sources]"]
    sources = dict(device.sources)
    for key in sorted(fit.fitted):
        sources[key] = f"flint calibrate on {source}"
    lines += [f"{toml_string(key)} = {toml_string(value)}" for key, value in sorted(sources.items())]
    return "\n".join(lines) + "\n"

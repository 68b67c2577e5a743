"""Kernel by kernel: Flint's kernel model beside a real GPU's profile, by the emitter that built each kernel.

    python bench/kernels.py [--measured bench/measured] [--devices h100,h200] [--only NAME,...]
                            [--calibration ../shared/calibration] [--top N]

`bench/heldout.py` compares kernel classes in total; this looks inside them. For each step that
`bench/measure_gpu.py` recorded (and the 1.7B GPT step of `../shared/calibration` on the H200, where
that folder is present) it extracts the same program on `gpu:DEVICE` and matches the profile's kernels
to the trace's compute nodes by the compiler's instruction name (a profile names an XLA kernel after
its fusion, with `_` for `.`). The GPU ran a newer XLA than Flint's deviceless compiler, so a name is
only taken where it occurs as often on both sides; the rest of the time is reported as unmatched.

Matched kernels are grouped by the emitter that built them in Flint's compile:

- `gemm`: cuBLAS calls and Triton GEMM fusions (the nodes with a `gemm`);
- `triton`: XLA's Triton block-level fusions (softmax- and normalization-like rows);
- `transpose`: XLA loop fusions that Flint times as untiled transposes;
- `xla`: every other fusion of XLA's own loop and reduction emitters.

Per group: measured and modelled ms, their ratio, and the bandwidth each kernel reached on the GPU
(Flint's bytes over the measured time), as a share of the device's peak: the one number per class
that a memory-bound kernel model can take. `--top` lists kernels one by one, each with the emitter
the GPU's own compile chose for it where `bench/measure_gpu.py` recorded that (`-` where it did
not): XLA's fusion autotuner picks between its own emitter and Triton by timing both on the GPU.
Every figure comes from this run and the recordings.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from heldout import ROOT, measurements

GROUPS = ("gemm", "triton", "transpose", "xla")


@dataclass
class Kernel:
    """One kernel name of one step: how often it ran and what both sides say of it in total."""

    name: str
    group: str
    count: int
    nbytes: int
    modelled_us: float
    measured_us: float = 0.0


def traced_kernels(model: Path, mesh: str, model_args: dict, device: str, out: Path) -> tuple[dict[str, Kernel], float]:
    """Flint's compute nodes of the program on `gpu:DEVICE` (the trace's rank 0), by the name a
    profile gives each kernel, and the device's peak bandwidth (GB/s)."""
    import flint
    from flint.analysis.calibrate import OTHER, trace_kernels
    from flint.devices import BUILTIN
    from flint.devices.kernels import calibrated_micros
    from flint.trace.reader import read_trace

    flint.extract(model, mesh, out, backend=f"gpu:{device}", model_args=model_args, force=True)
    spec = BUILTIN[device]
    kernels: dict[str, Kernel] = {}
    for node in trace_kernels(read_trace(next(out.glob("*.0.et")))):
        if node.name is None:
            continue
        group = "xla" if node.kind == OTHER else node.kind
        kernel = kernels.setdefault(node.name, Kernel(node.name, group, 0, 0, 0.0))
        kernel.count += 1
        kernel.nbytes += node.nbytes
        kernel.modelled_us += calibrated_micros(spec, node.flops, node.nbytes, node.gemm, node.kernel)
    return kernels, spec.mem_bw_gbps


def compare(label: str, kernels: dict[str, Kernel], peak_gbps: float, profile: Path, top: int,
            emitters: dict[str, str]) -> list[Kernel]:
    """Match the profile's kernels to `kernels`; print the step's groups (and its `top` kernels,
    with the emitter the GPU's compile chose where `emitters` records it) and return the matched
    kernels."""
    from flint.analysis.calibrate import read_profile

    measured_us: dict[str, float] = defaultdict(float)
    counts: Counter = Counter()
    for name, micros in read_profile(profile).kernels:
        measured_us[name] += micros
        counts[name] += 1
    matched = [k for name, k in kernels.items() if counts[name] == k.count]
    for kernel in matched:
        kernel.measured_us = measured_us[kernel.name]
    total = sum(measured_us.values())
    share = sum(k.measured_us for k in matched) / total if total else 0.0
    print(f"\n{label}: {len(matched)} of {len(kernels)} kernel names matched, {share:.0%} of the "
          f"profile's {total / 1e3:,.1f} ms")
    summarize(matched, peak_gbps)
    if top:
        print(f"  {'kernel':<34}{'group':<10}{'runs':>5}{'real ms':>10}{'Flint ms':>10}{'ratio':>7}{'of peak':>8}"
              f"  GPU's emitter")
    for kernel in sorted(matched, key=lambda k: -k.measured_us)[:top]:
        print(f"  {kernel.name[:33]:<34}{kernel.group:<10}{kernel.count:>5}{kernel.measured_us / 1e3:>10,.2f}"
              f"{kernel.modelled_us / 1e3:>10,.2f}{kernel.modelled_us / kernel.measured_us:>7.2f}"
              f"{kernel.nbytes / kernel.measured_us / peak_gbps / 1e3:>8.2f}  {emitters.get(kernel.name, '-')}")
    return matched


def summarize(matched: list[Kernel], peak_gbps: float) -> None:
    """Print measured and modelled ms and the bandwidth reached per group."""
    groups = {g: (sum(k.measured_us for k in matched if k.group == g),
                  sum(k.modelled_us for k in matched if k.group == g),
                  sum(k.nbytes for k in matched if k.group == g)) for g in GROUPS}
    print(f"  {'group':<44}{'real ms':>10}{'Flint ms':>10}{'ratio':>7}{'of peak BW':>11}")
    for group, (measured, modelled, nbytes) in groups.items():
        if measured:
            print(f"  {group:<44}{measured / 1e3:>10,.1f}{modelled / 1e3:>10,.1f}{modelled / measured:>7.2f}"
                  f"{nbytes / measured / peak_gbps / 1e3:>11.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", type=Path, default=ROOT / "bench" / "measured")
    parser.add_argument("--devices", default="h100,h200")
    parser.add_argument("--only", default="", help="Step names to compare (default: all recorded).")
    parser.add_argument("--calibration", type=Path, default=ROOT.parent / "shared" / "calibration")
    parser.add_argument("--top", type=int, default=0, help="Also list each step's N longest kernels.")
    options = parser.parse_args()
    only = {name for name in options.only.split(",") if name}
    steps = []
    for device in options.devices.split(","):
        for record in measurements(options.measured, device):
            if not only or record["name"] in only:
                steps.append((f"{device} {record['name']}", ROOT / record["model"], record["mesh"], record["args"],
                              device, options.measured / f"{device}-{record['name']}.trace.json.gz",
                              record.get("emitters", {})))
    program = options.calibration / "gpt_megatron.py"
    if "h200" in options.devices.split(",") and program.exists() and (not only or "calibration" in only):
        steps.append(("h200 calibration gpt-1.7b", program, "data=1,tensor=1", {"batch": 8}, "h200",
                      options.calibration / "h200_gpt1.7b_b8.perfetto.json.gz", {}))
    if not steps:
        raise SystemExit(f"no measurements in {options.measured} for {options.devices}")
    matched: dict[str, list[Kernel]] = defaultdict(list)
    peaks = {}
    with tempfile.TemporaryDirectory(prefix="flint-kernels-") as tmp:
        for index, (label, model, mesh, args, device, profile, emitters) in enumerate(steps):
            kernels, peaks[device] = traced_kernels(model, mesh, args, device, Path(tmp) / str(index))
            matched[device] += compare(label, kernels, peaks[device], profile, options.top, emitters)
    for device, found in matched.items():
        print(f"\n{device}, every step above:")
        summarize(found, peaks[device])


if __name__ == "__main__":
    main()

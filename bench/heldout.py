"""Predicted beside measured on real GPUs, on steps the device files were fitted to and held out.

    python bench/heldout.py [--measured bench/measured] [--suite bench/gpu_steps.toml] [--devices h100,h200]
                            [--only NAME,...] [--keep DIR]

`bench/measured/` holds what `bench/measure_gpu.py` recorded on a real H100 and H200 for the steps of
`bench/gpu_steps.toml` (GPT and Llama-style training and decode steps of several sizes): each
step's median time, the device's peak bytes in use and one profiled step's kernels. The h100 and
h200 device files were fitted to the profiles of the steps marked `fit`; the others are held out,
and the summary counts them apart. For each step this extracts the same program with Flint on the
matching deviceless backend (`gpu:h100`, `gpu:h200`) and prints Flint's numbers beside the
measurement:

- GEMM kernels and the other kernels (untiled transposes among them): the trace's durations summed
  by class, beside the profile's kernels of that class (kernels are matched by class, not one by
  one: the compilers differ);
- the step: the trace's compute time beside the median measured step (one GPU: no communication);
- peak memory: Flint's peak per rank (arguments + temporaries + outputs not aliased, donated)
  beside the device's `peak_bytes_in_use`.

Ratios are predicted / measured. Every figure comes from this run and the recorded measurements.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from measure_gpu import suite

ROOT = Path(__file__).resolve().parent.parent
STEP_TOLERANCE, GEMM_TOLERANCE, MEMORY_TOLERANCE = 0.10, 0.15, 0.10
NAME_WIDTH = 26


def measurements(directory: Path, device: str) -> list[dict]:
    path = directory / f"{device}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def beside(model: Path, mesh: str, model_args: dict, device: str, profile: Path, step_ms: float,
           peak_bytes: int, out: Path) -> dict[str, tuple[float, float] | None]:
    """Flint's trace of `model` on `gpu:DEVICE` (written to `out`) beside one GPU's measurement of
    it: (Flint, real) for the GEMM kernels' and the other kernels' ms (the profile's), the step's
    ms and the peak memory's GB (None where the extraction reported no memory)."""
    import flint
    from flint.analysis.calibrate import GEMM, read_profile, traced_ms
    from flint.trace.reader import read_trace

    summary = flint.extract(model, mesh, out, backend=f"gpu:{device}", model_args=model_args, force=True)
    predicted = traced_ms(read_trace(next(out.glob("*.0.et"))))
    measured = read_profile(profile).class_ms()
    peak = (summary.get("memory_per_rank") or {}).get("peak")
    return {
        "gemm": (predicted[GEMM], measured[GEMM]),
        "other": (sum(predicted.values()) - predicted[GEMM], sum(measured.values()) - measured[GEMM]),
        "step": (sum(predicted.values()), step_ms),
        "peak": (peak / 1e9, peak_bytes / 1e9) if peak else None,
    }


def compare(record: dict, fitted: bool, directory: Path, work: Path) -> dict:
    device, name = record["device"], record["name"]
    pairs = beside(ROOT / record["model"], record["mesh"], record["args"], device,
                   directory / f"{device}-{name}.trace.json.gz", record["step_median_s"] * 1e3,
                   record["memory"]["peak_bytes_in_use"], work / f"{device}-{name}")
    return {"name": name, "device": device, "fit": fitted, **pairs}


def ratio(pair: tuple[float, float]) -> float:
    return pair[0] / pair[1]


def print_row(row: dict) -> None:
    cells = "".join(f"{p:>10,.1f}{m:>9,.1f}{p / m:>6.2f}" for p, m in (row[k] for k in ("gemm", "other", "step", "peak")))
    print(f"{row['device']:<6}{row['name']:<{NAME_WIDTH}}{'fit' if row['fit'] else 'held':<6}{cells}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", type=Path, default=ROOT / "bench" / "measured")
    parser.add_argument("--suite", type=Path, default=ROOT / "bench" / "gpu_steps.toml",
                        help="the steps measured (which were fitted: `fit = true`)")
    parser.add_argument("--devices", default="h100,h200")
    parser.add_argument("--only", default="", help="comma-separated step names")
    parser.add_argument("--keep", type=Path, help="write the traces here (default: a temporary folder)")
    options = parser.parse_args()
    if options.keep:
        options.keep.mkdir(parents=True, exist_ok=True)
    steps = {s["name"]: s for s in suite(options.suite, "")}
    wanted = set(options.only.split(",")) if options.only else set(steps)
    header = "".join(f"{label:>25}" for label in ("GEMM ms: Flint  real", "other ms", "step ms", "peak GB"))
    print(f"{'':<{NAME_WIDTH + 12}}{header}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="flint-heldout-") as tmp:
        for device in options.devices.split(","):
            for record in measurements(options.measured, device):
                if record["name"] in wanted:
                    fitted = steps.get(record["name"], {}).get("fit", False)
                    rows.append(compare(record, fitted, options.measured, options.keep or Path(tmp)))
                    print_row(rows[-1])
    if not rows:
        raise SystemExit(f"no measurements in {options.measured} for {options.devices}")
    held = [r for r in rows if not r["fit"]]
    for key, tolerance in (("step", STEP_TOLERANCE), ("gemm", GEMM_TOLERANCE), ("peak", MEMORY_TOLERANCE)):
        for label, group in (("held-out", held), ("all", rows)):
            if not group:
                continue
            inside = sum(abs(ratio(r[key]) - 1) <= tolerance for r in group)
            worst = max(group, key=lambda r: abs(ratio(r[key]) - 1))
            print(f"{key}, {label}: {inside} of {len(group)} within ±{tolerance:.0%}; furthest "
                  f"{worst['device']} {worst['name']} at {ratio(worst[key]):.2f}")


if __name__ == "__main__":
    main()

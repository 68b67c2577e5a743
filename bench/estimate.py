"""Flint's estimator beside ASTRA-sim: the step each gives and how long each takes to give it.

The estimator times collectives as ASTRA-sim does here (`--collectives astra-sim`), so that the two
engines' steps agree; Flint's default, collectives as NCCL runs them, is checked against measured
NCCL figures by bench/collectives.py.

    python bench/estimate.py [--sizes 64,256] [--big 4096] [--network hgx] [--dir DIR]

Extracts `bench/gpt_at_scale.py` (DP x TP, 8-way tensor parallelism) and `examples/fsdp.py`
(FSDP x TP, 8-way tensor parallelism, two sequences per data-parallel rank) with `--backend
gpu:h100` at each of `--sizes` ranks and simulates each with `flint simulate --engine flint` and,
where `ASTRA_SIM` names ASTRA-sim, `--engine astra-sim`; then the DP x TP trace alone at each of
`--big` ranks with the estimator only. Prints one row per trace: the steps, their ratio and each
engine's wall time (the simulate command's own, without extraction). `--dir` keeps the traces
there (reused by a later run with the same `--dir`); by default they go to a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TENSOR = 8


def extract(kind: str, ranks: int, out: Path) -> None:
    if (out / "manifest.json").exists():
        return
    data = ranks // TENSOR
    if kind == "dp-tp":
        args = [str(ROOT / "bench" / "gpt_at_scale.py"), "--mesh", f"data={data},tensor={TENSOR}"]
    else:
        args = [str(ROOT / "examples" / "fsdp.py"), "--mesh", f"{data}x{TENSOR}", "--model-arg", f"batch={2 * data}"]
    run = subprocess.run([sys.executable, "-m", "flint", "extract", *args, "--backend", "gpu:h100", "-o", str(out)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"extract {kind} at {ranks} ranks failed: {run.stderr.strip().splitlines()[-1]}")


def simulate(trace: Path, engine: str, network: str) -> tuple[float, float]:
    """(step µs, seconds the command took)."""
    began = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "flint", "simulate", str(trace), "--engine", engine, "--network",
                          network, "--collectives", "astra-sim", "--json", "--no-estimate",
                          "-o", str(trace / f"sim-{engine}")],
                         capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if run.returncode != 0:
        raise SystemExit(f"simulate {trace} --engine {engine} failed: {run.stderr.strip()}")
    return json.loads(run.stdout)["step_us"], seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256", help="Rank counts for both engines.")
    parser.add_argument("--big", default="4096", help="Rank counts for the estimator alone ('' for none).")
    parser.add_argument("--network", default="hgx")
    parser.add_argument("--dir", type=Path, help="Where the traces go (kept) [default: a temporary directory].")
    args = parser.parse_args()
    astra = os.environ.get("ASTRA_SIM")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    big = [int(s) for s in args.big.split(",") if s]
    with tempfile.TemporaryDirectory() as scratch:
        base = args.dir or Path(scratch)
        base.mkdir(parents=True, exist_ok=True)
        print(f"{'trace':<8} {'ranks':>7} {'estimator µs':>13} {'ASTRA-sim µs':>13} {'ratio':>7} "
              f"{'estimator s':>12} {'ASTRA-sim s':>12}   (network {args.network})")
        jobs = [(kind, n, True) for n in sizes for kind in ("dp-tp", "fsdp")] + [("dp-tp", n, False) for n in big]
        for kind, ranks, both in jobs:
            trace = base / f"{kind}-{ranks}"
            extract(kind, ranks, trace)
            step, seconds = simulate(trace, "flint", args.network)
            row = f"{kind:<8} {ranks:>7,} {step:>13,.1f}"
            if both and astra:
                reference, astra_seconds = simulate(trace, "astra-sim", args.network)
                row += f" {reference:>13,.1f} {step / reference:>7.4f} {seconds:>12.2f} {astra_seconds:>12.2f}"
            else:
                row += f" {'-':>13} {'-':>7} {seconds:>12.2f} {'-':>12}"
            print(row, flush=True)


if __name__ == "__main__":
    main()

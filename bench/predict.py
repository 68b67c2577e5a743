"""Predicted beside measured: Flint's step time and memory against real hardware and published runs.

    python bench/predict.py [--calibration ../shared/calibration] [--rows 1,2,3,4] [--skip-table1]

1. The 1.7B GPT step on one H200 (`../shared/calibration`: the program, its profiled step and its
   measured step time and peak memory): Flint's `gpu:h200` trace of the same program, per kernel
   class (GEMMs, the rest) and in total, beside the profile; the peak memory per rank beside the
   device's `peak_bytes_in_use`.
2. Megatron-LM's Table 1 (Narayanan et al., 2021) rows without pipelining: the same GPT on
   `gpu:a100` with the paper's data x tensor layout and batch, simulated on Selene's network (the
   `hgx-a100` network file: 8 A100s per node on NVLink3 and NVSwitch, one 200 Gb/s HDR NIC per
   GPU) by Flint's estimator, collectives as NCCL runs them; TFLOP/s per GPU by the paper's model
   FLOPs, 96 B s l h^2 (1 + s / 6h + V / 16 l h), beside the published figure.

Every figure comes from this run; ratios are predicted / measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEQ, VOCAB = 2048, 51200
TABLE1 = [  # layers, hidden, heads, tensor-parallel size, GPUs, batch, published TFLOP/s per GPU
    (24, 2304, 24, 1, 32, 512, 137),
    (30, 3072, 32, 2, 64, 512, 138),
    (36, 4096, 32, 4, 128, 512, 142),
    (40, 6144, 48, 8, 256, 1024, 135),
]


def paper_flops(batch: int, layers: int, hidden: int) -> float:
    return 96 * batch * SEQ * layers * hidden**2 * (1 + SEQ / (6 * hidden) + VOCAB / (16 * layers * hidden))


def h200_step(calibration: Path, work: Path) -> None:
    from heldout import beside

    runs = [json.loads(line) for line in (calibration / "h200_gpt1.7b_steps.jsonl").read_text().splitlines()]
    step = next(r for r in runs if r["name"] == "g1.7b_b8" and "peak_bytes_in_use" in r.get("memory", {}))
    started = time.perf_counter()
    pairs = beside(calibration / "gpt_megatron.py", "data=1,tensor=1", {"batch": 8}, "h200",
                   calibration / "h200_gpt1.7b_b8.perfetto.json.gz", step["step_median_s"] * 1e3,
                   step["memory"]["peak_bytes_in_use"], work / "h200")
    print(f"1.7B GPT, batch 8, one H200 (extracted in {time.perf_counter() - started:.1f} s)")
    print(f"{'':<28}{'predicted':>12}{'measured':>12}{'ratio':>8}")
    labels = {"gemm": "GEMM kernels, ms", "other": "other kernels, ms", "step": "step, ms", "peak": "peak memory, GB"}
    for key, label in labels.items():
        if pairs[key]:
            p, m = pairs[key]
            print(f"{label:<28}{p:>12,.1f}{m:>12,.1f}{p / m:>8.2f}")


def table1(rows: list[int], model: Path, work: Path) -> None:
    import flint

    print("\nMegatron-LM Table 1 on gpu:a100, the hgx-a100 network (Selene's)")
    print(f"{'row':<5}{'model':<18}{'layout':<20}{'step s':>8}{'by':>11}{'TFLOP/s':>9}{'published':>10}{'ratio':>7}")
    for row in rows:
        layers, hidden, heads, tp, gpus, batch, published = TABLE1[row - 1]
        mesh = f"data={gpus // tp},tensor={tp}"
        out = work / f"row{row}"
        flint.extract(model, mesh, out, backend="gpu:a100", force=True,
                      model_args={"layers": layers, "hidden": hidden, "heads": heads, "batch": batch})
        result = flint.simulate(out, network="hgx-a100", output=out / "simulation")
        step_us = result["step_us"]
        engine = "ASTRA-sim" if result["engine"] == "astra-sim" else "estimate"
        tflops = paper_flops(batch, layers, hidden) / (step_us / 1e6) / gpus / 1e12
        print(f"{row:<5}{f'{layers}x{hidden}':<18}{mesh:<20}{step_us / 1e6:>8.2f}{engine:>11}{tflops:>9.0f}"
              f"{published:>10}{tflops / published:>7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", type=Path, default=ROOT.parent / "shared" / "calibration")
    parser.add_argument("--rows", default="1,2,3,4", help="Table 1 rows to simulate (1-4).")
    parser.add_argument("--skip-table1", action="store_true")
    args = parser.parse_args()
    if not (args.calibration / "gpt_megatron.py").exists():
        sys.exit(f"no gpt_megatron.py in {args.calibration}: give --calibration DIR")
    with tempfile.TemporaryDirectory(prefix="flint-predict-") as tmp:
        work = Path(tmp)
        h200_step(args.calibration, work)
        if not args.skip_table1:
            table1([int(r) for r in args.rows.split(",")], args.calibration / "gpt_megatron.py", work)


if __name__ == "__main__":
    main()

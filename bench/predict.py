"""Predicted beside measured: Flint's step time and memory against real hardware and published runs.

    python bench/predict.py [--calibration ../shared/calibration] [--rows 1,...,10] [--llama 1,2]
                            [--skip-table1] [--skip-llama] [--budget-s 600] [--budget-gb 12]

1. The 1.7B GPT step on one H200 (`../shared/calibration`: the program, its profiled step and its
   measured step time and peak memory): Flint's `gpu:h200` trace of the same program, per kernel
   class (GEMMs, the rest) and in total, beside the profile; the peak memory per rank beside the
   device's `peak_bytes_in_use`.
2. Every row of Megatron-LM's Table 1 (Narayanan et al., 2021): the same GPT on `gpu:a100` with the
   row's tensor, pipeline and data parallel sizes, batch, microbatch size and schedule as
   Megatron-LM's `examples/sc21/run_table_1.sh` gives them (interleaved where it sets
   `--num-layers-per-virtual-pipeline-stage`), simulated on Selene's network (the `hgx-a100`
   network file: 8 A100s per node on NVLink3 and NVSwitch, one 200 Gb/s HDR NIC per GPU) by Flint's
   estimator, collectives as NCCL runs them; TFLOP/s per GPU by the paper's model FLOPs,
   96 B s l h^2 (1 + s / 6h + V / 16 l h), beside the published figure. Rows without pipelining
   run each rank's whole batch in one step (Megatron-LM's 18.4B row accumulates 4 microbatches of 8
   instead).
3. Llama 3 405B on 16,384 H100s (Llama 3 paper, table 4), `examples/llama.py` at 405B's shape with
   128 layers (126 do not divide over 16 stages; Llama 3 ran 7 on the first and last stage), on
   the `hgx` network (8 H100s per node, one 400 Gb/s NIC per GPU, as Meta's RoCE cluster): TP 8,
   PP 16, DP 128 at sequence 8,192, and TP 8, CP 16, PP 16, DP 8 at 131,072, 16 sequences per
   data-parallel rank in microbatches of one, interleaved over 4 virtual stages of 2 layers (the
   paper does not give its schedule's virtual stages). TFLOP/s per GPU by 6 N + 12 l h s FLOPs per
   token (N: the parameters). The example has no activation recomputation and attends with
   XLA's own kernels (no fused flash attention).

Every pipelined row is extracted with `--rank-files classes` (one trace per pipeline stage) and
estimated with `flint simulate --engine flint`, each in a process of its own: the table gives their
seconds, the peak memory of each (the largest resident set of the process and its children,
sampled every 0.2 s) and the disk the traces took. A row that passes `--budget-s` or `--budget-gb`
is stopped and says which. Every figure comes from this run; ratios are predicted / measured.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEQ, VOCAB = 2048, 51200


@dataclass(frozen=True)
class Row:
    """One configuration: the model's shape, its layout and schedule, and the published TFLOP/s."""

    layers: int
    hidden: int
    heads: int
    tensor: int
    pipeline: int
    gpus: int
    batch: int
    microbatch: int
    virtual: int
    published: float
    context: int = 1

    @property
    def data(self) -> int:
        return self.gpus // (self.tensor * self.pipeline * self.context)

    @property
    def microbatches(self) -> int:
        return self.batch // (self.data * self.microbatch)


TABLE1 = [  # Narayanan et al. 2021, Table 1; microbatch sizes and virtual stages from examples/sc21
    Row(24, 2304, 24, 1, 1, 32, 512, 16, 1, 137),
    Row(30, 3072, 32, 2, 1, 64, 512, 16, 1, 138),
    Row(36, 4096, 32, 4, 1, 128, 512, 16, 1, 142),
    Row(40, 6144, 48, 8, 1, 256, 1024, 8, 1, 135),
    Row(48, 8192, 64, 8, 2, 512, 1536, 4, 1, 138),
    Row(60, 10240, 80, 8, 4, 1024, 1792, 2, 3, 140),
    Row(80, 12288, 96, 8, 8, 1536, 2304, 2, 2, 148),
    Row(96, 16384, 128, 8, 16, 1920, 2160, 1, 2, 155),
    Row(105, 20480, 128, 8, 35, 2520, 2520, 1, 3, 163),
    Row(128, 25600, 160, 8, 64, 3072, 3072, 1, 1, 163),
]
LLAMA = {  # Llama 3 405B: (mesh, sequence, sequences, published TFLOP/s per GPU)
    1: ("pp=16,data=128,tensor=8", 8192, 128 * 16, 400),
    2: ("pp=16,data=8,context=16,tensor=8", 131072, 8 * 16, 380),
}
LLAMA_VIRTUAL = 4
LLAMA_SHAPE = {"layers": 128, "width": 16384, "heads": 128, "kv_heads": 8, "ffn": 53248, "vocab": 128256}


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


@dataclass(frozen=True)
class Measured:
    """A command's JSON output (None where it failed or was stopped), its seconds and peak memory."""

    output: dict | None
    seconds: float
    peak_gb: float
    why: str = ""


def _group_rss_gb(group: int) -> float:
    """The resident memory of every process of a process group, in GB."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) == group:  # pgrp
                total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # rss, in pages
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def run_measured(command: list[str], budget_s: float, budget_gb: float) -> Measured:
    """Run `command` in a process group of its own, sampling its memory; stop it past a budget."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:  # a pipe would fill
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True, start_new_session=True)
        peak, why = 0.0, ""
        while process.poll() is None:
            peak = max(peak, _group_rss_gb(process.pid))
            elapsed = time.perf_counter() - started
            if peak > budget_gb or elapsed > budget_s:
                why = f"stopped at {peak:.1f} GB" if peak > budget_gb else f"stopped at {elapsed:.0f} s"
                os.killpg(process.pid, signal.SIGKILL)
                break
            time.sleep(0.2)
        process.wait()
        seconds = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if why or process.returncode != 0:
        return Measured(None, seconds, peak, why or stderr.strip().splitlines()[-1][:100])
    return Measured(json.loads(stdout), seconds, peak)


def flint_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "flint", *args]


def extract_and_estimate(model: Path, mesh: str, model_args: dict, backend: str, network: str, out: Path,
                         pipeline: list[str], budget: argparse.Namespace) -> tuple[Measured, Measured | None]:
    """`flint extract --rank-files classes` then `flint simulate --engine flint`, each measured."""
    arguments = [f"--model-arg={name}={value}" for name, value in model_args.items()]
    extracted = run_measured(flint_command("extract", str(model), "--mesh", mesh, "--backend", backend, "-o", str(out),
                                           "--force", "--json", "--rank-files", "classes", *arguments, *pipeline),
                             budget.budget_s, budget.budget_gb)
    if extracted.output is None:
        return extracted, None
    left = budget.budget_s - extracted.seconds
    return extracted, run_measured(flint_command("simulate", str(out), "--engine", "flint", "--network", network,
                                                 "--json", "-o", str(out / "simulation")), left, budget.budget_gb)


HEADER = (f"{'':<4}{'model':<18}{'TP x PP x DP':<14}{'M':>5}{'V':>3}{'step s':>8}{'TFLOP/s':>9}{'published':>10}"
          f"{'ratio':>7}{'extract s':>11}{'estimate s':>11}{'extract GB':>11}{'estimate GB':>12}{'disk MB':>9}")


def print_row(label: str, model: str, row: Row, extracted: Measured, estimated: Measured | None,
              flops: float) -> None:
    layout = f"{row.tensor} x {row.pipeline} x {row.data}"
    microbatches = row.microbatches if row.pipeline > 1 else 1  # unpipelined: the whole batch in one step
    head = f"{label:<4}{model:<18}{layout:<14}{microbatches:>5}{row.virtual:>3}"
    if estimated is None or estimated.output is None:
        failed = estimated if extracted.output is not None else extracted
        stage = "estimate" if extracted.output is not None else "extract"
        print(f"{head}  {stage}: {failed.why} after {failed.seconds:.0f} s, peak {failed.peak_gb:.1f} GB")
        return
    step_s = estimated.output["step_us"] / 1e6
    tflops = flops / step_s / row.gpus / 1e12
    disk = extracted.output["trace_bytes"] / 1e6
    print(f"{head}{step_s:>8.2f}{tflops:>9.0f}{row.published:>10.0f}{tflops / row.published:>7.2f}"
          f"{extracted.seconds:>11.0f}{estimated.seconds:>11.0f}{extracted.peak_gb:>11.1f}{estimated.peak_gb:>12.1f}"
          f"{disk:>9,.0f}")


def pipeline_flags(row: Row) -> list[str]:
    if row.pipeline == 1:
        return []
    flags = ["--pipeline-stages", str(row.pipeline), "--microbatches", str(row.microbatches)]
    if row.virtual > 1:
        flags += ["--schedule", "interleaved", "--virtual-stages", str(row.virtual)]
    return flags


def table1(rows: list[int], model: Path, work: Path, budget: argparse.Namespace) -> None:
    print("\nMegatron-LM Table 1 on gpu:a100, the hgx-a100 network (Selene's); M microbatches, V virtual stages")
    print(HEADER)
    for number in rows:
        row = TABLE1[number - 1]
        mesh = (f"pp={row.pipeline}," if row.pipeline > 1 else "") + f"data={row.data},tensor={row.tensor}"
        model_args = {"layers": row.layers, "hidden": row.hidden, "heads": row.heads, "batch": row.batch}
        extracted, estimated = extract_and_estimate(model, mesh, model_args, "gpu:a100", "hgx-a100",
                                                    work / f"row{number}", pipeline_flags(row), budget)
        print_row(str(number), f"{row.layers}x{row.hidden}", row, extracted, estimated,
                  paper_flops(row.batch, row.layers, row.hidden))


def llama_parameters(layers: int, width: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> int:
    head_dim = width // heads
    per_layer = 2 * width * heads * head_dim + 2 * width * kv_heads * head_dim + 3 * width * ffn + 2 * width
    return layers * per_layer + 2 * vocab * width + width


def llama(configs: list[int], work: Path, budget: argparse.Namespace) -> None:
    print("\nLlama 3 405B (128 layers) on gpu:h100, the hgx network; M microbatches, V virtual stages")
    print(HEADER)
    shape = LLAMA_SHAPE
    parameters = llama_parameters(**shape)
    for number in configs:
        mesh, seq, sequences, published = LLAMA[number]
        sizes = dict(part.split("=") for part in mesh.split(","))
        gpus = 1
        for size in sizes.values():
            gpus *= int(size)
        row = Row(shape["layers"], shape["width"], shape["heads"], int(sizes["tensor"]), int(sizes["pp"]), gpus,
                  sequences, 1, LLAMA_VIRTUAL, published, int(sizes.get("context", 1)))
        model_args = {**shape, "seq": seq, "batch": sequences}
        pipeline = ["--pipeline-stages", str(row.pipeline), "--microbatches", str(row.microbatches),
                    "--schedule", "interleaved", "--virtual-stages", str(LLAMA_VIRTUAL)]
        extracted, estimated = extract_and_estimate(ROOT / "examples" / "llama.py", mesh, model_args, "gpu:h100",
                                                    "hgx", work / f"llama{number}", pipeline, budget)
        tokens = sequences * seq
        flops = tokens * (6 * parameters + 12 * shape["layers"] * shape["width"] * seq)
        label = f"CP {row.context}" if row.context > 1 else ""
        print_row(str(number), f"405B {seq // 1024}K {label}".strip(), row, extracted, estimated, flops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", type=Path, default=ROOT.parent / "shared" / "calibration")
    parser.add_argument("--rows", default=",".join(str(i + 1) for i in range(len(TABLE1))),
                        help="Table 1 rows to predict (1-10).")
    parser.add_argument("--llama", default="1,2", help="Llama 3 405B configurations to predict (1: DP, 2: CP).")
    parser.add_argument("--skip-h200", action="store_true")
    parser.add_argument("--skip-table1", action="store_true")
    parser.add_argument("--skip-llama", action="store_true")
    parser.add_argument("--budget-s", type=float, default=600, help="Seconds for a row's extraction and estimate.")
    parser.add_argument("--budget-gb", type=float, default=12, help="Memory for either, in GB.")
    args = parser.parse_args()
    if not (args.calibration / "gpt_megatron.py").exists():
        sys.exit(f"no gpt_megatron.py in {args.calibration}: give --calibration DIR")
    with tempfile.TemporaryDirectory(prefix="flint-predict-") as tmp:
        work = Path(tmp)
        if not args.skip_h200:
            h200_step(args.calibration, work)
        if not args.skip_table1:
            table1([int(r) for r in args.rows.split(",")], args.calibration / "gpt_megatron.py", work, args)
        if not args.skip_llama:
            llama([int(c) for c in args.llama.split(",")], work, args)


if __name__ == "__main__":
    main()

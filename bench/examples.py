"""Every bundled example on the GPU compiler beside the CPU backend's partitioned stage, rank 0.

    python bench/examples.py [--only mlp,gpt,...]

Prints the table of docs/gpu-clusters.md: per example, the CPU partitioned stage's nodes and
collectives, the GPU kernels (GEMMs among them) and collectives on `gpu:h100`, the GPU memory per
rank, and rank 0's compute under `--durations calibrated`, `roofline` and `xla` ("–" where XLA's
scheduler left kernels without an estimate and the extraction refuses). Each figure comes from the
extraction's `--json` summary or from rank 0's trace, so the table can be re-made whenever the
compiler (a new JAX) changes its output.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLINT = Path(sys.executable).with_name("flint")
MESHES = {name: "2x4" for name in (
    "mlp", "gpt", "moe", "moe_gshard", "decode", "torch_mlp", "torch_gpt", "torch_cnn", "resnet_torch",
    "hf_llama", "hf_causal_lm", "hf_llama_decode",
)} | {"fsdp": "4x2", "pipeline_manual": "pp=4"}


def extract(name: str, out: Path, *extra: str) -> dict | None:
    """The `--json` summary of one extraction, or None where it refused."""
    run = subprocess.run(
        [str(FLINT), "extract", str(ROOT / "examples" / f"{name}.py"), "--mesh", MESHES[name], "-o", str(out),
         "--force", "--json", *extra], capture_output=True, text=True,
    )
    return json.loads(run.stdout) if run.returncode == 0 else None


def rank0(out: Path) -> tuple[int, int, float]:
    """Kernels, GEMM kernels and the compute microseconds of rank 0's trace."""
    from flint.schema import et_def_pb2 as pb
    from flint.trace.reader import attr_value, find_traces, read_trace

    prefix, _ = find_traces(out)
    nodes = [n for n in read_trace(out / f"{prefix}.0.et").nodes if n.type == pb.COMP_NODE]
    gemms = sum(attr_value(n, "kernel") == "gemm" for n in nodes)
    return len(nodes), gemms, sum(n.duration_micros for n in nodes)


def collectives(summary: dict) -> str:
    kinds = summary["per_rank"]["collectives"]
    return ", ".join(f"{kinds[kind]['count']} {kind}" for kind in sorted(kinds))


def row(name: str, tmp: Path) -> str:
    cpu = extract(name, tmp / "cpu", "--backend", "cpu", "--stage", "partitioned")
    gpu = extract(name, tmp / "gpu", "--backend", "gpu:h100")
    kernels, gemms, calibrated = rank0(tmp / "gpu")
    micros = [f"{calibrated:,.0f}"]
    for durations in ("roofline", "xla"):
        timed = extract(name, tmp / durations, "--backend", "gpu:h100", "--durations", durations)
        micros.append(f"{rank0(tmp / durations)[2]:,.0f}" if timed else "–")
    memory = gpu["memory_per_rank"]
    return (
        f"| `{name}.py` | {cpu['per_rank']['nodes']:,}, {collectives(cpu)} "
        f"| {kernels:,} ({gemms}), {collectives(gpu)} "
        f"| {memory['peak'] / 1e6:.1f} MB | {' / '.join(micros)} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated example names")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(MESHES)
    print("| example | CPU partitioned: nodes, collectives | GPU: kernels (GEMMs), collectives "
          "| GPU memory per rank | compute µs: calibrated / roofline / xla |")
    print("|---|---|---|---:|---:|")
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            print(row(name, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()

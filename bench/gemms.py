"""Flint's GEMM model beside published cuBLAS GEMM rates: one line per shape, modelled / measured.

    python bench/gemms.py [--tables bench/measured/gemms.toml]

Each table of `bench/measured/gemms.toml` gives a device file, the operands' bits, its source and
[m, n, k, TFLOP/s] rows as published; every row here is timed by the calibrated kernel model
(`flint.devices.kernels`, as every command times a GEMM) with 2mnk FLOPs and the three matrices'
bytes, then set beside the published rate. A table marked fitted is one a number of that device
file was fitted to (it checks the fit, it does not test it); the rest are held out. Per table, the
geometric mean and the range of the ratios over the shapes with every side 4,096 or more, where the
model's tiles fill the device.
"""

from __future__ import annotations

import argparse
import math
import tomllib
from pathlib import Path

from flint.devices.kernels import calibrated_micros
from flint.devices.spec import load_device

ROOT = Path(__file__).resolve().parent.parent
LARGE = 4096
"""Every side at least this: the shapes a table's summary covers."""


def modelled_tflops(device, m: int, n: int, k: int, bits: int) -> float:
    flops = 2 * m * n * k
    nbytes = (m * k + k * n + m * n) * bits // 8
    return flops / calibrated_micros(device, flops, nbytes, (1, m, n, k, bits)) / 1e6


def table(entry: dict) -> None:
    device = load_device(entry["device"])
    state = "fitted to it" if entry["fitted"] else "held out"
    print(f"\n{device.name}, {entry['bits']}-bit operands ({state}): {entry['source']}")
    print(f"{'m':>8} {'n':>7} {'k':>7} {'published':>10} {'Flint':>8} {'ratio':>6}")
    large = []
    for m, n, k, measured in entry["rows"]:
        flint = modelled_tflops(device, m, n, k, entry["bits"])
        print(f"{m:>8} {n:>7} {k:>7} {measured:>10.1f} {flint:>8.1f} {flint / measured:>6.2f}")
        if min(m, n, k) >= LARGE:
            large.append(flint / measured)
    mean = math.exp(sum(map(math.log, large)) / len(large))
    print(f"every side {LARGE:,} or more: geometric mean {mean:.2f}, from {min(large):.2f} to {max(large):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=Path, default=ROOT / "bench" / "measured" / "gemms.toml")
    args = parser.parse_args()
    for entry in tomllib.loads(args.tables.read_text())["table"]:
        table(entry)


if __name__ == "__main__":
    main()

"""Extraction at 64 to 131,072 ranks: seconds per stage, peak memory, bytes and rank files per second.

    python bench/scale.py [--sizes 64,512,4096,32768,131072] [--dir DIR] [--profile]

Extracts `bench/gpt_at_scale.py` (`examples/gpt.py`, 3 layers, two sequences per data-parallel rank)
on a data x tensor mesh with 8-way tensor parallelism at each size, each in a fresh process so that
its peak RSS is its own. Meshes of up to 2,048 ranks use the CPU backend, larger ones a v5p topology
(needs `flint-traces[tpu]`). Every trace is deleted once measured.

Emission is compared with plain writes of 4,096 files of this model's size into the same directory,
measured at the start of the same run: the disk's ceiling. `--profile` prints the 25 costliest
functions (cProfile, cumulative) of each extraction.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
MODEL = ROOT / "gpt_at_scale.py"
TENSOR = 8
BACKENDS = {
    64: ("cpu", 1),
    512: ("cpu", 1),
    4096: ("tpu:v5p:16x16x16", 1),
    32768: ("tpu:v5p:16x16x32", 4),
    131072: ("tpu:v5p:16x16x32", 16),
}
TARGETS = {4096: 10.0, 32768: 60.0, 131072: 300.0}
"""Seconds, end to end (the whole process, imports included)."""
RSS_TARGET_GIB = {131072: 4.0}
FILES_PER_SECOND_TARGET = 2000
FILE_BYTES = 180_000
"""About one rank file of this model (~1,400 nodes)."""
STAGES = ("load", "lower", "partition", "parse", "graph", "emit", "check")


def _child(args: argparse.Namespace) -> None:
    """Extract one size and print its measurements as one JSON line."""
    from flint.compile.backend import parse_backend
    from flint.devices import load_device
    from flint.mesh import parse_mesh
    from flint.pipeline import ExtractRequest, extract

    ranks = args.child
    request = ExtractRequest(
        model=MODEL,
        mesh=parse_mesh(f"data={ranks // TENSOR},tensor={TENSOR}"),
        output=Path(args.dir) / "trace",
        device=load_device("h100"),
        backend=parse_backend(*BACKENDS[ranks]),
    )
    started = time.perf_counter()
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        result = profiler.runcall(extract, request)
        stats = pstats.Stats(profiler, stream=sys.stderr)
        stats.sort_stats("cumulative").print_stats(25)
    else:
        result = extract(request)
    report = {
        "ranks": ranks,
        "backend": str(request.backend) + (f" x{request.backend.slices}" if ranks > 2048 else ""),
        "nodes": result.totals[0][1].nodes,
        "seconds": result.seconds,
        "extract": time.perf_counter() - started,
        "bytes": result.bytes_written,
        "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    print(json.dumps(report))


def _disk_ceiling(directory: Path, count: int, size: int) -> float:
    """Files per second for plain writes of `count` files of `size` bytes."""
    data = os.urandom(size)
    target = Path(tempfile.mkdtemp(dir=directory))
    try:
        os.sync()
        start = time.perf_counter()
        for i in range(count):
            with open(target / f"x.{i}.et", "wb") as handle:
                handle.write(data)
        return count / (time.perf_counter() - start)
    finally:
        shutil.rmtree(target)


def _measure(ranks: int, directory: Path, profile: bool) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"scale-{ranks}-", dir=directory))
    try:
        os.sync()  # start from a clean page cache: the previous size's writes are on disk
        command = [sys.executable, __file__, "--child", str(ranks), "--dir", str(work)]
        started = time.perf_counter()
        done = subprocess.run(command + (["--profile"] if profile else []), capture_output=True,
                              text=True)
        wall = time.perf_counter() - started
        if done.returncode:
            raise SystemExit(f"{ranks} ranks failed:\n{done.stderr[-4000:]}")
        if profile:
            print(f"--- profile, {ranks} ranks ---\n{done.stderr[-12000:]}", file=sys.stderr)
        report = json.loads(done.stdout.strip().splitlines()[-1])
        report["wall"] = wall
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report


def _row(r: dict) -> str:
    s = r["seconds"]
    rate = r["ranks"] / s["emit"]
    cells = [f"{r['ranks']:>7,}", f"{r['backend']:<22}", f"{r['nodes']:>5}"]
    cells += [f"{s[name]:>7.2f}" for name in STAGES]
    cells += [f"{r['wall']:>7.1f}", f"{r['rss_gib']:>5.2f}", f"{r['bytes'] / 1e9:>7.2f}"]
    cells += [f"{rate:>7,.0f}", f"{r['bytes'] / s['emit'] / 1e6:>5.0f}"]
    return " ".join(cells)


def _verdicts(r: dict, disk_rate: float) -> list[str]:
    out = []
    ranks, wall = r["ranks"], r["wall"]
    if ranks in TARGETS:
        target = TARGETS[ranks]
        verdict = "met" if wall <= target else f"MISSED by {wall - target:.1f} s ({wall / target:.2f}x)"
        out.append(f"{ranks:,} ranks end to end {wall:.1f} s, target <= {target:.0f} s: {verdict}")
    if ranks in RSS_TARGET_GIB:
        target = RSS_TARGET_GIB[ranks]
        verdict = "met" if r["rss_gib"] <= target else f"MISSED ({r['rss_gib'] / target:.2f}x)"
        out.append(f"{ranks:,} ranks peak RSS {r['rss_gib']:.2f} GiB, target <= {target} GiB: {verdict}")
    rate = ranks / r["seconds"]["emit"]
    if ranks >= 4096:
        verdict = "met" if rate >= FILES_PER_SECOND_TARGET else (
            f"MISSED ({rate / FILES_PER_SECOND_TARGET:.2f}x; plain writes: {disk_rate:,.0f}/s)"
        )
        out.append(f"{ranks:,} ranks emission {rate:,.0f} files/s, target >= 2,000: {verdict}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, BACKENDS)))
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where traces are written")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    header = [f"{'ranks':>7}", f"{'backend':<22}", f"{'nodes':>5}"]
    header += [f"{name:>7}" for name in STAGES]
    header += [f"{'wall s':>7}", f"{'RSS':>5}", f"{'GB':>7}", f"{'files/s':>7}", f"{'MB/s':>5}"]
    os.sync()
    disk_rate = _disk_ceiling(Path(args.dir), 4096, FILE_BYTES)
    print(" ".join(header))
    verdicts = []
    for ranks in (int(size) for size in args.sizes.split(",")):
        report = _measure(ranks, Path(args.dir), args.profile)
        print(_row(report), flush=True)
        verdicts += _verdicts(report, disk_rate)
    print("\nstage columns: seconds; wall: the whole process; RSS: peak GiB; GB written; files/s and")
    print(f"MB/s: emission. Plain writes of 4,096 files of {FILE_BYTES // 1000} KB into {args.dir}:")
    print(f"{disk_rate:,.0f} files/s ({disk_rate * FILE_BYTES / 1e6:,.0f} MB/s), the disk's ceiling.\n")
    print("\n".join(verdicts))


if __name__ == "__main__":
    main()

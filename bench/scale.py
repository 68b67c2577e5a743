"""Extraction at 64 to 131,072 ranks: seconds per stage, peak memory, bytes and rank files per second.

    python bench/scale.py [--sizes 64,512,4096,32768,131072] [--backends cpu,tpu,gpu] [--dir DIR]
                          [--profile]

Extracts `bench/gpt_at_scale.py` (`examples/gpt.py`, 3 layers, two sequences per data-parallel rank)
on a data x tensor mesh with 8-way tensor parallelism at each size and backend, each in a fresh
process so that its peak RSS is its own:

- `cpu`: the CPU backend, for meshes of up to 2,048 ranks (stage `partitioned`);
- `tpu`: a v5p topology with pod slices (`flint-traces[tpu]`), at 4,096, 32,768 and 131,072 ranks
  (stage `partitioned`);
- `gpu`: `--backend gpu:h100` (the default backend), XLA's GPU compiler for that many virtual
  H100s, traced kernel by kernel (stage `optimized`, the backend's default), at any size.

By default meshes of up to 2,048 ranks run on `cpu` and larger ones on both `tpu` and `gpu`;
`--backends` picks some of them (each at the sizes it supports). Every trace is deleted once
measured.

Emission is compared with plain writes of 4,096 files of each backend's rank-file size into the same
directory, measured at the start of the same run: the disk's ceiling. `--profile` prints the 25
costliest functions (cProfile, cumulative) of each extraction.
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
SIZES = (64, 512, 4096, 32768, 131072)
CPU_LIMIT = 2048
TPU_TOPOLOGIES = {
    4096: ("tpu:v5p:16x16x16", 1),
    32768: ("tpu:v5p:16x16x32", 4),
    131072: ("tpu:v5p:16x16x32", 16),
}
GPU = "gpu:h100"
KINDS = ("cpu", "tpu", "gpu")
TARGETS = {
    ("tpu", 4096): 10.0,
    ("tpu", 32768): 60.0,
    ("tpu", 131072): 300.0,
    ("gpu", 131072): 60.0,
}
"""Seconds, end to end (the whole process, imports included)."""
RSS_TARGET_GIB = {131072: 4.0}
FILES_PER_SECOND_TARGET = 2000
FILE_BYTES = {"cpu": 180_000, "tpu": 180_000, "gpu": 60_000}
"""About one rank file of this model: ~1,500 (cpu) and ~1,400 (tpu) nodes at the partitioned stage,
~470 kernels at the GPU's optimised one."""
STAGES = ("load", "lower", "partition", "parse", "graph", "emit", "check")


def _backend(kind: str, ranks: int) -> tuple[str, int] | None:
    """`(--backend, --slices)` of `kind` at `ranks`, or None where it does not compile that mesh."""
    if kind == "cpu":
        return ("cpu", 1) if ranks <= CPU_LIMIT else None
    if kind == "tpu":
        return TPU_TOPOLOGIES.get(ranks)
    return (GPU, 1)


def _runs(sizes: list[int], backends: list[str] | None) -> list[tuple[int, str]]:
    """(ranks, kind) in the order measured: size by size, cpu, tpu, gpu."""
    runs = []
    for ranks in sizes:
        if backends is None:
            kinds = ["cpu"] if ranks <= CPU_LIMIT else ["tpu", "gpu"]
        else:
            kinds = [kind for kind in KINDS if kind in backends]
        for kind in kinds:
            if _backend(kind, ranks) is None:
                print(f"skipped: {kind} at {ranks:,} ranks (no such mesh on that backend)",
                      file=sys.stderr)
            else:
                runs.append((ranks, kind))
    return runs


def _child(args: argparse.Namespace) -> None:
    """Extract one size on one backend and print its measurements as one JSON line."""
    from flint.compile.backend import parse_backend
    from flint.devices import load_device
    from flint.mesh import parse_mesh
    from flint.pipeline import ExtractRequest, extract

    ranks, kind = args.child, args.kind
    backend = parse_backend(*_backend(kind, ranks))
    request = ExtractRequest(
        model=MODEL,
        mesh=parse_mesh(f"data={ranks // TENSOR},tensor={TENSOR}"),
        output=Path(args.dir) / "trace",
        device=load_device("h100"),
        backend=backend,
        stage=backend.default_stage,
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
        "kind": kind,
        "backend": str(backend) + (f" x{backend.slices}" if backend.topology else ""),
        "stage": request.stage,
        "nodes": result.totals[0][1].nodes,
        "seconds": result.seconds,
        "extract": time.perf_counter() - started,
        "bytes": result.bytes_written,
        "files": len(result.files),
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


def _measure(ranks: int, kind: str, directory: Path, profile: bool) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"scale-{kind}-{ranks}-", dir=directory))
    try:
        os.sync()  # start from a clean page cache: the previous run's writes are on disk
        command = [sys.executable, __file__, "--child", str(ranks), "--kind", kind,
                   "--dir", str(work)]
        started = time.perf_counter()
        done = subprocess.run(command + (["--profile"] if profile else []), capture_output=True,
                              text=True)
        wall = time.perf_counter() - started
        if done.returncode:
            raise SystemExit(f"{kind} at {ranks} ranks failed:\n{done.stderr[-4000:]}")
        if profile:
            print(f"--- profile, {kind}, {ranks} ranks ---\n{done.stderr[-12000:]}",
                  file=sys.stderr)
        report = json.loads(done.stdout.strip().splitlines()[-1])
        report["wall"] = wall
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report


def _row(r: dict) -> str:
    s = r["seconds"]
    rate = r["ranks"] / s["emit"]
    cells = [f"{r['ranks']:>7,}", f"{r['backend']:<22}", f"{r['nodes']:>5}"]
    cells += [f"{s.get(name, 0.0):>7.2f}" for name in STAGES]
    cells += [f"{r['wall']:>7.1f}", f"{r['rss_gib']:>5.2f}", f"{r['bytes'] / 1e9:>7.2f}"]
    cells += [f"{r['bytes'] / r['ranks'] / 1e3:>6.0f}"]
    cells += [f"{rate:>7,.0f}", f"{r['bytes'] / s['emit'] / 1e6:>5.0f}"]
    return " ".join(cells)


def _verdicts(r: dict, disk_rates: dict[str, float]) -> list[str]:
    out = []
    ranks, kind, wall = r["ranks"], r["kind"], r["wall"]
    name = f"{kind} {ranks:,} ranks"
    if (kind, ranks) in TARGETS:
        target = TARGETS[kind, ranks]
        verdict = "met" if wall <= target else (
            f"MISSED by {wall - target:.1f} s ({wall / target:.2f}x)"
        )
        out.append(f"{name} end to end {wall:.1f} s, target <= {target:.0f} s: {verdict}")
    if ranks in RSS_TARGET_GIB:
        target = RSS_TARGET_GIB[ranks]
        verdict = "met" if r["rss_gib"] <= target else f"MISSED ({r['rss_gib'] / target:.2f}x)"
        out.append(f"{name} peak RSS {r['rss_gib']:.2f} GiB, target <= {target} GiB: {verdict}")
    rate = ranks / r["seconds"]["emit"]
    if ranks >= 4096:
        verdict = "met" if rate >= FILES_PER_SECOND_TARGET else (
            f"MISSED ({rate / FILES_PER_SECOND_TARGET:.2f}x; plain writes of "
            f"{FILE_BYTES[kind] // 1000} KB: {disk_rates[kind]:,.0f}/s)"
        )
        out.append(f"{name} emission {rate:,.0f} files/s, "
                   f"target >= {FILES_PER_SECOND_TARGET:,}: {verdict}")
    per_file = r["bytes"] / ranks
    if abs(per_file - FILE_BYTES[kind]) > 0.25 * FILE_BYTES[kind]:
        out.append(f"{name}: rank files average {per_file / 1e3:.0f} KB, but the plain-write "
                   f"comparison used {FILE_BYTES[kind] // 1000} KB (update FILE_BYTES)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--backends", help="some of cpu,tpu,gpu (default: cpu up to 2,048 ranks, "
                                           "tpu and gpu beyond)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where traces are written")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--kind", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    backends = None
    if args.backends:
        backends = [name.strip() for name in args.backends.split(",") if name.strip()]
        unknown = sorted(set(backends) - set(KINDS))
        if unknown:
            parser.error(f"unknown backend(s) {', '.join(unknown)}: use some of {','.join(KINDS)}")
    runs = _runs([int(size) for size in args.sizes.split(",")], backends)
    header = [f"{'ranks':>7}", f"{'backend':<22}", f"{'nodes':>5}"]
    header += [f"{name:>7}" for name in STAGES]
    header += [f"{'wall s':>7}", f"{'RSS':>5}", f"{'GB':>7}", f"{'KB/rk':>6}", f"{'files/s':>7}",
               f"{'MB/s':>5}"]
    os.sync()
    sizes = sorted({FILE_BYTES[kind] for _, kind in runs})
    by_size = {size: _disk_ceiling(Path(args.dir), 4096, size) for size in sizes}
    disk_rates = {kind: by_size[FILE_BYTES[kind]] for kind in KINDS if FILE_BYTES[kind] in by_size}
    print(" ".join(header))
    verdicts = []
    for ranks, kind in runs:
        report = _measure(ranks, kind, Path(args.dir), args.profile)
        print(_row(report), flush=True)
        verdicts += _verdicts(report, disk_rates)
    print("\nstage columns: seconds (partition: the whole compile at stage optimized, gpu); wall:")
    print("the whole process; RSS: peak GiB; GB written; KB/rk: per rank file; files/s and MB/s:")
    print("emission.")
    print(f"Plain writes of 4,096 files into {args.dir}, the disk's ceiling:")
    for size, rate in by_size.items():
        kinds = ", ".join(kind for kind in KINDS if FILE_BYTES[kind] == size and kind in disk_rates)
        print(f"  {size // 1000} KB ({kinds}): {rate:,.0f} files/s ({rate * size / 1e6:,.0f} MB/s)")
    print()
    print("\n".join(verdicts))


if __name__ == "__main__":
    main()

"""`flint check` on a large trace: rank files per second, beside plain reading of the same files.

    python bench/check.py [--ranks 131072] [--dir DIR] [--keep]

Extracts `bench/gpt_at_scale.py` (8-way tensor parallelism, v5p topology: needs flint-traces[tpu])
into DIR/check-RANKS, or reuses the trace already there. Then, in one run: reads every rank file
(`open().read()`, one after another: what the disk gives), runs `flint check` on the trace in a
fresh process (the command as a user runs it, start-up included), and reads every file again, so
that the check sits between two measurements of the disk. Each pass starts with none of the files
in the page cache (Linux: the trace's pages are dropped, nobody else's), unless `--warm`. The trace
is deleted at the end unless `--keep`. A 131,072-rank trace is about 24 GB, a 32,768-rank one 6 GB.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from scale import MODEL, TENSOR
from scale import TPU_TOPOLOGIES as TOPOLOGIES  # `--backend` and `--slices` per rank count
TARGET = 2000
"""Rank files per second."""


def _extract(ranks: int, trace: Path) -> None:
    if (trace / "manifest.json").exists():
        print(f"reusing {trace}")
        return
    backend, slices = TOPOLOGIES[ranks]
    command = [sys.executable, "-m", "flint", "extract", str(MODEL), "--mesh",
               f"data={ranks // TENSOR},tensor={TENSOR}", "--backend", backend,
               "--slices", str(slices), "-o", str(trace), "--force"]
    print(f"extracting {ranks:,} ranks into {trace} ...", flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def _drop_cached(files: list[Path]) -> None:
    """Evict the files' pages from the page cache, so that the next pass reads the disk."""
    os.sync()
    for path in files:
        handle = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(handle, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(handle)


def _timed(files: list[Path], run: Callable[[], None], cold: bool) -> float:
    """Files per second of `run()`, started with none of `files` in the page cache if `cold`."""
    if cold:
        _drop_cached(files)
    started = time.perf_counter()
    run()
    return len(files) / (time.perf_counter() - started)


def _read_all(files: list[Path]) -> None:
    for path in files:
        with open(path, "rb") as handle:
            handle.read()


def _check(trace: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "flint", "check", str(trace)],
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"flint check failed (exit {done.returncode}):\n{done.stdout[-2000:]}"
                         f"{done.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=131072, choices=list(TOPOLOGIES))
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the trace is written")
    parser.add_argument("--keep", action="store_true", help="keep the trace for another run")
    parser.add_argument("--warm", action="store_true", help="leave the files in the page cache")
    args = parser.parse_args()
    trace = Path(args.dir) / f"check-{args.ranks}"
    _extract(args.ranks, trace)
    files = sorted(trace.glob("*.et"))
    size = sum(path.stat().st_size for path in files)
    try:
        before = _timed(files, lambda: _read_all(files), not args.warm)
        check = _timed(files, lambda: _check(trace), not args.warm)
        after = _timed(files, lambda: _read_all(files), not args.warm)
    finally:
        if not args.keep:
            shutil.rmtree(trace)
    cache = "in the page cache" if args.warm else "none in the page cache"
    print(f"{len(files):,} rank files, {size / 1e9:.2f} GB in {trace}, {cache} at each pass")
    print(f"plain reading   {before:>8,.0f} files/s ({before * size / len(files) / 1e6:,.0f} MB/s)")
    print(f"flint check     {check:>8,.0f} files/s, start-up included")
    print(f"plain reading   {after:>8,.0f} files/s, again")
    disk = (before + after) / 2
    verdict = "met" if check >= TARGET else f"MISSED ({check / TARGET:.2f}x)"
    print(f"check at {check / disk:.2f}x plain reading; target >= {TARGET:,} files/s: {verdict}")


if __name__ == "__main__":
    main()

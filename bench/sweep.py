"""The sweep's own cost: its wall time against the sum of its points' extraction times, and points
per minute with one job and with two.

    python bench/sweep.py [--dir DIR]

The points: examples/mlp.py on the CPU backend over every data x tensor factorization of 8 ranks,
at two batch sizes (8 points, each a few seconds). In one run:

1. each point extracted alone, one after another, with `flint extract` (the sum S of their times:
   what a shell loop over the points costs), after one untimed extraction that warms the caches;
2. `flint sweep --jobs 1` over the same points (wall W1): overhead W1 / S - 1, target <= 10%; it
   includes the sweep's schedule estimate of every point, its records and its table;
3. `flint sweep --jobs 2` into a fresh directory (wall W2): points per minute at each job count.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = """\
model = "{model}"
backend = "cpu"
[mesh]
ranks = 8
axes = ["data", "tensor"]
[grid]
model_args = {{ batch = [64, 128] }}
"""


def flint(*args: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "flint", *args], check=True, capture_output=True, text=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, help="work directory [default: a temporary one]")
    args = parser.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="flint-bench-sweep-"))
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "sweep.toml"
    spec.write_text(SPEC.format(model=ROOT / "examples" / "mlp.py"))

    from flint.exploration.point import extract_command
    from flint.exploration.spec import read_spec

    expanded = read_spec(spec)
    (work / "alone").mkdir(exist_ok=True)
    # one untimed extraction first, so that no side pays for a cold page cache
    subprocess.run(extract_command(expanded.model, expanded.points[0], work / "warm"), check=True,
                   capture_output=True)
    alone = 0.0
    for point in expanded.points:
        command = extract_command(expanded.model, point, work / "alone" / point.key)
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        alone += time.perf_counter() - started
    walls = {jobs: flint("sweep", str(spec), "-o", str(work / f"jobs{jobs}"), "--jobs", str(jobs), "--json")
             for jobs in (1, 2)}
    records = [json.loads(line) for line in (work / "jobs1" / "results.jsonl").read_text().splitlines()]
    n = len(expanded.points)
    assert len(records) == n and all(r["status"] == "ok" for r in records), records
    print(f"{n} points (examples/mlp.py, CPU backend, 8 ranks)")
    print(f"  extracted alone, one by one     {alone:7.1f} s")
    print(f"  flint sweep --jobs 1            {walls[1]:7.1f} s   overhead {walls[1] / alone - 1:+.1%} (target <= 10%)")
    print(f"  flint sweep --jobs 2            {walls[2]:7.1f} s")
    per_minute = {jobs: n / wall * 60 for jobs, wall in walls.items()}
    print(f"  points per minute: {per_minute[1]:.1f} with --jobs 1, {per_minute[2]:.1f} with --jobs 2 "
          f"({per_minute[2] / per_minute[1]:.2f}x)")


if __name__ == "__main__":
    main()

"""Run one point of a sweep: extract it, schedule it, simulate it where ASTRA-sim is, summarise.

The extraction is a `flint extract` command in its own process: JAX fixes its devices once per
process, so a process per extraction is what lets one sweep visit many meshes (on whichever machine
runs the point: a Ray worker runs this same function). Simulation needs no JAX and runs here. The point's result is one flat record (a CSV row), whatever happened:
`ok`, `skipped` (extract refused the configuration as bad input, e.g. a size that does not divide,
with its one-line reason) or `failed` (anything else, with its one-line error: the model's own code
raising among them, which a fixed model may get past, so `--retry-failed` runs it again).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from flint.errors import FlintError
from flint.exploration.spec import Point, ranks
from flint.simulation import SimulateRequest, simulate
from flint.trace.reader import ALL_RANK_FILES, ONE_PER_CLASS

INTERRUPTED = {130, 143, -2, -15}
"""Exit statuses of a `flint` command stopped by SIGINT or SIGTERM (as a shell or Python reports them)."""
BAD_INPUT = 2
MODEL_CODE = re.compile(r"\braised [\w.]+ at |\bcalled sys\.exit\(|\bis not valid Python\b|"
                        r"\btracing the step failed\b|\bcannot export the step\b|\btorch-mlir cannot lower\b")
"""What extract says (exit status 2) where the model file's own code went wrong: it raised on import,
in workload(mesh) or logical_rules(mesh) (`raised RuntimeError at model.py:3: ...`), while its step
was traced, or as PyTorch exported it; not a configuration extract refuses."""


class PointInterrupted(Exception):
    """A point's command was stopped by a signal: the sweep is being interrupted, record nothing."""


class Processes:
    """The commands running now, so that an interrupted sweep can stop them all at once."""

    def __init__(self) -> None:
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self.stopping = False

    def run(self, command: list[str]) -> subprocess.CompletedProcess:
        with self._lock:
            if self.stopping:
                raise PointInterrupted()
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self._running.add(process)
        try:
            stdout, stderr = process.communicate()
        finally:
            with self._lock:
                self._running.discard(process)
        if self.stopping or process.returncode in INTERRUPTED:
            raise PointInterrupted()
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)

    def stop(self) -> None:
        with self._lock:
            self.stopping = True
            for process in self._running:
                process.terminate()


def extract_command(model: Path, point: Point, output: Path, rank_files: str = ALL_RANK_FILES) -> list[str]:
    """`flint extract` for `point`, writing its trace (`--rank-files rank_files`) to `output`."""
    command = [sys.executable, "-m", "flint", "extract", str(model), "--mesh", point.mesh, "-o", str(output),
               "--force", "--json", "--rank-files", rank_files]
    options = point.options
    for option in ("backend", "stage", "strategy", "device", "durations"):
        if option in options:
            command += [f"--{option}", point.file(option, "")]
    if "donate" in options:
        command += ["--donate" if options["donate"] else "--no-donate"]
    if stages := point.pipeline_stages:
        command += ["--pipeline-stages", str(stages)]
        for option in ("schedule", "microbatches", "virtual_stages"):
            if option in options:
                command += [f"--{option.replace('_', '-')}", str(options[option])]
    for name, value in point.model_args.items():
        command += ["--model-arg", f"{name}={value!r}" if isinstance(value, str) else f"{name}={value}"]
    return command


def run_point(model: Path, point: Point, workdir: Path, simulator: str | None = None,
              keep_traces: bool = False, processes: Processes | None = None, engine: str = "auto") -> dict[str, Any]:
    """Extract, schedule and simulate `point` in `workdir` (by `engine`, as `flint simulate
    --engine`); its record."""
    processes = processes or Processes()
    started = time.perf_counter()
    workdir.mkdir(parents=True, exist_ok=True)
    trace = workdir / "trace"
    record = base_record(point)
    # The estimator alone needs one file per rank class; a trace kept, or given to ASTRA-sim, has every rank's.
    rank_files = ONE_PER_CLASS if engine == "flint" and not keep_traces else ALL_RANK_FILES
    try:
        record |= _extract_and_simulate(model, point, trace, simulator, processes, engine, rank_files)
    except PointInterrupted:
        # nothing of the point is recorded, so nothing of it is kept: not even what an extraction
        # stopped before it could clean up left (an empty staging folder, say)
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    finally:
        if not keep_traces:
            shutil.rmtree(workdir, ignore_errors=True)
    record["seconds"] = round(time.perf_counter() - started, 3)
    return record


def _extract_and_simulate(model: Path, point: Point, trace: Path, simulator: str | None,
                          processes: Processes, engine: str = "auto", rank_files: str = ALL_RANK_FILES
                          ) -> dict[str, Any]:
    started = time.perf_counter()
    extracted = processes.run(extract_command(model, point, trace, rank_files))
    record: dict[str, Any] = {"extract_seconds": round(time.perf_counter() - started, 3)}
    if extracted.returncode != 0:
        reason = _one_line(extracted.stderr, extracted.returncode)
        refused = extracted.returncode == BAD_INPUT and not MODEL_CODE.search(reason)
        return record | {"status": "skipped" if refused else "failed", "reason": reason}
    record |= from_extraction(json.loads(extracted.stdout))
    request = SimulateRequest(trace, network=point.file("network", "hgx"), simulator=simulator,
                              engine=engine, collectives=str(point.options.get("collectives", "nccl")))
    try:
        simulated = simulate(request).as_json()
    except FlintError as exc:
        return record | {"status": "failed", "reason": f"simulate: {exc}"}
    return record | from_simulation(simulated) | {"status": "ok"}


COLUMNS = ("id", "status", "reason", "mesh", "ranks", "strategy", "pipeline_stages", "schedule", "microbatches",
           "virtual_stages", "backend", "device", "network", "collectives", "durations", "stage", "donate",
           "model_args", "model", "model_sha256", "step_us", "simulated_step_us",
           "estimated_step_us", "compute_us", "exposed_communication_us", "idle_us", "memory_per_rank_bytes",
           "device_memory_bytes", "fits", "flops_per_rank", "communication_bytes_per_rank", "extract_seconds",
           "seconds")
"""A record's fields, in the order of results.csv."""


def base_record(point: Point) -> dict[str, Any]:
    options = point.options
    record = dict.fromkeys(COLUMNS)
    record.update({
        "id": point.key, "mesh": point.mesh, "ranks": ranks(point), "pipeline_stages": point.pipeline_stages,
        "model_args": dict(point.model_args), "network": options.get("network", "hgx"),
        "collectives": options.get("collectives", "nccl"),
        "model": point.files.get("model"), "model_sha256": point.digests.get("model"),
        **{k: options.get(k) for k in ("strategy", "backend", "device", "durations", "stage", "donate")},
        **({k: options.get(k) for k in ("schedule", "microbatches", "virtual_stages")}
           if point.pipeline_stages else {}),
    })
    return record


def from_extraction(summary: dict) -> dict[str, Any]:
    per_rank, memory = summary["per_rank"], summary.get("memory_per_rank") or {}
    peak, device = memory.get("peak"), memory.get("device")
    return {
        "flops_per_rank": per_rank["flops"],
        "communication_bytes_per_rank": sum(c["bytes"] for c in per_rank.get("collectives", {}).values()),
        "memory_per_rank_bytes": peak,
        "device_memory_bytes": device,
        "fits": None if peak is None or not device else peak <= device,
    }


def simulate_finalist(point: Point, trace: Path, simulator: str) -> dict[str, Any]:
    """ASTRA-sim's step for a point the estimator ranked among the best (its trace kept), as the
    fields it adds to the point's record."""
    request = SimulateRequest(trace, network=point.file("network", "hgx"), simulator=simulator,
                              engine="astra-sim", estimate=False, output=trace.parent / "astra-sim")
    try:
        result = simulate(request).as_json()
    except FlintError as exc:
        return {"finalist_reason": f"simulate: {exc}"[:300]}
    return {"simulated_step_us": result["step_us"]}


def from_simulation(result: dict) -> dict[str, Any]:
    slowest = next((r for r in result["per_rank"] if r["rank"] == result["slowest_rank"]), {})
    simulated = result["step_us"] if result.get("engine") == "astra-sim" else None
    estimated = result["timeline_estimate_us"]
    return {
        "simulated_step_us": simulated,
        "estimated_step_us": estimated,
        "step_us": simulated if simulated is not None else estimated,
        "compute_us": slowest.get("compute_us"),
        "exposed_communication_us": slowest.get("exposed_communication_us"),
        "idle_us": slowest.get("idle_us"),
    }


def _one_line(stderr: str, returncode: int) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    line = lines[-1] if lines else f"exit {returncode}"
    return line.removeprefix("error: ")[:300]

"""Run a sweep's points, on this machine (`jobs` at a time) or as Ray tasks, recording each as it
finishes. A rerun skips every point already recorded (failed ones too, unless `retry_failed`), so
an interrupted sweep resumes where it stopped. A sweep refused or stopped leaves no directory it
made empty behind (nor an empty `points/` or point folder)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flint.emit.writer import make_directories, remove_empty
from flint.errors import FlintError

from flint.exploration.point import PointInterrupted, Processes, base_record, run_point, simulate_finalist
from flint.exploration.rank import ranked
from flint.exploration.results import ResultStore
from flint.exploration.spec import Point, SweepSpec, read_spec
from flint.simulation.run import ENVIRONMENT, find_simulator

POINTS = "points"
"""The sweep directory's folder of per-point work (traces, simulator files), kept with keep_traces."""


@dataclass(frozen=True)
class SweepRequest:
    """`ray`: None runs on this machine; an address (or "auto", or "" for a new local instance)
    runs the points as Ray tasks."""

    spec: Path
    output: Path
    jobs: int = 1
    ray: str | None = None
    retry_failed: bool = False
    keep_traces: bool = False
    simulator: str | None = None
    finalists: int | None = None
    """Rank every point by Flint's estimator and run ASTRA-sim on the best this many only."""


@dataclass(frozen=True)
class SweepOutcome:
    spec: SweepSpec
    records: list[dict[str, Any]]
    """Every point's latest record, in grid order."""
    ran: int
    """Points run by this sweep."""
    reused: int
    """Points whose record an earlier run of the sweep left."""
    duplicates: int = 0
    """Points skipped as the same as another (recorded, never run)."""


def run_sweep(request: SweepRequest, on_progress: Callable[[int, int], None] = lambda done, total: None
              ) -> SweepOutcome:
    spec = read_spec(request.spec)
    simulator = find_simulator(request.simulator)
    if request.finalists and simulator is None:
        raise FlintError(f"--finalists {request.finalists} simulates the best points with ASTRA-sim, and none "
                         f"was found: give --astra-sim PATH or set ${ENVIRONMENT}, or drop --finalists")
    simulator = str(simulator) if simulator else None
    if request.ray is not None:
        _import_ray()
    made = _make_directory(request.output)
    try:
        return _run(request, spec, simulator, on_progress)
    finally:
        points = request.output.resolve() / POINTS
        remove_empty([*(points.iterdir() if points.is_dir() else ()), points, *made])


def _run(request: SweepRequest, spec: SweepSpec, simulator: str | None,
         on_progress: Callable[[int, int], None]) -> SweepOutcome:
    store = ResultStore(request.output)
    done = store.done(request.retry_failed)
    reused = sum(p.key in done and p.key not in spec.skipped for p in spec.points)
    for point in spec.points:
        if point.key in spec.skipped and point.key not in done:
            store.add(base_record(point) | {"status": "skipped", "reason": spec.skipped[point.key]})
            done.add(point.key)
    todo = [p for p in spec.points if p.key not in done]
    total, finished = len(spec.points), len(spec.points) - len(todo)
    on_progress(finished, total)

    def record(result: dict[str, Any]) -> None:
        nonlocal finished
        store.add(result)
        finished += 1
        on_progress(finished, total)

    run = _run_on_ray if request.ray is not None else _run_here
    run(request, spec, todo, simulator, record)
    if request.finalists:
        _simulate_finalists(request, spec, store, simulator)
    duplicates = sum(p.key in spec.skipped for p in spec.points)
    return SweepOutcome(spec, store.ordered(p.key for p in spec.points), len(todo), reused, duplicates)


def _make_directory(output: Path) -> list[Path]:
    """Make the sweep directory with its parents; those it made, innermost first."""
    try:
        return make_directories(output)
    except OSError as exc:
        raise FlintError(f"cannot create sweep directory {output}: {exc.strerror}") from None


def _import_ray():
    """Ray, or one line before anything is made."""
    try:
        import ray
    except ImportError:
        raise FlintError("--ray needs Ray: pip install 'flint-traces[ray]'") from None
    return ray


def _engine(request: SweepRequest) -> str:
    """Flint's estimator times every point (the default everywhere), unless an ASTRA-sim named by
    --astra-sim is to simulate each one (not only the finalists)."""
    return "auto" if request.simulator and not request.finalists else "flint"


def _keep(request: SweepRequest) -> bool:
    """Keep each point's trace: asked to, or until the finalists are simulated."""
    return request.keep_traces or bool(request.finalists)


def _simulate_finalists(request: SweepRequest, spec: SweepSpec, store: ResultStore, simulator: str) -> None:
    """ASTRA-sim on the `finalists` best points by the estimator (whose traces this run kept; a
    point from an earlier run without its trace keeps its estimate only); then the traces go,
    unless kept."""
    by_key = {p.key: p for p in spec.points}
    records = store.ordered(p.key for p in spec.points)
    best = [r for r in ranked(records)][: request.finalists]
    try:
        for record in best:
            trace = _workdir(request, by_key[record["id"]]) / "trace"
            if record.get("simulated_step_us") is not None or not trace.is_dir():
                continue
            store.add(record | {"finalist": True} | simulate_finalist(by_key[record["id"]], trace, simulator))
    finally:
        if not request.keep_traces:
            for point in spec.points:
                shutil.rmtree(_workdir(request, point), ignore_errors=True)


def _workdir(request: SweepRequest, point: Point) -> Path:
    """Absolute: a Ray worker need not share this process's working directory."""
    return request.output.resolve() / POINTS / point.key


def _run_here(request, spec, todo, simulator, record) -> None:
    processes = Processes()
    with ThreadPoolExecutor(max_workers=request.jobs) as pool:
        points = {pool.submit(run_point, spec.model, p, _workdir(request, p), simulator, _keep(request),
                              processes, _engine(request)): p for p in todo}
        pending = set(points)
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    record(_outcome(future.result, points[future]))
        except BaseException:
            processes.stop()
            for future in pending:
                future.cancel()
            raise


def _outcome(result: Callable[[], dict[str, Any]], point: Point) -> dict[str, Any]:
    """A point's record; one whose run broke in Flint's own code is a failed point, and the sweep
    goes on."""
    try:
        return result()
    except PointInterrupted:
        raise
    except Exception as exc:  # noqa: BLE001 - recorded as the point's one-line error
        return base_record(point) | {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:300]}


def _run_on_ray(request, spec, todo, simulator, record) -> None:
    ray = _import_ray()
    ray.init(address=request.ray or None, include_dashboard=False, log_to_driver=False,
             ignore_reinit_error=True, configure_logging=False)
    remote = ray.remote(num_cpus=1)(run_point)
    points = {remote.remote(spec.model, p, _workdir(request, p), simulator, _keep(request), None,
                            _engine(request)): p for p in todo}
    pending = list(points)
    try:
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            for ref in finished:
                record(_outcome(lambda: ray.get(ref), points[ref]))
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    finally:
        ray.shutdown()

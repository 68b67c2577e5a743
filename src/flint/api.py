"""Flint from Python: `flint.extract`, `flint.simulation` and `flint.exploration`, for notebooks and scripts.

Each takes what its command takes, as keyword arguments named like the flags, and returns what its
`--json` prints. `extract` runs the compiler in a child process, as the command does, so one script
may extract many meshes; errors are `FlintError`s carrying the command's one-line message.

    import flint

    summary = flint.extract("examples/gpt.py", "data=2,tensor=4", "traces/gpt", backend="gpu:h100", force=True)
    result = flint.simulation("traces/gpt", network="hgx")
    records = flint.exploration("examples/sweep.toml", "sweeps/gpt64", jobs=2)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from flint.compile.backend import DEFAULT_BACKEND, parse_backend
from flint.devices import load_device
from flint.emit import check_dump_dir, check_name, prepare_output
from flint.errors import FlintError
from flint.exploration import SweepRequest, run_sweep
from flint.frontend import parse_model_arg
from flint.layout import LayoutRequest, merge, parse_rule, parse_shard, read_config
from flint.mesh import parse_mesh
from flint.pipeline import ExtractRequest, Report, extract_isolated
from flint.pipelining import PipelineRequest
from flint.simulation import SimulateRequest
from flint.simulation import simulate as run_simulation
from flint.trace.reader import ALL_RANK_FILES, RANK_FILE_CHOICES


def extract_request(model: str | Path, mesh: str, output: str | Path, *, backend: str = DEFAULT_BACKEND,
                    slices: int = 1, stage: str | None = None, device: str | None = None, durations: str | None = None,
                    name: str | None = None, strategy: str | None = None, rules: Iterable[str] = (),
                    shards: Iterable[str] = (), config: str | Path | None = None,
                    model_args: Mapping[str, Any] | Iterable[str] | None = None,
                    pipeline_stages: int | None = None, microbatches: int | None = None,
                    schedule: str | None = None, virtual_stages: int | None = None,
                    dump_ir: str | Path | None = None, loop_trips: int | None = None, strict: bool = False,
                    donate: bool = True, rank_files: str = ALL_RANK_FILES, force: bool = False,
                    command: str = "") -> ExtractRequest:
    """Check every option and build the request, before anything slow runs."""
    pipeline = pipeline_request(pipeline_stages, microbatches, schedule, virtual_stages)
    if rank_files not in RANK_FILE_CHOICES:
        raise FlintError(f"unknown rank_files {rank_files!r}: use one of {', '.join(RANK_FILE_CHOICES)}")
    parsed_backend = parse_backend(backend, slices)
    if isinstance(model_args, Mapping):
        arguments = tuple(model_args.items())
    else:
        arguments = tuple(parse_model_arg(arg) for arg in model_args or ())
    output = prepare_output(Path(output), force)
    return ExtractRequest(
        model=Path(model),
        mesh=parse_mesh(mesh),
        output=output,
        device=load_device(device or parsed_backend.roofline_device),
        name=check_name(name),
        stage=stage or parsed_backend.default_stage,
        dump_ir=check_dump_dir(Path(dump_ir) if dump_ir else None, output),
        strict=strict,
        loop_trips=loop_trips,
        backend=parsed_backend,
        durations=durations or parsed_backend.default_durations,
        layout=merge(
            read_config(Path(config)) if config else None,
            LayoutRequest(strategy=strategy, rules=tuple(map(parse_rule, rules)),
                          shards=tuple(map(parse_shard, shards))),
        ),
        pipeline=pipeline,
        model_args=arguments,
        command=command,
        donate=donate,
        rank_files=rank_files,
    )


def pipeline_request(stages, microbatches, schedule, virtual_stages) -> PipelineRequest | None:
    """The pipelining options as a request (None without stages), with their defaults."""
    if stages is None:
        given = [flag for flag, value in (("--microbatches", microbatches), ("--schedule", schedule),
                                          ("--virtual-stages", virtual_stages)) if value is not None]
        if given:
            raise FlintError(f"{given[0]} needs --pipeline-stages")
        return None
    schedule = schedule or "1f1b"
    default_virtual = 2 if schedule == "interleaved" else 1
    return PipelineRequest(stages, microbatches or stages, schedule, virtual_stages or default_virtual)


def extract_summary(request: ExtractRequest, result: Report, seconds: float) -> dict:
    """What `flint extract --json` prints."""
    summary = {
        "name": result.name,
        "ranks": request.mesh.size,
        "mesh": str(request.mesh),
        "output": str(request.output),
        "files": result.files,
        "rank_files": request.rank_files,
        "trace_bytes": result.bytes_written,
        "every_rank_trace_bytes": result.every_rank_bytes,
        "per_rank": result.totals[0][1].as_json(),
        "ranks_alike": len(result.totals) == 1,
        "memory_per_rank": result.memory,
        "seconds": round(seconds, 3),
    }
    return (
        summary
        | ({"pipeline": result.pipeline} if result.pipeline else {})
        | ({"compiler_fallback": result.compiler_fallback} if result.compiler_fallback else {})
    )


def extract(model: str | Path, mesh: str, output: str | Path,
            on_progress: Callable[[str, int, int], None] | None = None, **options) -> dict:
    """Extract traces of `model` on `mesh` into `output` (the options of `flint extract`, e.g.
    backend="gpu:h100", strategy="fsdp+tp", model_args={"layers": 8}, donate=False, force=True);
    returns the summary `flint extract --json` prints."""
    started = time.perf_counter()
    request = extract_request(model, mesh, output, **options)
    result = extract_isolated(request, on_progress or (lambda stage, done, total: None), lambda layout: None)
    return extract_summary(request, result, time.perf_counter() - started)


def simulate(directory: str | Path, **options) -> dict:
    """Simulate a trace with Flint's estimator or ASTRA-sim (the options of `flint simulate`:
    network, collectives, roofline, device, system, simulator, output, prefix, estimate, timeout,
    groups, engine); returns what `flint simulate --json` prints."""
    for path_option in ("system", "output", "groups"):
        if options.get(path_option) is not None:
            options[path_option] = Path(options[path_option])
    return run_simulation(SimulateRequest(directory=Path(directory), **options)).as_json()


def sweep(spec: str | Path, output: str | Path, **options) -> list[dict]:
    """Run a sweep (the options of `flint sweep`: jobs, ray, retry_failed, keep_traces, simulator);
    returns every point's record, in grid order, as `flint sweep --json` prints them."""
    return run_sweep(SweepRequest(spec=Path(spec), output=Path(output), **options)).records

"""The extraction pipeline, stage by stage, each stage's artifact kept for inspection.

    workload = load_workload(path, mesh)          # frontend
    workload, layout = apply_layout(workload, ..) # strategy, config and CLI shardings
    module   = partition(workload, mesh)          # XLA SPMD partitioning
    program  = parse_module(module)               # typed StableHLO ops
    graph    = build_graph(program, ranks)        # networkx workload graph
    step     = pipeline_step(graph, ...)          # with --pipeline-stages: stages and schedule
    write_trace(plan, ...)                        # Chakra .et per rank + groups + manifest

With `--pipeline-stages` the step is compiled for one microbatch of one chunk of layers on the mesh
without the stage axis; `flint.pipelining` says which units each stage runs, and `flint.emit` writes
each stage's copies of the piece's graph file by file.

`extract()` runs them in order and times each, which is what `bench/extract.py` uses; the CLI runs
it through `extract_isolated()`, in a child process that Ctrl-C stops at once.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from flint.compile.backend import CPU, Backend, make_virtual_mesh
from flint.compile.capture import PartitionedModule, partition
from flint.devices import Device
from flint.emit import (
    ChakraEmitter,
    GraphPlan,
    OutputDir,
    PipelinedPlan,
    Planned,
    RankTotals,
    TracePlan,
    TraceSize,
    check_emitted,
    disk_errors,
    merged_totals,
    trace_bytes,
    write_ranks,
)
from flint.errors import FlintError
from flint.frontend import Workload, load_workload
from flint.graph import WorkloadGraph, build_graph
from flint.ir.parse import Program, parse_module
from flint.isolation import Isolation, Send
from flint.layout import Layout, LayoutRequest, apply_layout
from flint.mesh import MeshSpec
from flint.pipelining import (
    PipelineRequest,
    Regions,
    one_microbatch,
    pipeline_step,
    stage_mesh,
)
from flint.trace.reader import ALL_RANK_FILES, ONE_PER_CLASS, RANK_FILES
from flint.version import __version__

Progress = Callable[[str, int, int], None]
"""Called as `progress(stage, done, total)` while a stage works through many items; once, before
the rank files are written, as `progress(TRACE_BYTES, one_per_class, every_rank)` with the bytes
that one file per rank class and every rank's file take (`TraceSize`)."""
TRACE_BYTES = "trace-bytes"


@dataclass(frozen=True)
class ExtractRequest:
    """Everything one extraction depends on; equal requests give byte-identical outputs."""

    model: Path
    mesh: MeshSpec
    output: Path
    device: Device
    name: str | None = None
    stage: str = "partitioned"
    dump_ir: Path | None = None
    strict: bool = False
    loop_trips: int | None = None
    layout: LayoutRequest = LayoutRequest()
    backend: Backend = CPU
    durations: str = "roofline"
    """`calibrated` (the device's kernel model, the default on GPU backends), `roofline` (its
    peaks), or `xla`: the GPU compiler's own estimate of each kernel."""
    pipeline: PipelineRequest | None = None
    model_args: tuple[tuple[str, Any], ...] = ()
    """Keyword arguments of the model file's `workload(mesh, ...)`, in the order given."""
    command: str = ""
    donate: bool = True
    """Donate the arguments the step replaces (or the model's `donate_argnums`), as a training
    step does; False (`--no-donate`): none. A pipelined step donates nothing either way."""
    rank_files: str = ALL_RANK_FILES
    """`all`: a file for every rank, the Chakra trace ASTRA-sim runs; `classes`: one for each rank
    class (ranks that run the same work), all that Flint's estimator needs, where every rank's
    would fill the disk."""


@dataclass
class Extraction:
    """The artifacts of every stage, and the seconds each stage took. `graph` is the step's graph
    (a pipelined step's piece), `plan` what its files hold; `totals` are counted as they are written."""

    workload: Workload
    layout: Layout
    module: PartitionedModule
    program: Program
    graph: WorkloadGraph
    plan: TracePlan
    totals: list[tuple[list[list[int]], RankTotals]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    bytes_written: int = 0
    trace_size: TraceSize | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    regions: Regions | None = None


def _versions() -> dict[str, str]:
    import jax
    import jaxlib

    return {"flint": __version__, "jax": jax.__version__, "jaxlib": jaxlib.__version__}


def manifest(request: ExtractRequest, extraction: Extraction, prefix: str) -> dict:
    return {
        "name": prefix,
        "model": extraction.workload.path.name,
        "model_args": dict(request.model_args),
        "mesh": {"shape": list(request.mesh.shape), "axis_names": list(request.mesh.axis_names)},
        "ranks": request.mesh.size,
        RANK_FILES: request.rank_files,
        "backend": str(request.backend),
        "slices": request.backend.slices,
        "stage": request.stage,
        "durations": request.durations,
        "layout": {
            "strategy": request.layout.strategy,
            "rules": {name: list(axes) for name, axes in sorted(extraction.layout.rules.items())},
            "inputs": {
                item.path: [list(axes) for axes in item.spec] for item in extraction.layout.inputs
            },
        },
        "device": request.device.as_json(),
        "versions": _versions(),
        "files": {
            "traces": f"{prefix}.{{rank}}.et",
            "comm_groups": f"{prefix}.comm_groups.json",
            "graph": f"{prefix}.graph.json",
        },
        "costliest_branches": extraction.graph.costliest_branches,
        "rank_totals": [
            {"ranks": rank_ranges, **totals.as_json()} for rank_ranges, totals in extraction.totals
        ],
        "memory_per_rank": memory_json(request, extraction.module),
        "donated_arguments": donated_names(extraction.workload, extraction.module),
        "compiler_fallback": extraction.module.compiler_fallback,
        "command": request.command,
    } | ({"pipeline": pipeline_summary(request.pipeline, extraction.regions)} if request.pipeline else {})


def pipeline_summary(pipeline: PipelineRequest, regions: Regions) -> dict:
    """The schedule asked for and what the compiled piece gave it, for the manifest and summary."""
    return {
        "stages": pipeline.stages,
        "microbatches": pipeline.microbatches,
        "schedule": pipeline.schedule,
        "virtual_stages": pipeline.virtual_stages,
        "layers_per_chunk": regions.chunk_layers,
        "activation_bytes": regions.activation_bytes,
        "gradient_bytes": regions.gradient_bytes,
    }


def _graph_json(plan: TracePlan) -> str:
    """Rank 0's workload graph, the nodes of its file: a collective names its group by id, as its
    `pg_name` does (the groups themselves, every rank of the mesh, are in the communicator-group
    file)."""
    graph = nx.DiGraph()
    for planned in plan.planned(int(plan.classes.of_rank[0])):
        graph.add_node(planned.id, **_graph_node(planned, plan))
        graph.add_edges_from((dep, planned.id) for dep in planned.deps)
        graph.add_edges_from((dep, planned.id, {"ctrl": True}) for dep in planned.ctrl)
    data = nx.node_link_data(graph, edges="edges")
    return json.dumps(data, sort_keys=True, default=list) + "\n"


def _graph_node(planned: Planned, plan: TracePlan) -> dict:
    node = {key: value for key, value in planned.data.items() if key != "groups"} | {"name": planned.name}
    if planned.partition >= 0:
        node["pg_name"] = str(plan.groups.ids_of_rank[0, planned.partition])
    return node


def donated_names(workload: Workload, module: PartitionedModule) -> list[str]:
    """The step arguments the compile donated, by name."""
    from flint.layout.inputs import argument_names

    names = argument_names(workload.step, len(workload.args))
    return [names[i] for i in module.donated]


def memory_json(request: ExtractRequest, module: PartitionedModule) -> dict | None:
    """Device memory per rank as the compiled executable needs it, beside the device's own where the
    backend knows it (GPUs), so a layout that does not fit says so. A pipelined step has none: what
    was compiled is one microbatch of one chunk of layers, not what a rank holds."""
    if module.memory is None or request.pipeline:
        return None
    return module.memory.as_json() | {"device": request.backend.device_memory}


def write_trace(
    request: ExtractRequest, extraction: Extraction, progress: Progress | None, out: OutputDir
) -> dict[str, float]:
    """Write every file into the staging directory `out` (its owner moves it into place when all
    succeeded); the seconds spent writing (`emit`) and checking the result against the contract
    (`check`)."""
    started = time.perf_counter()
    prefix = request.name or extraction.workload.name
    plan = extraction.plan
    emitter = ChakraEmitter(
        plan,
        request.device,
        metadata={"producer": f"flint {__version__}", "mesh": str(request.mesh)},
        durations=request.durations,
        estimates=_xla_estimates(request, extraction),
    )
    one_per_class = request.rank_files == ONE_PER_CLASS
    files = len(plan.classes.roles) if one_per_class else request.mesh.size
    kept: dict = {}
    size = extraction.trace_size = trace_bytes(emitter, kept, one_per_class)
    extraction.totals = merged_totals(plan.classes, [emitter.totals[c] for c in range(len(plan.classes.roles))])
    needed = size.one_per_class if one_per_class else size.every_rank
    free = shutil.disk_usage(out.staging).free
    if needed > free:
        smaller = "" if one_per_class else (
            f", write one file per rank class ({size.one_per_class / 1e6:,.1f} MB) with --rank-files classes")
        raise FlintError(
            f"the {files:,} rank traces need {needed / 1e6:,.1f} MB and {request.output.parent} has "
            f"{free / 1e6:,.1f} MB free: free space, choose another -o{smaller}, or extract a smaller mesh"
        )
    if progress:
        progress(TRACE_BYTES, size.one_per_class, size.every_rank)
    out.write_text(f"{prefix}.comm_groups.json", json.dumps(plan.groups.as_json()) + "\n")
    extraction.bytes_written = write_ranks(
        emitter,
        out.staging,
        prefix,
        (lambda done: progress("emit", done, files)) if progress else None,
        kept=kept,
        one_per_class=one_per_class,
    )
    out.write_text(f"{prefix}.graph.json", _graph_json(plan))
    out.write_text(
        "manifest.json", json.dumps(manifest(request, extraction, prefix), indent=2) + "\n"
    )
    written = time.perf_counter()
    violations = check_emitted(out.staging, prefix, emitter, one_per_class)
    if violations:
        raise AssertionError(
            "the trace breaks the Chakra contract (a bug in Flint):\n"
            + "\n".join(str(v) for v in violations[:20])
        )
    extraction.files = sorted(os.listdir(out.staging))
    return {"emit": written - started, "check": time.perf_counter() - written}


def _xla_estimates(request: ExtractRequest, extraction: Extraction):
    """XLA's own time for every kernel, under `--durations xla`: all of them or a one-line error,
    never a trace that quietly times some kernels by another model."""
    if request.durations != "xla":
        return None
    estimates = extraction.module.estimates
    graph = extraction.graph.graph
    missing = [n for n, data in graph.nodes(data=True)
               if data["kind"] != "collective" and data.get("instruction") not in estimates]
    if missing:
        raise FlintError(
            f"--durations xla: XLA's scheduler gave no estimate for {len(missing)} of this step's "
            f"{len(graph)} nodes (the first: {graph.nodes[missing[0]]['name']!r}): use --durations calibrated"
        )
    return estimates


def extract(
    request: ExtractRequest,
    progress: Progress | None = None,
    on_layout: Callable[[Layout], None] | None = None,
    out: OutputDir | None = None,
) -> Extraction:
    """Run every stage for `request` and write its trace directory; `on_layout` sees the layout
    before compilation starts (what `--explain` prints).

    The files go into `out`, which the caller then commits or discards (`extract_isolated` does,
    in the parent process), or else into an `OutputDir` that replaces the output when all succeeded.
    """
    if out is not None:
        return _stages(request, out, progress, on_layout)
    with OutputDir(request.output) as fresh:
        return _stages(request, fresh, progress, on_layout)


def _stages(
    request: ExtractRequest,
    out: OutputDir,
    progress: Progress | None,
    on_layout: Callable[[Layout], None] | None,
) -> Extraction:
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[stage] = now - clock
        clock = now

    if request.stage != "partitioned" and request.backend.topology is not None:
        raise FlintError(
            f"--stage {request.stage} reads the CPU or GPU compiler's module: trace --backend "
            f"{request.backend} at --stage partitioned"
        )
    if request.durations == "xla" and (request.backend.gpu is None or request.stage != "optimized"):
        raise FlintError(
            "--durations xla takes the GPU compiler's own estimates: use it with --backend gpu:<gpu> "
            "at --stage optimized"
        )
    compiled_mesh = request.mesh
    if request.pipeline:
        if request.backend.topology is not None:
            raise FlintError(
                "--pipeline-stages reads the CPU or GPU compiler's module: use --backend cpu or "
                "gpu:<gpu>"
            )
        if request.durations == "xla":
            raise FlintError(
                "--durations xla times the kernels XLA compiled, and a pipelined step adds one it did "
                "not (the sum of each weight gradient over microbatches): use --durations calibrated"
            )
        compiled_mesh = stage_mesh(request.mesh, request.pipeline.stage_axis(request.mesh))
    mesh = make_virtual_mesh(compiled_mesh, request.backend)
    workload, layout = apply_layout(load_workload(request.model, mesh, dict(request.model_args)), mesh, request.layout)
    if on_layout:
        on_layout(layout)
    chunk_layers = None
    if request.pipeline:
        workload, chunk_layers = one_microbatch(workload, layout, request.pipeline, mesh)
    lap("load")
    module = partition(workload, mesh, request.stage, donate=request.donate and not request.pipeline,
                       one_trip_loops=request.pipeline is not None and chunk_layers == 1)
    seconds["lower"] = module.lower_seconds
    seconds["partition"] = module.compile_seconds
    clock = time.perf_counter()
    if request.dump_ir:
        request.dump_ir.mkdir(parents=True, exist_ok=True)
        (request.dump_ir / f"{request.name or workload.name}.{request.stage}.mlir").write_text(
            module.text()
        )
    program = parse_module(module)
    lap("parse")
    graph = build_graph(program, compiled_mesh.size, request.loop_trips, compiled_mesh)
    if graph.unknown_ops and request.strict:
        raise FlintError(
            f"no cost rule for {', '.join(graph.unknown_ops)} (--strict): drop --strict to emit "
            "them with bytes only"
        )
    regions, plan = None, GraphPlan(graph)
    if request.pipeline:
        step = pipeline_step(graph, program, layout, request.pipeline, request.mesh, chunk_layers)
        regions, plan = step.regions, PipelinedPlan(step)
    extraction = Extraction(
        workload=workload,
        layout=layout,
        module=module,
        program=program,
        graph=graph,
        plan=plan,
        regions=regions,
    )
    lap("graph")
    with disk_errors(request.output):
        seconds.update(write_trace(request, extraction, progress, out))
    extraction.seconds = seconds
    return extraction


@dataclass(frozen=True)
class Report:
    """What the command line prints of an extraction: small and picklable, so that it comes back
    intact from the process that ran it."""

    name: str
    files: int
    totals: list[tuple[list[list[int]], RankTotals]]
    unknown_ops: tuple[str, ...]
    costliest_branches: int
    pipeline: dict | None
    memory: dict | None
    compiler_fallback: str | None = None
    bytes_written: int = 0
    every_rank_bytes: int = 0
    """What every rank's files take (about, where one per class was written: `TraceSize`)."""


def report(request: ExtractRequest, extraction: Extraction) -> Report:
    pipeline = request.pipeline
    return Report(
        name=request.name or extraction.workload.name,
        files=len(extraction.files),
        totals=extraction.totals,
        unknown_ops=tuple(extraction.graph.unknown_ops),
        costliest_branches=extraction.graph.costliest_branches,
        pipeline=pipeline_summary(pipeline, extraction.regions) if pipeline else None,
        memory=memory_json(request, extraction.module),
        compiler_fallback=extraction.module.compiler_fallback,
        bytes_written=extraction.bytes_written,
        every_rank_bytes=extraction.trace_size.every_rank,
    )


def extract_isolated(
    request: ExtractRequest,
    progress: Progress | None = None,
    on_layout: Callable[[Layout], None] | None = None,
) -> Report:
    """`extract()` in a child process that SIGINT or SIGTERM stops at once, with nothing left
    behind (`flint.isolation`): they raise `Interrupted` here, the output as it was.

    This process holds the output's lock and staging directory and commits it only once the child
    succeeded, so an interrupt can never cut a commit short. What the child reports (progress,
    the layout) reaches the callbacks here.
    """

    def on_event(kind: str, *args) -> None:
        {"progress": progress, "layout": on_layout}[kind](*args)

    with Isolation() as isolation, OutputDir(request.output) as out:

        def work(send: Send) -> Report:
            relay_progress = (lambda *event: send("progress", *event)) if progress else None
            relay_layout = (lambda layout: send("layout", layout)) if on_layout else None
            return report(request, extract(request, relay_progress, relay_layout, out))

        return isolation.run(work, on_event)

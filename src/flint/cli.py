"""`flint` command line: wires the pipeline stages to flags, and nothing else."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import NoReturn

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from flint import __version__
from flint.analysis.dot import MAX_NODES
from flint.compile.capture import STAGES
from flint.devices import BUILTIN, load_device
from flint.emit.durations import DURATIONS
from flint.errors import FlintError
from flint.layout import STRATEGIES
from flint.mesh import parse_mesh
from flint.pipelining import SCHEDULES

stderr = Console(stderr=True, highlight=False, soft_wrap=True)  # long paths stay on one line
stdout = Console(highlight=False, soft_wrap=True)


def _usage_error(exc: click.UsageError) -> NoReturn:
    """A mistyped command line is bad input like any other: one line, exit 2."""
    command = exc.ctx.command_path if exc.ctx else "flint"
    stderr.print(f"[bold red]error:[/] {escape(exc.format_message())} (see {command} --help)")
    sys.exit(2)


class FlintGroup(click.Group):
    """Turns `FlintError` and usage errors into one line on stderr (exit 2), unless `--debug`
    asks for the traceback; `flint` alone still shows the help."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            _usage_error(exc)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            _usage_error(exc)
        except FlintError as exc:
            if ctx.params.get("debug"):
                raise
            stderr.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
            sys.exit(2)


@click.group(cls=FlintGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="flint")
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
def main(debug: bool) -> None:
    """Flint turns a JAX or PyTorch training or inference step into MLCommons Chakra traces.

    The step is partitioned by the XLA compiler for a virtual device mesh of any size, so FLOPs,
    bytes and collectives are exactly what the compiler produced. The traces feed ASTRA-sim.

    A model file is Python: for JAX it defines workload(mesh) (examples/mlp.py); for PyTorch it
    defines model(), an nn.Module, and example_inputs(), the batch (examples/torch_mlp.py; needs
    flint-traces[torch]).

    \b
    Quick start:
      flint extract examples/mlp.py --mesh 8x8 -o mlp-traces
      flint inspect mlp-traces

    \b
    Exit codes:
      0    success
      1    a check found problems (flint check, flint validate)
      2    bad input or usage: one line on stderr says what was wrong and what to do
      130  interrupted (Ctrl-C): nothing is left behind
    """


def _progress(quiet: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
        disable=quiet or not stderr.is_terminal,
    )


def _warn_unmatched(layout) -> None:
    for warning in layout.warnings:
        stderr.print(f"[yellow]warning:[/] {warning}")


def _explain(layout) -> None:
    """The final sharding of every input and the logical rules, as the step will be compiled."""
    _warn_unmatched(layout)
    rows = [
        (
            item.path,
            str(list(item.shape)),
            item.dtype,
            "(" + ", ".join("+".join(axes) if axes else "None" for axes in item.spec) + ")",
            item.origin,
        )
        for item in layout.inputs
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)] if rows else [0] * 4
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4], err=True)
    if layout.rules:
        rules = ", ".join(
            f"{name}={'+'.join(axes) or 'None'}" for name, axes in sorted(layout.rules.items())
        )
        stderr.print(f"logical rules: {rules}")


def _format_summary(summary: dict) -> None:
    totals = summary["per_rank"]
    stdout.print(
        f"[bold]{summary['name']}[/]: {summary['ranks']} ranks on mesh {summary['mesh']}, "
        f"{totals['nodes']} nodes per rank"
    )
    stdout.print(f"  FLOPs per rank        {totals['flops']:,}")
    stdout.print(f"  bytes per rank        {totals['bytes']:,}")
    if not summary["ranks_alike"]:
        stdout.print("  (rank 0 shown; ranks differ in point-to-point traffic: see manifest.json)")
    for kind, coll in totals["collectives"].items():
        stdout.print(f"  {kind:<21} {coll['count']} per rank, {coll['bytes']:,} bytes")
    if not totals["collectives"]:
        stdout.print("  no collectives")
    if summary["memory_per_rank"]:
        memory = summary["memory_per_rank"]
        stdout.print(
            f"  memory per rank       {memory['peak']:,} bytes (arguments {memory['arguments']:,}, "
            f"temporaries {memory['temporaries']:,})"
        )
    if "pipeline" in summary:
        p = summary["pipeline"]
        stdout.print(
            f"  pipeline              {p['stages']} stages x {p['microbatches']} microbatches "
            f"({p['schedule']}), {p['activation_bytes']:,} bytes per activation"
        )
    stdout.print(f"wrote {summary['output']} ({summary['files']} files) in {summary['seconds']:.1f} s")


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--mesh", "mesh_spec", required=True, metavar="MESH",
              help="Virtual device mesh: 8x8, 2x4x8 (axes data,...,tensor) or data=16,tensor=8.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("traces"),
              show_default=True, help="Directory to write the trace into (must be empty or new).")
@click.option("--name", help="File name prefix of the trace files [default: the model file's stem].")
@click.option("--device", "device_spec", default="h100", show_default=True, metavar="DEVICE",
              help=f"Roofline for duration_micros: {', '.join(BUILTIN)}, or a JSON spec file.")
@click.option("--stage", type=click.Choice(STAGES),
              help="Module to trace: right after SPMD partitioning, or fully optimised (the GPU "
                   "compiler's kernels) [default: optimized on gpu backends, else partitioned].")
@click.option("--durations", type=click.Choice(DURATIONS), default="roofline", show_default=True,
              help="Kernel times for duration_micros: the --device roofline, or xla: the GPU "
                   "compiler's own estimates (its latency-hiding scheduler), with --backend gpu.")
@click.option("--backend", "backend_spec", default="cpu", show_default=True, metavar="BACKEND",
              help="Virtual devices: cpu (up to 2,048), gpu:h100|h200|a100|b200|FILE (any count, "
                   "needs flint-traces[gpu]), or tpu:TOPOLOGY such as tpu:v5p:16x16x32 "
                   "(needs flint-traces[tpu]).")
@click.option("--slices", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="Pod slices of the TPU topology (multi-slice); the mesh has all their devices.")
@click.option("--dump-ir", type=click.Path(path_type=Path), metavar="DIR",
              help="Also write the traced StableHLO module as text into DIR.")
@click.option("--loop-trips", type=click.IntRange(min=0), metavar="N",
              help="Unroll loops whose trip count is not static N times (default: refuse them).")
@click.option("--strategy", type=click.Choice(STRATEGIES), metavar="PRESET",
              help=f"Parallel layout preset, replacing the model's: {' | '.join(STRATEGIES)}.")
@click.option("--rule", "rules", multiple=True, metavar="NAME=AXES",
              help="Logical axis rule, e.g. batch=data or mlp=tensor (axes joined by +). Repeatable.")
@click.option("--shard", "shards", multiple=True, metavar="PATTERN=SPEC",
              help="Shard inputs whose path matches PATTERN, e.g. 'params/.*/w_in=None,data,tensor'. "
                   "Repeatable; the last match wins.")
@click.option("--config", "config", type=click.Path(path_type=Path), metavar="TOML",
              help="Layout file with strategy, [rules] and [shard] (overridden by the flags).")
@click.option("--explain", is_flag=True, help="Print the final sharding of every input before compiling.")
@click.option("--pipeline-stages", "stages", type=click.IntRange(min=2), metavar="S",
              help="Pipeline the layers (a lax.scan) over S stages: the mesh axis named pp or stage.")
@click.option("--microbatches", type=click.IntRange(min=1), metavar="M",
              help="Microbatches per step, with --pipeline-stages [default: S].")
@click.option("--schedule", "pipeline_schedule", type=click.Choice(SCHEDULES), metavar="SCHEDULE",
              help=f"Pipeline schedule, with --pipeline-stages: {' | '.join(SCHEDULES)} [default: 1f1b].")
@click.option("--virtual-stages", type=click.IntRange(min=1), metavar="V",
              help="Layer chunks per stage for --schedule interleaved [default: 2].")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
@click.option("--strict", is_flag=True, help="Fail on ops that have no cost rule instead of warning.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (no progress bars).")
def extract(model, mesh_spec, output, name, device_spec, stage, durations, backend_spec, slices, dump_ir,
            loop_trips, strategy, rules, shards, config, explain, stages, microbatches,
            pipeline_schedule, virtual_stages, force, strict, as_json):
    """Extract traces from a model file.

    MODEL is a Python file. A JAX model defines `workload(mesh)`, which returns `(step, args)`: the
    step function and its arguments as jax.ShapeDtypeStructs with NamedShardings over `mesh` (see
    examples/mlp.py). A PyTorch model defines `model()`, an nn.Module, and `example_inputs()`, the
    batch as a dict of tensors, both built without allocating weights; with `loss_fn(model, batch)` the
    training step is extracted, else the forward (see examples/torch_mlp.py; needs
    flint-traces[torch]).

    The layout can be changed without editing MODEL. Precedence: the model's own shardings <
    --strategy < --config < --rule/--shard. Inputs are named by path (step argument, then keys):
    params/layers/w_in, batch/tokens; --explain lists them.

    \b
      flint extract examples/gpt.py --mesh 4x2 --strategy fsdp+tp
      flint extract examples/gpt.py --mesh data=4,tensor=2 --shard 'params/layers/w_in=None,data,tensor'

    Pipeline parallelism: --pipeline-stages S splits the stacked layers over the mesh axis named pp
    (or stage), --microbatches M splits the batch (the step's last argument), and each stage runs
    its forwards and backwards in --schedule order (gpipe: all forwards, then all backwards; 1f1b:
    S - s - 1 forwards, then alternating; interleaved: --virtual-stages chunks per stage).

    \b
      flint extract examples/gpt.py --mesh pp=3,dp=2,tp=2 --strategy dp+tp --pipeline-stages 3 --microbatches 4

    Writes NAME.<rank>.et for every rank, NAME.comm_groups.json (for ASTRA-sim's
    --comm-group-configuration), NAME.graph.json (one rank's workload graph) and manifest.json.
    """
    from flint.compile.backend import parse_backend
    from flint.emit import check_name, prepare_output
    from flint.isolation import Interrupted
    from flint.layout import LayoutRequest, merge, parse_rule, parse_shard, read_config
    from flint.pipeline import ExtractRequest, extract_isolated

    started = time.perf_counter()
    pipeline = _pipeline_request(stages, microbatches, pipeline_schedule, virtual_stages)
    backend = parse_backend(backend_spec, slices)
    request = ExtractRequest(
        model=model,
        mesh=parse_mesh(mesh_spec),
        output=prepare_output(output, force),
        device=load_device(device_spec),
        name=check_name(name),
        stage=stage or ("partitioned" if pipeline else backend.default_stage),
        dump_ir=dump_ir,
        strict=strict,
        loop_trips=loop_trips,
        backend=backend,
        durations=durations,
        layout=merge(
            read_config(config) if config else None,
            LayoutRequest(
                strategy=strategy,
                rules=tuple(parse_rule(r) for r in rules),
                shards=tuple(parse_shard(s) for s in shards),
            ),
        ),
        pipeline=pipeline,
        command=shlex.join(["flint", *sys.argv[1:]]),
    )
    bars = _progress(as_json)
    task = bars.add_task("writing rank traces", total=request.mesh.size, visible=False)

    def on_progress(stage_name: str, done: int, total: int) -> None:
        bars.start()  # only now: forking while its refresh thread ran could fork a lock it held
        bars.update(task, completed=done, total=total, visible=True)

    try:
        result = extract_isolated(request, on_progress, _explain if explain else _warn_unmatched)
    except Interrupted as interrupt:
        stderr.print("[bold red]interrupted:[/] nothing was written")
        sys.exit(128 + interrupt.signum)
    finally:
        bars.stop()
    for op in result.unknown_ops:
        stderr.print(f"[yellow]warning:[/] no cost rule for {op}: emitted with bytes only (--strict fails)")
    if result.costliest_branches:
        stderr.print(f"[yellow]note:[/] {_branches(result.costliest_branches)}")
    memory = result.memory
    if memory and memory["device"] and memory["peak"] > memory["device"]:
        stderr.print(
            f"[yellow]warning:[/] each rank needs {memory['peak'] / 2**30:.1f} GiB of device memory but "
            f"{request.backend} has {memory['device'] / 2**30:.1f} GiB: the layout does not fit"
        )
    summary = {
        "name": result.name,
        "ranks": request.mesh.size,
        "mesh": str(request.mesh),
        "output": str(request.output),
        "files": result.files,
        "per_rank": result.totals[0][1].as_json(),
        "ranks_alike": len(result.totals) == 1,
        "memory_per_rank": memory,
        "seconds": round(time.perf_counter() - started, 3),
    }
    if result.pipeline:
        summary["pipeline"] = result.pipeline
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        _format_summary(summary)


def _pipeline_request(stages, microbatches, schedule, virtual_stages):
    """The pipelining flags as a request (None without --pipeline-stages), with their defaults."""
    from flint.pipelining import PipelineRequest

    if stages is None:
        given = [flag for flag, value in (("--microbatches", microbatches), ("--schedule", schedule),
                                          ("--virtual-stages", virtual_stages)) if value is not None]
        if given:
            raise FlintError(f"{given[0]} needs --pipeline-stages")
        return None
    schedule = schedule or "1f1b"
    default_virtual = 2 if schedule == "interleaved" else 1
    return PipelineRequest(stages, microbatches or stages, schedule, virtual_stages or default_virtual)


def _trace_files(path: Path, prefix: str | None, rank: int | None = None):
    """The trace files at `path` with their groups and rank count, or one line saying why not."""
    from flint.trace.reader import locate_traces

    return _located(path, lambda: locate_traces(path, prefix, rank))


def _trace_set(directory: Path, prefix: str | None) -> None:
    """One line unless `directory` holds a trace set, whose files and groups are left to judge."""
    from flint.trace.reader import find_traces

    _located(directory, lambda: find_traces(directory, prefix))


def _located(path: Path, lookup):
    """What `lookup` of the trace files at `path` refuses (none there, several prefixes, an
    unreadable group file), as one line."""
    if not path.exists():
        raise FlintError(f"{str(path)!r} does not exist: give a trace directory or one .et file")
    try:
        return lookup()
    except (FileNotFoundError, ValueError) as exc:
        raise FlintError(f"{exc}: give a directory that holds <prefix>.<rank>.et files") from None


def _read_trace(path: Path):
    """One rank file, decoded; one that does not decode is bad input, not a bug: one line."""
    from flint.trace.errors import TraceFormatError
    from flint.trace.reader import read_trace

    try:
        return read_trace(path)
    except TraceFormatError as exc:
        message = f"not a readable Chakra trace: {exc}: `flint check` lists all its problems"
        raise FlintError(message) from None


def _timing_options(command):
    """--device, --link-gbps, --link-latency-us: what a node's time is (flint.trace.timing)."""
    from flint.trace.timing import DEFAULT_LINK_GBPS, DEFAULT_LINK_LATENCY_US

    for option in (
        click.option("--link-latency-us", type=click.FloatRange(min=0), default=DEFAULT_LINK_LATENCY_US,
                     show_default=True, help="Link latency per ring step (alpha), in µs."),
        click.option("--link-gbps", type=click.FloatRange(min=0, min_open=True),
                     default=DEFAULT_LINK_GBPS, show_default=True,
                     help="Link bandwidth per rank in GB/s (10^9 bytes/s)."),
        click.option("--device", "device_spec", default="h100", show_default=True, metavar="DEVICE",
                     help=f"Roofline for compute times: {', '.join(BUILTIN)}, or a JSON spec file."),
    ):
        command = option(command)
    return command


def _timer(device_spec: str, link_gbps: float, link_latency_us: float, groups, num_ranks: int):
    from flint.trace.timing import Link, NodeTimer

    return NodeTimer(load_device(device_spec), Link(link_gbps, link_latency_us), groups, num_ranks)


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--rank", type=int, help="Show this rank only.")
@click.option("--prefix", help="Trace name prefix, when a directory holds several traces.")
@click.option("--json", "as_json", is_flag=True, help="Print the per-rank summaries as JSON.")
@_timing_options
def inspect(path, rank, prefix, as_json, device_spec, link_gbps, link_latency_us):
    """Summarise a trace, rank by rank.

    Nodes by type, FLOPs, bytes, collectives by kind and group size, send/recv peers, the heaviest
    nodes, and the spread across ranks.

    PATH is a trace directory or a single .et file; any trace following the Chakra schema works.
    Details are shown for the first rank listed (--rank picks one).
    """
    from flint.analysis.summary import summarize
    from flint.analysis.views import inspect_view

    files = _trace_files(path, prefix, rank)
    timer = _timer(device_spec, link_gbps, link_latency_us, files.groups, files.num_ranks)
    summaries = [summarize(_read_trace(f), timer) for f in files.paths]
    if as_json:
        click.echo(json.dumps([s.as_json() for s in summaries], indent=2))
        return
    stdout.print(inspect_view(str(path), summaries))


@main.command()
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--prefix", help="Trace name prefix, when the directory holds several traces.")
@click.option("--ranks", "num_ranks", type=click.IntRange(min=1), metavar="N",
              help="Ranks ASTRA-sim will run [default: what manifest.json records, else the "
                   "highest rank file + 1].")
def check(directory, prefix, num_ranks):
    """Check traces against the contract.

    Every rule ASTRA-sim depends on, on every rank of DIRECTORY: one line per violation, and exit
    code 1 if there is any.
    """
    from flint.trace.contract import check_traces

    _trace_set(directory, prefix)
    with _progress(False) as bars:
        task = bars.add_task("checking rank traces", total=None)
        violations = check_traces(
            directory, prefix, num_ranks,
            lambda done, total: bars.update(task, completed=done, total=total),
        )
    for violation in violations:
        click.echo(str(violation))
    if violations:
        plural = "s" if len(violations) > 1 else ""
        stderr.print(f"[bold red]{len(violations)} contract violation{plural}[/]")
        sys.exit(1)
    stdout.print(f"{directory}: every rank follows the trace contract")


@main.command()
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="Chrome trace-event JSON to write (open it in ui.perfetto.dev).")
@click.option("--plot", type=click.Path(path_type=Path, dir_okay=False),
              help="Also draw per-rank bars of compute / exposed communication (PNG, SVG, PDF; matplotlib).")
@click.option("--prefix", help="Trace name prefix, when the directory holds several traces.")
@click.option("--json", "as_json", is_flag=True, help="Print each rank's times as JSON.")
@_timing_options
def timeline(directory, output, plot, prefix, as_json, device_spec, link_gbps, link_latency_us):
    """Schedule one step as a timeline.

    Writes Chrome trace-event JSON (open it in ui.perfetto.dev), before spending hours in
    ASTRA-sim. Each rank's graph is list-scheduled: one compute stream with roofline times,
    collectives with alpha-beta ring times starting when their whole group reaches them, a RECV no
    earlier than its SEND. Refuses a trace that breaks the contract (see `flint check`).
    """
    from flint.analysis.timeline import load_timeline, to_trace_events
    from flint.analysis.views import timeline_view

    _trace_set(directory, prefix)
    scheduled = load_timeline(
        directory, prefix,
        lambda groups, num_ranks: _timer(device_spec, link_gbps, link_latency_us, groups, num_ranks),
    )
    metadata = {"trace": str(directory), "device": device_spec, "link_gbps": link_gbps,
                "link_latency_us": link_latency_us}
    try:
        output.write_text(json.dumps(to_trace_events(scheduled, metadata)) + "\n")
    except OSError as exc:
        raise FlintError(f"cannot write {str(output)!r}: {exc.strerror}") from None
    if plot:
        from flint.analysis.plot import plot_ranks

        plot_ranks(scheduled, plot, f"{directory.name}: one step, {scheduled.step:,.1f} µs")
    if as_json:
        click.echo(json.dumps({"step_us": scheduled.step,
                               "ranks": [r.as_json() for r in scheduled.ranks]}, indent=2))
        return
    stdout.print(timeline_view(scheduled))
    stdout.print(f"wrote {output}" + (f" and {plot}" if plot else ""))


@main.command()
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--network", default="hgx", show_default=True, metavar="NETWORK",
              help="Network: hgx (8-GPU NVLink nodes, 50 GB/s scale-out), nvl72 (72-GPU NVLink domains), "
                   "flat (one switch), or an ASTRA-sim network .yml.")
@click.option("--roofline", is_flag=True,
              help="Let ASTRA-sim time compute from FLOPs and bytes (its roofline mode) instead of "
                   "replaying each node's duration.")
@click.option("--device", "device_spec", metavar="DEVICE",
              help=f"Roofline device: {', '.join(BUILTIN)}, or a JSON spec file [default: the trace's].")
@click.option("--system", type=click.Path(path_type=Path, dir_okay=False), metavar="JSON",
              help="ASTRA-sim system keys that replace Flint's (scheduling, chunking, collective algorithms).")
@click.option("--astra-sim", "simulator", type=click.Path(path_type=Path, dir_okay=False), metavar="PATH",
              help="ASTRA-sim's AstraSim_Analytical_Congestion_Unaware binary (or a wrapper) "
                   "[default: $ASTRA_SIM, else astra-sim on PATH].")
@click.option("-o", "--output", type=click.Path(path_type=Path, file_okay=False), metavar="DIR",
              help="Where ASTRA-sim's inputs, logs and result.json go [default: DIRECTORY/astra-sim].")
@click.option("--prefix", help="Trace name prefix, when the directory holds several traces.")
@click.option("--estimate/--no-estimate", default=True, show_default=True,
              help="Also schedule the trace with flint timeline's model on the same network.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Stop ASTRA-sim after this long.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def simulate(directory, network, roofline, device_spec, system, simulator, output, prefix, estimate, timeout,
             as_json):
    """Simulate one step on a machine with ASTRA-sim.

    Writes ASTRA-sim's system, network and memory files for the trace in DIRECTORY: one network
    dimension per tier of the --network (the mesh's innermost axes on the fastest), the device from
    the trace's manifest. Runs ASTRA-sim and reports the step (the slowest rank) and where each
    rank's time went, beside flint timeline's estimate. Without ASTRA-sim it writes the files and
    prints the command to run.

    \b
      flint simulate traces/mlp
      flint simulate traces/gpt --network my-cluster.yml --roofline --json
    """
    from flint.simulate import SimulateRequest
    from flint.simulate import simulate as run_simulation
    from flint.simulate.view import simulation_view

    _trace_set(directory, prefix)
    request = SimulateRequest(directory=directory, network=network, roofline=roofline, device=device_spec,
                              system=system, simulator=simulator, output=output, prefix=prefix, estimate=estimate,
                              timeout=timeout)
    with _progress(as_json) as bars:
        task = bars.add_task("simulating ranks", total=None)
        result = run_simulation(request, lambda done, total: bars.update(task, completed=done, total=total))
    if as_json:
        click.echo(json.dumps(result.as_json(), indent=2))
    else:
        stdout.print(simulation_view(result))


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--mesh", "mesh_spec", required=True, metavar="MESH", help="Virtual device mesh, as for extract.")
@click.option("--traces", type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="Validate this trace (an --stage optimized extraction, run with the layout its "
                   "manifest records) instead of a fresh one.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict, counts and times as JSON.")
@_timing_options
def validate(model, mesh_spec, traces, as_json, device_spec, link_gbps, link_latency_us):
    """Run the step and check its trace.

    MODEL is a model file as for extract (JAX or PyTorch). The step runs once on the virtual
    devices with random inputs under JAX's profiler. Every executed collective must match one trace
    node by kind, group and bytes (exit 1 otherwise, listing each disagreement); compute ops are
    matched by count, and measured times are set beside predicted ones per kind.
    """
    from flint.analysis.validate import ValidateRequest
    from flint.analysis.validate import validate as run_validate
    from flint.analysis.views import validation_view
    from flint.trace.timing import Link

    request = ValidateRequest(
        model=model,
        mesh=parse_mesh(mesh_spec),
        device=load_device(device_spec),
        link=Link(link_gbps, link_latency_us),
        traces=traces,
        command=shlex.join(["flint", *sys.argv[1:]]),
    )
    verdict, execution = run_validate(request)
    if as_json:
        click.echo(json.dumps(verdict.as_json(), indent=2))
    else:
        for line in verdict.disagreements:
            click.echo(line)
        ranks = verdict.num_ranks
        stdout.print(f"ran {model} on {ranks} virtual CPU devices (mesh {request.mesh}) in "
                     f"{execution.seconds:.2f} s under the profiler")
        stdout.print(f"communication: {verdict.matched} executed transfers matched by kind, group "
                     f"and bytes on {ranks} ranks; {len(verdict.disagreements)} disagreements")
        executed = sorted(set(verdict.compute_executed.values()))
        traced = sorted(set(verdict.compute_traced.values()))
        stdout.print(f"compute ops per rank: {', '.join(map(str, executed))} executed, "
                     f"{', '.join(map(str, traced))} in the trace"
                     + ("" if verdict.compute_counts_agree else " [yellow](counts differ)[/]"))
        stdout.print(validation_view(verdict, request.device.name))
    if not verdict.ok:
        stderr.print(f"[bold red]the graph and the execution disagree on {len(verdict.disagreements)} "
                     "transfers[/]")
        if verdict.costliest_branches:
            stderr.print(f"[yellow]note:[/] {_branches(verdict.costliest_branches)}; the random inputs "
                         "may have taken another")
        sys.exit(1)


def _branches(count: int) -> str:
    plural = "s" if count > 1 else ""
    return (f"{count} conditional{plural} whose selector depends on data or on the rank, traced as "
            "the costliest branch")


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--rank", type=int, default=0, show_default=True, help="The rank to draw.")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="File to write: .dot/.gv (DOT text) or .svg/.png/.pdf (needs Graphviz's dot).")
@click.option("--max-nodes", type=click.IntRange(min=1), default=MAX_NODES, show_default=True,
              help="Refuse ranks with more nodes than this.")
@click.option("--prefix", help="Trace name prefix, when a directory holds several traces.")
@_timing_options
def graph(path, rank, output, max_nodes, prefix, device_spec, link_gbps, link_latency_us):
    """Draw one rank's dependency graph.

    For small traces: nodes with cost and time, data deps solid, ctrl deps dashed.
    """
    from flint.analysis.dot import write_graph

    files = _trace_files(path, prefix, None if path.is_file() else rank)
    timer = _timer(device_spec, link_gbps, link_latency_us, files.groups, files.num_ranks)
    write_graph(_read_trace(files.paths[0]), timer, output, max_nodes)
    stdout.print(f"wrote {output}")

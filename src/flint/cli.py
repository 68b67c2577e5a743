"""`flint` command line: wires the pipeline stages to flags, and nothing else."""

from __future__ import annotations

import json
import math
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from flint.analysis.dot import MAX_NODES
from flint.compile.backend import DEFAULT_BACKEND
from flint.compile.capture import STAGES
from flint.devices import BUILTIN, load_device
from flint.devices.kernels import DURATIONS
from flint.emit.writer import write_whole
from flint.errors import FlintError
from flint.layout import STRATEGIES
from flint.mesh import parse_mesh
from flint.pipelining import SCHEDULES
from flint.step.nccl import ALGORITHMS, PROTOCOLS
from flint.step.network_files import nccl_releases
from flint.trace.reader import ALL_RANK_FILES, ONE_PER_CLASS, RANK_FILE_CHOICES
from flint.version import __version__

stderr = Console(stderr=True, highlight=False, soft_wrap=True)  # long paths stay on one line
stdout = Console(highlight=False, soft_wrap=True)


def _usage_error(exc: click.UsageError) -> NoReturn:
    """A mistyped command line is bad input like any other: one line, exit 2."""
    command = exc.ctx.command_path if exc.ctx else "flint"
    stderr.print(f"[bold red]error:[/] {escape(exc.format_message())} (see {command} --help)")
    sys.exit(2)


def _other_click_error(exc: click.ClickException) -> NoReturn:
    """Click's errors that are not about the command line (a file it could not open): bad input."""
    stderr.print(f"[bold red]error:[/] {escape(exc.format_message())}")
    sys.exit(2)


@contextmanager
def _click_errors_in_one_line() -> Iterator[None]:
    """Click's errors, while it parses the command line or runs a command, as one line (exit 2);
    `flint` alone still shows the help."""
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:
        raise
    except click.UsageError as exc:
        _usage_error(exc)
    except click.ClickException as exc:
        _other_click_error(exc)


DEBUG = "flint.debug"
"""Key in `ctx.meta`, which every context of one command line shares, set by any `--debug`."""
LARGE_TRACE_BYTES = 10**9
"""From this size on, `flint extract` says how large the rank traces will be before writing them."""
NCCL_RELEASES = f"{nccl_releases()[0]} to {nccl_releases()[-1]}"
"""The NCCL releases whose tuners a network file's `nccl` may name, for --help."""


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[DEBUG] = True


def _debug_option() -> click.Option:
    return click.Option(["--debug"], is_flag=True, expose_value=False, callback=_set_debug,
                        help="Show full tracebacks instead of one-line errors.")


class FlintGroup(click.Group):
    """Turns `FlintError` and click's errors into one line on stderr (exit 2) and Ctrl-C into
    exit 130, unless `--debug` (given before or after the command's name) asks for the
    traceback; `flint` alone still shows the help."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.params.append(_debug_option())

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        cmd.params.append(_debug_option())
        super().add_command(cmd, name)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        with _click_errors_in_one_line():
            return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context):
        try:
            with _click_errors_in_one_line():
                return super().invoke(ctx)
        except FlintError as exc:
            if ctx.meta.get(DEBUG):
                raise
            stderr.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
            sys.exit(2)
        except KeyboardInterrupt:
            if ctx.meta.get(DEBUG):
                raise
            stderr.print("[bold red]interrupted[/]")
            sys.exit(130)


@click.group(cls=FlintGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="flint")
def main() -> None:
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
      0    success (flint check: warnings alone do not fail it)
      1    a check found problems (flint check, flint validate)
      2    bad input or usage: one line on stderr says what was wrong and what to do
      130  interrupted (Ctrl-C): nothing is left behind
      143  terminated (SIGTERM), likewise

    --debug, before or after the command's name, shows tracebacks instead of one-line errors.
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


def _named(ctx, param, value: str | None) -> str | None:
    """A name or file given: an empty one would stand for the default, as if none were."""
    if value is not None and not value.strip():
        raise click.BadParameter("is empty: give a name or a file, or leave the option out")
    return value


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
            f"temporaries {memory['temporaries']:,}, donated {memory['donated']:,})"
        )
    if "pipeline" in summary:
        p = summary["pipeline"]
        stdout.print(
            f"  pipeline              {p['stages']} stages x {p['microbatches']} microbatches "
            f"({p['schedule']}), {p['activation_bytes']:,} bytes per activation"
        )
    per_class = ", one rank trace per class" if summary["rank_files"] == ONE_PER_CLASS else ""
    stdout.print(f"wrote {summary['output']} ({summary['files']} files{per_class}) in {summary['seconds']:.1f} s")


def _model_arg_option(command):
    """--model-arg NAME=VALUE, repeatable: the model file's knobs."""
    return click.option(
        "--model-arg", "model_args", multiple=True, metavar="NAME=VALUE",
        help="Keyword argument of the model file's workload(mesh, ...) (PyTorch: of model() or "
             "example_inputs()), e.g. layers=16 (repeatable).",
    )(command)


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--mesh", "mesh_spec", required=True, metavar="MESH",
              help="Virtual device mesh: 8x8, 2x4x8 (axes data,...,tensor) or data=16,tensor=8.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("traces"),
              show_default=True, help="Directory to write the trace into (must be empty or new).")
@click.option("--name", help="File name prefix of the trace files [default: the model file's stem].")
@click.option("--device", "device_spec", metavar="DEVICE", callback=_named,
              help=f"Device that times kernels for duration_micros: {', '.join(BUILTIN)}, or a "
                   ".toml/.json device file [default: the backend's GPU or TPU where it is one of "
                   "these, else h100].")
@click.option("--stage", type=click.Choice(STAGES),
              help="Module to trace: right after SPMD partitioning, or fully optimised (the GPU "
                   "compiler's kernels) [default: optimized on gpu backends, else partitioned].")
@click.option("--durations", type=click.Choice(DURATIONS),
              help="Kernel times for duration_micros: calibrated (the --device's kernel model: GEMM "
                   "throughput by shape, achievable bandwidth, a cost per kernel), roofline (its "
                   "peaks), or xla (the GPU compiler's own estimates, with --backend gpu; not "
                   "with --pipeline-stages) "
                   "[default: calibrated on gpu backends, else roofline].")
@click.option("--backend", "backend_spec", default=DEFAULT_BACKEND, show_default=True, metavar="BACKEND",
              help="Virtual devices: gpu:h100|h200|a100|b200|FILE (XLA's GPU compiler, any count), "
                   "cpu (the CPU compiler, up to 2,048), or tpu:TOPOLOGY such as tpu:v5p:16x16x32 "
                   "(needs flint-traces[tpu]).")
@click.option("--slices", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="Pod slices of the TPU topology (multi-slice); the mesh has all their devices.")
@_model_arg_option
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
@click.option("--donate/--no-donate", default=True, show_default=True,
              help="Donate the step arguments an output replaces (parameters, optimizer state), or "
                   "the model file's donate_argnums, as a training step does: memory per rank "
                   "holds one copy of them.")
@click.option("--rank-files", type=click.Choice(RANK_FILE_CHOICES), default=ALL_RANK_FILES, show_default=True,
              help="all: a file for every rank, the Chakra trace ASTRA-sim runs. classes: one file per "
                   "rank class (ranks that run the same work, e.g. a pipeline stage), which is all that "
                   "simulate --engine flint, timeline, inspect and sweep need; for meshes whose every "
                   "rank's files would not fit on disk.")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
@click.option("--strict", is_flag=True, help="Fail on ops that have no cost rule instead of warning.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (no progress bars).")
def extract(model, mesh_spec, output, name, device_spec, stage, durations, backend_spec, slices, model_args,
            dump_ir, loop_trips, strategy, rules, shards, config, explain, stages, microbatches,
            pipeline_schedule, virtual_stages, donate, rank_files, force, strict, as_json):
    """Extract traces from a model file.

    By default XLA's GPU compiler compiles the step for a cluster of virtual H100s (no GPU needed)
    and the trace has one node per kernel it emits; --backend cpu traces the CPU compiler's
    partitioned module instead, one node per op.

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
    (or stage), --microbatches M splits every batch input (the step's last argument, the ones before
    it laid out like it, or the model file's batch_argnums), and each stage runs its forwards and
    backwards in --schedule order (gpipe: all forwards, then all backwards; 1f1b: S - s - 1
    forwards, then alternating; interleaved: --virtual-stages chunks per stage).

    \b
      flint extract examples/gpt.py --mesh pp=3,dp=2,tp=2 --strategy dp+tp --pipeline-stages 3 --microbatches 4

    Writes NAME.<rank>.et for every rank, NAME.comm_groups.json (for ASTRA-sim's
    --comm-group-configuration), NAME.graph.json (one rank's workload graph) and manifest.json.
    Before writing it says how large the rank files will be, from 1 GB on. With --rank-files
    classes only the first rank of each class gets a file, and the manifest's rank_totals say
    which ranks each stands for:

    \b
      flint extract big.py --mesh pp=64,data=6,tensor=8 --pipeline-stages 64 --rank-files classes
      flint simulate traces --engine flint
    """
    from flint.api import extract_request, extract_summary
    from flint.isolation import Interrupted
    from flint.pipeline import TRACE_BYTES, extract_isolated

    started = time.perf_counter()
    request = extract_request(
        model, mesh_spec, output, backend=backend_spec, slices=slices, stage=stage, device=device_spec,
        durations=durations, name=name, strategy=strategy, rules=rules, shards=shards, config=config,
        model_args=model_args, pipeline_stages=stages, microbatches=microbatches, schedule=pipeline_schedule,
        virtual_stages=virtual_stages, dump_ir=dump_ir, loop_trips=loop_trips, strict=strict, force=force,
        donate=donate, rank_files=rank_files, command=shlex.join(["flint", *sys.argv[1:]]),
    )
    bars = _progress(as_json)
    task = bars.add_task("writing rank traces", total=request.mesh.size, visible=False)

    def on_progress(stage_name: str, done: int, total: int) -> None:
        if stage_name == TRACE_BYTES:
            _note_trace_size(request, one_per_class=done, every_rank=total)
            return
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
    if result.compiler_fallback == "cublas_gemm":
        stderr.print(
            "[yellow]warning:[/] the GPU compiler could not tile a Triton GEMM: compiled with cuBLAS "
            "GEMMs instead (xla_gpu_enable_triton_gemm=false), as the manifest records"
        )
    memory = result.memory
    if memory and memory["device"] and memory["peak"] > memory["device"]:
        stderr.print(
            f"[yellow]warning:[/] each rank needs {memory['peak'] / 2**30:.1f} GiB of device memory but "
            f"{request.backend} has {memory['device'] / 2**30:.1f} GiB: the layout does not fit"
        )
    summary = extract_summary(request, result, time.perf_counter() - started)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        _format_summary(summary)


def _note_trace_size(request, one_per_class: int, every_rank: int) -> None:
    """Say how large the rank files will be before they are written, from `LARGE_TRACE_BYTES` on,
    with the other choice of --rank-files beside it."""
    if request.rank_files == ONE_PER_CLASS:
        if max(one_per_class, every_rank) >= LARGE_TRACE_BYTES:
            stderr.print(f"[yellow]note:[/] writing one rank trace per class, {_size(one_per_class)} (every "
                         f"rank's {request.mesh.size:,} would take about {_size(every_rank)})")
    elif every_rank >= LARGE_TRACE_BYTES:
        stderr.print(f"[yellow]note:[/] writing {request.mesh.size:,} rank traces, {_size(every_rank)} (one per "
                     f"rank class would take {_size(one_per_class)}: --rank-files classes)")


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:,.1f} GB" if nbytes >= 10**9 else f"{nbytes / 1e6:,.1f} MB"


def _trace_files(path: Path, prefix: str | None, rank: int | None = None, groups: Path | None = None,
                 one_file_too: bool = False):
    """The trace files at `path` with their groups and rank count, or one line saying why not."""
    from flint.trace.reader import locate_traces

    return _located(path, lambda: locate_traces(path, prefix, rank, groups), one_file_too)


def _one_rank(path: Path, rank: int | None) -> int | None:
    """The rank a command that reads one rank reads of `path`: --rank where given (a file of another
    rank is refused as it is opened), else a file's own, else 0."""
    return 0 if rank is None and not path.is_file() else rank


class FiniteFloat(click.FloatRange):
    """A number in a range; nan, which compares false with every bound, and infinities are none."""

    def convert(self, value, param, ctx) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class OutputFile(click.Path):
    """A file a command writes, refused before any work where its directory does not exist."""

    def __init__(self) -> None:
        super().__init__(path_type=Path, dir_okay=False)

    def convert(self, value, param, ctx) -> Path:
        if isinstance(value, str) and not value.strip():
            self.fail("is empty: give the file to write", param, ctx)
        path = super().convert(value, param, ctx)
        if not path.absolute().parent.is_dir():
            self.fail(f"directory {str(path.parent)!r} of {str(path)!r} does not exist: create it first", param, ctx)
        return path


def _plot_option(help_text: str, kind: click.ParamType | None = None):
    """--plot FILE: a figure, refused before any work unless matplotlib is there and writes its
    format (a sweep would otherwise run every point first); `kind`: its type, by default a file in
    a directory that exists (OutputFile)."""
    def check(ctx, param, value: Path | None) -> Path | None:
        if value is None:
            return value
        if value.suffix.lower() not in (".png", ".svg", ".pdf"):
            raise click.BadParameter(f"{str(value)!r} is not a .png, .svg or .pdf file")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise click.UsageError("--plot needs matplotlib: pip install 'flint-traces[plot]'", ctx) from None
        return value

    return click.option("--plot", type=kind or OutputFile(), callback=check,
                        help=help_text)


def _groups_option(command):
    """--groups FILE: the communicator groups under another name than PREFIX.comm_groups.json."""
    return click.option(
        "--groups", "groups_file", type=click.Path(path_type=Path, exists=True, dir_okay=False),
        metavar="FILE", help="Communicator-group JSON of the trace, where another producer names it "
                             "otherwise [default: PREFIX.comm_groups.json beside the rank files].",
    )(command)


def _trace_set(directory: Path, prefix: str | None) -> None:
    """One line unless `directory` holds a trace set, whose files and groups are left to judge."""
    from flint.trace.reader import find_traces

    _located(directory, lambda: find_traces(directory, prefix))


def _exists(path: Path, one_file_too: bool = False) -> None:
    """One line unless `path` exists."""
    if not path.exists():
        what = "a trace directory or one .et file" if one_file_too else "a trace directory"
        raise FlintError(f"{str(path)!r} does not exist: give {what}")


def _located(path: Path, lookup, one_file_too: bool = False):
    """What `lookup` of the trace files at `path` refuses (none there, several prefixes, an
    unreadable groups file, a rank it lacks), as one line."""
    from flint.trace.errors import TraceLookupError

    _exists(path, one_file_too)
    try:
        return lookup()
    except FileNotFoundError as exc:
        raise FlintError(f"{exc}: give a directory that holds <prefix>.<rank>.et files") from None
    except (TraceLookupError, ValueError) as exc:  # each says what to do
        raise FlintError(str(exc)) from None


def _read_trace(files, path: Path):
    """One rank file of an opened set, decoded; one that does not decode is bad input, not a bug:
    one line."""
    from flint.trace.errors import TraceFormatError

    try:
        return files.trace(path)
    except TraceFormatError as exc:
        message = f"not a readable Chakra trace: {exc}: `flint check` lists all its problems"
        raise FlintError(message) from None


def _compute_options(command):
    """--device, --durations: how compute nodes are timed (flint.trace.timing)."""
    from flint.trace.timing import READER_DURATIONS

    for option in (
        click.option("--durations", type=click.Choice(READER_DURATIONS),
                     help="Compute times: trace (each node's duration_micros, as extracted), or "
                          "calibrated or roofline: timed again by that kernel model on --device "
                          "[default: trace; calibrated with --device]."),
        click.option("--device", "device_spec", metavar="DEVICE", callback=_named,
                     help=f"Time compute again on this device: {', '.join(BUILTIN)}, or a .toml/.json "
                          "device file [default: the trace's own durations; with --durations, the "
                          "device its manifest records]."),
    ):
        command = option(command)
    return command


def _timing_options(command):
    """--device, --durations, --link-gbps, --link-latency-us: what a node's time is (flint.trace.timing)."""
    from flint.trace.timing import DEFAULT_LINK_GBPS, DEFAULT_LINK_LATENCY_US

    for option in (
        click.option("--link-latency-us", type=FiniteFloat(min=0), default=DEFAULT_LINK_LATENCY_US,
                     show_default=True, help="Link latency per ring step (alpha), in µs."),
        click.option("--link-gbps", type=FiniteFloat(min=0, min_open=True),
                     default=DEFAULT_LINK_GBPS, show_default=True,
                     help="Link bandwidth per rank in GB/s (10^9 bytes/s)."),
    ):
        command = option(command)
    return _compute_options(command)


def _network_options(command):
    """--network, --collectives, --link-gbps, --link-latency-us: the network communication is timed
    on and how (flint.step.nccl, flint.step.astra_sim), as flint simulate's estimator times it."""
    from flint.step.models import DEFAULT_NETWORK
    from flint.step.network_files import BUILTIN_NETWORKS

    for option in (
        click.option("--link-latency-us", type=FiniteFloat(min=0),
                     help="Instead of --network: every rank one hop from every other, this latency per hop "
                          "in µs (ASTRA-sim's; with --collectives astra-sim) [default with --link-gbps: the "
                          "flat network's]."),
        click.option("--link-gbps", type=FiniteFloat(min=0, min_open=True),
                     help="Instead of --network: every rank one hop from every other at this bandwidth "
                          "(GB/s, as ASTRA-sim reads its network files) [default with --link-latency-us: "
                          "the flat network's]."),
        click.option("--collectives", type=click.Choice(["nccl", "astra-sim"]), default="nccl",
                     show_default=True,
                     help="How collectives are timed: as NCCL runs them (its algorithms, protocols and "
                          "tuner, on the network file's bandwidths: what the tuner of the release the file "
                          f"names with nccl = \"2.26.2\" picks, {NCCL_RELEASES}; the newest without), or as "
                          "ASTRA-sim's analytical backend times them (a ring per network dimension)."),
        click.option("--network", metavar="NETWORK", callback=_named,
                     help=f"Network: {', '.join(BUILTIN_NETWORKS)} (flint/step/networks/), a network "
                          f"file (.toml), or an ASTRA-sim network (.yml) [default: {DEFAULT_NETWORK}]."),
    ):
        command = option(command)
    return command


def _compute(files, device_spec: str | None, durations: str | None):
    """How the opened trace set `files` times compute."""
    from flint.trace.timing import reader_compute

    asked = durations not in (None, "trace") or device_spec
    return reader_compute(device_spec, durations, _manifest_of(files) if asked else None)


def _manifest_of(files) -> dict | None:
    """The manifest of the opened trace set `files`, None without one."""
    from flint.trace.errors import TraceFormatError

    try:
        return files.recorded()
    except TraceFormatError as exc:
        raise FlintError(f"{exc}: extract the trace again") from None


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--rank", type=int, help="Show this rank only.")
@click.option("--prefix", help="Trace name prefix, when a directory holds several traces.")
@click.option("--json", "as_json", is_flag=True, help="Print the per-rank summaries as JSON.")
@_groups_option
@_compute_options
@_network_options
def inspect(path, rank, prefix, as_json, groups_file, device_spec, durations, network, collectives, link_gbps,
            link_latency_us):
    """Summarise a trace, rank by rank.

    Nodes by type, FLOPs, bytes, collectives by kind and group size, send/recv peers, the heaviest
    nodes (communication timed on the --network as NCCL runs it, --collectives), and the spread
    across ranks.

    PATH is a trace directory or a single .et file; any trace following the Chakra schema works.
    Details are shown for the first rank listed (--rank picks one). FLOPs are those of the COMP
    nodes that compute (num_ops above 1), as extract counts them; --json uses extract's keys.
    """
    from flint.analysis.summary import summarize
    from flint.analysis.views import inspect_view
    from flint.step.models import reader_collectives
    from flint.trace.contract import contract_breach
    from flint.trace.timing import Link, NodeTimer

    files = _trace_files(path, prefix, rank, groups_file, one_file_too=True)
    compute = _compute(files, device_spec, durations)
    model = reader_collectives(network, _manifest_of(files), files.num_ranks, link_gbps, link_latency_us,
                               model=collectives, device=compute.device)
    timer = NodeTimer(compute, Link(), files.groups, files.num_ranks, model)
    # A whole set is checked as simulate checks it, but summarised all the same (another producer's
    # trace may be worth a look); a part of one cannot be checked alone.
    whole = rank is None and path.is_dir() and not files.one_per_class
    breach = contract_breach(files) if whole else None
    summaries = [summarize(_read_trace(files, f), timer) for f in files.paths]  # or one line, unwarned
    if breach:
        stderr.print(f"[yellow]warning:[/] {escape(breach)}", highlight=False, soft_wrap=True)
    ungrouped = sum(s.ungrouped for s in summaries)
    if ungrouped and not breach:
        _warn_ungrouped(files, ungrouped, "untimed, so not among the heaviest nodes")
    if as_json:
        click.echo(json.dumps([s.as_json() for s in summaries], indent=2))
        return
    how = "as NCCL runs them" if collectives == "nccl" else "as ASTRA-sim times them"
    source = str(path)
    if rank is None and path.is_dir() and files.one_per_class:
        source += f", one file per rank class of {files.num_ranks:,} ranks"
    stdout.print(inspect_view(source, summaries, compute.label, f"{how} on {model.network.name}"))


@main.command()
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--prefix", help="Trace name prefix, when the directory holds several traces.")
@click.option("--ranks", "num_ranks", type=click.IntRange(min=1), metavar="N",
              help="Ranks ASTRA-sim will run [default: what manifest.json records, else the "
                   "highest rank file + 1].")
@_groups_option
@click.option("--json", "as_json", is_flag=True,
              help="Print the verdict and every finding (rule, severity, rank, node_id, message, "
                   "count) as JSON.")
def check(directory, prefix, num_ranks, groups_file, as_json):
    """Check traces against the contract.

    Every rule ASTRA-sim depends on, on every rank of DIRECTORY: one line per error, and exit code
    1 if there is any. What ASTRA-sim tolerates (another producer's habits: an empty metadata
    version, an integer is_cpu_op, a SEND without comm_src) is a warning on stderr, once per kind
    with its count, and leaves the exit code 0.
    """
    from flint.trace.contract import check_traces

    _trace_set(directory, prefix)
    with _progress(as_json) as bars:
        task = bars.add_task("checking rank traces", total=None)
        violations = check_traces(
            directory, prefix, num_ranks,
            lambda done, total: bars.update(task, completed=done, total=total),
            groups_file,
        )
    errors = [v for v in violations if v.is_error]
    if as_json:
        click.echo(json.dumps({"ok": not errors, "errors": len(errors),
                               "warnings": len(violations) - len(errors),
                               "violations": [v.as_json() for v in violations]}, indent=2))
    else:
        for violation in violations:
            if violation.is_error:
                click.echo(str(violation))
            else:
                stderr.print(f"[yellow]warning:[/] {escape(str(violation))}")
    if errors:
        if not as_json:
            plural = "s" if len(errors) > 1 else ""
            stderr.print(f"[bold red]{len(errors)} contract violation{plural}[/]")
        sys.exit(1)
    if not as_json:
        stdout.print(f"{directory}: every rank follows the trace contract")


@main.command()
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("-o", "--output", type=OutputFile(), required=True,
              help="Chrome trace-event JSON to write (open it in ui.perfetto.dev).")
@_plot_option("Also draw per-rank bars of compute / exposed communication (PNG, SVG, PDF; matplotlib).")
@click.option("--prefix", help="Trace name prefix, when the directory holds several traces.")
@click.option("--json", "as_json", is_flag=True, help="Print each rank's times as JSON.")
@_groups_option
@_compute_options
@_network_options
def timeline(directory, output, plot, prefix, as_json, groups_file, device_spec, durations, network, collectives,
             link_gbps, link_latency_us):
    """Schedule one step as a timeline.

    Writes Chrome trace-event JSON (open it in ui.perfetto.dev), before spending hours in
    ASTRA-sim. Each rank's graph is list-scheduled as ASTRA-sim issues it: one compute node and one
    collective or SEND at a time, lowest id first; compute takes the trace's durations,
    communication is timed on the --network as NCCL runs it (--collectives), a collective starts when its
    whole group issues it and a RECV no earlier than its SEND. The step is the one flint simulate
    --engine flint gives. Above 64 ranks, one rank per class of the manifest stands for its class.
    Refuses a trace that breaks the contract (see `flint check`).
    """
    from flint.analysis.timeline import to_trace_events
    from flint.step.schedule import AS_ASTRA_SIM, schedule_trace_set
    from flint.analysis.views import timeline_view
    from flint.step.models import reader_collectives
    from flint.trace.timing import Link, NodeTimer

    if plot is not None and plot.resolve() == output.resolve():
        raise FlintError(f"-o and --plot both name {str(output)!r}: give each a file of its own")
    files = _trace_files(directory, prefix, None, groups_file)
    _refuse_overwriting(files, [output, plot])
    compute = _compute(files, device_spec, durations)
    model = reader_collectives(network, _manifest_of(files), files.num_ranks, link_gbps,
                               link_latency_us, model=collectives, device=compute.device)
    scheduled = schedule_trace_set(
        files, lambda groups, num_ranks: NodeTimer(compute, Link(), groups, num_ranks, model), issue=AS_ASTRA_SIM,
    )
    metadata = {"trace": str(directory), "compute": compute.label, "network": model.network.as_json(),
                "collectives": collectives}
    if plot:  # first: the figure fails more ways than the JSON, and neither is left without the other
        from flint.analysis.plot import plot_ranks

        plot_ranks(scheduled, plot, f"{directory.name}: one step, {scheduled.step:,.1f} µs")
    try:
        write_whole(output, (json.dumps(to_trace_events(scheduled, metadata)) + "\n").encode())
    except FlintError:
        if plot:
            plot.unlink(missing_ok=True)
        raise
    if as_json:
        click.echo(json.dumps({"step_us": scheduled.step,
                               "ranks": [r.as_json() for r in scheduled.every_rank()]}, indent=2))
        return
    stdout.print(timeline_view(scheduled))
    if scheduled.represents is not None:
        ranks = sum(len(members) for members in scheduled.represents.values())
        classes = len(scheduled.represents)
        stdout.print(f"{ranks:,} ranks in {classes:,} class{'es' * (classes != 1)}: one rank of each scheduled, "
                     "standing for its class")
    stdout.print(f"wrote {output}" + (f" and {plot}" if plot else ""))


@main.command()
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--network", default="hgx", show_default=True, metavar="NETWORK", callback=_named,
              help="Network: a built-in one (hgx, hgx-h200, hgx-a100, hgx-b200, nvl72, flat), a network file "
                   "(.toml), or an ASTRA-sim network (.yml).")
@click.option("--collectives", type=click.Choice(["nccl", "astra-sim"]), default="nccl", show_default=True,
              help="How the estimator times collectives: as NCCL runs them (the algorithms and protocols "
                   "the tuner of the release a network file names with nccl = \"2.26.2\" picks, "
                   f"{NCCL_RELEASES}; the newest without), or as ASTRA-sim's analytical backend times "
                   "them (which it agrees with).")
@click.option("--roofline", is_flag=True,
              help="Let ASTRA-sim time compute from FLOPs and bytes (its roofline mode) instead of "
                   "replaying each node's duration.")
@click.option("--device", "device_spec", metavar="DEVICE", callback=_named,
              help=f"Roofline device: {', '.join(BUILTIN)}, or a JSON spec file [default: the trace's].")
@click.option("--system", type=click.Path(path_type=Path, dir_okay=False), metavar="JSON",
              help="ASTRA-sim system keys that replace Flint's (scheduling, chunking, collective algorithms), "
                   "for --collectives astra-sim or --engine astra-sim.")
@click.option("--astra-sim", "simulator", type=click.Path(path_type=Path, dir_okay=False), metavar="PATH",
              help="ASTRA-sim's AstraSim_Analytical_Congestion_Unaware binary (or a wrapper) "
                   "[default: $ASTRA_SIM, else astra-sim on PATH].")
@click.option("-o", "--output", type=click.Path(path_type=Path, file_okay=False), metavar="DIR",
              help="Where ASTRA-sim's inputs, logs and result.json go, replacing an earlier simulation's only "
                   "once this one succeeded [default: DIRECTORY/astra-sim].")
@click.option("--prefix", help="Trace name prefix, when the directory holds several traces.")
@click.option("--estimate/--no-estimate", default=True, show_default=True,
              help="With ASTRA-sim, also give the estimator's step (flint timeline's) on the same network.")
@click.option("--timeout", type=FiniteFloat(min=0, min_open=True), metavar="SECONDS",
              help="Stop ASTRA-sim (and what it started) when it runs longer than this, and fail.")
@click.option("--engine", type=click.Choice(["flint", "astra-sim", "auto"]),
              help="What gives the step [default: flint; astra-sim with --astra-sim]: Flint's estimator (flint timeline's schedule, collectives as "
                   "--collectives says; the more faithful to real clusters), ASTRA-sim (handed the closest "
                   "network it models, with the estimator's step beside), or auto: ASTRA-sim where it is "
                   "found and the trace has at most 2,048 ranks, else the estimator.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@_groups_option
def simulate(directory, network, collectives, roofline, device_spec, system, simulator, output, prefix, estimate,
             timeout, engine, as_json, groups_file):
    """Simulate one step on a machine.

    By Flint's estimator (the default: collectives as NCCL runs them, which matches real clusters
    more closely than ASTRA-sim's rings), or by ASTRA-sim (--engine).
    Writes ASTRA-sim's system, network and memory files for the trace in DIRECTORY: one network
    dimension per tier of the --network (the mesh's innermost axes on the fastest), the device from
    the trace's manifest. Runs the --engine and reports the step (the slowest rank), where each
    rank's time went, and which engine gave it; beside ASTRA-sim's step stands the estimator's.
    With --engine astra-sim and no ASTRA-sim it writes the files and prints the command to run.

    \b
      flint simulate traces/mlp
      flint simulate traces/gpt --network my-cluster.yml --roofline --json
    """
    from flint.simulation import SimulateRequest
    from flint.simulation import simulate as run_simulation
    from flint.simulation.view import simulation_view

    _exists(directory)  # the rest is judged as the set is opened, once
    if engine == "flint" and simulator:
        raise FlintError(f"--astra-sim {simulator} names ASTRA-sim, which --engine flint does not run: "
                         "drop one of them")
    request = SimulateRequest(directory=directory, network=network, roofline=roofline, device=device_spec,
                              system=system, simulator=simulator, output=output, prefix=prefix, estimate=estimate,
                              timeout=timeout, groups=groups_file,
                              engine=engine or ("astra-sim" if simulator else "flint"), collectives=collectives)

    def terminate(signum, frame) -> NoReturn:
        raise _Terminated  # stops ASTRA-sim and removes what was staged, as Ctrl-C does

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        with _progress(as_json) as bars:
            task = bars.add_task("simulating ranks", total=None)
            result = run_simulation(request, lambda done, total: bars.update(task, completed=done, total=total))
    except _Terminated:
        stderr.print("[bold red]terminated[/]")
        sys.exit(128 + signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if as_json:
        click.echo(json.dumps(result.as_json(), indent=2))
    else:
        stdout.print(simulation_view(result))


class _Terminated(KeyboardInterrupt):
    """SIGTERM during `flint simulate`: unwinds as Ctrl-C does (ASTRA-sim's process group killed,
    the staging directory removed), then exits 143."""


def _warn_ungrouped(files, count: int, effect: str) -> None:
    """Warn of `count` collectives whose group no groups file gives (so nothing can time them)."""
    source = f"{files.groups_path} lacks" if files.groups_path.exists() else \
        f"no groups file gives ({files.groups_path} does not exist)"
    counted = "1 collective names" if count == 1 else f"{count:,} collectives name"
    stderr.print(f"[yellow]warning:[/] {escape(f'{counted} a group that {source}')}: "
                 f"{effect}; `{escape(files.check_command())}` lists them", highlight=False, soft_wrap=True)


def _refuse_overwriting(files, outputs) -> None:
    """Refuse an output that is one of the trace set's own files (a rank's trace, its groups, its
    manifest): writing it would break the trace that every later command reads."""
    from flint.trace.reader import MANIFEST

    own = [*files.paths, files.groups_path, files.directory / MANIFEST if files.directory else None]
    inputs = {path.resolve() for path in own if path is not None}
    for output in outputs:
        if output is not None and output.resolve() in inputs:
            raise FlintError(f"{str(output)!r} is a file of the trace it is written from: write it elsewhere")


def _check_plot_directory(plot: Path, output: Path) -> None:
    """Refuse, before any point runs, a --plot whose directory neither exists nor is one the sweep
    makes: -o DIR is made with its parents, so the plot may go in DIR or any directory above it."""
    directory, made = plot.absolute().parent, output.absolute()
    if not directory.is_dir() and directory not in (made, *made.parents):
        raise click.BadParameter(f"directory {str(plot.parent)!r} of {str(plot)!r} does not exist and is not "
                                 f"{str(output)!r} or above it: create it first", param_hint="'--plot'")


@main.command()
@click.argument("spec", type=click.Path(path_type=Path, dir_okay=False))
@click.option("-o", "--output", type=click.Path(path_type=Path, file_okay=False), required=True, metavar="DIR",
              help="Where results.jsonl, results.csv and (with --keep-traces) each point's files go.")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="Points run at once on this machine (each extraction uses a core or more).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="", default=None, metavar="[ADDRESS]",
              help="Run the points as Ray tasks: on the cluster at ADDRESS (or auto), or alone on a new "
                   "local instance (needs flint-traces[ray]).")
@click.option("--retry-failed", is_flag=True, help="Run again the points that failed last time.")
@click.option("--keep-traces", is_flag=True, help="Keep each point's trace and simulator files.")
@click.option("--astra-sim", "simulator", type=click.Path(path_type=Path, dir_okay=False), metavar="PATH",
              help="ASTRA-sim to simulate each point with (up to 2,048 ranks) [default: none: points are "
                   "ranked by Flint's estimator, collectives as NCCL runs them; with --finalists, $ASTRA_SIM "
                   "or astra-sim on PATH].")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, metavar="N",
              help="Points in the ranking.")
@click.option("--finalists", type=click.IntRange(min=1), metavar="K",
              help="Rank every point by Flint's estimator, then run ASTRA-sim on the best K only; the "
                   "ranking shows both steps.")
@_plot_option("Draw step time against memory per rank with the Pareto front (PNG, SVG, PDF; matplotlib), in "
              "a directory that exists or that DIR makes.", click.Path(path_type=Path, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print every point's record as JSON, in grid order.")
def sweep(spec, output, jobs, ray_address, retry_failed, keep_traces, simulator, top, finalists, plot, as_json):
    """Explore layouts: extract and simulate a grid of points.

    SPEC is a TOML file naming a model file and the grid: meshes (listed, or every factorization of
    a rank count over named axes), model arguments, strategies, pipeline schedules and microbatches,
    backends, devices and networks (see examples/sweep.toml). Each point is extracted in a process
    of its own (as flint extract), then scheduled and simulated (as flint simulate); its record
    streams to DIR/results.jsonl and DIR/results.csv as it finishes. A rerun skips recorded
    points, so an interrupted sweep resumes. Points that cannot work are recorded as skipped with
    the reason. At the end, the points that fit in device memory are ranked by step time.

    \b
      flint sweep examples/sweep.toml -o sweeps/gpt64 --jobs 2 --plot sweeps/gpt64.png
    """
    from flint.exploration import SweepRequest, read_spec, run_sweep
    from flint.exploration.plot import no_plot, refusal
    from flint.exploration.view import sweep_view

    if plot is not None:
        _check_plot_directory(plot, output)
        if (reason := refusal(read_spec(spec))) is not None:
            raise FlintError(reason)
    request = SweepRequest(spec=spec, output=output, jobs=jobs, ray=ray_address, retry_failed=retry_failed,
                           keep_traces=keep_traces, simulator=simulator, finalists=finalists)
    stopped = signal.SIGINT

    def terminate(signum, frame) -> NoReturn:
        nonlocal stopped
        stopped = signum
        raise KeyboardInterrupt  # stops the running points as Ctrl-C does

    signal.signal(signal.SIGTERM, terminate)
    try:
        with _progress(as_json) as bars:
            task = bars.add_task("sweeping points", total=None)
            outcome = run_sweep(request, lambda done, total: bars.update(task, completed=done, total=total))
    except KeyboardInterrupt:
        stderr.print(f"[bold red]interrupted:[/] every finished point is recorded in {output}; rerun to resume")
        sys.exit(128 + stopped)
    unplotted = no_plot(outcome.records) if plot else None
    if plot and unplotted is None:
        from flint.exploration.plot import plot_sweep

        plot_sweep(outcome.records, plot, f"{outcome.spec.model.name}: {len(outcome.records)} points")
    if as_json:
        click.echo(json.dumps(outcome.records, indent=2))
    else:
        stdout.print(sweep_view(outcome.records, top, outcome.ran, outcome.reused, outcome.duplicates))
        drawn = plot and unplotted is None
        stdout.print(f"results in {output / 'results.csv'}" + (f", plot in {plot}" if drawn else ""))
    if unplotted is not None:  # after the ranking, which the sweep still gives
        raise FlintError(f"--plot {plot}: {unplotted}")


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--mesh", "mesh_spec", required=True, metavar="MESH", help="Virtual device mesh, as for extract.")
@click.option("--traces", type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="Validate this trace (an --stage optimized extraction, run with the layout and "
                   "model arguments its manifest records) instead of a fresh one.")
@_model_arg_option
@click.option("--json", "as_json", is_flag=True, help="Print the verdict, counts and times as JSON.")
@_timing_options
def validate(model, mesh_spec, traces, model_args, as_json, device_spec, durations, link_gbps, link_latency_us):
    """Run the step and check its trace.

    MODEL is a model file as for extract (JAX or PyTorch). The step runs once on the virtual
    devices with random inputs under JAX's profiler. Every executed collective must match one trace
    node by kind, group and bytes (exit 1 otherwise, listing each disagreement); compute ops are
    matched by count, and measured times are set beside predicted ones per kind.
    """
    from flint.analysis.validate import ValidateRequest
    from flint.analysis.validate import validate as run_validate
    from flint.frontend import parse_model_arg
    from flint.analysis.views import validation_view
    from flint.isolation import stdout_to_stderr
    from flint.trace.timing import Compute, Link, reader_compute

    # A given trace is timed as the other readers time it. A fresh one is extracted on --device (an
    # H100 without one) with roofline durations, which are its own, so it is timed likewise.
    device = load_device(device_spec or "h100")
    if traces:
        compute = _compute(_trace_files(traces, None), device_spec, durations)
    elif device_spec:
        compute = reader_compute(device_spec, durations, None)
    else:
        compute = Compute(device, "roofline" if durations in (None, "trace") else durations)
    request = ValidateRequest(
        model=model,
        mesh=parse_mesh(mesh_spec),
        device=device,
        compute=compute,
        link=Link(link_gbps, link_latency_us),
        traces=traces,
        command=shlex.join(["flint", *sys.argv[1:]]),
        model_args=tuple(map(parse_model_arg, model_args)),
    )
    with stdout_to_stderr():
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
        stdout.print(validation_view(verdict, compute.label))
    if not verdict.ok:
        stderr.print(f"[bold red]the graph and the execution disagree on {len(verdict.disagreements)} "
                     "transfers[/]")
        if verdict.costliest_branches:
            stderr.print(f"[yellow]note:[/] {_branches(verdict.costliest_branches)}; the random inputs "
                         "may have taken another")
        sys.exit(1)


def _calibrate_network(paths, output: Path, network: str, ranks, nodes, algorithm, protocol, nccl, name,
                       as_json) -> None:
    """`flint calibrate --network`: fit a network file to nccl-tests output."""
    from flint.analysis.calibrate_network import calibrate_network
    from flint.analysis.nccl_tests import read_nccl_tests
    from flint.analysis.views import network_calibration_view
    from flint.step.network_files import network_named, network_toml

    if output.suffix != ".toml":
        raise FlintError(f"--output {str(output)!r}: a network file ends in .toml")
    base = network_named(network)
    runs = [read_nccl_tests(path) for path in paths]
    fit = calibrate_network(runs, base, name or f"{base.name}-calibrated", ranks, nodes, algorithm, protocol, nccl)
    on = ", ".join(p.name for p in paths)
    source = f"flint calibrate --network {network} on {on} (in-place times{fit.runs[0].held_to})"
    fitted = fit.network.with_sources(**{key: source for key in fit.fitted})
    if fit.network.nccl != base.nccl:  # the runs' release, not the file's
        fitted = fitted.with_sources(nccl=f"the NCCL release that ran {on} ({fit.release_from})")
    try:  # encoded before the file is opened: a name that is not UTF-8 leaves no file behind
        text = network_toml(fitted, f"{fitted.name}: fitted by flint calibrate --network").encode()
    except UnicodeEncodeError:
        raise FlintError("--name or a measured file's name holds bytes that are not UTF-8, which a TOML file "
                         "cannot: give names in UTF-8") from None
    write_whole(output, text)
    if as_json:
        click.echo(json.dumps(fit.as_json(), indent=2))
        return
    stdout.print(network_calibration_view(fit))
    stdout.print(f"wrote {output}: use it as --network {shlex.quote(str(output))}")


def _branches(count: int) -> str:
    plural = "s" if count > 1 else ""
    return (f"{count} conditional{plural} whose selector depends on data or on the rank, traced as "
            "the costliest branch")


@main.command()
@click.argument("pairs", nargs=-1, required=True, type=click.Path(path_type=Path),
                metavar="PROFILE TRACE [...] | NCCL_TESTS...")
@click.option("-o", "--output", type=OutputFile(), required=True,
              help="Device file (.toml, for --device) or, with --network, network file (.toml, for "
                   "--network) to write.")
@click.option("--rank", type=int,
              help="The traces' rank that was profiled [default: TRACE's, where it is one .et file; else 0].")
@click.option("--device", "device_spec", metavar="DEVICE", callback=_named,
              help="Device whose peaks to keep [default: the one the traces' manifests record].")
@click.option("--network", metavar="NETWORK", callback=_named,
              help="Fit this network (a built-in one or a .toml network file) to nccl-tests output instead "
                   "of a device to profiles.")
@click.option("--ranks", type=click.IntRange(min=2), help="With --network: the GPUs the nccl-tests ran on, "
              "where their output does not list them.")
@click.option("--nodes", type=click.IntRange(min=1), help="With --network: the nodes they ran on, where the "
              "output does not list them [default: 1].")
@click.option("--algorithm", type=click.Choice(ALGORITHMS, case_sensitive=False),
              help="With --network: the algorithm the runs were held to with NCCL_ALGO [default: NCCL's choice].")
@click.option("--protocol", type=click.Choice(PROTOCOLS, case_sensitive=False),
              help="With --network: the protocol the runs were held to with NCCL_PROTO [default: NCCL's choice].")
@click.option("--nccl", metavar="RELEASE",
              help="With --network: the NCCL release the runs ran (2.26.2, or 2.26 for its newest), whose tuner "
                   "picks each size's algorithm, where their output states none or one Flint has no tuner of "
                   "[default: the one it states, else the network's].")
@click.option("--name", help="Name of the fitted device or network [default: its own, with -calibrated].")
@click.option("--json", "as_json", is_flag=True, help="Print the fit as JSON.")
def calibrate(pairs, output, rank, device_spec, network, ranks, nodes, algorithm, protocol, nccl, name, as_json):
    """Fit a device to profiled steps, or a network to nccl-tests.

    Each PROFILE is one real step of a program, profiled on one GPU with JAX's profiler (the
    trace-event JSON, .json or .json.gz, that jax.profiler writes); the TRACE after it is Flint's
    trace of the same program (a directory or one rank's .et), extracted for that GPU. Kernels are
    compared by class (GEMMs, untiled transposes, Triton block-level fusions known by the trace's
    kernel names, everything else): the fit sets the device's per-kernel overhead and each class's
    efficiency so that the class's modelled time, summed over the steps, equals the measured one,
    prints the profiles beside the model before and after, per class and per step, and writes the
    device file (use it as --device). Steps of several programs give a device that carries over to
    other programs better than one program's step does.

    With --network, each argument is the output of an nccl-tests program (all_reduce_perf,
    all_gather_perf, reduce_scatter_perf, alltoall_perf, broadcast_perf, sendrecv_perf, named in
    the file's name or its header): the fit sets the bandwidth each run's largest size measures,
    the one that bounds what NCCL runs there (NVLS's or the ring's in a node; across nodes the
    NICs', or the node's where NVLS bounds NVLS-Tree, or NCCL's channels between nodes where the
    run outruns NCCL's caps per channel; a run whose largest size does not show one is refused)
    and, to the smaller sizes, NVLS's latency and step or a node's Simple ring step and LL128
    share from one-node runs, the network's latency from runs across nodes (one the sizes leave
    open, as a latency measured at one size, keeps the file's own); prints each size measured
    beside NCCL's model before and after; and writes the network file (use it as --network). Runs
    made with NCCL_ALGO or NCCL_PROTO set need --algorithm or --protocol: their output does not
    say so. To measure the NICs between two nodes, NCCL's maintainers run a ring (NCCL_ALGO=Ring).
    NCCL's tuner picks each size's algorithm, and releases pick differently: the fit takes the
    tuner of the release the runs ran, which nccl-tests from 2.17 states (nccl-library=...) and
    NCCL prints with NCCL_DEBUG set, or --nccl where they do not, and the fitted file names it.

    \b
      flint calibrate --network hgx all_reduce_perf.txt all_gather_perf.txt --ranks 8 -o my-hgx.toml
      flint calibrate --network hgx ring_all_reduce_perf.txt --algorithm Ring -o my-hgx.toml
    """
    if name is not None and not name.strip():
        raise FlintError("--name is empty: give the fitted file's name, or leave --name out for its default")
    # each fit's own options, which the other would ignore without a word
    for option, value in ({"--rank": rank, "--device": device_spec} if network else
                          {"--ranks": ranks, "--nodes": nodes, "--algorithm": algorithm,
                           "--protocol": protocol, "--nccl": nccl}).items():
        if value is not None and network:
            raise FlintError(f"{option} is for fitting a device to profiles, not a network: leave it out with "
                             "--network")
        if value is not None:
            raise FlintError(f"{option} describes nccl-tests runs, for fitting a network: give --network with it, or "
                             "leave it out")
    if network is not None:
        _calibrate_network(pairs, output, network, ranks, nodes, algorithm, protocol, nccl, name, as_json)
        return
    from flint.analysis.calibrate import ProfiledStep, device_toml, read_profile, step_name
    from flint.analysis.calibrate import calibrate as fit_device
    from flint.analysis.views import calibration_view
    from flint.trace.timing import reader_compute

    if output.suffix != ".toml":
        raise FlintError(f"--output {str(output)!r}: a device file ends in .toml")
    if len(pairs) % 2:
        raise FlintError(f"{len(pairs)} paths given: give a PROFILE and its TRACE for each step")
    steps, bases = [], {}
    for profile, trace in zip(pairs[::2], pairs[1::2]):
        files = _trace_files(trace, None, _one_rank(trace, rank), one_file_too=True)
        base = reader_compute(device_spec, "calibrated", _manifest_of(files)).device
        bases.setdefault(base.name, base)
        steps.append(ProfiledStep(step_name(profile), read_profile(profile), _read_trace(files, files.paths[0])))
    if len(bases) > 1:
        raise FlintError(f"the traces were extracted for different devices ({', '.join(sorted(bases))}): "
                         "give --device to say whose peaks to keep")
    base = next(iter(bases.values()))
    fit = fit_device(steps, base, name or f"{base.name}-calibrated")
    try:
        text = device_toml(fit, ", ".join(p.name for p in pairs[::2])).encode()
    except UnicodeEncodeError:
        raise FlintError("--name or a profile's name holds bytes that are not UTF-8, which a TOML file cannot: "
                         "give names in UTF-8") from None
    write_whole(output, text)
    if as_json:
        click.echo(json.dumps(fit.as_json(), indent=2))
        return
    for key in fit.clamped:
        stderr.print(f"[yellow]warning:[/] {key}: the profiles' kernels of this class are faster than "
                     "their peaks allow the traces': kept at 1")
    stdout.print(calibration_view(fit))
    stdout.print(f"wrote {output}: use it as --device {shlex.quote(str(output))}")


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--rank", type=int, help="The rank to draw [default: PATH's, where it is one .et file; else 0].")
@click.option("-o", "--output", type=OutputFile(), required=True,
              help="File to write: .dot/.gv (DOT text) or .svg/.png/.pdf (needs Graphviz's dot).")
@click.option("--max-nodes", type=click.IntRange(min=1), default=MAX_NODES, show_default=True,
              help="Refuse ranks with more nodes than this.")
@click.option("--prefix", help="Trace name prefix, when a directory holds several traces.")
@_groups_option
@_compute_options
@_network_options
def graph(path, rank, output, max_nodes, prefix, groups_file, device_spec, durations, network, collectives,
          link_gbps, link_latency_us):
    """Draw one rank's dependency graph.

    For small traces: nodes with cost and time, data deps solid, ctrl deps dashed. Nodes are timed
    as inspect and timeline time them: collectives as NCCL runs them on --network.
    """
    from flint.analysis.dot import untimed, write_graph
    from flint.step.models import reader_collectives
    from flint.trace.timing import Link, NodeTimer

    files = _trace_files(path, prefix, _one_rank(path, rank), groups_file, one_file_too=True)
    compute = _compute(files, device_spec, durations)
    model = reader_collectives(network, _manifest_of(files), files.num_ranks, link_gbps, link_latency_us,
                               model=collectives, device=compute.device)
    timer = NodeTimer(compute, Link(), files.groups, files.num_ranks, model)
    trace = _read_trace(files, files.paths[0])
    write_graph(trace, timer, output, max_nodes)
    ungrouped = sum(1 for node in trace.nodes if untimed(timer, node))
    if ungrouped:
        _warn_ungrouped(files, ungrouped, "drawn untimed")
    stdout.print(f"wrote {output}")

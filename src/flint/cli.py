"""`flint` command line: wires the pipeline stages to flags, and nothing else."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from flint import __version__
from flint.devices import BUILTIN, load_device
from flint.errors import FlintError
from flint.mesh import parse_mesh
from flint.partition import STAGES

stderr = Console(stderr=True, highlight=False)
stdout = Console(highlight=False)


class FlintGroup(click.Group):
    """Turns `FlintError` into one line on stderr (exit 2) unless `--debug` asks for the traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except FlintError as exc:
            if ctx.params.get("debug"):
                raise
            stderr.print(f"[bold red]error:[/] {exc}", soft_wrap=True)
            sys.exit(2)


@click.group(cls=FlintGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="flint")
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
def main(debug: bool) -> None:
    """Flint turns a JAX training or inference step into MLCommons Chakra execution traces.

    The step is partitioned by the XLA compiler for a virtual device mesh of any size, so FLOPs,
    bytes and collectives are exactly what the compiler produced. The traces feed ASTRA-sim.

    \b
    Quick start:
      flint extract examples/mlp.py --mesh 8x8 -o traces/
      flint inspect traces/
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
@click.option("--stage", type=click.Choice(STAGES), default="partitioned", show_default=True,
              help="Module to trace: right after SPMD partitioning, or fully optimised.")
@click.option("--dump-ir", type=click.Path(path_type=Path), metavar="DIR",
              help="Also write the traced StableHLO module as text into DIR.")
@click.option("--loop-trips", type=click.IntRange(min=0), metavar="N",
              help="Unroll loops whose trip count is not static N times (default: refuse them).")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
@click.option("--strict", is_flag=True, help="Fail on ops that have no cost rule instead of warning.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (no progress bars).")
def extract(model, mesh_spec, output, name, device_spec, stage, dump_ir, loop_trips, force, strict,
            as_json):
    """Extract Chakra traces of the step defined in MODEL.

    MODEL is a Python file defining `workload(mesh)`, which returns `(step, args)`: the step function
    and its arguments as jax.ShapeDtypeStructs with NamedShardings over `mesh` (see examples/mlp.py).

    Writes NAME.<rank>.et for every rank, NAME.comm_groups.json (for ASTRA-sim's
    --comm-group-configuration), NAME.graph.json (one rank's workload graph) and manifest.json.
    """
    from flint.emit import prepare_output
    from flint.pipeline import ExtractRequest, extract as run_extract

    started = time.perf_counter()
    request = ExtractRequest(
        model=model,
        mesh=parse_mesh(mesh_spec),
        output=prepare_output(output, force),
        device=load_device(device_spec),
        name=name,
        stage=stage,
        dump_ir=dump_ir,
        strict=strict,
        loop_trips=loop_trips,
        command=shlex.join(["flint", *sys.argv[1:]]),
    )
    with _progress(as_json) as bars:
        task = bars.add_task("writing rank traces", total=request.mesh.size, visible=False)

        def on_progress(stage_name: str, done: int, total: int) -> None:
            bars.update(task, completed=done, total=total, visible=True)

        result = run_extract(request, on_progress)
    for op in result.graph.unknown_ops:
        stderr.print(f"[yellow]warning:[/] no cost rule for {op}: emitted with bytes only (--strict fails)")
    summary = {
        "name": request.name or result.workload.name,
        "ranks": request.mesh.size,
        "mesh": str(request.mesh),
        "output": str(request.output),
        "files": len(result.files),
        "per_rank": result.totals[0][1].as_json(),
        "ranks_alike": len(result.totals) == 1,
        "seconds": round(time.perf_counter() - started, 3),
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        _format_summary(summary)


def _trace_files(path: Path, prefix: str | None) -> list[Path]:
    from flint.trace.reader import find_traces

    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FlintError(f"{str(path)!r} does not exist: give a trace directory or one .et file")
    try:
        return find_traces(path, prefix)[1]
    except (FileNotFoundError, ValueError) as exc:
        raise FlintError(f"{exc}: give a directory that holds <prefix>.<rank>.et files") from None


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--rank", type=int, help="Show this rank only.")
@click.option("--prefix", help="Trace name prefix, when a directory holds several traces.")
@click.option("--json", "as_json", is_flag=True, help="Print the per-rank summaries as JSON.")
def inspect(path, rank, prefix, as_json):
    """Summarise a Chakra trace: nodes by type, FLOPs, bytes and collectives per rank.

    PATH is a trace directory or a single .et file; any trace following the Chakra schema works.
    """
    from rich.table import Table

    from flint.trace.errors import TraceFormatError
    from flint.trace.reader import parse_trace_name, read_trace
    from flint.trace.summary import summarize

    files = _trace_files(path, prefix)
    if rank is not None:
        files = [f for f in files if (parse_trace_name(f) or ("", -1))[1] == rank]
        if not files:
            raise FlintError(f"no trace file for rank {rank} in {str(path)!r}")
    try:
        summaries = [summarize(read_trace(f)) for f in files]
    except TraceFormatError as exc:
        raise FlintError(f"not a readable Chakra trace: {exc}") from None
    if as_json:
        click.echo(json.dumps([s.as_json() for s in summaries], indent=2))
        return
    table = Table(title=f"{path} ({len(summaries)} ranks)")
    for column in ("rank", "nodes", "by type", "FLOPs", "bytes", "collectives", "send/recv"):
        table.add_column(column, justify="right" if column not in ("by type", "collectives") else "left")
    for s in summaries:
        table.add_row(
            str(s.rank),
            str(s.nodes),
            ", ".join(f"{k.removesuffix('_NODE')} {v}" for k, v in s.nodes_by_type.items()),
            f"{s.flops:,}",
            f"{s.bytes:,}",
            ", ".join(f"{k} {c}x {b:,} B" for k, (c, b) in s.collectives.items()) or "-",
            f"{s.sends}/{s.recvs}",
        )
    stdout.print(table)


@main.command()
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--prefix", help="Trace name prefix, when the directory holds several traces.")
def check(directory, prefix):
    """Check a trace directory against every rule ASTRA-sim depends on (exit 1 on violations)."""
    from flint.trace.contract import check_traces

    _trace_files(directory, prefix)
    violations = check_traces(directory, prefix)
    for violation in violations:
        click.echo(str(violation))
    if violations:
        stderr.print(f"[bold red]{len(violations)} contract violations[/]")
        sys.exit(1)
    stdout.print(f"{directory}: every rank follows the trace contract")

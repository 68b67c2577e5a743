"""Rich tables for what `inspect`, `timeline` and `validate` report; the JSON forms are the
artifacts' own `as_json`. Kept apart from the CLI so that it only wires options to modules.

Numbers are never wrapped or cut, in a terminal of any width or in a pipe (80 columns): text
columns give way first (folded, not cut), and a per-rank table too wide for the terminal is split
in two.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table

from flint.analysis.summary import TraceSummary, spread
from flint.step.schedule import Timeline
from flint.analysis.validate import Validation


def plural(count: int, noun: str) -> str:
    """`1 rank`, `2 ranks`."""
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def _table(title: str, columns: Sequence[str], texts: Sequence[str] = (),
           cut: Sequence[str] = ()) -> Table:
    """Columns named in `texts` are left-aligned and fold where the terminal is narrow, those in
    `cut` (long names) end in an ellipsis; all others hold numbers: right-aligned, never wrapped."""
    table = Table(title=title)
    for column in columns:
        if column in cut:
            table.add_column(column, overflow="ellipsis")
        elif column in texts:
            table.add_column(column, overflow="fold")
        else:
            table.add_column(column, justify="right", no_wrap=True)
    return table


def inspect_view(source: str, summaries: Sequence[TraceSummary], compute: str = "the trace's durations",
                 collectives: str = "alpha-beta") -> RenderableType:
    """Per-rank totals, their spread across ranks, and the details of the first rank shown;
    `source` is the directory or file they were read from, `compute` and `collectives` how compute
    and communication were timed."""
    parts: list[RenderableType] = [_PerRank(f"{source} ({plural(len(summaries), 'rank')})", summaries)]
    if len(summaries) > 1:
        parts.append(_spread(summaries))
    first = summaries[0]
    if first.by_group_size:
        table = _table(f"rank {first.rank}: collectives by kind and group size",
                       ("kind", "group size", "count", "bytes"), texts=("kind",))
        for (kind, n), (count, nbytes) in first.by_group_size.items():
            table.add_row(kind, "?" if n is None else str(n), str(count), f"{nbytes:,}")
        parts.append(table)
    if first.sends_to or first.recvs_from:
        table = _table(f"rank {first.rank}: send/recv peers", ("direction", "peer", "count", "bytes"),
                       texts=("direction",))
        for direction, peers in (("send to", first.sends_to), ("recv from", first.recvs_from)):
            for peer, (count, nbytes) in peers.items():
                table.add_row(direction, str(peer), str(count), f"{nbytes:,}")
        parts.append(table)
    if first.heaviest:
        table = _table(f"rank {first.rank}: heaviest nodes (compute: {compute}; collectives: {collectives})",
                       ("id", "name", "type", "µs", "FLOPs", "bytes"), texts=("type",), cut=("name",))
        for node in first.heaviest:
            table.add_row(str(node.id), node.name, node.type, f"{node.micros:,.1f}",
                          f"{node.flops:,}", f"{node.bytes:,}")
        parts.append(table)
    return Group(*parts)


class _PerRank:
    """One row per rank: its numbers, node types and collectives in one table where the terminal
    has room for the text columns without breaking their words, else in two tables."""

    NUMBERS = ("rank", "nodes", "FLOPs", "bytes", "send/recv")
    TEXTS = ("by type", "collectives")

    def __init__(self, title: str, summaries: Sequence[TraceSummary]):
        self.title = title
        self.rows = [
            {
                "rank": str(s.rank),
                "nodes": str(s.nodes),
                "by type": ", ".join(f"{k} {v}" for k, v in s.nodes_by_type.items()),
                "FLOPs": f"{s.flops:,}",
                "bytes": f"{s.bytes:,}",
                "collectives": ", ".join(f"{k} {c}x {b:,} B"
                                         for k, (c, b) in s.group_collectives.items()) or "-",
                "send/recv": f"{s.sends}/{s.recvs}",
            }
            for s in summaries
        ]

    def _widest(self, column: str, words: bool = False) -> int:
        """The longest cell of `column` (with `words`, its longest word), its header included."""
        cells = [column, *(row[column] for row in self.rows)]
        return max(len(part) for cell in cells for part in (cell.split() if words else [cell]))

    def _table(self, title: str, columns: Sequence[str]) -> Table:
        table = _table(title, columns, texts=self.TEXTS)
        for row in self.rows:
            table.add_row(*(row[column] for column in columns))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # Rich narrows the text columns alike, so each needs room for the longest word of either;
        # every column takes a space either side and a border.
        word = max(self._widest(column, words=True) for column in self.TEXTS)
        widths = [self._widest(column) for column in self.NUMBERS] + [word] * len(self.TEXTS)
        if sum(width + 3 for width in widths) + 1 <= options.max_width:
            yield self._table(self.title, ("rank", "nodes", "by type", "FLOPs", "bytes",
                                           "collectives", "send/recv"))
        else:
            # Where even the numbers do not fit, the table grows wider than the terminal rather
            # than cut them (a console that soft-wraps, as flint's does, prints its lines whole).
            width = sum(self._widest(column) + 3 for column in self.NUMBERS) + 1
            yield from console.render(self._table(self.title, self.NUMBERS),
                                      options.update_width(max(width, options.max_width)))
            yield self._table("nodes by type and collectives", ("rank", *self.TEXTS))


def _spread(summaries: Sequence[TraceSummary]) -> Table:
    table = _table(f"spread across {plural(len(summaries), 'rank')}",
                   ("per rank", "min", "rank", "max", "rank"), texts=("per rank",))
    for row in spread(summaries):
        table.add_row(row.metric, f"{row.low:,}", str(row.low_rank), f"{row.high:,}", str(row.high_rank))
    return table


def timeline_view(timeline: Timeline) -> Table:
    """Step time and where it went, as min and max across ranks."""
    table = _table(f"one step: {timeline.step:,.1f} µs (critical-path schedule)",
                   ("per rank, µs", "min", "max"), texts=("per rank, µs",))
    for label, value in (
        ("busy computing", lambda r: r.compute),
        ("communicating", lambda r: r.communication),
        ("exposed communication", lambda r: r.exposed),
        ("finished at", lambda r: r.step),
    ):
        values = [value(r) for r in timeline.ranks]
        table.add_row(label, f"{min(values):,.1f}", f"{max(values):,.1f}")
    return table


def validation_view(validation: Validation, device: str) -> Table:
    """Counts and times per op kind, executed against traced."""
    table = _table("per op kind, mean per rank",
                   ("kind", "executed", "in trace", "measured µs", f"predicted µs ({device})"),
                   texts=("kind",))
    for row in validation.rows:
        table.add_row(row.kind, f"{row.executed:g}", f"{row.traced:g}", f"{row.measured_us:,.1f}",
                      f"{row.predicted_us:,.1f}")
    return table


def calibration_view(fit) -> Table:
    """The profile beside the kernel model, per kernel class, before and after the fit."""
    table = _table(f"{fit.device.name}: measured beside modelled, per kernel class",
                   ("class", "measured n", "traced n", "measured ms", "before ms", "after ms"))
    for c in fit.classes:
        table.add_row(c.kind, f"{c.measured_kernels:,}", f"{c.traced_kernels:,}", f"{c.measured_ms:,.1f}",
                      f"{c.before_ms:,.1f}", f"{c.after_ms:,.1f}")
    for step in fit.steps:
        table.add_row(f"step {step.name}", "", "", f"{step.measured_ms:,.1f}", f"{step.before_ms:,.1f}",
                      f"{step.after_ms:,.1f}")
    c = fit.device.calibration
    table.caption = (f"fitted: kernel overhead {c.kernel_overhead_us:g} µs, GEMM efficiency "
                     f"{c.gemm_efficiency:g}, memory efficiency {c.memory_efficiency:g}"
                     + "".join(f", {key.replace('_', ' ')} {getattr(c, key):g}"
                               for key in ("transpose_efficiency", "triton_efficiency") if key in fit.fitted))
    return table


def network_calibration_view(fit) -> Group:
    """Each nccl-tests run beside NCCL's model of it, before and after the fit, size by size."""
    tables = []
    for run in fit.runs:
        table = _table(f"{run.run.path.name}: {run.run.collective}, {run.placement.ranks} ranks on "
                       f"{run.placement.nodes} node{'s' if run.placement.nodes > 1 else ''}, in place{run.held_to}",
                       ("bytes", "measured µs", "before µs", "after µs", "ratio", "NCCL runs"), texts=("NCCL runs",))
        for row in run.rows:
            table.add_row(f"{row.size:,}", f"{row.measured:,.1f}", f"{row.before:,.1f}", f"{row.after.micros:,.1f}",
                          f"{row.after.micros / row.measured:.2f}", f"{row.after.algorithm} {row.after.protocol}")
        tables.append(table)
    fitted = ", ".join(f"{key} {value:g}" for key, value in fit.fitted.items())
    notes = [f"[yellow]note:[/] {key} ended at the end of the range tried ({fit.fitted[key]:g}): these times "
             "do not follow a latency plus bytes over a bandwidth, so the fit is as near as that form gets"
             for key in fit.at_limit]
    tuner = f"NCCL {fit.network.release}'s tuner picked ({fit.release_from})"
    return Group(*tables, f"fitted: {fitted}", tuner, *notes)

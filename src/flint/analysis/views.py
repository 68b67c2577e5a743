"""Rich tables for what `inspect`, `timeline` and `validate` report; the JSON forms are the
artifacts' own `as_json`. Kept apart from the CLI so that it only wires options to modules."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table

from flint.analysis.summary import TraceSummary, spread
from flint.analysis.timeline import Timeline
from flint.analysis.validate import Validation


def inspect_view(title: str, summaries: Sequence[TraceSummary]) -> RenderableType:
    """Per-rank totals, their spread across ranks, and the details of the first rank shown."""
    parts: list[RenderableType] = [_per_rank(title, summaries)]
    if len(summaries) > 1:
        parts.append(_spread(summaries))
    first = summaries[0]
    if first.by_group_size:
        table = Table(title=f"rank {first.rank}: collectives by kind and group size")
        for column in ("kind", "group size", "count", "bytes"):
            table.add_column(column, justify="left" if column == "kind" else "right")
        for (kind, n), (count, nbytes) in first.by_group_size.items():
            table.add_row(kind, "?" if n is None else str(n), str(count), f"{nbytes:,}")
        parts.append(table)
    if first.sends_to or first.recvs_from:
        table = Table(title=f"rank {first.rank}: send/recv peers")
        for column in ("direction", "peer", "count", "bytes"):
            table.add_column(column, justify="left" if column == "direction" else "right")
        for direction, peers in (("send to", first.sends_to), ("recv from", first.recvs_from)):
            for peer, (count, nbytes) in peers.items():
                table.add_row(direction, str(peer), str(count), f"{nbytes:,}")
        parts.append(table)
    if first.heaviest:
        table = Table(title=f"rank {first.rank}: heaviest nodes (roofline and alpha-beta time)")
        for column in ("id", "name", "type", "µs", "FLOPs", "bytes"):
            table.add_column(column, justify="left" if column in ("name", "type") else "right")
        for node in first.heaviest:
            table.add_row(str(node.id), node.name, node.type, f"{node.micros:,.1f}",
                          f"{node.flops:,}", f"{node.bytes:,}")
        parts.append(table)
    return Group(*parts)


def _per_rank(title: str, summaries: Sequence[TraceSummary]) -> Table:
    table = Table(title=title)
    for column in ("rank", "nodes", "by type", "FLOPs", "bytes", "collectives", "send/recv"):
        table.add_column(column, justify="left" if column in ("by type", "collectives") else "right")
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
    return table


def _spread(summaries: Sequence[TraceSummary]) -> Table:
    table = Table(title=f"spread across {len(summaries)} ranks")
    for column in ("per rank", "min", "rank", "max", "rank"):
        table.add_column(column, justify="left" if column == "per rank" else "right")
    for row in spread(summaries):
        table.add_row(row.metric, f"{row.low:,}", str(row.low_rank), f"{row.high:,}", str(row.high_rank))
    return table


def timeline_view(timeline: Timeline) -> Table:
    """Step time and where it went, as min and max across ranks."""
    table = Table(title=f"one step: {timeline.step:,.1f} µs (critical-path schedule)")
    for column in ("per rank, µs", "min", "max"):
        table.add_column(column, justify="left" if column.startswith("per") else "right")
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
    table = Table(title="per op kind, mean per rank")
    columns = ("kind", "executed", "in trace", "measured µs", f"predicted µs ({device})")
    for column in columns:
        table.add_column(column, justify="left" if column == "kind" else "right")
    for row in validation.rows:
        table.add_row(row.kind, f"{row.executed:g}", f"{row.traced:g}", f"{row.measured_us:,.1f}",
                      f"{row.predicted_us:,.1f}")
    return table

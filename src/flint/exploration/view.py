"""The terminal view of a sweep: its best points, ranked, and what did not run and why.

Each setting that varies across the sweep's points (mesh, strategy, pipeline, backend, device,
network, collectives, durations, stage, donate, each model argument) is a column of the ranking
and a part of each point's label on the plot; the settings every point shares are one line under
the table. The numbers never fold; in a narrow terminal the text columns do."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import PurePath
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from flint.exploration.rank import ranked


def _pipeline(record: dict[str, Any]) -> str:
    stages = record.get("pipeline_stages")
    if not stages:
        return "-"
    virtual = f", {record['virtual_stages']} virtual" if record.get("virtual_stages") else ""
    return f"{stages} x {record.get('schedule') or '1f1b'}, {record.get('microbatches') or stages} mb{virtual}"


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "-" if value is None else str(value)


def _option(name: str) -> Callable[[dict[str, Any]], str]:
    return lambda record: _value(record.get(name))


def _model_arg(name: str) -> Callable[[dict[str, Any]], str]:
    return lambda record: _value((record.get("model_args") or {}).get(name))


SETTINGS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("model", lambda record: PurePath(record["model"]).name if record.get("model") else "-"),
    ("mesh", _option("mesh")),
    ("strategy", lambda record: record.get("strategy") or "model's"),
    ("pipeline", _pipeline),
    *((name, _option(name)) for name in ("backend", "device", "network", "collectives", "durations", "stage",
                                         "donate")),
)
"""A point's settings as the ranking shows them, by name (a model argument's are added by name)."""


def settings(records: Sequence[dict[str, Any]]) -> tuple[list[tuple[str, Callable]], list[str]]:
    """The settings that vary across `records` (name, how to show it), and those every record
    shares that the sweep set (`network hgx`, a model argument as `batch=8`)."""
    arguments = dict.fromkeys(name for record in records for name in record.get("model_args") or {})
    varying, shared = [], []
    for name, show in (*SETTINGS, *((name, _model_arg(name)) for name in arguments)):
        values = {show(record) for record in records}
        if len(values) > 1:
            varying.append((name, show))
        elif values and (value := values.pop()) not in ("-", "model's"):
            shared.append(f"{name}={value}" if name in arguments else f"{name} {value}")
    return varying, shared


BARE = ("mesh", "strategy", "pipeline")
"""Settings a plot's label gives as their value alone: they read as themselves (data=8,tensor=8 dp+tp)."""


def labels(records: Sequence[dict[str, Any]], among: Sequence[dict[str, Any]]) -> list[str]:
    """Each of `records`' label on a plot: its settings that vary across `among` (the sweep's
    points) and apply to it (no pipeline where it has none), `BARE` ones as their value, the others
    as name=value."""
    varying, _ = settings(among)
    return [" ".join(value if name in BARE else f"{name}={value}" for name, show in varying
                     if (value := show(record)) != "-") for record in records]


def sweep_view(records: Sequence[dict[str, Any]], top: int, ran: int, reused: int, duplicates: int = 0) -> Group:
    best = ranked(records)
    simulated = any(r.get("simulated_step_us") is not None for r in best)
    finalists = any(r.get("finalist") for r in best)
    source = ("Flint's estimator; ASTRA-sim on the finalists" if finalists else
              "ASTRA-sim" if simulated else "Flint's estimator")
    table = Table(title=f"best {min(top, len(best))} of {len(best)} points (step: {source})")
    varying, shared = settings(records)
    steps = ("estimator ms", "ASTRA-sim ms") if finalists else ("step ms",)
    table.add_column("#", justify="right", no_wrap=True)
    for name, _ in varying:
        table.add_column(name, justify="left", overflow="fold")
    for column in (*steps, "GiB/rank", "fits"):
        table.add_column(column, justify="left" if column == "fits" else "right", no_wrap=True)
    for place, record in enumerate(best[:top], 1):
        memory = record.get("memory_per_rank_bytes")
        fits = {True: "yes", False: "[red]no[/]", None: "?"}[record.get("fits")]
        simulated_us = record.get("simulated_step_us")
        shown = [f"{record['step_us'] / 1e3:,.3f}"]
        if finalists:
            shown.append("-" if simulated_us is None else f"{simulated_us / 1e3:,.3f}")
        table.add_row(str(place), *(show(record) for _, show in varying), *shown,
                      "?" if memory is None else f"{memory / 2**30:,.2f}", fits)
    lines: list = [table]
    if shared:
        lines.append(Text("every point: " + "; ".join(shared), style="dim"))
    counts = Counter(r.get("status") for r in records)
    same = f", {duplicates} the same as another point" if duplicates else ""
    lines.append(Text(f"{counts['ok']} ran, {counts['skipped']} skipped, {counts['failed']} failed "
                      f"({ran} run now, {reused} from earlier runs{same})"))
    reasons = Counter(r["reason"] for r in records if r.get("status") in ("skipped", "failed") and r.get("reason"))
    for reason, count in reasons.most_common(5):
        lines.append(Text(f"  {count} x {reason}", style="dim"))
    return Group(*lines)

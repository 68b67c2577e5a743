"""The terminal view of a sweep: its best points, ranked, and what did not run and why."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from flint.exploration.rank import ranked


def _pipeline(record: dict[str, Any]) -> str:
    stages = record.get("pipeline_stages")
    if not stages:
        return "-"
    return f"{stages} x {record.get('schedule') or '1f1b'}, {record.get('microbatches') or stages} mb"


def _args(record: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in (record.get("model_args") or {}).items()) or "-"


def sweep_view(records: Sequence[dict[str, Any]], top: int, ran: int, reused: int) -> Group:
    best = ranked(records)
    simulated = any(r.get("simulated_step_us") is not None for r in best)
    finalists = any(r.get("finalist") for r in best)
    source = ("Flint's estimator; ASTRA-sim on the finalists" if finalists else
              "ASTRA-sim" if simulated else "Flint's estimator")
    table = Table(title=f"best {min(top, len(best))} of {len(best)} points (step: {source})")
    steps = (("estimator ms", "right"), ("ASTRA-sim ms", "right")) if finalists else (("step ms", "right"),)
    for column, justify in (("#", "right"), ("mesh", "left"), ("strategy", "left"), ("pipeline", "left"),
                            ("model args", "left"), *steps, ("GiB/rank", "right"), ("fits", "left")):
        table.add_column(column, justify=justify, overflow="fold")
    for place, record in enumerate(best[:top], 1):
        memory = record.get("memory_per_rank_bytes")
        fits = {True: "yes", False: "[red]no[/]", None: "?"}[record.get("fits")]
        simulated_us = record.get("simulated_step_us")
        shown = [f"{record['step_us'] / 1e3:,.3f}"]
        if finalists:
            shown.append("-" if simulated_us is None else f"{simulated_us / 1e3:,.3f}")
        table.add_row(str(place), record["mesh"], record.get("strategy") or "model's", _pipeline(record),
                      _args(record), *shown,
                      "?" if memory is None else f"{memory / 2**30:,.2f}", fits)
    counts = Counter(r.get("status") for r in records)
    lines: list = [table, Text(f"{counts['ok']} ran, {counts['skipped']} skipped, {counts['failed']} failed "
                               f"({ran} run now, {reused} from earlier runs)")]
    reasons = Counter(r["reason"] for r in records if r.get("status") in ("skipped", "failed") and r.get("reason"))
    for reason, count in reasons.most_common(5):
        lines.append(Text(f"  {count} x {reason}", style="dim"))
    return Group(*lines)

"""Which points win: those that fit in device memory, fastest first; and the Pareto front of step
time against memory per rank (no other point is both faster and smaller)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def ranked(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points that ran, fitting ones first (unknown memory counts as fitting), each group by
    step time, ties by id."""
    ran = [r for r in records if r.get("status") == "ok" and r.get("step_us") is not None]
    return sorted(ran, key=lambda r: (r.get("fits") is False, r["step_us"], r["id"]))


def pareto_front(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points no other point beats on both step time and memory per rank, by memory."""
    points = sorted((r for r in ranked(records) if r.get("memory_per_rank_bytes") is not None),
                    key=lambda r: (r["memory_per_rank_bytes"], r["step_us"]))
    front, best = [], float("inf")
    for record in points:
        if record["step_us"] < best:
            front.append(record)
            best = record["step_us"]
    return front

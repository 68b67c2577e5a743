"""`flint sweep --plot`: step time against memory per rank, one dot per point, the Pareto front
drawn through the points no other beats on both."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flint.errors import FlintError
from flint.exploration.rank import pareto_front, ranked


def plot_sweep(records: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise FlintError("--plot needs matplotlib: pip install 'flint-traces[plot]'") from None
    points = [r for r in ranked(records) if r.get("memory_per_rank_bytes") is not None]
    if not points:
        raise FlintError("--plot: no point ran with a memory figure to plot")
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = {True: "tab:blue", None: "tab:blue", False: "tab:red"}
    ax.scatter([r["memory_per_rank_bytes"] / 2**30 for r in points], [r["step_us"] / 1e3 for r in points],
               c=[colors[r.get("fits")] for r in points], s=18, alpha=0.7, label="points (red: does not fit)")
    front = pareto_front(points)
    ax.plot([r["memory_per_rank_bytes"] / 2**30 for r in front], [r["step_us"] / 1e3 for r in front],
            "k.-", label="Pareto front")
    for record in front:
        ax.annotate(f"{record['mesh']} {record.get('strategy') or ''}".strip(), (record["memory_per_rank_bytes"] / 2**30, record["step_us"] / 1e3),
                    fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("memory per rank (GiB)")
    ax.set_ylabel("step time (ms)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path)
    except (OSError, ValueError) as exc:
        raise FlintError(f"cannot write plot {path}: {exc}") from None
    finally:
        plt.close(fig)

"""`flint sweep --plot`: step time against memory per rank, one dot per point, the Pareto front
drawn through the points no other beats on both, each labelled by the settings that vary across
the sweep. A spec whose every point is pipelined (no memory figure) is refused before any point
runs; a sweep none of whose points that ran has one gets its ranking, and one line why no plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flint.errors import FlintError
from flint.exploration.rank import pareto_front, ranked
from flint.exploration.spec import SweepSpec
from flint.exploration.view import labels

NO_MEMORY = "a pipelined point has no memory figure"


def refusal(spec: SweepSpec) -> str | None:
    """Why no point of `spec` could be plotted, where the spec alone says so (every point it runs
    is pipelined), so that --plot is refused before any point runs."""
    runs = [p for p in spec.points if p.key not in spec.skipped]
    if runs and all(p.pipeline_stages for p in runs):
        return (f"--plot: every point of {spec.path} is pipelined (a pp axis above 1) and {NO_MEMORY}: "
                "nothing to plot; drop --plot, or add meshes without a pipeline axis")
    return None


def no_plot(records: Sequence[dict[str, Any]]) -> str | None:
    """Why `records` give no plot (none ran, or none that ran has a memory figure), or None."""
    ran = ranked(records)
    if not ran:
        return "no point ran, so there is no plot"
    if not any(r.get("memory_per_rank_bytes") is not None for r in ran):
        pipelined = all(r.get("pipeline_stages") for r in ran)
        return f"no point that ran has a memory figure{f' ({NO_MEMORY})' if pipelined else ''}, so there is no plot"
    return None


def plot_sweep(records: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise FlintError("--plot needs matplotlib: pip install 'flint-traces[plot]'") from None
    if (reason := no_plot(records)) is not None:
        raise FlintError(f"--plot: {reason}")
    points = [r for r in ranked(records) if r.get("memory_per_rank_bytes") is not None]
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = {True: "tab:blue", None: "tab:blue", False: "tab:red"}
    ax.scatter([r["memory_per_rank_bytes"] / 2**30 for r in points], [r["step_us"] / 1e3 for r in points],
               c=[colors[r.get("fits")] for r in points], s=18, alpha=0.7, label="points (red: does not fit)")
    front = pareto_front(points)
    ax.plot([r["memory_per_rank_bytes"] / 2**30 for r in front], [r["step_us"] / 1e3 for r in front],
            "k.-", label="Pareto front")
    for record, label in zip(front, labels(front, records)):
        ax.annotate(label or record["mesh"], (record["memory_per_rank_bytes"] / 2**30, record["step_us"] / 1e3),
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

"""Per-rank stacked bars of one scheduled step: compute, exposed communication, idle.

matplotlib is an optional dependency (`pip install 'flint-traces[plot]'`), imported only here.
"""

from __future__ import annotations

import os

from flint.step.schedule import Timeline
from flint.errors import FlintError

SEGMENTS = (
    ("compute", "#4c72b0"),
    ("exposed communication", "#dd8452"),
    ("idle", "#d9d9d9"),
)


def plot_ranks(timeline: Timeline, path: str | os.PathLike[str], title: str) -> None:
    """Write a bar per rank whose segments add up to the step time (µs): the slowest rank sets it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        raise FlintError(
            "--plot needs matplotlib: pip install 'flint-traces[plot]' (or pip install matplotlib)"
        ) from None
    ranks = [r.rank for r in timeline.ranks]
    heights = {
        "compute": [r.compute for r in timeline.ranks],
        "exposed communication": [r.exposed for r in timeline.ranks],
        "idle": [max(0.0, timeline.step - r.compute - r.exposed) for r in timeline.ranks],
    }
    figure, axes = pyplot.subplots(figsize=(max(6.0, 0.25 * len(ranks) + 2), 4))
    bottom = [0.0] * len(ranks)
    for label, color in SEGMENTS:
        axes.bar(ranks, heights[label], bottom=bottom, color=color, label=label, width=0.8)
        bottom = [b + h for b, h in zip(bottom, heights[label], strict=True)]
    axes.set_xlabel("rank")
    axes.set_ylabel("time in one step (µs)")
    axes.set_title(title)
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=len(SEGMENTS), frameon=False)
    try:
        figure.savefig(path, dpi=120, bbox_inches="tight")
    except OSError as exc:
        raise FlintError(f"cannot write {str(path)!r}: {exc.strerror}") from None
    finally:
        pyplot.close(figure)

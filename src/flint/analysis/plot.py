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
    """Write a bar per rank whose segments add up to the step time (µs): the slowest rank sets it.
    Scheduled one rank per class, a bar per class, labelled with the ranks it stands for."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        raise FlintError(
            "--plot needs matplotlib: pip install 'flint-traces[plot]' (or pip install matplotlib)"
        ) from None
    ranks, labels, xlabel = bars(timeline)
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
    if labels is not None:
        axes.set_xticks(ranks, labels, rotation=90 if len(ranks) > 8 else 0)
    axes.set_xlabel(xlabel)
    axes.set_ylabel("time in one step (µs)")
    axes.set_title(title)
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=len(SEGMENTS), frameon=False)
    try:
        figure.savefig(path, dpi=120, bbox_inches="tight")
    except OSError as exc:
        raise FlintError(f"cannot write {str(path)!r}: {exc.strerror}") from None
    finally:
        pyplot.close(figure)


def bars(timeline: Timeline) -> tuple[list[int], list[str] | None, str]:
    """Where each scheduled rank's bar stands, its tick label (None: the rank numbers on the axis)
    and the axis's label: at its rank, or, scheduled one rank per class, side by side, labelled
    with the ranks of its class (before, a bar stood at its one rank and the rest of the axis
    looked like ranks that took no time)."""
    if timeline.represents is None:
        return [r.rank for r in timeline.ranks], None, "rank"
    labels = [_members(timeline.represents[r.rank]) for r in timeline.ranks]
    return list(range(len(timeline.ranks))), labels, "the ranks of a class (one scheduled for each)"


def _members(ranks: list[int]) -> str:
    """A class's ranks in a tick label: '0-3', or the first and how many more where they are not
    consecutive."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return str(ranks[0])
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return f"{ranks[0]} +{len(ranks) - 1}"

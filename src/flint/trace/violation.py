"""The unit of a contract report."""

from __future__ import annotations

from dataclasses import dataclass

ERROR, WARNING = "error", "warning"
"""Severities: an error is what ASTRA-sim misreads, hangs or aborts on; a warning a departure from
the contract that ASTRA-sim tolerates (it reads the trace as its producer meant)."""


@dataclass(frozen=True)
class Violation:
    """One broken contract rule, located as precisely as the rule allows.

    ``rank`` and ``node_id`` are None for findings that belong to no single rank or node
    (e.g. a bad comm-groups file, or a collective a rank never issued). ``count`` is how many
    places share this finding where warnings alike are reported once (the first of them here).
    """

    rule: str
    rank: int | None
    node_id: int | None
    message: str
    severity: str = ERROR
    count: int = 1

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    def __str__(self) -> str:
        where = " ".join(
            f"{label} {value}"
            for label, value in (("rank", self.rank), ("node", self.node_id))
            if value is not None
        )
        text = f"{self.message} [{self.rule}]"
        if self.count > 1:
            text += f" ({self.count:,} times, the first here)"
        return f"{where}: {text}" if where else text

    def as_json(self) -> dict:
        return {"rule": self.rule, "severity": self.severity, "rank": self.rank,
                "node_id": self.node_id, "message": self.message, "count": self.count}

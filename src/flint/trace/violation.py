"""The unit of a contract report."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Violation:
    """One broken contract rule, located as precisely as the rule allows.

    ``rank`` and ``node_id`` are None for findings that belong to no single rank or node
    (e.g. a bad comm-groups file, or a collective a rank never issued).
    """

    rule: str
    rank: int | None
    node_id: int | None
    message: str

    def __str__(self) -> str:
        where = " ".join(
            f"{label} {value}"
            for label, value in (("rank", self.rank), ("node", self.node_id))
            if value is not None
        )
        text = f"{self.message} [{self.rule}]"
        return f"{where}: {text}" if where else text

"""A sweep's results on disk: `results.jsonl`, one record appended per finished point (the log a
rerun resumes from), and `results.csv`, the latest record of every point, rewritten whole.

The log is read back tolerantly: a run killed mid-write leaves a truncated last line, which is
ignored (that point simply runs again) and dropped before the next record is appended, so that the
two do not run together into one invalid line (a last record missing only its newline is kept, and
ended). Where either file cannot be read or written (a directory in its place, a full disk), the
sweep stops with one line naming it, and no staged copy is left beside it.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flint.emit.writer import write_whole
from flint.errors import FlintError
from flint.exploration.point import COLUMNS

LOG, TABLE = "results.jsonl", "results.csv"


class ResultStore:
    """The records of one sweep directory, by point id (the latest record of each)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.records: dict[str, dict[str, Any]] = {}
        self._unended: tuple[int, bool] | None = None
        """Where the log's last line starts, and whether it is a record, if it has no newline."""
        for name in (LOG, TABLE):
            if (directory / name).is_dir():
                raise FlintError(f"{str(directory / name)!r} is a directory, where the sweep keeps its results: "
                                 "remove it or choose another -o")
        log = directory / LOG
        if log.exists():
            try:
                data = log.read_bytes()
            except OSError as exc:
                raise FlintError(f"cannot read {str(log)!r}: {exc.strerror}") from None
            for line in data.decode(errors="replace").splitlines():
                record = _record(line)
                if record is not None:
                    self.records[record["id"]] = record
            if data and not data.endswith(b"\n"):
                start = data.rfind(b"\n") + 1
                self._unended = (start, _record(data[start:].decode(errors="replace")) is not None)

    def done(self, retry_failed: bool) -> set[str]:
        """Points that need not run again: finished or skipped, and failed unless retried."""
        again = {"failed"} if retry_failed else set()
        return {key for key, record in self.records.items() if record.get("status") not in again}

    def add(self, record: dict[str, Any]) -> None:
        self.records[record["id"]] = record
        try:
            if self._unended is not None:
                self._end_log(*self._unended)
                self._unended = None
            with open(self.directory / LOG, "a") as log:
                log.write(json.dumps(record, sort_keys=True) + "\n")
                log.flush()
                os.fsync(log.fileno())
        except OSError as exc:
            raise FlintError(f"cannot write {str(self.directory / LOG)!r}: {exc.strerror}") from None
        self._write_table()

    def _end_log(self, start: int, whole: bool) -> None:
        """End the log's last line: a whole record gets its newline, a cut-off one is dropped."""
        if whole:
            with open(self.directory / LOG, "a") as log:
                log.write("\n")
        else:
            os.truncate(self.directory / LOG, start)

    def _write_table(self) -> None:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, COLUMNS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for record in self.records.values():
            writer.writerow({k: json.dumps(v) if isinstance(v, dict) else v for k, v in record.items()})
        write_whole(self.directory / TABLE, buffer.getvalue().encode())

    def ordered(self, keys: Iterable[str]) -> list[dict[str, Any]]:
        return [self.records[k] for k in keys if k in self.records]


def _record(line: str) -> dict[str, Any] | None:
    """A log line's record, or None for a line that is not one (cut off by a kill, say)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("id"), str) else None

"""nccl-tests output, read: the measured collectives `flint calibrate --network` fits a network to.

nccl-tests (`all_reduce_perf`, `all_gather_perf`, ..., `sendrecv_perf`) print one row per size:
size (B), count, type, redop, root, then out-of-place time (µs), algbw, busbw, #wrong, then the
same in place (older versions lack redop and root). Flint reads the size and the in-place time
(the last group of four columns; lines of NCCL's own log, which NCCL_DEBUG=INFO interleaves, are
not rows), the collective from the file's name or its "Collective test starting" line, the ranks
and nodes from its "#  Rank  R Group G Pid P on HOST device D" lines where there are any, and the
NCCL release that ran where the output states it: nccl-tests from 2.17 prints "nccl-library=CODE"
(NCCL_VERSION_CODE, 22602 for 2.26.2) in its first line, and NCCL prints "NCCL version
2.26.2+cuda12.8" with NCCL_DEBUG=VERSION or WARN (a log line's text with INFO).

Older nccl-tests print each group's largest error (a float, such as 2e-06) where newer ones count
wrong results; those rows are read, and a footer that counts values out of bounds ("Out of bounds
values : 1 FAILED") says whether the results were wrong.

Refused: a file that states two releases, as one run ran one; a table of the out-of-place columns
only, as having no in-place column (the times Flint fits); a file of more than one run (more than
one program named, footer or row of a size, as runs concatenated give), as a run is one
collective's table; the output of a program Flint does not fit (reduce_perf, gather_perf, ...),
and a file whose name says one program and whose "Collective test starting" line another; and a
row where nccl-tests found wrong results (#wrong, in place or out of place, above 0; N/A: not
checked), or a footer that counts values out of bounds, as those times are not of a correct
collective.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from flint.errors import FlintError
from flint.schema import et_def_pb2 as pb
from flint.step.nccl import SEND_RECV

COLLECTIVES = {
    "all_reduce": pb.ALL_REDUCE, "all_gather": pb.ALL_GATHER, "reduce_scatter": pb.REDUCE_SCATTER,
    "alltoall": pb.ALL_TO_ALL, "broadcast": pb.BROADCAST, "sendrecv": SEND_RECV,
}
"""nccl-tests' programs (NAME_perf) and the collectives they time (sendrecv: a SEND/RECV pair)."""
_NAME = re.compile(rf"({'|'.join(COLLECTIVES)})_perf")
OUT_OF_PLACE_ONLY = (7, 9)
"""The widths of a row of one group of time columns: size, count, type, (redop, root,) time, algbw,
busbw, #wrong."""
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)", re.MULTILINE)
_NCCL_LOG = re.compile(r"\[\d+\] (?:.*\s)?NCCL (?:INFO|WARN|TRACE) |^\s*NCCL version \S+\s*$")
"""A line of NCCL's own log (debug.cc: "host:pid:tid [dev] NCCL INFO ...", as NCCL_DEBUG=INFO
interleaves with the table; with NCCL_DEBUG=VERSION or WARN, the bare "NCCL version ..." line)."""
_STARTING = re.compile(r"Collective test starting:\s*(\S+?)_perf\b")
"""nccl-tests' header line that names the program that ran."""
_OUT_OF_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)", re.MULTILINE)
"""nccl-tests' footer, one per run: how many values its check found out of bounds."""
_LIBRARY = re.compile(r"\bnccl-library=(\d+)")
_LOGGED = re.compile(r"\bNCCL version (\d+\.\d+\.\d+)")


@dataclass(frozen=True)
class Measurement:
    """One size of one nccl-tests run: `size` bytes as nccl-tests counts them (an all-gather's
    output, a reduce-scatter's input), its in-place time in µs."""

    size: int
    micros: float


@dataclass(frozen=True)
class NcclTestsRun:
    """One nccl-tests output file: which collective, on how many ranks and nodes (None: not
    recorded), its rows, and the NCCL release that ran (None: not stated)."""

    path: Path
    collective: str
    ranks: int | None
    nodes: int | None
    rows: tuple[Measurement, ...]
    nccl: str | None = None

    @property
    def comm_type(self) -> int:
        return COLLECTIVES[self.collective]

    @property
    def largest(self) -> Measurement:
        """The row of the largest size: the one that measures a bandwidth."""
        return max(self.rows, key=lambda row: row.size)


def read_nccl_tests(path: Path) -> NcclTestsRun:
    """One nccl-tests output file; one line saying what is wrong where it is not one."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FlintError(f"nccl-tests output {str(path)!r} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FlintError(f"cannot read nccl-tests output {str(path)!r}: {exc}") from None
    named = _program(path, text)
    rows: dict[int, Measurement] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or line.lstrip().startswith("#") or _NCCL_LOG.search(line):
            continue
        try:
            size, micros, wrong, in_place = _row(fields)
        except ValueError:
            raise FlintError(f"{path}, line {number}: not a row of nccl-tests' table (size, count, type, ..., "
                             f"time, algbw, busbw, #wrong): {line.strip()[:60]!r}") from None
        if not in_place:
            raise FlintError(f"{path}, line {number}: has no in-place column: Flint fits in-place times: give "
                             "nccl-tests' output with both groups of columns, out of place and in place")
        if wrong:
            raise FlintError(f"{path}, line {number}: nccl-tests found {wrong} wrong results at {size:,} bytes "
                             f"(#wrong): its times are not those of a correct {named}: give a run without them")
        if size in rows:
            raise FlintError(f"{path}, line {number}: a second row of {size:,} bytes: a run measures each size "
                             "once, so the file holds more than one: give each run's output in a file of its own")
        rows[size] = Measurement(size, micros)
    if not rows:
        raise FlintError(f"{path}: no rows of nccl-tests' table in it: give the output of {named}_perf")
    footers = [int(count) for count in _OUT_OF_BOUNDS.findall(text)]
    if len(footers) > 1:
        raise FlintError(f"{path}: holds {len(footers)} runs' footers ('Out of bounds values'): give each run's "
                         "output in a file of its own")
    if sum(footers):
        raise FlintError(f"{path}: nccl-tests found {footers[0]} value{'s' * (footers[0] > 1)} out of bounds: its "
                         f"times are not those of a correct {named}: give a run without them")
    listed = _RANK.findall(text)
    ranks = {int(rank): host for rank, host in listed}
    if len(ranks) < len(listed):
        raise FlintError(f"{path}: lists a rank twice ('#  Rank' lines), as runs concatenated do: give each run's "
                         "output in a file of its own")
    return NcclTestsRun(path, named, len(ranks) or None, len(set(ranks.values())) or None, tuple(rows.values()),
                        _stated_release(path, text))


def _program(path: Path, text: str) -> str:
    """The collective a run times: the program its "Collective test starting" line names, else the
    one its file's name or text names; one line where that is none Flint fits, or where the name
    and that line disagree."""
    known = ", ".join(f"{name}_perf" for name in COLLECTIVES)
    programs = sorted(set(_STARTING.findall(text)) | set(_NAME.findall(text)))
    if len(programs) > 1:  # runs concatenated: one NcclTestsRun is one collective's table
        listed = ", ".join(f"{name}_perf" for name in programs)
        raise FlintError(f"{path}: holds the tables of more than one nccl-tests program ({listed}): "
                         "give each one's output in a file of its own")
    started = _STARTING.search(text)
    if started is not None and started[1] not in COLLECTIVES:
        raise FlintError(f"{path}: the output of {started[1]}_perf, which Flint does not fit: give the output of "
                         f"one of {known}")
    named = _NAME.search(path.name)
    if started is not None and named is not None and named[1] != started[1]:
        raise FlintError(f"{path}: its name says {named[1]}_perf and its output {started[1]}_perf: give the file "
                         "the name of the program that ran")
    found = started or named or _NAME.search(text)
    if found is None:
        raise FlintError(f"{path}: which collective? neither its name nor its text names a program Flint fits "
                         f"({known}): keep nccl-tests' 'Collective test starting' line, or name the file after "
                         "the program that ran")
    return found[1]


def _stated_release(path: Path, text: str) -> str | None:
    """The NCCL release the output states (see the module docstring), None where it states none."""
    stated = {_version(int(code)) for code in _LIBRARY.findall(text)} | set(_LOGGED.findall(text))
    if len(stated) > 1:
        raise FlintError(f"{path}: states NCCL releases {', '.join(sorted(stated))}: one run ran one; give each "
                         "run's output in a file of its own")
    return stated.pop() if stated else None


def _version(code: int) -> str:
    """NCCL_VERSION_CODE as a release: major x 10000 + minor x 100 + patch from 2.9 (nccl.h), major
    x 1000 + minor x 100 + patch before."""
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def _row(fields: list[str]) -> tuple[int, float, int, bool]:
    """A row's size, last time (µs) and wrong results (each #wrong column; N/A where nccl-tests did
    not check, -c 0; an older nccl-tests' largest error, a float, counts none: its footer does), and
    whether the time is in place; ValueError where it is not a row. A row of
    7 or 9 fields (without or with redop and root) that reads as one has out-of-place columns only:
    said as such, not as a broken row. The width first: a row cut off mid-line has fewer fields than
    the indices. A time of inf, as of nan, would reach the fit's logs."""
    in_place = len(fields) >= 10
    if not in_place and len(fields) not in OUT_OF_PLACE_ONLY:
        raise ValueError
    size, micros = int(fields[0]), float(fields[-4])
    wrong = [_wrong(count) for count in (fields[-5], fields[-1])[not in_place:] if count != "N/A"]
    if size < 0 or not (math.isfinite(micros) and micros > 0) or min(wrong, default=0) < 0:
        raise ValueError
    return size, micros, sum(wrong), in_place


def _wrong(field: str) -> int:
    """A #wrong column's count; 0 for an older nccl-tests' largest error (a float, finite and not
    negative); ValueError for anything else."""
    try:
        return int(field)
    except ValueError:
        error = float(field)
        if not (math.isfinite(error) and error >= 0):
            raise
        return 0

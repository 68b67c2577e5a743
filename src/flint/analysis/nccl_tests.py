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

Refused: a file that states two releases, as one run ran one; a table of the out-of-place columns
only, as having no in-place column (the times Flint fits); a file whose text names more than one
program (runs concatenated), as a run is one collective's table; and a row where nccl-tests found
wrong results (#wrong, in place or out of place, above 0; N/A: not checked), as its time is not of
a correct collective.
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
    named = _NAME.search(path.name) or _NAME.search(text)
    if named is None:
        raise FlintError(f"{path}: which collective? name the file after its nccl-tests program "
                         f"({', '.join(f'{name}_perf.txt' for name in COLLECTIVES)})")
    programs = sorted(set(_NAME.findall(text)))
    if len(programs) > 1:  # runs concatenated: one NcclTestsRun is one collective's table
        listed = ", ".join(f"{name}_perf" for name in programs)
        raise FlintError(f"{path}: holds the tables of more than one nccl-tests program ({listed}): "
                         "give each one's output in a file of its own")
    rows = []
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
                             f"(#wrong): its times are not those of a correct {named[1]}: give a run without them")
        rows.append(Measurement(size, micros))
    if not rows:
        raise FlintError(f"{path}: no rows of nccl-tests' table in it: give the output of {named[0]}")
    ranks = {int(rank): host for rank, host in _RANK.findall(text)}
    return NcclTestsRun(path, named[1], len(ranks) or None, len(set(ranks.values())) or None, tuple(rows),
                        _stated_release(path, text))


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
    not check, -c 0), and whether the time is in place; ValueError where it is not a row. A row of
    7 or 9 fields (without or with redop and root) that reads as one has out-of-place columns only:
    said as such, not as a broken row. The width first: a row cut off mid-line has fewer fields than
    the indices. A time of inf, as of nan, would reach the fit's logs."""
    in_place = len(fields) >= 10
    if not in_place and len(fields) not in OUT_OF_PLACE_ONLY:
        raise ValueError
    size, micros = int(fields[0]), float(fields[-4])
    wrong = [int(count) for count in (fields[-5], fields[-1])[not in_place:] if count != "N/A"]
    if size < 0 or not (math.isfinite(micros) and micros > 0) or min(wrong, default=0) < 0:
        raise ValueError
    return size, micros, sum(wrong), in_place

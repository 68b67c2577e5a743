"""Run ASTRA-sim and read what each rank reports.

Each rank prints `sys[R] finished, C cycles, exposed communication E cycles.` and then its
statistics (`Wall time`, `GPU time`, `Comm time`, `Total compute-communication overlap`), all in
cycles, which are nanoseconds. A rank's step is its wall time; its compute is the GPU time; the
communication not hidden behind compute is `Comm time` less the overlap; what remains of the step
(the slowest rank's wall time, as in `flint timeline`) is idle: waiting on another rank (a pipeline
bubble, a late peer), or for the slowest one at the end of the step.

Two exits are not failures of the step: exit 0, and a crash at teardown (SIGABRT or SIGSEGV) after
every rank finished, on a trace whose ranks use two or more communicator groups. The upstream build
corrupts its heap there (`malloc_consolidate(): unaligned fastbin chunk detected`); the results are
complete and the crash is reported as that known issue.
"""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from flint.errors import FlintError

ENVIRONMENT = "ASTRA_SIM"
"""The environment variable naming the ASTRA-sim binary (or a wrapper script) when --astra-sim does not."""
NAMES = ("astra-sim", "AstraSim_Analytical_Congestion_Unaware")
"""What the simulator is called on PATH: a wrapper, or the analytical congestion-unaware binary."""

_FINISHED = re.compile(r"sys\[(\d+)\] finished, (\d+) cycles, exposed communication (\d+) cycles")
_STATISTIC = re.compile(r"sys\[(\d+)\], (Wall time|GPU time|Comm time|Total compute-communication overlap): (\d+)")
_STATISTICS = {"Wall time": "wall", "GPU time": "compute", "Comm time": "communication",
               "Total compute-communication overlap": "overlap"}
_TEARDOWN_CRASH = {-signal.SIGABRT, -signal.SIGSEGV, 128 + signal.SIGABRT, 128 + signal.SIGSEGV}


def find_simulator(given: str | os.PathLike[str] | None) -> Path | None:
    """The ASTRA-sim to run: `given`, else $ASTRA_SIM, else one on PATH; None if there is none."""
    for candidate, origin in ((given, "--astra-sim"), (os.environ.get(ENVIRONMENT), f"${ENVIRONMENT}")):
        if candidate:
            path = Path(candidate)
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise FlintError(f"{origin} {str(path)!r} is not an executable file: point it at ASTRA-sim's "
                                 "AstraSim_Analytical_Congestion_Unaware binary (or a wrapper)")
            return path
    for name in NAMES:
        if found := shutil.which(name):
            return Path(found)
    return None


@dataclass
class RankResult:
    """One rank's times in nanoseconds, as ASTRA-sim reports them."""

    rank: int
    wall: int = 0
    compute: int = 0
    communication: int = 0
    overlap: int = 0
    finished: bool = False

    @property
    def exposed(self) -> int:
        """Communication not hidden behind compute."""
        return max(self.communication - self.overlap, 0)

    def idle(self, step: int) -> int:
        """Of the whole `step` (the slowest rank's wall time), neither computing nor communicating."""
        return max(step - self.compute - self.exposed, 0)

    def as_json(self, step: int) -> dict:
        return {"rank": self.rank, "step_us": self.wall / 1e3, "compute_us": self.compute / 1e3,
                "communication_us": self.communication / 1e3,
                "exposed_communication_us": self.exposed / 1e3, "idle_us": self.idle(step) / 1e3}


@dataclass
class SimulatorRun:
    """What one ASTRA-sim run printed, parsed, and how it ended."""

    ranks: dict[int, RankResult] = field(default_factory=dict)
    returncode: int = 0
    stderr_tail: str = ""

    def rank(self, rank: int) -> RankResult:
        if rank not in self.ranks:
            self.ranks[rank] = RankResult(rank)
        return self.ranks[rank]

    def read_line(self, line: str) -> int | None:
        """Take in one line of output; the rank that just finished, if this line says so."""
        if match := _FINISHED.search(line):
            rank = self.rank(int(match[1]))
            rank.finished, rank.wall = True, int(match[2])
            return rank.rank
        if match := _STATISTIC.search(line):
            setattr(self.rank(int(match[1])), _STATISTICS[match[2]], int(match[3]))
        return None

    def finished(self, num_ranks: int) -> int:
        return sum(1 for r in range(num_ranks) if r in self.ranks and self.ranks[r].finished)

    @property
    def crashed_at_teardown(self) -> bool:
        return self.returncode in _TEARDOWN_CRASH


def run_simulator(command: list[str], workdir: Path, num_ranks: int, multi_group: bool,
                  on_finished: Callable[[int], None] = lambda done: None,
                  timeout: float | None = None) -> SimulatorRun:
    """Run `command` in `workdir`, reading rank results as they are printed (`on_finished` gets
    the count so far), and check it ran to the end of every rank.

    ASTRA-sim runs in a process group of its own, which is killed whole (a wrapper script and the
    simulator it started) when it runs past `timeout` seconds, or when this process is interrupted
    (Ctrl-C reaches only the terminal's foreground group, which it has left). `workdir` is a
    staging directory its caller discards on any error: a run that fails is kept, its files moved
    into a new temporary directory that the error names; a timed-out or interrupted one is not."""
    run = SimulatorRun()
    stderr_path = workdir / "stderr.txt"
    deadline = None if timeout is None else time.monotonic() + timeout
    with open(workdir / "stdout.txt", "wb") as log, open(stderr_path, "wb") as errors:
        try:
            process = subprocess.Popen(command, cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=errors, start_new_session=True)
        except OSError as exc:
            raise FlintError(f"cannot run ASTRA-sim {command[0]!r}: {exc.strerror}") from None
        try:
            done = 0
            for line in _lines(process.stdout.fileno(), deadline):
                log.write(line)
                if run.read_line(line.decode(errors="replace")) is not None:
                    done += 1
                    on_finished(done)
            run.returncode = process.wait(timeout=None if deadline is None else max(deadline - time.monotonic(), 0))
        except (_PastDeadline, subprocess.TimeoutExpired):
            _kill_group(process)
            raise FlintError(f"ASTRA-sim ran past --timeout {timeout:g} s with {run.finished(num_ranks)} of "
                             f"{num_ranks} ranks finished, and was stopped: raise --timeout, or leave it out to "
                             "wait for the end") from None
        finally:
            _kill_group(process)  # anything of the group still running: on an interrupt, all of it
            process.stdout.close()
    run.stderr_tail = _last_line(stderr_path.read_text(errors="replace"))
    finished = run.finished(num_ranks)
    if finished < num_ranks:
        why = f"exit {run.returncode}" + (f": {run.stderr_tail}" if run.stderr_tail else "")
        raise FlintError(f"ASTRA-sim stopped with {finished} of {num_ranks} ranks finished ({why}): "
                         f"its inputs and output are kept in {_keep(workdir)}; `flint check` the trace")
    if run.returncode != 0 and not (run.crashed_at_teardown and multi_group):
        raise FlintError(f"ASTRA-sim exited {run.returncode} after every rank finished: {run.stderr_tail} "
                         f"(its inputs and output are kept in {_keep(workdir)})")
    return run


class _PastDeadline(Exception):
    """The run's --timeout passed while its output was still open."""


def _lines(fd: int, deadline: float | None) -> Iterator[bytes]:
    """The lines read from `fd` until it closes, each as soon as it is whole; `_PastDeadline` once
    `deadline` (of `time.monotonic`) passes first."""
    pending = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            if deadline is not None:
                wait = deadline - time.monotonic()
                if wait <= 0 or not selector.select(wait):
                    raise _PastDeadline
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            *whole, pending = (pending + chunk).split(b"\n")
            for line in whole:
                yield line + b"\n"
    if pending:
        yield pending


def _kill_group(process: subprocess.Popen) -> None:
    """Kill the process group `process` leads (the simulator, a wrapper, and whatever they started)
    and reap `process`. No other group can take its id while one of this group lives; once none
    does, there is nothing to kill."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def _keep(workdir: Path) -> Path:
    """Move a failed run's files out of the staging directory `workdir` (discarded after) into a new
    temporary directory, for the user to look into; where they went."""
    kept = Path(tempfile.mkdtemp(prefix="flint-astra-sim-failed-"))
    for entry in workdir.iterdir():
        shutil.move(entry, kept / entry.name)
    return kept


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""

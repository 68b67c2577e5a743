"""Nothing escapes, nothing is left behind: SIGINT or SIGTERM at any moment of `flint extract` stops
it within seconds, with one line and exit 128 + the signal, no temp or staging files and the
previous output as it was; concurrent runs into one directory leave one complete trace.

Each run gets its own TMPDIR, so that whatever it leaves there (XLA's dump directory) is counted.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import pty
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES, MODELS

from flint.emit.writer import OutputDir
from flint.errors import FlintError
from flint.isolation import Interrupted, Isolation, RemoteTraceback
from flint.trace.contract import check_traces

SIGNAL_TO_EXIT = 5.0
"""Seconds a run may take to exit after the signal (it takes well under one)."""


STARTED: list[subprocess.Popen] = []


def start(tmp_path: Path, model: Path, mesh: str, *extra: str) -> subprocess.Popen:
    run = subprocess.Popen(
        [sys.executable, "-m", "flint", "extract", str(model), "--mesh", mesh,
         "-o", str(tmp_path / "work" / "out"), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path / "tmp")},
    )
    STARTED.append(run)
    return run


@pytest.fixture(autouse=True)
def no_run_outlives_its_test():
    """A failed test must not leave its run compiling on CI's two cores."""
    yield
    while STARTED:
        run = STARTED.pop()
        run.kill()
        run.communicate()


def wait_for(run: subprocess.Popen, pattern: str, under: Path) -> None:
    """Poll until a file or directory matching `pattern` exists under `under`."""
    deadline = time.monotonic() + 120
    while not _matches(under, pattern):
        assert run.poll() is None, f"the run ended first: {run.communicate()}"
        assert time.monotonic() < deadline, f"no {pattern} under {under}"
        time.sleep(0.005)


def _matches(under: Path, pattern: str) -> bool:
    """Whether `pattern` matches, counting a directory that vanishes mid-scan (renamed into
    place) as no match yet."""
    try:
        return any(under.glob(pattern))
    except FileNotFoundError:
        return False


def snapshot(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.fixture
def dirs(tmp_path) -> None:
    """tmp_path/work holds the output, tmp_path/tmp is the runs' TMPDIR."""
    for name in ("work", "tmp"):
        (tmp_path / name).mkdir()


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """One finished trace (tmp/work/out), extracted once for the module."""
    tmp = tmp_path_factory.mktemp("finished")
    for name in ("work", "tmp"):
        (tmp / name).mkdir()
    run = start(tmp, EXAMPLES / "mlp.py", "2x4")
    assert run.wait(timeout=600) == 0, run.communicate()
    return tmp / "work" / "out"


@pytest.fixture
def previous(tmp_path, dirs, finished) -> dict[str, str]:
    """A finished trace in tmp_path/work/out, which an interrupted --force run must leave as it is."""
    shutil.copytree(finished, tmp_path / "work" / "out")
    return snapshot(tmp_path / "work" / "out")


MOMENTS = {
    # the child imports the model file (and JAX) once the run's temp directory exists
    "importing": ("gpt.py", "2x4", (), "tmp", "flint-*", 0.3),
    # XLA's dump directory exists only while XLA compiles
    "compiling": ("gpt.py", "2x4", (), "tmp", "flint-*/flint-xla-*", 0.0),
    # rank files appear in the staging directory next to the output: 8,192 GPU ranks take seconds
    # to write (2,048 CPU ranks take a few tenths, which a loaded machine's poll can miss)
    "writing": ("mlp.py", "256x32", ("--backend", "gpu:h100"), "work", ".out.*/mlp.*.et", 0.0),
}


@pytest.mark.parametrize(
    "moment, signum",
    [("importing", signal.SIGINT), ("compiling", signal.SIGINT), ("compiling", signal.SIGTERM),
     ("writing", signal.SIGINT)],
    ids=["sigint-importing", "sigint-compiling", "sigterm-compiling", "sigint-writing"],
)
def test_a_signal_stops_the_run_and_leaves_nothing(tmp_path, previous, moment, signum):
    model, mesh, backend, under, pattern, settle = MOMENTS[moment]
    run = start(tmp_path, EXAMPLES / model, mesh, *backend, "--force")
    wait_for(run, pattern, tmp_path / under)
    time.sleep(settle)
    sent = time.monotonic()
    run.send_signal(signum)
    stdout, stderr = run.communicate(timeout=SIGNAL_TO_EXIT + 5)
    assert time.monotonic() - sent < SIGNAL_TO_EXIT
    assert run.returncode == 128 + signum, stderr
    assert stderr.splitlines() == ["interrupted: nothing was written"] and not stdout
    assert os.listdir(tmp_path / "tmp") == [], "temp files left behind"
    assert os.listdir(tmp_path / "work") == ["out"], "staging or lock files left behind"
    assert snapshot(tmp_path / "work" / "out") == previous


def test_progress_bars_still_show_in_a_terminal(tmp_path, dirs):
    """The child reports progress; the parent draws the bars on its terminal (stderr)."""
    main, terminal = pty.openpty()
    run = subprocess.Popen(
        [sys.executable, "-m", "flint", "extract", str(EXAMPLES / "mlp.py"), "--mesh", "64x8",
         "-o", str(tmp_path / "work" / "out")],
        stdout=subprocess.DEVNULL, stderr=terminal, env={**os.environ, "TMPDIR": str(tmp_path / "tmp")},
    )
    os.close(terminal)
    drawn = b""
    while chunk := _read(main):
        drawn += chunk
    os.close(main)
    assert run.wait(timeout=600) == 0, drawn
    assert b"writing rank traces" in drawn and b"512/512" in drawn


def _read(fd: int) -> bytes:
    """What a pseudo-terminal's other end wrote, b"" once it is closed."""
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: every writer has closed it
        return b""


def test_concurrent_runs_into_one_directory_leave_one_complete_trace(tmp_path, dirs):
    runs = [start(tmp_path, EXAMPLES / "mlp.py", "2x4", "--force", "--json") for _ in range(3)]
    results = [(run.wait(timeout=600), *run.communicate()) for run in runs]
    for code, stdout, stderr in results:
        if code == 0:
            assert json.loads(stdout)["files"] == 11
        else:
            assert code == 2 and stderr.splitlines() == [
                f"error: output directory '{tmp_path / 'work' / 'out'}' is being written by another "
                "flint run: wait for it to finish or choose another -o"
            ]
    assert any(code == 0 for code, _, _ in results)
    out = tmp_path / "work" / "out"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["ranks"] == 8
    assert sorted(os.listdir(out)) == sorted(
        [f"mlp.{rank}.et" for rank in range(8)] + ["mlp.comm_groups.json", "mlp.graph.json", "manifest.json"]
    )
    assert check_traces(out, num_ranks=8) == []
    assert os.listdir(tmp_path / "work") == ["out"] and os.listdir(tmp_path / "tmp") == []


def test_a_run_into_a_directory_being_written_fails_at_once(tmp_path, dirs):
    """A run holding the output's lock (here this test) makes another one fail before slow work."""
    holder = OutputDir(tmp_path / "work" / "out")
    run = start(tmp_path, MODELS / "raises.py", "2")
    _, stderr = run.communicate(timeout=600)
    holder.discard()
    assert run.returncode == 2
    assert len(stderr.splitlines()) == 1 and "is being written by another flint run" in stderr
    assert os.listdir(tmp_path / "work") == [] and os.listdir(tmp_path / "tmp") == []


def test_output_dir_lock_is_released_and_removed(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    first = OutputDir(target)
    with pytest.raises(FlintError, match="being written by another flint run"):
        OutputDir(target)
    first.write_text("new.txt", "new")
    first.commit()
    assert os.listdir(tmp_path) == ["out"] and os.listdir(target) == ["new.txt"]
    with OutputDir(target) as second:
        second.write_text("newer.txt", "newer")
    assert os.listdir(tmp_path) == ["out"] and os.listdir(target) == ["newer.txt"]


# ---------------------------------------------------------------------- the isolation itself


class Unpicklable(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a} and {b}")


def _fail(send):
    raise Unpicklable(1, 2)


def _refuse(send):
    raise FlintError("bad input")


def test_events_result_and_temp_directory_of_the_child():
    events = []

    def work(send):
        import tempfile

        send("pid", os.getpid())
        send("tmp", tempfile.gettempdir(), os.environ["TMPDIR"])
        return "done"

    with Isolation() as isolation:
        assert isolation.run(work, lambda *event: events.append(event)) == "done"
        scratch = isolation.scratch
    assert events[0][1] != os.getpid()
    assert events[1] == ("tmp", str(scratch), str(scratch))
    assert not scratch.exists()


def test_exceptions_come_back_with_the_childs_traceback():
    with Isolation() as isolation:
        with pytest.raises(FlintError, match="bad input") as caught:
            isolation.run(_refuse, print)
        assert isinstance(caught.value.__cause__, RemoteTraceback)
        assert "FlintError: bad input" in str(caught.value.__cause__)
        with pytest.raises(RuntimeError, match="Unpicklable: 1 and 2") as caught:
            isolation.run(_fail, print)
        assert "in _fail" in str(caught.value.__cause__)


def test_a_child_killed_from_outside_is_one_line():
    with Isolation() as isolation, pytest.raises(FlintError, match="was killed by SIGKILL"):
        isolation.run(lambda send: os.kill(os.getpid(), signal.SIGKILL), print)


def test_a_child_that_aborts_points_at_its_own_message():
    """Native code that aborts (XLA's failed checks) writes why to stderr first: the one line
    points there instead of guessing memory."""
    def abort(send):
        faulthandler.disable()  # pytest's would print the child's Python stack as well
        os.abort()

    with Isolation() as isolation, pytest.raises(FlintError) as caught:
        isolation.run(abort, print)
    message = str(caught.value)
    assert "aborted (SIGABRT)" in message and "the line above it says why" in message
    assert "\n" not in message


def test_sigint_kills_the_child_and_removes_its_temp_directory():
    pids, handler = [], signal.getsignal(signal.SIGINT)

    def work(send):
        send(os.getpid())
        (Path(os.environ["TMPDIR"]) / "partial").write_text("x")
        time.sleep(60)

    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with pytest.raises(Interrupted) as caught, Isolation() as isolation:
        isolation.run(work, pids.append)
    assert caught.value.signum == signal.SIGINT and time.monotonic() - started < 5
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)
    assert not isolation.scratch.exists()
    assert signal.getsignal(signal.SIGINT) is handler

"""Run slow work in a child process that Ctrl-C stops at once, leaving nothing behind.

Python runs a signal handler only between bytecodes, so Ctrl-C during a long call into C++ (XLA
compiling the step) waits until the call returns, and exiting while the compiler's threads still
ran crashed the process, leaving XLA's dump directory in the temp directory. So the work runs in a
forked child and the parent only waits: on SIGINT or SIGTERM it kills the child (SIGKILL), reaps
it, removes the child's temp directory and raises `Interrupted`, all within milliseconds.

The child is forked, not spawned: it inherits the work (a closure over the model's request) without
pickling and starts in milliseconds. The parent must not have started JAX or other threads that
hold locks by then, or the child could inherit a lock held forever: the CLI imports JAX only in the
child and starts its progress bars after the fork. The child ignores SIGINT and SIGTERM: Ctrl-C
reaches the terminal's whole foreground process group, and the parent alone decides. It stays in
that group, so Ctrl-Z stops both and it may write to the terminal. Every temp file of the child
lands in one directory of the parent's (`TMPDIR`), removed at the end.

Signals interrupt only the wait for the child; anywhere else in an `Isolation` block (forking,
cleaning up, the caller committing the child's output) they are held and raise when the next wait
starts, or are dropped once the work is done, so cleanup and commit are never cut short.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import shutil
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, Pipe
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from flint.errors import FlintError

T = TypeVar("T")
Send = Callable[..., None]
"""`send(*event)` in the child calls `on_event(*event)` in the parent."""
SIGNALS = (signal.SIGINT, signal.SIGTERM)
_PR_SET_PDEATHSIG = 1


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: the child is gone and its temp directory removed.

    A `BaseException`, as `KeyboardInterrupt` is, so that `except Exception` does not swallow it.
    """

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class RemoteTraceback(Exception):
    """The child's traceback, as the cause of the exception re-raised in the parent (`--debug`)."""

    def __str__(self) -> str:
        return "\n\n" + self.args[0]


class Isolation:
    """Runs work in forked children while SIGINT and SIGTERM stop it; owns the children's temp
    directory. Use as a context manager around the runs and whatever must finish with them."""

    def __enter__(self) -> "Isolation":
        self._armed = False
        self._held: int | None = None
        self.scratch = Path(tempfile.mkdtemp(prefix="flint-"))
        # A signal ignored at start (a background job of a script) stays ignored, as Python does.
        self._previous = {
            signum: signal.signal(signum, self._on_signal)
            for signum in SIGNALS
            if signal.getsignal(signum) is not signal.SIG_IGN
        }
        return self

    def __exit__(self, *exc_info) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame) -> None:
        self._held = self._held or signum
        if self._armed:
            self._armed = False
            raise Interrupted(self._held)

    @contextlib.contextmanager
    def _interruptible(self) -> Iterator[None]:
        if self._held:
            raise Interrupted(self._held)
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    def run(self, work: Callable[[Send], T], on_event: Callable[..., None]) -> T:
        """`work(send)` in a child process; its result, or its exception re-raised here."""
        receive, send = Pipe(duplex=False)
        _flush()  # else the child would write the parent's buffered output a second time
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            receive.close()
            _child(work, send, self.scratch, parent)
        send.close()
        child = _Child(pid)
        try:
            with self._interruptible():
                return _outcome(receive, on_event, child)
        finally:
            child.kill()
            receive.close()


class _Child:
    """A forked child, reaped once: after that its pid may belong to another process."""

    def __init__(self, pid: int):
        self.pid = pid
        self.status: int | None = None

    def reap(self) -> int:
        if self.status is None:
            self.status = os.waitpid(self.pid, 0)[1]
        return self.status

    def kill(self) -> None:
        """Kill the child (harmless if it has exited: it stays a zombie until reaped) and reap it,
        so that nothing writes into its files while they are removed."""
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
        self.reap()

    def death(self) -> str:
        """Why the child ended without a word: the out-of-memory killer's SIGKILL, most likely; or
        an abort in native code (a failed check of the compiler, an allocation that failed), which
        writes its reason to stderr first."""
        status = self.reap()
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGABRT:
            return ("the extraction process aborted (SIGABRT) before it finished: the line above it "
                    "says why (a check of the compiler that failed on this program or layout, or "
                    "memory that ran out); try another layout, or free memory and run again")
        if os.WIFSIGNALED(status):
            how = f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
        else:
            how = f"exited with status {os.waitstatus_to_exitcode(status)}"
        return (
            f"the extraction process {how} before it finished: if memory ran out, free some and "
            "run again"
        )


def _outcome(receive: Connection, on_event: Callable[..., None], child: _Child) -> Any:
    """Pass the child's events on until its result or exception arrives."""
    while True:
        try:
            kind, *payload = receive.recv()
        except EOFError:
            raise FlintError(child.death()) from None
        if kind == "event":
            on_event(*payload[0])
        elif kind == "result":
            return payload[0]
        else:
            exc, text = payload
            raise exc from RemoteTraceback(text)


def _child(work: Callable[[Send], Any], send: Connection, scratch: Path, parent: int) -> NoReturn:
    """The forked child: run `work`, send its result or exception, and exit without unwinding into
    the parent's code (no `atexit`, no `finally` of the parent's frames)."""
    try:
        _detach(scratch, parent)
        message = ("result", work(lambda *event: send.send(("event", event))))
    except BaseException as exc:  # everything goes to the parent
        message = ("error", _portable(exc), traceback.format_exc())
    try:
        _flush()
        send.send(message)
    finally:
        os._exit(0)


def _detach(scratch: Path, parent: int) -> None:
    """Leave the signals to the parent, die with it (killed with SIGKILL, it cannot kill the child),
    and keep every temp file in `scratch`."""
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # see `stdout_to_stderr`: the parent alone answers
    os.environ["TMPDIR"] = tempfile.tempdir = str(scratch)


def _portable(exc: BaseException) -> BaseException:
    """`exc` as the parent will receive it: itself if it survives pickling, else a RuntimeError with
    its type and message (an exception raised in XLA or MLIR may not)."""
    try:
        return pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send what is written to standard output meanwhile (a model file's prints, from Python or
    native code) to standard error: standard output carries the command's answer, which `--json`
    keeps to JSON alone."""
    _flush()
    saved = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        yield
    finally:
        _flush()
        os.dup2(saved, sys.stdout.fileno())
        os.close(saved)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()

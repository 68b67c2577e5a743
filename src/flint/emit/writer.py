"""All-or-nothing output directories.

Files are written into a hidden sibling directory and renamed into place at the end, so an interrupted
or failed extraction never leaves a half-written trace where ASTRA-sim would pick it up.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flint.errors import FlintError


def prepare_output(path: Path, force: bool) -> Path:
    """Check up front (before any slow work) that `path` may receive a trace."""
    path = Path(path)
    if Path.cwd().resolve().is_relative_to(path.resolve()):
        raise FlintError(
            f"output {str(path)!r} is the current directory or contains it, which cannot be "
            "replaced: choose another -o"
        )
    if path.name == "..":
        raise FlintError(f"output {str(path)!r} ends in '..': name the directory itself in -o")
    if path.exists() and not path.is_dir():
        raise FlintError(f"output {str(path)!r} exists and is not a directory: choose another -o")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise FlintError(
            f"output directory {str(path)!r} is not empty: choose another -o or pass --force to replace it"
        )
    if not path.parent.exists():
        raise FlintError(f"parent directory of {str(path)!r} does not exist: create it first")
    _check_writable(path)
    return path


def _check_writable(path: Path) -> None:
    """Create and remove a directory where the staging directory will go. Only trying tells: root
    may write anywhere `os.access` looks, except on a read-only mount or through a file."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as exc:
        raise FlintError(
            f"cannot create output {str(path)!r} in {str(path.parent)!r}: {exc.strerror}: "
            "choose another -o"
        ) from None


def make_directories(path: Path) -> list[Path]:
    """Make directory `path` with its missing parents; those made, innermost first (for
    `remove_empty`, where what was to go in them fails). OSError where one cannot be made, after
    taking back those it made."""
    made, directory = [], Path(path).absolute()
    while not directory.exists() and directory != directory.parent:
        made.append(directory)
        directory = directory.parent
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError:
        remove_empty(made)
        raise
    return made


def remove_empty(directories: list[Path]) -> None:
    """Remove each of `directories`, inner ones first, that is empty (and still there)."""
    for directory in directories:
        try:
            directory.rmdir()
        except OSError:  # not empty, or gone
            pass


def write_whole(output: Path, data: bytes) -> None:
    """Write `output` whole or not at all: into a file beside it, renamed over it once written, so
    that a full disk or an interrupt leaves any earlier file as it was and no fragment of a new one.
    A link is written through (its target replaced), and what is not a regular file (a pipe, a
    device such as /dev/stdout) is written as a stream, as it cannot be replaced."""
    target = output.resolve() if output.is_symlink() else output
    try:
        if target.exists() and not target.is_file():
            with open(target, "wb") as stream:
                stream.write(data)
            return
    except OSError as exc:
        raise FlintError(f"cannot write {str(output)!r}: {exc.strerror}") from None
    staged = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        staged.write_bytes(data)
        os.replace(staged, target)
    except OSError as exc:
        raise FlintError(f"cannot write {str(output)!r}: {exc.strerror}") from None
    finally:
        staged.unlink(missing_ok=True)


def check_dump_dir(path: Path | None, output: Path) -> Path | None:
    """`path` if the traced IR may be written there: a directory (or none yet) outside `output`,
    which the finished trace replaces whole."""
    if path is None:
        return None
    if path.exists() and not path.is_dir():
        raise FlintError(f"--dump-ir {str(path)!r} exists and is not a directory: choose another --dump-ir")
    if path.resolve().is_relative_to(output.resolve()):
        raise FlintError(f"--dump-ir {str(path)!r} is inside the output {str(output)!r}, which the trace replaces: "
                         "choose a --dump-ir outside -o")
    return path


def check_name(name: str | None) -> str | None:
    """`name` if it is a plain file name: trace files are `NAME.<rank>.et` in the output directory,
    and a path separator or `..` would put them outside it."""
    if name is None:
        return None
    if name in ("", ".", "..") or any(sep and sep in name for sep in (os.sep, os.altsep)):
        raise FlintError(
            f"invalid --name {name!r}: give a file name prefix without path separators, such as mlp"
        )
    return name


@contextmanager
def disk_errors(target: Path) -> Iterator[None]:
    """A full disk (or quota) while the trace is written is the user's to fix, said in one line."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise FlintError(
            f"no space left on device writing {str(target)!r}: free space or choose another -o"
        ) from exc


class OutputDir:
    """A staging directory that becomes `target` on `commit()`, or vanishes on `discard()`; as a
    context manager, one or the other when the block ends.

    From creation to then, an exclusive lock keeps other flint runs away from `target`: a second
    run into the same directory fails at once, rather than racing this one's commit and leaving
    its staging directory behind. The lock is an flock on the hidden file `.NAME.lock` next to
    `target`, removed on release; a run killed with SIGKILL leaves it, harmless, as the kernel
    drops the lock with the process.
    """

    def __init__(self, target: Path):
        self.target = Path(target)
        self._lock_path = self.target.parent / f".{self.target.name}.lock"
        self._lock = _lock(self._lock_path, self.target)
        try:
            self.staging = Path(
                tempfile.mkdtemp(prefix=f".{self.target.name}.", dir=self.target.parent)
            )
        except BaseException:
            self._release()
            raise

    def path(self, name: str) -> Path:
        return self.staging / name

    def write_text(self, name: str, text: str) -> None:
        self.path(name).write_text(text, encoding="utf-8")

    def commit(self) -> None:
        """Move the staging directory into place; the previous output is deleted only after."""
        try:
            os.chmod(self.staging, 0o755)
            previous = self.target.exists()  # the lock keeps other runs from changing that
            old = self.staging.with_name(self.staging.name + ".old")
            if previous:
                os.rename(self.target, old)
            os.rename(self.staging, self.target)
            if previous:
                shutil.rmtree(old)
        finally:
            self.discard()  # releases the lock, and removes the staging directory if a move failed

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        self._release()

    def _release(self) -> None:
        """Delete the lock file while still holding the lock: a run that opened it meanwhile finds
        it gone once it gets the lock, and locks a fresh one (`_lock`)."""
        if self._lock is not None:
            if _names(self._lock, self._lock_path):  # unless someone deleted it by hand
                os.unlink(self._lock_path)
            os.close(self._lock)
            self._lock = None

    def __enter__(self) -> "OutputDir":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()


def _lock(path: Path, target: Path) -> int:
    """A descriptor of `path` (created if need be) holding its exclusive flock."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FlintError(
                f"output directory {str(target)!r} is being written by another flint run: wait for "
                "it to finish or choose another -o"
            ) from None
        if _names(fd, path):
            return fd
        os.close(fd)


def _names(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open as `fd` (the run before may have deleted it)."""
    try:
        found, held = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)

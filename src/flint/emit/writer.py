"""All-or-nothing output directories.

Files are written into a hidden sibling directory and renamed into place at the end, so an interrupted
or failed extraction never leaves a half-written trace where ASTRA-sim would pick it up.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from flint.errors import FlintError


def prepare_output(path: Path, force: bool) -> Path:
    """Check up front (before any slow work) that `path` may receive a trace."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FlintError(f"output {str(path)!r} exists and is not a directory: choose another -o")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise FlintError(
            f"output directory {str(path)!r} is not empty: choose another -o or pass --force to replace it"
        )
    if not path.parent.exists():
        raise FlintError(f"parent directory of {str(path)!r} does not exist: create it first")
    return path


class OutputDir:
    """A staging directory that becomes `target` on `commit()`, or vanishes on error."""

    def __init__(self, target: Path):
        self.target = Path(target)
        self.staging = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.", dir=self.target.parent))

    def path(self, name: str) -> Path:
        return self.staging / name

    def write_text(self, name: str, text: str) -> None:
        self.path(name).write_text(text, encoding="utf-8")

    def commit(self) -> None:
        os.chmod(self.staging, 0o755)
        if self.target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.old.", dir=self.target.parent))
            os.rename(self.target, old / "previous")
            os.rename(self.staging, self.target)
            shutil.rmtree(old)
        else:
            os.rename(self.staging, self.target)

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)

    def __enter__(self) -> "OutputDir":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()

"""`flint extract` says how large the rank traces will be before writing them, and refuses, with
one line and nothing written, where the disk cannot hold them."""

from __future__ import annotations

from collections import namedtuple

import pytest
from conftest import EXAMPLES

import flint
import flint.pipeline
from flint.errors import FlintError
from flint.pipeline import TRACE_BYTES

Usage = namedtuple("Usage", "total used free")


def test_the_size_said_before_writing_is_the_size_written(tmp_path):
    said = []

    def progress(stage, done, total):
        if stage == TRACE_BYTES:
            said.append(done)

    out = tmp_path / "out"
    flint.extract(EXAMPLES / "mlp.py", "2x4", out, backend="cpu", on_progress=progress)
    on_disk = sum(path.stat().st_size for path in out.glob("*.et"))
    assert len(said) == 1 and said[0] == on_disk > 0


def test_traces_larger_than_the_free_space_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(flint.pipeline.shutil, "disk_usage", lambda path: Usage(10**6, 10**6 - 1000, 1000))
    out = tmp_path / "out"
    with pytest.raises(FlintError, match=r"the 8 rank traces need [\d.]+ MB and .* has 0\.0 MB free"):
        flint.extract(EXAMPLES / "mlp.py", "2x4", out, backend="cpu")
    assert not out.exists()

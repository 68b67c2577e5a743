"""`flint extract` says how large the rank traces will be before writing them, and refuses, with
one line and nothing written, where the disk cannot hold them.

Each extraction runs through `flint.extract` in a fresh Python process: the API forks its
extraction, and a fork of this test process, whose JAX other tests have started with its threads,
can deadlock.
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import EXAMPLES

SIZE_SAID = """
import json, sys
import flint
from flint.pipeline import TRACE_BYTES
said = []
flint.extract(sys.argv[1], "2x4", sys.argv[2], backend="cpu",
              on_progress=lambda stage, done, total: said.append([done, total]) if stage == TRACE_BYTES else None)
print(json.dumps(said))
"""

DISK_FULL = """
import shutil, sys
from collections import namedtuple
import flint
from flint.errors import FlintError
Usage = namedtuple("Usage", "total used free")
shutil.disk_usage = lambda path: Usage(10**6, 10**6 - 1000, 1000)
try:
    flint.extract(sys.argv[1], "2x4", sys.argv[2], backend="cpu")
except FlintError as exc:
    print(exc)
"""


def python(code: str, *args) -> str:
    done = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_size_said_before_writing_is_the_size_written(tmp_path):
    out = tmp_path / "out"
    said = json.loads(python(SIZE_SAID, EXAMPLES / "mlp.py", out))
    on_disk = sum(path.stat().st_size for path in out.glob("*.et"))
    one_class = (out / "mlp.0.et").stat().st_size  # every rank of the data x tensor mesh is alike
    assert said == [[one_class, on_disk]] and on_disk > one_class > 0


def test_traces_larger_than_the_free_space_are_refused(tmp_path):
    out = tmp_path / "out"
    message = python(DISK_FULL, EXAMPLES / "mlp.py", out).strip()
    assert len(message.splitlines()) == 1
    assert "the 8 rank traces need" in message and "has 0.0 MB free" in message
    assert "with --rank-files classes" in message
    assert not out.exists()

"""Hostile inputs to `flint extract`: each ends in one line on stderr and exit status 2, before any
slow work where it can be known up front, and leaves nothing behind: no file outside the output
directory, no staging or XLA dump directory, a previous output as it was.

The checks that need no compile run `tests/models/raises.py`, whose import fails: a check that came
after loading the model would report that instead.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, MODELS, Run, load_example, matmuls_and_collectives

from flint.schema import et_def_pb2 as pb
from flint.trace.reader import attr_value, find_traces, read_trace

mlp = load_example("mlp")
RAISES = MODELS / "raises.py"
FLINT = ("-m", "flint")
FULL_DISK = (
    "-c",
    "import errno\n"
    "import flint.emit.parallel as parallel\n"
    "from flint.cli import main\n"
    "write = parallel._write_chunk\n"
    "def full(*args):\n"
    "    write(*args)\n"
    "    raise OSError(errno.ENOSPC, 'No space left on device')\n"
    "parallel._write_chunk = full\n"
    "main()\n",
)
"""`flint` whose disk fills up once the first rank file is written (the staging directory holds
something by then)."""


def run_flint(*args, cwd: Path | None = None, env=None, preexec_fn=None, entry=FLINT) -> Run:
    """`python -m flint ARGS` in a fresh process (`conftest.flint`, with an environment and a hook)."""
    done = subprocess.run(
        [sys.executable, *entry, *map(str, args)],
        capture_output=True, text=True, cwd=cwd, env=env, preexec_fn=preexec_fn, timeout=600,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def snapshot(directory: Path) -> dict[str, bytes | None]:
    """Every path under `directory` and each file's bytes, to compare before and after a run."""
    return {
        str(p.relative_to(directory)): p.read_bytes() if p.is_file() else None
        for p in sorted(directory.rglob("*"))
    }


def assert_one_line(run: Run, *words: str) -> None:
    """Exit status 2 and a single `error:` line that contains every word."""
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, run.stderr
    assert lines[0].startswith("error: "), lines[0]
    for word in words:
        assert word in lines[0], lines[0]


# ------------------------------------------------------------------------------ a 1-rank mesh


def test_one_rank_partitioned_is_the_whole_step(tmp_path):
    """No partitioner runs on one device: the trace is the unsharded step, with no collectives.
    The five matmuls of forward and backward (see tests/test_mlp.py) at full size."""
    out = tmp_path / "out"
    run = run_flint("extract", EXAMPLES / "mlp.py", "--mesh", "1", "--backend", "cpu", "-o", out, "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["ranks"] == 1
    assert [p.name for p in find_traces(out)[1]] == ["mlp.0.et"]
    matmul = 2 * mlp.BATCH * mlp.D_MODEL * mlp.D_HIDDEN
    assert matmuls_and_collectives(out, 0) == (5 * matmul, [])
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_one_rank_optimized_holds_the_five_full_matmuls(tmp_path):
    """At --stage optimized XLA:CPU fuses some matmuls, so they are counted by size: the five
    costliest nodes are the step's five matmuls, 2 * BATCH * D_MODEL * D_HIDDEN FLOPs each."""
    out = tmp_path / "out"
    run = run_flint("extract", EXAMPLES / "mlp.py", "--mesh", "1x1", "--backend", "cpu", "--stage", "optimized",
                    "-o", out)
    assert run.returncode == 0, run.stderr
    nodes = read_trace(out / "mlp.0.et").nodes
    flops = sorted((attr_value(n, "num_ops") or 0 for n in nodes), reverse=True)
    assert flops[:5] == [2 * mlp.BATCH * mlp.D_MODEL * mlp.D_HIDDEN] * 5
    assert flops[5] < flops[4]
    assert {n.type for n in nodes} == {pb.COMP_NODE}


# ------------------------------------------------------------------------------ up front


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".", ""])
def test_name_with_a_path_is_refused(tmp_path, name):
    before = snapshot(tmp_path)
    run = run_flint("extract", RAISES, "--mesh", "1", "-o", tmp_path / "out", "--name", name)
    assert_one_line(run, f"--name {name!r}", "path separators")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("output", [".", "..", "work/.."])
def test_output_containing_the_working_directory_is_refused(tmp_path, output):
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("mine")
    before = snapshot(tmp_path)
    run = run_flint("extract", RAISES, "--mesh", "1", "-o", output, "--force", cwd=work)
    assert_one_line(run, "current directory", "choose another -o")
    assert snapshot(tmp_path) == before


def test_output_under_a_file_is_refused(tmp_path):
    """A parent that cannot hold a directory fails for root too (os.access would say yes)."""
    (tmp_path / "file").write_text("mine")
    before = snapshot(tmp_path)
    run = run_flint("extract", RAISES, "--mesh", "1", "-o", tmp_path / "file" / "out")
    assert_one_line(run, str(tmp_path / "file"), "Not a directory", "choose another -o")
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_output_parent_is_refused(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        run = run_flint("extract", RAISES, "--mesh", "1", "-o", parent / "out")
        assert_one_line(run, str(parent), "Permission denied", "choose another -o")
        assert list(parent.iterdir()) == []
    finally:
        parent.chmod(0o755)


@pytest.mark.parametrize(
    "content, words",
    [
        (None, ("Is a directory", "readable .toml or .json file")),
        ('{"name": "x", "peak_tflops": NaN, "mem_bw_gbps": 100}', ("peak_tflops is nan", "finite")),
        ('{"name": "x", "peak_tflops": 100, "mem_bw_gbps": Infinity}', ("mem_bw_gbps is inf", "finite")),
        ('{"name": "x", "peak_tflops": 1e999, "mem_bw_gbps": 100}', ("peak_tflops is inf", "finite")),
        ('{"name": "x", "peak_tflops": "fast", "mem_bw_gbps": 100}', ("'fast', not a number",)),
        ('["x", 100, 100]', ("a list, not an object",)),
        ('{"name": "x", "peak_tflops": 100', ("not valid JSON", "Expecting")),
    ],
    ids=["directory", "nan", "infinity", "overflow", "string", "list", "truncated"],
)
def test_bad_device_file_is_refused(tmp_path, content, words):
    spec = tmp_path / "dev.json"
    if content is None:
        spec.mkdir()
    else:
        spec.write_text(content)
    before = snapshot(tmp_path)
    run = run_flint("extract", RAISES, "--mesh", "1", "-o", tmp_path / "out", "--device", spec)
    assert_one_line(run, str(spec), *words)
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------------------ the model file


@pytest.mark.parametrize(
    "source, words",
    [
        ("import sys\n\nsys.exit(3)\n", ("on import", "sys.exit(3) at model.py:3", "remove the call")),
        (
            "import sys\n\n\ndef workload(mesh):\n    sys.exit(3)\n",
            ("workload(mesh) called sys.exit(3) at model.py:5", "remove the call"),
        ),
        (
            "def workload(mesh):\n    return ('step', 42)\n",
            ("first element is of type str", "not a callable step function"),
        ),
        (
            "def workload(mesh):\n    return print\n",
            ("must return (step, args)", "returned an object of type builtin_function"),
        ),
    ],
    ids=["exit-on-import", "exit-in-workload", "step-is-a-str", "not-a-tuple"],
)
def test_misbehaving_model_file(tmp_path, source, words):
    model = tmp_path / "model.py"
    model.write_text(source)
    out = tmp_path / "out"
    assert_one_line(run_flint("extract", model, "--mesh", "1", "-o", out), "model.py", *words)
    assert not out.exists()


# ------------------------------------------------------------------------------ full disks


@pytest.mark.parametrize("previous", [False, True], ids=["new", "replacing"])
def test_full_disk_writing_the_trace(tmp_path, previous):
    out = tmp_path / "out"
    if previous:
        out.mkdir()
        (out / "keep.txt").write_text("previous")
    before = snapshot(tmp_path)
    run = run_flint("extract", EXAMPLES / "mlp.py", "--mesh", "1", "-o", out, "--force", entry=FULL_DISK)
    assert_one_line(run, f"no space left on device writing {str(out)!r}", "free space", "another -o")
    assert snapshot(tmp_path) == before


def test_full_temp_directory_during_the_compile(tmp_path):
    """XLA only logs a dump file it cannot write; a process whose files may not exceed 4 KiB makes
    every dump fail as a full disk would (ENOSPC and EFBIG both leave the file cut short)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    out = tmp_path / "out"

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    run = run_flint("extract", EXAMPLES / "mlp.py", "--mesh", "1", "-o", out,
                    env={**os.environ, "TMPDIR": str(temp)}, preexec_fn=small_files)
    assert_one_line(run, "XLA could not write", str(temp), "TMPDIR")
    assert list(temp.iterdir()) == [] and not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["tmp"]

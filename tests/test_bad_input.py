"""Every bad input gives one line on stderr saying what and how to fix, a non-zero exit, no output."""

from __future__ import annotations

import importlib.util
import os

import pytest
from conftest import EXAMPLES, MODELS, flint


def assert_refused(run, out, *words: str) -> None:
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("error: ")
    for word in words:
        assert word in lines[0], lines[0]
    assert not out.exists(), "nothing may be written on error"
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "staging left"


@pytest.mark.parametrize(
    "model, words",
    [
        (MODELS / "missing.py", ("not found",)),
        (MODELS / "README.txt", ("not found",)),
        (MODELS / "not_python.py", ("not valid Python", "line 1")),
        (MODELS / "raises.py", ("RuntimeError", "raises.py:3", "failed on purpose")),
        (MODELS / "no_entry.py", ("workload(mesh)",)),
        (MODELS / "indivisible.py", ("params/w", "dimension 0", "100", "data")),
    ],
    ids=["missing", "not-a-file", "not-python", "raises", "no-entry-point", "indivisible"],
)
def test_bad_model_file(tmp_path, model, words):
    out = tmp_path / "out"
    assert_refused(flint("extract", model, "--mesh", "8", "-o", out), out, *words)


@pytest.mark.parametrize("signature, args, words", [
    ("workload()", [], ("workload must take the mesh first", "def workload(mesh, ...)")),
    ("workload(*, mesh)", [], ("workload must take the mesh first",)),
    ("workload(mesh, layers)", [], ("needs the model argument 'layers'", "--model-arg layers=VALUE")),
    ("workload(mesh, layers=2)", ["--model-arg", "width=8"], ("has no model argument 'width'", "it takes layers")),
], ids=["no-mesh", "keyword-mesh", "missing-argument", "unknown-argument"])
def test_a_workload_signature_that_does_not_fit_is_one_line(tmp_path, signature, args, words):
    """Checked before the model runs: workload's own signature against the mesh and --model-arg."""
    model = tmp_path / "model.py"
    model.write_text(f"def {signature}:\n    raise RuntimeError('not reached')\n")
    out = tmp_path / "out"
    assert_refused(flint("extract", model, "--mesh", "8", "-o", out, *args), out, *words)


@pytest.mark.parametrize("batch, shape", [("abc", "('abc', 1024)"), ("-8", "(-8, 1024)"), ("True", "(True, 1024)")])
def test_an_input_size_that_is_no_size_is_one_line(tmp_path, batch, shape):
    """mlp.py's input x is (batch, 1024): a batch that is text, negative or a bool is no size."""
    out = tmp_path / "out"
    run = flint("extract", EXAMPLES / "mlp.py", "--mesh", "2", "-o", out, "--model-arg", f"batch={batch}")
    assert_refused(run, out, f"input args[1]['x'] has shape {shape}", "whole number, 0 or more")


@pytest.mark.parametrize("where, words", [
    ("file", ("--dump-ir", "exists and is not a directory")),
    ("out/ir", ("--dump-ir", "is inside the output", "which the trace replaces")),
], ids=["a-file", "inside-the-output"])
def test_a_dump_dir_that_cannot_keep_the_ir_is_one_line(tmp_path, where, words):
    (tmp_path / "file").write_text("")
    out = tmp_path / "out"
    run = flint("extract", EXAMPLES / "mlp.py", "--mesh", "2", "-o", out, "--dump-ir", tmp_path / where)
    assert_refused(run, out, *words)


def test_a_model_path_that_is_a_directory_or_holds_nul_bytes_is_one_line(tmp_path):
    (tmp_path / "model.py").mkdir()
    (tmp_path / "nul.py").write_bytes(b"x = 1\n\x00\n")
    out = tmp_path / "out"
    assert_refused(flint("extract", tmp_path / "model.py", "--mesh", "2", "-o", out), out, "is a directory")
    run = flint("extract", tmp_path / "nul.py", "--mesh", "2", "-o", out)
    assert_refused(run, out, "not valid Python: source code string cannot contain null bytes")
    assert "line None" not in run.stderr


@pytest.mark.parametrize("args", [("extract", EXAMPLES / "mlp.py", "--mesh", "2", "--device", ""),
                                  ("simulate", EXAMPLES, "--network", " "), ("inspect", EXAMPLES, "--device", "")])
def test_an_empty_device_or_network_is_refused_not_taken_for_the_default(tmp_path, args):
    run = flint(*args, "-o", tmp_path / "out") if args[0] == "extract" else flint(*args)
    assert run.returncode == 2 and "is empty: give a name or a file, or leave the option out" in run.stderr


def test_not_a_python_file(tmp_path):
    model = tmp_path / "model.txt"
    model.write_text("x = 1\n")
    out = tmp_path / "out"
    assert_refused(flint("extract", model, "--mesh", "2", "-o", out), out, "not a Python file")


@pytest.mark.parametrize("mesh", ["8x", "0x8", "-2", "axb", "data=4,data=2", "x=0"])
def test_malformed_mesh(tmp_path, mesh):
    out = tmp_path / "out"
    assert_refused(flint("extract", EXAMPLES / "mlp.py", "--mesh", mesh, "-o", out), out, "--mesh")


def test_mesh_larger_than_backend(tmp_path):
    out = tmp_path / "out"
    run = flint("extract", EXAMPLES / "mlp.py", "--mesh", "64x64", "--backend", "cpu", "-o", out)
    assert_refused(run, out, "4096", "2048", "--backend tpu:")


def test_mesh_beyond_the_gpu_rank_limit_is_refused_before_any_device_is_made(tmp_path):
    """2^20 + 1 ranks on the GPU backend: XLA's topology holds every virtual GPU in memory (about
    6 KB each), so a mesh of hundreds of millions would fill the memory before the model's own
    checks ran (without the limit, this mesh reaches them and fails on the batch instead)."""
    out = tmp_path / "out"
    run = flint("extract", EXAMPLES / "mlp.py", "--mesh", f"{2**20 + 1}", "--backend", "gpu:h100", "-o", out)
    assert_refused(run, out, "1,048,577 ranks", "1,048,576", "smaller mesh")


@pytest.mark.parametrize(
    "flags, words",
    [
        (("--backend", "fpga"), ("--backend 'fpga'", "tpu:<topology>", "gpu:<h100")),
        (("--backend", "tpu"), ("--backend 'tpu'", "tpu:<topology>")),
        (("--slices", "2"), ("--slices", "--backend tpu:")),
        (("--backend", "tpu:v5p:2x2x2", "--stage", "optimized"), ("--stage optimized", "CPU or GPU")),
        (("--backend", "gpu:h900"), ("gpu:h900", "gpu:h100")),
        (("--backend", "gpu:"), ("--backend 'gpu:'", "gpu:<h100")),
    ],
    ids=["unknown", "no-topology", "slices-on-cpu", "optimized-on-tpu", "unknown-gpu", "gpu-colon-names-none"],
)
def test_bad_backend(tmp_path, flags, words):
    out = tmp_path / "out"
    assert_refused(flint("extract", EXAMPLES / "mlp.py", "--mesh", "8", "-o", out, *flags), out, *words)


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu (flint-traces[tpu])")
@pytest.mark.parametrize(
    "mesh, backend, words",
    [
        ("4x4", "tpu:v5p:2x2x2", ("16 ranks", "8 devices", "mesh of 8 ranks")),
        ("8", "tpu:v5p:3x3x3", ("tpu:v5p:3x3x3", "tpu:v5p:16x16x32")),
    ],
    ids=["size-mismatch", "bad-topology"],
)
def test_bad_tpu_topology(tmp_path, mesh, backend, words):
    out = tmp_path / "out"
    run = flint("extract", EXAMPLES / "mlp.py", "--mesh", mesh, "--backend", backend, "-o", out)
    assert_refused(run, out, *words)


def test_output_directory_not_empty(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    run = flint("extract", EXAMPLES / "mlp.py", "--mesh", "2", "-o", out)
    assert run.returncode != 0 and "--force" in run.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_force_replaces_output_directory(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    run = flint("extract", EXAMPLES / "mlp.py", "--mesh", "2", "-o", out, "--force")
    assert run.returncode == 0, run.stderr
    assert not (out / "keep.txt").exists() and (out / "mlp.1.et").exists()


def test_unknown_op_warns_once_and_strict_refuses(tmp_path):
    out = tmp_path / "out"
    run = flint("extract", MODELS / "no_cost_rule.py", "--mesh", "2", "--backend", "cpu", "-o", out)
    assert run.returncode == 0, run.stderr
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "no cost rule" in warnings[0]
    strict = tmp_path / "strict"
    assert_refused(
        flint("extract", MODELS / "no_cost_rule.py", "--mesh", "2", "--backend", "cpu", "-o", strict, "--strict"),
        strict,
        "--strict",
    )


def test_debug_shows_traceback(tmp_path):
    run = flint("--debug", "extract", MODELS / "raises.py", "--mesh", "2", "-o", tmp_path / "o")
    assert run.returncode != 0 and "Traceback" in run.stderr


@pytest.mark.parametrize(
    "args, words",
    [
        (("extract", "examples/mlp.py"), ("Missing option '--mesh'", "flint extract --help")),
        (("extrct",), ("No such command 'extrct'", "flint --help")),
        (("check", "--rnks", "3", "x"), ("No such option '--rnks'", "--ranks", "flint check --help")),
        (("timeline", "examples", "-o", "t.json", "--plot", "bars.xyz"),
         ("'bars.xyz' is not a .png, .svg or .pdf file", "flint timeline --help")),
        (("sweep", "examples/sweep-mlp.toml", "-o", "s", "--plot", "front.gif"),
         ("'front.gif' is not a .png, .svg or .pdf file", "flint sweep --help")),
    ],
    ids=["missing-option", "unknown-command", "unknown-option", "timeline-plot-format", "sweep-plot-format"],
)
def test_usage_errors_are_one_line(args, words):
    run = flint(*args)
    assert run.returncode == 2
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert all(word in run.stderr for word in words), run.stderr


@pytest.mark.parametrize("command", [("sweep", "examples/sweep-mlp.toml", "-o"), ("timeline", "examples", "-o")],
                         ids=["sweep", "timeline"])
def test_a_plot_without_matplotlib_is_refused_before_any_work(tmp_path, command):
    """Where matplotlib cannot be imported, --plot is refused in one line before anything runs or
    is written; before, a sweep ran every point and then failed at the plot."""
    (tmp_path / "shim").mkdir()
    (tmp_path / "shim" / "matplotlib.py").write_text('raise ImportError("not installed")\n')
    out = tmp_path / "out"
    run = flint(*command, out, "--plot", tmp_path / "front.png", env={**os.environ, "PYTHONPATH": str(tmp_path / "shim")})
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "--plot needs matplotlib: pip install 'flint-traces[plot]'" in run.stderr
    assert not out.exists() and not (tmp_path / "front.png").exists()


@pytest.mark.parametrize("text, parsed", [
    ("layers=16", ("layers", 16)),
    ("rate=0.5", ("rate", 0.5)),
    ("scan=False", ("scan", False)),
    ("scan=false", ("scan", False)),  # as a shell user writes it: not the string "false", which is true
    (" scan = TRUE ", ("scan", True)),
    ("activation=gelu", ("activation", "gelu")),
    ("name='true'", ("name", "true")),  # a quoted literal stays a string
])
def test_model_arguments_read_as_literals_booleans_or_strings(text, parsed):
    from flint.frontend import parse_model_arg

    assert parse_model_arg(text) == parsed


def test_a_model_argument_without_a_name_is_one_line():
    from flint.errors import FlintError
    from flint.frontend import parse_model_arg

    with pytest.raises(FlintError, match=r"--model-arg '16' is not NAME=VALUE: give e.g. --model-arg layers=16"):
        parse_model_arg("16")

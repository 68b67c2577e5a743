"""`flint sweep`: the grid a spec expands to, counted by hand; a sweep that records every point,
skips what cannot work with the reason, and resumes after being killed without redoing a point.

The sweeps here run examples/mlp.py on the CPU backend (a few seconds a point). mlp per rank on
data=dp, tensor=tp with batch b: five matmuls of 2 * (b/dp) * 1024 * (4096/tp) FLOPs and the SGD
update of w_in and w_out, (1024 * 4096 / tp) values each at 2 FLOPs a value (a multiply and a
subtract), plus elementwise work on activations (under 0.2% here); the gradients of w_in and w_out,
in bf16, are all-reduced over the data group.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import io
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES, flint

from flint.exploration.spec import factorizations, read_spec
from flint.frontend.model_file import declared_signature

BF16 = 2


def test_factorizations_of_a_rank_count():
    assert list(factorizations(12, 2)) == [(1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)]
    # 64 = 2^6 over three axes: the ways to put six 2s in three places, C(8, 2)
    found = list(factorizations(64, 3))
    assert len(found) == len(set(found)) == math.comb(8, 2) == 28
    assert all(math.prod(f) == 64 for f in found)
    # 10^11 = 2^11 5^11: eleven 2s over three places, C(13, 2), and eleven 5s likewise; found without
    # trying each of 10^11 candidates
    found = list(factorizations(10**11, 3))
    assert len(found) == len(set(found)) == math.comb(13, 2) ** 2 and all(math.prod(f) == 10**11 for f in found)


def test_a_spec_expands_to_its_grid(tmp_path):
    spec = tmp_path / "sweep.toml"
    spec.write_text(f'model = "{EXAMPLES / "gpt.py"}"\nbackend = "gpu:h100"\n'
                    '[mesh]\nranks = 8\naxes = ["pp", "data", "tensor"]\n'
                    '[grid]\nstrategy = ["dp+tp", "fsdp+tp"]\nschedule = ["1f1b", "gpipe"]\n'
                    'model_args = { layers = [4] }\n')
    expanded = read_spec(spec)
    # 8 = 2^3 over three axes: C(5, 2) = 10 meshes, times 2 strategies, times 2 schedules
    assert len(expanded.points) == 10 * 2 * 2
    assert len({p.key for p in expanded.points}) == 40
    # the 4 meshes with pp=1 run no pipeline: their gpipe points are their 1f1b points again
    no_pipeline = [p for p in expanded.points if p.pipeline_stages is None]
    assert len(no_pipeline) == 4 * 2 * 2
    assert set(expanded.skipped) == {p.key for p in no_pipeline if p.options["schedule"] == "gpipe"}
    assert all(p.options["backend"] == "gpu:h100" and p.model_args == {"layers": 4} for p in expanded.points)


@pytest.mark.parametrize("text, message", [
    ('model = "m.py"\n[mesh]\nranks = 8\n', "give [mesh] shapes"),
    ('model = "m.py"\n[mesh]\nshapes = ["8"]\n[grid]\nlayers = [2]\n', "[grid] key 'layers' is not model_args"),
    ('[mesh]\nshapes = ["8"]\n', "give the model file"),
    ('model = "m.py"\n[mesh]\nshapes = ["data=0"]\n', "invalid [mesh] shape 'data=0'"),
    ('model = "m.py"\n[mesh]\nshapes = []\n', "[mesh] shapes is an empty list"),
    ('model = "m.py"\n[mesh]\nshapes = ["2x2", "data=2,tensor=2"]\n',
     "[mesh] shapes '2x2' and 'data=2,tensor=2' are one"),
    ('model = "m.py"\n[mesh]\nranks = true\naxes = ["data"]\n', "[mesh] ranks must be a positive integer"),
    ('model = "m.py"\n[mesh]\nshapes = ["8"]\n[grid]\nnetwork = ["hgx", "hgx"]\n', "[grid] network lists 'hgx' twice"),
    ('model = "m.py"\n[mesh]\nshapes = ["8"]\n[grid]\nmodel_args = { layers = [2, 2] }\n',
     "[grid] model_args.layers lists 2 twice"),
    ('model = "m.py"\n[mesh]\nshapes = ["8"]\nnetwork = "hgx"\n', "[mesh] key 'network' is not shapes, ranks or axes"),
    ('model = "m.py"\n[mesh]\nshapes = ["8"]\nranks = 8\n', "[mesh] gives shapes and ranks or axes"),
    ('model = "m.py"\n[mesh]\nshapes = ["8"]\n[grid]\nstrategy = ["dp", "dq"]\n', "strategy 'dq' is not one of dp,"),
    ('model = "m.py"\nschedule = "zb"\n[mesh]\nshapes = ["8"]\n', "schedule 'zb' is not one of gpipe, 1f1b"),
    ('model = "m.py"\n[mesh]\nshapes = ["8"]\n[grid]\nmicrobatches = [4, 0]\n', "microbatches 0 is not a positive"),
    ('model = "m.py"\ndonate = "yes"\n[mesh]\nshapes = ["8"]\n', "donate 'yes' is not true or false"),
    ('model = "m.py"\nnetwork = "hgx-z"\n[mesh]\nshapes = ["8"]\n', "unknown --network 'hgx-z': use one of"),
    ('model = "m.py"\n[mesh]\nshapes = ["8"]\n[grid]\nnetwork = ["missing.toml"]\n', "'missing.toml' not found"),
    ('model = "m.py"\ndevice = "h1000"\n[mesh]\nshapes = ["8"]\n', "unknown --device 'h1000'"),
    ('model = "m.py"\nbackend = "gpu:h1000"\n[mesh]\nshapes = ["8"]\n', "--backend gpu:h1000: no such GPU"),
    ('model = "m.py"\nmodel_args = 3\n[mesh]\nshapes = ["8"]\n', "model_args is 3, not a table"),
    ('model = "m.py"\ngrid = [1]\n[mesh]\nshapes = ["8"]\n', "grid is [1], not a table"),
    ('model = "m.py"\nstrategy = "dp"\n[mesh]\nshapes = ["8"]\n[grid]\nstrategy = ["fsdp"]\n',
     "strategy is given both fixed and in [grid]"),
    ('model = "m.py"\n[model_args]\nbatch = 8\n[mesh]\nshapes = ["8"]\n[grid]\nmodel_args = { batch = [4] }\n',
     "model_args.batch is given both fixed and in [grid]"),
], ids=["no-shapes", "grid-key", "no-model", "bad-mesh", "no-meshes", "one-mesh-twice", "bool-ranks", "value-twice",
        "model-arg-twice", "mesh-key", "mesh-both", "strategy", "schedule",
        "microbatches", "donate", "network", "network-file", "device", "backend", "model-args", "grid",
        "fixed-and-grid", "model-arg-fixed-and-grid"])
def test_a_bad_spec_is_one_line(tmp_path, text, message):
    """Refused before any point runs: a value no point could run with is not a skipped point."""
    spec = tmp_path / "bad.toml"
    spec.write_text(text)
    run = flint("sweep", spec, "-o", tmp_path / "out")
    assert run.returncode == 2 and message in run.stderr and len(run.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("workload, fixed, grid, message", [
    ("def workload(mesh, batch=8, width=1024):", "", "model_args = { widht = [1, 2] }",
     "workload(mesh, ...) has no model argument 'widht': it takes batch, width"),
    ("def workload(mesh, layers=2, *, width):", "model_args = { layers = 4 }", "",
     "workload(mesh, ...) needs the model argument 'width': give model_args.width in the spec"),
    ("def workload():", "", "", "workload must take the mesh first"),
], ids=["unknown", "missing", "no-mesh"])
def test_model_args_the_workload_cannot_take_are_refused_before_any_point(tmp_path, workload, fixed, grid, message):
    """Each point would import the file and be skipped for the same reason, one by one."""
    (tmp_path / "mlp.py").write_text(f"import sys\n\n\n{workload}\n    return None\n")
    spec = tmp_path / "bad.toml"
    spec.write_text(f'model = "mlp.py"\n{fixed}\n[mesh]\nshapes = ["8"]\n[grid]\n{grid}\n')
    run = flint("sweep", spec, "-o", tmp_path / "out")
    assert run.returncode == 2 and f"sweep spec {spec}: mlp.py: {message}" in run.stderr, run.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", [
    "def workload(mesh, **model_args):\n    pass\n",
    "import functools\n\n\n@functools.cache\ndef workload(mesh):\n    pass\n",
    "def make():\n    return lambda mesh, widht: None\n\n\nworkload = make()\n",
    "from models import *\n\n\ndef workload(mesh):\n    pass\n",
    "def model():\n    pass\n\n\ndef example_inputs():\n    pass\n",
    "def workload(mesh:\n",
], ids=["kwargs", "decorated", "assigned", "star-import", "torch", "syntax-error"])
def test_a_workload_its_text_does_not_settle_is_left_to_each_point(tmp_path, text):
    (tmp_path / "model.py").write_text(text)
    spec = tmp_path / "sweep.toml"
    spec.write_text('model = "model.py"\nmodel_args = { widht = 2 }\n[mesh]\nshapes = ["8"]\n')
    assert [p.model_args for p in read_spec(spec).points] == [{"widht": 2}]


def test_a_declared_signature_is_the_one_python_makes():
    text = "def workload(mesh, /, a, b=1, *rest, c, d=2, **kw):\n    pass\n"
    declared = declared_signature_of(text)
    made = inspect.signature(_defined(text))
    assert [(p.name, p.kind, p.default is p.empty) for p in declared.parameters.values()] == \
        [(p.name, p.kind, p.default is p.empty) for p in made.parameters.values()]


def declared_signature_of(text: str) -> inspect.Signature:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "model.py"
        path.write_text(text)
        return declared_signature(path)


def _defined(text: str):
    namespace: dict = {}
    exec(text, namespace)
    return namespace["workload"]


def test_finalists_without_astra_sim_are_refused_before_any_point(tmp_path):
    """No ASTRA-sim given, in $ASTRA_SIM or on PATH: the finalists could not be simulated."""
    spec, out = write_mlp_spec(tmp_path), tmp_path / "out"
    run = flint("sweep", spec, "-o", out, "--finalists", "1", env={"PATH": str(tmp_path)})
    assert run.returncode == 2 and "--finalists 1 simulates the best points with ASTRA-sim" in run.stderr
    assert not out.exists()


def test_a_plot_may_go_in_a_directory_the_sweep_makes(tmp_path):
    """-o DIR is made with its parents, so --plot may name a file in DIR or above it before either
    exists (as the --help example does: -o sweeps/gpt64 --plot sweeps/gpt64.png); a directory
    elsewhere that does not exist is refused before any point, and nothing is made. Before, any
    --plot in a directory that did not exist yet was refused."""
    pytest.importorskip("matplotlib")
    spec, made = write_mlp_spec(tmp_path), tmp_path / "sweeps"
    refused = flint("sweep", spec, "-o", made / "mlp", "--plot", tmp_path / "plots" / "mlp.png")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "directory" in refused.stderr and "does not exist and is not" in refused.stderr
    assert not made.exists() and not (tmp_path / "plots").exists()
    run = flint("sweep", spec, "-o", made / "mlp", "--plot", made / "mlp.png")
    assert run.returncode == 0, run.stderr
    assert (made / "mlp.png").read_bytes().startswith(b"\x89PNG") and (made / "mlp" / "results.csv").is_file()


def write_mlp_spec(tmp_path: Path) -> Path:
    spec = tmp_path / "mlp.toml"
    spec.write_text(f'model = "{EXAMPLES / "mlp.py"}"\nbackend = "cpu"\n'
                    '[mesh]\nshapes = ["data=2,tensor=2", "data=4,tensor=1"]\n'
                    '[grid]\nmodel_args = { batch = [8, 6] }\n')
    return spec


def records(directory: Path) -> list[dict]:
    return [json.loads(line) for line in (directory / "results.jsonl").read_text().splitlines()]


def check_mlp_records(found: dict[tuple[str, int], dict]) -> None:
    """By hand (module docstring); batch 6 does not divide over 4 data ranks."""
    assert set(found) == {("data=2,tensor=2", 8), ("data=2,tensor=2", 6), ("data=4,tensor=1", 8),
                          ("data=4,tensor=1", 6)}
    skipped = found["data=4,tensor=1", 6]
    assert skipped["status"] == "skipped" and "does not divide" in skipped["reason"]
    for (mesh, batch), record in found.items():
        if record is skipped:
            continue
        dp, tp = (int(part.split("=")[1]) for part in mesh.split(","))
        assert record["status"] == "ok", record
        assert record["ranks"] == 4
        matmuls_and_update = 5 * 2 * (batch // dp) * 1024 * (4096 // tp) + 2 * 2 * 1024 * (4096 // tp)
        assert matmuls_and_update <= record["flops_per_rank"] < 1.002 * matmuls_and_update
        gradients = 2 * 1024 * 4096 // tp * BF16
        assert gradients <= record["communication_bytes_per_rank"] < 1.01 * gradients
        assert record["step_us"] > 0 and record["memory_per_rank_bytes"] > 2 * 1024 * 4096 // tp * BF16


def by_point(rows: list[dict]) -> dict[tuple[str, int], dict]:
    return {(r["mesh"], r["model_args"]["batch"]): r for r in rows}


def test_a_killed_sweep_resumes_without_redoing_a_point(tmp_path):
    spec, out = write_mlp_spec(tmp_path), tmp_path / "out"
    first = subprocess.Popen([sys.executable, "-m", "flint", "sweep", str(spec), "-o", str(out)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    try:
        while not ((out / "results.jsonl").exists() and (out / "results.jsonl").read_text().count("\n") >= 1):
            assert first.poll() is None and time.monotonic() < deadline, "the sweep ended before a point"
            time.sleep(0.05)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the sweep and the point it was running
        first.wait()
    before = records(out)
    assert 1 <= len(before) < 4
    run = flint("sweep", spec, "-o", out, "--json")
    assert run.returncode == 0, run.stderr
    after = records(out)
    assert after[:len(before)] == before
    ids = [r["id"] for r in after]
    assert len(ids) == len(set(ids)) == 4  # every point once: none redone
    check_mlp_records(by_point(json.loads(run.stdout)))
    csv_rows = (out / "results.csv").read_text().splitlines()
    assert len(csv_rows) == 1 + 4 and csv_rows[0].startswith("id,status,reason,mesh,ranks")
    # a third run has nothing to do
    again = flint("sweep", spec, "-o", out)
    assert again.returncode == 0 and "(0 run now, 4 from earlier runs)" in again.stdout


def test_sigterm_stops_the_sweep_and_its_points(tmp_path):
    """SIGTERM to the sweep alone: it stops the point it is running, keeps what finished, and exits
    143 with one line."""
    spec, out = write_mlp_spec(tmp_path), tmp_path / "out"
    sweep = subprocess.Popen([sys.executable, "-m", "flint", "sweep", str(spec), "-o", str(out)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not ((out / "results.jsonl").exists() and (out / "results.jsonl").read_text().count("\n") >= 1):
        assert sweep.poll() is None and time.monotonic() < deadline, "the sweep ended before a point"
        time.sleep(0.05)
    sweep.send_signal(signal.SIGTERM)
    _, stderr = sweep.communicate(timeout=30)
    assert sweep.returncode == 143
    assert stderr.strip().endswith("every finished point is recorded in " + str(out) + "; rerun to resume")
    assert 1 <= len(records(out)) < 4
    points = subprocess.run(["pgrep", "-f", str(out / "points")], capture_output=True, text=True).stdout
    assert points == "", "a point's extraction outlived the sweep"


def test_a_sweep_runs_on_ray(tmp_path):
    pytest.importorskip("ray", reason="needs flint-traces[ray]")
    spec, out = write_mlp_spec(tmp_path), tmp_path / "out"
    run = flint("sweep", spec, "-o", out, "--ray", "--json")
    assert run.returncode == 0, run.stderr
    check_mlp_records(by_point(json.loads(run.stdout)))


SIMULATOR = os.environ.get("ASTRA_SIM", "")


@pytest.mark.skipif(not (SIMULATOR and os.access(SIMULATOR, os.X_OK)), reason="needs ASTRA-sim: set ASTRA_SIM")
def test_finalists_rank_by_the_estimator_and_simulate_the_best(tmp_path):
    """--finalists 2: every point is ranked by Flint's estimator; ASTRA-sim runs on the best two
    only, and the ranking shows both steps; no trace is left behind."""
    spec, out = write_mlp_spec(tmp_path), tmp_path / "out"
    run = flint("sweep", spec, "-o", out, "--finalists", "2", "--json")
    assert run.returncode == 0, run.stderr
    ok = sorted((r for r in json.loads(run.stdout) if r["status"] == "ok"), key=lambda r: (r["step_us"], r["id"]))
    assert len(ok) == 3
    assert all(r["estimated_step_us"] == r["step_us"] for r in ok)
    finalists = [r for r in ok if r.get("simulated_step_us") is not None]
    assert [r["id"] for r in finalists] == [r["id"] for r in ok[:2]]
    # ASTRA-sim's step stands beside the estimator's (collectives as NCCL runs them), which ranks
    for record in finalists:
        assert record["simulated_step_us"] > 0 and record["step_us"] == record["estimated_step_us"]
    assert not any((out / "points").glob("*/trace"))
    text = flint("sweep", spec, "-o", out)
    assert "ASTRA-sim on the finalists" in text.stdout


def test_a_point_times_collectives_as_its_spec_says(tmp_path):
    """[grid] collectives = nccl, astra-sim: each point's step is the one `flint simulate
    --collectives` gives on its (kept) trace."""
    spec, out = tmp_path / "mlp.toml", tmp_path / "out"
    spec.write_text(f'model = "{EXAMPLES / "mlp.py"}"\nbackend = "cpu"\n[mesh]\nshapes = ["data=4,tensor=1"]\n'
                    '[grid]\ncollectives = ["nccl", "astra-sim"]\n')
    run = flint("sweep", spec, "-o", out, "--keep-traces", "--json")
    assert run.returncode == 0, run.stderr
    found = {r["collectives"]: r for r in json.loads(run.stdout)}
    assert set(found) == {"nccl", "astra-sim"}
    for model, record in found.items():
        assert record["status"] == "ok", record
        trace = out / "points" / record["id"] / "trace"
        simulated = flint("simulate", trace, "--collectives", model, "--json", "-o", tmp_path / model)
        assert json.loads(simulated.stdout)["step_us"] == pytest.approx(record["step_us"])
    assert found["nccl"]["step_us"] != found["astra-sim"]["step_us"]


NETWORKS = Path(__file__).resolve().parent.parent / "src" / "flint" / "step" / "networks"
DEVICE_FILES = Path(__file__).resolve().parent.parent / "src" / "flint" / "devices" / "data"
MLP_SIZES = "BATCH, D_MODEL, D_HIDDEN = 256, 1024, 4096"


def mlp_flops(batch: int, dp: int, tp: int, hidden: int = 4096, width: int = 1024) -> int:
    """Per rank, by hand (module docstring): five matmuls and the SGD update of w_in and w_out."""
    return 5 * 2 * (batch // dp) * width * (hidden // tp) + 2 * 2 * width * (hidden // tp)


def test_a_point_id_covers_the_model_file(tmp_path):
    """Two models swept into one directory on the same mesh: each runs, and each record names its
    model file and the SHA-256 of its bytes. Before, a point's id covered its mesh, options and
    model arguments only, so the second model's sweep printed the first's result as its own. An
    unchanged model is reused; an edited one (a comment added) runs again."""
    out, text = tmp_path / "out", (EXAMPLES / "mlp.py").read_text()
    assert MLP_SIZES in text
    mlp, big = tmp_path / "mlp.py", tmp_path / "bigmlp.py"
    mlp.write_text(text)
    big.write_text(text.replace(MLP_SIZES, "BATCH, D_MODEL, D_HIDDEN = 256, 1024, 8 * 4096"))

    def sweep(model: Path):
        spec = tmp_path / f"{model.stem}.toml"
        spec.write_text(f'model = "{model.name}"\nbackend = "cpu"\n[mesh]\nshapes = ["data=2,tensor=2"]\n')
        run = flint("sweep", spec, "-o", out)
        assert run.returncode == 0, run.stderr
        return run.stdout

    assert "(1 run now, 0 from earlier runs)" in sweep(mlp)
    assert "(1 run now, 0 from earlier runs)" in sweep(big)
    rows = records(out)
    assert len(rows) == 2 and rows[0]["id"] != rows[1]["id"]
    for row, model, hidden in ((rows[0], mlp, 4096), (rows[1], big, 8 * 4096)):
        assert row["status"] == "ok", row
        assert row["model"] == str(model.resolve())
        assert row["model_sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
        assert mlp_flops(256, 2, 2, hidden) <= row["flops_per_rank"] < 1.002 * mlp_flops(256, 2, 2, hidden)
    header = (out / "results.csv").read_text().splitlines()[0].split(",")
    assert {"model", "model_sha256"} <= set(header)
    assert "(0 run now, 1 from earlier runs)" in sweep(big)
    big.write_text(big.read_text() + "# edited\n")
    assert "(1 run now, 0 from earlier runs)" in sweep(big)
    assert len(records(out)) == 3


def table_rows(text: str) -> list[list[str]]:
    """The body rows of a rich table, each cell's folded pieces joined."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        if cells[0]:
            rows.append(cells)
        else:
            rows[-1] = [a + b for a, b in zip(rows[-1], cells)]
    return rows


def test_the_ranking_shows_every_key_that_varies(monkeypatch, tmp_path):
    """Ten points that differ in network and collectives only: each row of the ranking names its
    network and collectives, and each label on the plot too; numbers stay whole in 80 columns.
    Before, every row read `data=2,tensor=4 │ dp+tp │ - │ -`."""
    from rich.console import Console

    from flint.exploration.view import sweep_view

    networks = ["hgx", "nvl72", "hgx-a100", "mynet.toml", "ring.yml"]
    rows = [{"id": f"p{i:02}", "status": "ok", "mesh": "data=2,tensor=4", "ranks": 8, "strategy": "dp+tp",
             "pipeline_stages": None, "network": network, "collectives": collectives, "backend": "gpu:h100",
             "model_args": {}, "step_us": 1_234_567.891 + 1000 * i, "memory_per_rank_bytes": (20 - i) * 2**28,
             "fits": True}
            for i, (network, collectives) in enumerate(itertools.product(networks, ["nccl", "astra-sim"]))]
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(sweep_view(rows, top=10, ran=10, reused=0))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    shown = table_rows(text)
    assert len(shown) == 10
    for place, (row, cells) in enumerate(zip(rows, shown), 1):  # fastest first: the grid's order here
        assert cells[0] == str(place)
        assert row["network"] in cells and row["collectives"] in cells, cells
        assert f"{row['step_us'] / 1e3:,.3f}" in cells and f"{row['memory_per_rank_bytes'] / 2**30:,.2f}" in cells
    assert "data=2,tensor=4" in text and "dp+tp" in text

    pytest.importorskip("matplotlib")
    import matplotlib.axes

    from flint.exploration.plot import plot_sweep

    labels = []
    monkeypatch.setattr(matplotlib.axes.Axes, "annotate", lambda self, text, *a, **k: labels.append(text))
    plot_sweep(rows, tmp_path / "plot.png", "ten points")
    # every point is on the Pareto front: each slower one needs less memory
    assert len(labels) == 10 and len(set(labels)) == 10
    for row in rows:
        assert any(row["network"] in label and row["collectives"] in label for label in labels), labels


def test_network_and_device_files_are_read_beside_the_spec(tmp_path):
    """`network` and `device` files named in a spec are read from the spec's directory, as its
    model is, whatever the working directory; before, only from the working directory. A copy of
    the hgx preset times the step as hgx does; the ranking names each point's network."""
    specs, elsewhere, out = tmp_path / "specs", tmp_path / "elsewhere", tmp_path / "out"
    specs.mkdir()
    elsewhere.mkdir()
    (specs / "mynet.toml").write_text((NETWORKS / "hgx.toml").read_text())
    (specs / "mydev.toml").write_text((DEVICE_FILES / "h100.toml").read_text())
    spec = specs / "nets.toml"
    spec.write_text(f'model = "{EXAMPLES / "mlp.py"}"\nbackend = "cpu"\ndevice = "mydev.toml"\n'
                    '[mesh]\nshapes = ["data=4,tensor=2"]\n[grid]\nnetwork = ["hgx", "mynet.toml"]\n')
    run = flint("sweep", spec, "-o", out, "--json", cwd=elsewhere)
    assert run.returncode == 0, run.stderr
    found = {r["network"]: r for r in json.loads(run.stdout)}
    assert set(found) == {"hgx", "mynet.toml"} and all(r["status"] == "ok" for r in found.values()), found
    assert found["mynet.toml"]["step_us"] == pytest.approx(found["hgx"]["step_us"])
    table = flint("sweep", spec, "-o", out, cwd=elsewhere, env={**os.environ, "COLUMNS": "80"})
    assert {tuple(c for c in cells if c in found) for cells in table_rows(table.stdout)} == {("hgx",), ("mynet.toml",)}


@pytest.mark.parametrize("option, value", [("network", "mynet.toml"), ("device", "mydev.json")])
def test_a_missing_file_in_a_spec_says_where_it_looked(tmp_path, option, value):
    directory = tmp_path / "x"
    directory.mkdir()
    spec = directory / "nets.toml"
    spec.write_text(f'model = "{EXAMPLES / "mlp.py"}"\n[mesh]\nshapes = ["8"]\n[grid]\n{option} = ["{value}"]\n')
    run = flint("sweep", spec, "-o", tmp_path / "out", cwd=tmp_path)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert f"{value!r} not found" in run.stderr and str(directory / value) in run.stderr
    assert not (tmp_path / "out").exists()


def test_duplicates_are_not_counted_as_earlier_runs(tmp_path):
    """On a fresh directory, a point skipped as the same as another is no point from an earlier
    run (before: "(1 run now, 1 from earlier runs)"); a sweep without --keep-traces leaves its
    results and nothing else (before, an empty points/ too)."""
    spec, out = tmp_path / "mlp.toml", tmp_path / "out"
    spec.write_text(f'model = "{EXAMPLES / "mlp.py"}"\nbackend = "cpu"\n[mesh]\nshapes = ["data=4"]\n'
                    '[grid]\nschedule = ["1f1b", "gpipe"]\n')
    run = flint("sweep", spec, "-o", out)
    assert run.returncode == 0, run.stderr
    assert "1 ran, 1 skipped, 0 failed (1 run now, 0 from earlier runs, 1 the same as another point)" in run.stdout
    assert sorted(p.name for p in out.iterdir()) == ["results.csv", "results.jsonl"]
    again = flint("sweep", spec, "-o", out)
    assert "(0 run now, 1 from earlier runs, 1 the same as another point)" in again.stdout


def test_a_record_appended_after_a_cut_off_line_is_whole(tmp_path):
    """A sweep killed mid-write leaves a last line without its end: the next record must not be
    appended to it (before, the two made one invalid line, and the new record was lost on reading
    back). A record missing only its newline is kept."""
    from flint.exploration.results import LOG, ResultStore

    whole, cut = {"id": "a" * 12, "status": "ok"}, json.dumps({"id": "b" * 12, "status": "ok"})
    (tmp_path / LOG).write_text(json.dumps(whole) + "\n" + cut[:20])
    ResultStore(tmp_path).add({"id": "c" * 12, "status": "ok"})
    lines = (tmp_path / LOG).read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a" * 12, "c" * 12]
    assert set(ResultStore(tmp_path).records) == {"a" * 12, "c" * 12}

    (tmp_path / LOG).write_text(json.dumps(whole))
    ResultStore(tmp_path).add({"id": "c" * 12, "status": "ok"})
    assert [json.loads(line)["id"] for line in (tmp_path / LOG).read_text().splitlines()] == ["a" * 12, "c" * 12]


@pytest.mark.parametrize("taken", ["results.jsonl", "results.csv"])
def test_a_directory_where_results_go_is_refused_before_any_point(tmp_path, taken):
    """A directory named as the log or the table: one line, before any point runs, and nothing
    written beside it. Before, the point ran and then a traceback (IsADirectoryError) left a staged
    `.results.csv.tmp` (or, for the log, a traceback at once)."""
    spec, out = tmp_path / "mlp.toml", tmp_path / "out"
    spec.write_text(f'model = "{EXAMPLES / "mlp.py"}"\nbackend = "cpu"\n[mesh]\nshapes = ["data=4"]\n')
    (out / taken).mkdir(parents=True)
    run = flint("sweep", spec, "-o", out)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert f"'{out / taken}' is a directory, where the sweep keeps its results" in run.stderr
    assert [p.name for p in out.iterdir()] == [taken]


def test_a_log_that_cannot_be_written_is_one_line(tmp_path):
    """Files limited to 2 KiB (ulimit -f 2) and a record of 4 KiB: the store says which file it
    could not write and why, in the one line the CLI prints (before: a raw OSError's traceback)."""
    store = ("import resource, sys\nfrom pathlib import Path\nfrom flint.errors import FlintError\n"
             "from flint.exploration.results import ResultStore\n"
             "resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))\n"
             "try:\n    ResultStore(Path(sys.argv[1])).add({'id': 'a' * 12, 'status': 'failed', 'reason': 'x' * 4096})\n"
             "except FlintError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", store, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout == f"cannot write '{tmp_path / 'results.jsonl'}': File too large\n"


def test_a_model_that_raises_is_failed_and_retried(tmp_path):
    """A model whose code raises is failed, not skipped (skipped is for a configuration extract
    refuses, such as a size that does not divide), so --retry-failed runs it again once the
    model is fixed (here in a module it imports, so that the model file itself is unchanged)."""
    (tmp_path / "helper.py").write_text("raise RuntimeError('helper broken')\n")
    (tmp_path / "model.py").write_text("import helper  # noqa: F401\n" + (EXAMPLES / "mlp.py").read_text())
    spec, out = tmp_path / "model.toml", tmp_path / "out"
    spec.write_text('model = "model.py"\nbackend = "cpu"\n[mesh]\nshapes = ["data=4"]\n')
    run = flint("sweep", spec, "-o", out, "--json")
    assert run.returncode == 0, run.stderr
    [record] = json.loads(run.stdout)
    assert record["status"] == "failed" and "RuntimeError" in record["reason"] and "helper broken" in record["reason"]
    (tmp_path / "helper.py").write_text("")
    fixed = flint("sweep", spec, "-o", out, "--json", "--retry-failed")
    [record] = json.loads(fixed.stdout)
    assert record["status"] == "ok", record
    assert mlp_flops(256, 4, 1) <= record["flops_per_rank"] < 1.002 * mlp_flops(256, 4, 1)


def test_a_plot_no_point_can_have_is_refused_before_any_point(tmp_path):
    """Every point pipelined: none has a memory figure, so --plot is refused before any work."""
    pytest.importorskip("matplotlib")
    spec, out = tmp_path / "pp.toml", tmp_path / "out"
    spec.write_text(f'model = "{EXAMPLES / "mlp.py"}"\nbackend = "cpu"\n[mesh]\nshapes = ["pp=2,data=2"]\n')
    run = flint("sweep", spec, "-o", out, "--plot", tmp_path / "plot.png")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "--plot" in run.stderr and "pipelined" in run.stderr
    assert not out.exists() and not (tmp_path / "plot.png").exists()


def test_a_plot_with_no_point_to_draw_comes_after_the_ranking(tmp_path):
    """Every point skipped (batch 6 does not divide over 4 data ranks): the ranking and the
    counts are printed, then one line says why there is no plot."""
    pytest.importorskip("matplotlib")
    spec, out = tmp_path / "mlp.toml", tmp_path / "out"
    spec.write_text(f'model = "{EXAMPLES / "mlp.py"}"\nbackend = "cpu"\nmodel_args = {{ batch = 6 }}\n'
                    '[mesh]\nshapes = ["data=4"]\n')
    run = flint("sweep", spec, "-o", out, "--plot", tmp_path / "plot.png")
    assert run.returncode == 2, run.stderr
    assert "0 ran, 1 skipped, 0 failed" in run.stdout
    assert len(run.stderr.strip().splitlines()) == 1 and "no plot" in run.stderr, run.stderr
    assert not (tmp_path / "plot.png").exists() and len(records(out)) == 1


def test_an_astra_sim_network_of_other_npus_is_refused_before_any_point(tmp_path):
    """A ring of 8 NPUs swept with meshes of 8 and 16 ranks: refused in one line before any point
    runs, naming the network and the mesh it does not fit (before, each such point failed after
    its extraction, and the sweep exited 0)."""
    (tmp_path / "ring.yml").write_text("topology: [ Ring ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\n"
                                       "latency: [ 500.0 ]\n")
    spec, out = tmp_path / "ring.toml", tmp_path / "out"
    spec.write_text(f'model = "{EXAMPLES / "mlp.py"}"\nbackend = "cpu"\n[mesh]\nshapes = ["data=8", "data=16"]\n'
                    '[grid]\nnetwork = ["hgx", "ring.yml"]\n')
    run = flint("sweep", spec, "-o", out)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "ring.yml" in run.stderr and "8 NPUs" in run.stderr and "data=16" in run.stderr
    assert not out.exists()


def test_ray_missing_leaves_nothing(tmp_path):
    """--ray without Ray is refused before -o DIR (and its parents) is made."""
    if importlib.util.find_spec("ray") is not None:
        pytest.skip("Ray is installed")
    spec, out = write_mlp_spec(tmp_path), tmp_path / "made" / "sweeps" / "mlp"
    run = flint("sweep", spec, "-o", out, "--ray", "auto")
    assert run.returncode == 2 and "--ray needs Ray" in run.stderr
    assert not (tmp_path / "made").exists()


def test_an_interrupted_sweep_leaves_no_empty_folder(tmp_path):
    """SIGINT while two points run with --keep-traces: the points interrupted leave no empty
    points/<id>/ behind (nor an empty points/)."""
    spec, out = write_mlp_spec(tmp_path), tmp_path / "out"
    sweep = subprocess.Popen([sys.executable, "-m", "flint", "sweep", str(spec), "-o", str(out), "--jobs", "2",
                              "--keep-traces"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not ((out / "points").is_dir() and len(list((out / "points").iterdir())) >= 2):
        assert sweep.poll() is None and time.monotonic() < deadline, "the sweep ended before two points started"
        time.sleep(0.02)
    time.sleep(0.5)
    sweep.send_signal(signal.SIGINT)
    _, stderr = sweep.communicate(timeout=60)
    assert sweep.returncode == 130, stderr
    empty = [p for p in [out, *out.rglob("*")] if p.is_dir() and not any(p.iterdir())]
    assert empty == []


def test_a_plot_label_reads_as_the_point_and_leaves_out_what_does_not_apply():
    """Mesh, strategy and pipeline read as themselves; other settings as name=value; a pipeline a
    point does not have is left out. Before: 'pp=1,data=64,tensor=1 strategy=dp+tp pipeline=-'."""
    from flint.exploration.view import labels

    flat = {"mesh": "pp=1,data=64,tensor=1", "strategy": "dp+tp", "network": "hgx"}
    piped = {"mesh": "pp=8,data=8,tensor=1", "strategy": "fsdp+tp", "pipeline_stages": 8, "schedule": "gpipe",
             "microbatches": 4, "network": "nvl72"}
    assert labels([flat, piped], [flat, piped]) == ["pp=1,data=64,tensor=1 dp+tp network=hgx",
                                                    "pp=8,data=8,tensor=1 fsdp+tp 8 x gpipe, 4 mb network=nvl72"]

"""`flint extract --rank-files classes`: one file per rank class, enough for Flint's estimator.

A pipelined GPT on `pp=2,data=2,tensor=2` has two rank classes, its two stages: every rank of a
stage runs the same nodes and differs only in group ids and peers. The mesh puts `pp` first, so
stage 1's lowest rank is 8 / 2 = 4, and the set holds ranks 0 and 4 only. The estimator must give
the same step from those two files as from every rank's, which it schedules rank by rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXTRACT = [
    "extract", str(ROOT / "examples" / "gpt.py"), "--mesh", "pp=2,data=2,tensor=2", "--strategy", "dp+tp",
    "--pipeline-stages", "2", "--microbatches", "4", "--backend", "cpu", "--model-arg", "layers=4",
    "--force", "--json",
]


def flint(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flint", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """The same step extracted with every rank's file and with one per class."""
    found = {}
    for kind in ("all", "classes"):
        out = tmp_path_factory.mktemp(kind) / "gpt"
        run = flint(*EXTRACT, "-o", str(out), "--rank-files", kind)
        assert run.returncode == 0, run.stderr
        found[kind] = out, json.loads(run.stdout)
    return found


def rank_files(directory: Path) -> dict[int, int]:
    """Rank -> size in bytes of its `.et` file."""
    return {int(name.split(".")[1]): (directory / name).stat().st_size
            for name in os.listdir(directory) if name.endswith(".et")}


def test_one_file_per_stage_and_the_manifest_says_so(traces):
    directory, summary = traces["classes"]
    assert sorted(rank_files(directory)) == [0, 4]
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["rank_files"] == "classes" and manifest["ranks"] == 8
    assert [entry["ranks"] for entry in manifest["rank_totals"]] == [[[0, 3]], [[4, 7]]]
    assert summary["rank_files"] == "classes" and summary["files"] == 5  # 2 traces, groups, graph, manifest


def test_a_rank_the_class_set_has_no_file_of_names_the_files_it_has(traces):
    """The set holds ranks 0 and 4 of 8. Before: 'its files are of ranks 0 to 4', as if 1 to 3
    were there too."""
    directory, _ = traces["classes"]
    run = flint("inspect", str(directory), "--rank", "3")
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert ("no trace file for rank 3; it holds one file per rank class of 8 ranks (flint extract --rank-files "
            "classes), of ranks 0, 4: choose one of those") in run.stderr


def test_sizes_told_match_the_files(traces):
    """The bytes the summary reports are those on disk; every rank's, estimated from one file per
    class, is within the few bytes by which group ids and peers change a file's varints."""
    classes_dir, classes = traces["classes"]
    all_dir, every = traces["all"]
    written = rank_files(classes_dir)
    assert classes["trace_bytes"] == sum(written.values())
    on_disk = sum(rank_files(all_dir).values())
    assert every["trace_bytes"] == every["every_rank_trace_bytes"] == on_disk
    assert classes["every_rank_trace_bytes"] == pytest.approx(on_disk, rel=1e-3)
    assert classes["every_rank_trace_bytes"] == 4 * written[0] + 4 * written[4]


def test_the_estimate_is_every_ranks(traces):
    steps = {}
    for kind, (directory, _) in traces.items():
        run = flint("simulate", str(directory), "--engine", "flint", "--json", "-o", str(directory.parent / "sim"))
        assert run.returncode == 0, run.stderr
        steps[kind] = json.loads(run.stdout)
    assert steps["classes"]["step_us"] == pytest.approx(steps["all"]["step_us"], rel=1e-9)
    by_rank = {r["rank"]: r for r in steps["all"]["per_rank"]}
    assert len(steps["classes"]["per_rank"]) == 8
    for rank in steps["classes"]["per_rank"]:
        assert rank["step_us"] == pytest.approx(by_rank[rank["rank"]]["step_us"], rel=1e-9)


def test_astra_sim_and_check_say_every_rank_is_needed(traces):
    directory, _ = traces["classes"]
    run = flint("simulate", str(directory), "--engine", "astra-sim")
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "--rank-files all" in run.stderr
    check = flint("check", str(directory), "--json")
    findings = json.loads(check.stdout)
    assert check.returncode == 1
    assert [(f["rule"], f["severity"]) for f in findings["violations"]] == [("rank-files", "error")]
    assert "--rank-files all" in findings["violations"][0]["message"]


@pytest.mark.parametrize(("engine", "keep", "expected"), [
    ("flint", False, "classes"),  # only the estimator reads the trace, which is then deleted
    ("flint", True, "all"),  # a kept trace is the user's: every rank's file
    ("auto", False, "all"),  # ASTRA-sim may run it
])
def test_a_sweep_point_writes_one_file_per_class_only_for_the_estimator(tmp_path, engine, keep, expected):
    from flint.exploration.point import Processes, run_point
    from flint.exploration.spec import Point

    commands = []

    class Recording(Processes):
        def run(self, command):
            commands.append(command)
            return subprocess.CompletedProcess(command, 2, "", "error: refused\n")

    record = run_point(Path("m.py"), Point("data=2"), tmp_path / "p", keep_traces=keep, processes=Recording(),
                       engine=engine)
    assert record["status"] == "skipped"
    (command,) = commands
    assert command[command.index("--rank-files") + 1] == expected


def test_a_set_whose_classes_are_single_ranks_is_every_ranks(tmp_path):
    """On `pp=2` each stage is one rank, so one file per class is every rank's file: check and
    simulate both take it as a whole trace, which ASTRA-sim can run."""
    out = tmp_path / "gpt"
    run = flint("extract", str(ROOT / "examples" / "gpt.py"), "--mesh", "pp=2", "--pipeline-stages", "2",
                "--microbatches", "2", "--backend", "cpu", "--model-arg", "layers=2", "--rank-files", "classes",
                "-o", str(out), "--json")
    assert run.returncode == 0, run.stderr
    assert sorted(rank_files(out)) == [0, 1]
    check = flint("check", str(out), "--json")
    assert check.returncode == 0, check.stdout
    from flint.trace.reader import locate_traces

    assert not locate_traces(out).one_per_class

"""One machine-readable vocabulary: `extract --json`, `manifest.json`, `inspect --json` and
`check --json` name the same things alike and count them alike; `--debug` and the exit codes are
the same on every command.

FLOPs per rank are those of the COMP nodes that compute: `num_ops` above 1, since the contract makes
a node that only moves data carry 1 (`flint.trace.vocabulary`). Read from the files with protobuf's
own decoder here, they must equal what `extract` counted on the graph and what `inspect` reads.
The MLP on 2x4 (b = 256 / 2 rows, h = 4,096 / 4 hidden columns per rank, D = 1,024) runs five
[b, D] x [D, h]-sized matmuls per rank: two forward, three backward (the gradients of both weights
and of the hidden activation; the input needs none), 5 * 2 * b * D * h FLOPs, plus elementwise work.
"""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES, extract, flint, load_example
from test_roundtrip import decode_independently
from test_trace_contract import set_attr, valid_trace

from flint.cli import main
from flint.schema import et_def_pb2 as pb
from flint.trace.vocabulary import collective_name, compute_flops, node_type_name

BF16, F32 = 2, 4
COMMUNICATION = re.compile(
    r"(all_reduce|all_gather|reduce_scatter|all_to_all|broadcast|send|recv|comm_type_(\d+|unknown))"
)
NODE_TYPE = re.compile(r"(comp|comm_coll|comm_send|comm_recv|mem_load|mem_store|metadata|invalid"
                       r"|node_type_\d+)")
TOTALS = {"nodes": int, "flops": int, "transcendentals": int, "bytes": int, "collectives": dict}
VIOLATION = {"rule": str, "severity": str, "rank": (int, type(None)), "node_id": (int, type(None)),
             "message": str, "count": int}


def assert_totals(totals: dict) -> None:
    """The per-rank totals every command prints: these keys and types, communication by name."""
    for key, kind in TOTALS.items():
        assert isinstance(totals[key], kind), (key, totals[key])
    for name, entry in totals["collectives"].items():
        assert COMMUNICATION.fullmatch(name), name
        assert set(entry) == {"count", "bytes"} and all(isinstance(v, int) for v in entry.values())


def assert_check_report(report: dict) -> None:
    assert set(report) == {"ok", "errors", "warnings", "violations"}
    for violation in report["violations"]:
        assert set(violation) == set(VIOLATION)
        for key, kind in VIOLATION.items():
            assert isinstance(violation[key], kind), (key, violation)
        assert violation["severity"] in ("error", "warning")
    errors = sum(v["severity"] == "error" for v in report["violations"])
    assert (report["ok"], report["errors"], report["warnings"]) == (
        errors == 0, errors, len(report["violations"]) - errors
    )


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    """`flint extract --json` of a bundled example on 2x4, once per module: (directory, summary)."""
    cache = {}

    def get(name: str):
        if name not in cache:
            out = tmp_path_factory.mktemp(name) / "traces"
            cache[name] = out, extract(EXAMPLES / f"{name}.py", "2x4", out)
        return cache[name]

    return get


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_extract_inspect_and_manifest_agree(extracted, name):
    directory, summary = extracted(name)
    per_rank = summary["per_rank"]
    assert_totals(per_rank)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert {k: v for k, v in manifest["rank_totals"][0].items() if k != "ranks"} == per_rank
    run = flint("inspect", directory, "--json")
    assert run.returncode == 0, run.stderr
    ranks = json.loads(run.stdout)
    for rank in ranks:
        assert_totals(rank)
        assert all(NODE_TYPE.fullmatch(kind) for kind in rank["nodes_by_type"])
        assert {key: rank[key] for key in TOTALS} == per_rank, rank["rank"]

    _, nodes = decode_independently(directory / f"{name}.0.et")
    num_ops = [next(a.int64_val for a in n.attr if a.name == "num_ops")
               for n in nodes if n.type == pb.COMP_NODE]
    assert per_rank["flops"] == sum(ops for ops in num_ops if ops > 1)
    # Nodes that only move data are in the trace with one op each, and are not FLOPs.
    assert sum(num_ops) - per_rank["flops"] == num_ops.count(1) > 0


def test_mlp_counts_by_hand(extracted):
    mlp = load_example("mlp")
    _, summary = extracted("mlp")
    b, h, d = mlp.BATCH // 2, mlp.D_HIDDEN // 4, mlp.D_MODEL
    matmuls = 5 * 2 * b * d * h
    assert matmuls <= summary["per_rank"]["flops"] < matmuls * 1.01
    assert summary["per_rank"]["collectives"] == {
        "all_reduce": {"count": 4, "bytes": b * d * BF16 + 2 * d * h * BF16 + F32}
    }


def test_check_json(extracted, tmp_path):
    directory, _ = extracted("mlp")
    run = flint("check", directory, "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert_check_report(report)
    assert report == {"ok": True, "errors": 0, "warnings": 0, "violations": []}

    trace = valid_trace()
    set_attr(trace.node(2, 1), "num_ops", "int64_val", 0)
    run = flint("check", trace.write(tmp_path), "--json")
    assert run.returncode == 1
    report = json.loads(run.stdout)
    assert_check_report(report)
    assert report["violations"] == [{"rule": "num-ops", "severity": "error", "rank": 2, "node_id": 1,
                                     "message": "num_ops must be > 0, got 0", "count": 1}]


def test_send_and_recv_are_named_as_extract_names_them(tmp_path):
    """The hand-built contract trace: rank 1 sends 512 B to rank 2."""
    run = flint("inspect", valid_trace().write(tmp_path), "--json")
    assert run.returncode == 0, run.stderr
    ranks = {s["rank"]: s for s in json.loads(run.stdout)}
    assert ranks[1]["collectives"]["send"] == {"count": 1, "bytes": 512}
    assert ranks[2]["collectives"]["recv"] == {"count": 1, "bytes": 512}
    assert "send" not in ranks[0]["collectives"] and ranks[0]["nodes_by_type"]["mem_load"] == 1


def test_vocabulary_names():
    assert [collective_name(t) for t in (pb.ALL_REDUCE, pb.REDUCE_SCATTER, pb.BROADCAST)] == [
        "all_reduce", "reduce_scatter", "broadcast"
    ]
    assert (collective_name(42), collective_name(None)) == ("comm_type_42", "comm_type_unknown")
    assert [node_type_name(t) for t in (pb.COMP_NODE, pb.COMM_RECV_NODE, 82)] == [
        "comp", "comm_recv", "node_type_82"
    ]
    assert [compute_flops(n) for n in (1, 2, 1000)] == [0, 2, 1000]


# -- the same command line conventions on every command --------------------------------------------

@pytest.mark.parametrize("command", sorted(main.commands))
def test_debug_is_an_option_of_every_command(command):
    result = CliRunner().invoke(main, [command, "--debug", "--help"])
    assert result.exit_code == 0, result.output
    assert "--debug" in result.output


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_before_or_after_the_command_shows_the_traceback(tmp_path, where):
    missing = str(tmp_path / "nothing")
    args = ["--debug", "inspect", missing] if where == "before" else ["inspect", missing, "--debug"]
    run = flint(*args)
    assert run.returncode == 1 and "Traceback (most recent call last)" in run.stderr
    run = flint("inspect", missing)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1


def test_usage_errors_exit_2(tmp_path):
    for args in (["nosuch"], ["check"], ["check", str(tmp_path), "--ranks", "0"],
                 ["inspect", str(tmp_path), "--bogus"], ["extract", "--debug"]):
        run = flint(*args)
        assert run.returncode == 2, (args, run.stderr)
        assert run.stderr.startswith("error: ") and len(run.stderr.strip().splitlines()) == 1


def test_ctrl_c_exits_130(tmp_path, monkeypatch):
    def interrupt(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr("flint.analysis.summary.summarize", interrupt)
    result = CliRunner().invoke(main, ["inspect", str(valid_trace().write(tmp_path))])
    assert result.exit_code == 130 and "interrupted" in result.output

"""`flint inspect` details and `flint graph` on the hand-built trace of the contract tests.

That trace, per rank: COMP 1 (1,000 ops, 4,096 B) -> ALL_REDUCE 2 of 1,024 B on the rank's pair
group -> ALL_GATHER 3 of 256 B on all 4 ranks -> SEND 1->2 of 512 B (rank 1) / its RECV (rank 2) or
a MEM node of 128 B (ranks 0, 3) -> BROADCAST 5 of 64 B on all ranks, replayed as 10 µs.

With a 1 TFLOP/s, 1 GB/s device and a 1 GB/s link with alpha = 2 µs, by hand:
COMP max(0.001, 4.096) = 4.096 µs (unrounded); ALL_REDUCE n=2: 2*2 + 1024/1000 = 5.024 µs; ALL_GATHER n=4:
3*2 + 3*256/1000 = 6.768 µs; SEND 2 + 0.512 = 2.512 µs; MEM 0.128 µs; BROADCAST 10 µs.

`flint inspect` times communication as NCCL runs it, by default on one hgx node (here of 4 ranks):
Ring LL for each collective (NVIDIA/nccl tuning.cc: 6.6 µs, 0.6 µs per NVLink step, LL bus
bandwidth min(141, 370.8 / 2) GB/s): ALL_REDUCE n=2: 6.6 + 2*0.6 + 1024 / (141e3 * 2/2); ALL_GATHER
n=4 (1,024 B in all): 6.6 + 3*0.6 + 1024 / (141e3 * 4/3); BROADCAST: 6.6 + 0.6 + 64 / 141e3; SEND
in the node: 8.4 + 3.4 + 512 / 370.8e3 µs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import flint
from test_trace_contract import set_attr, valid_trace

from flint.analysis.dot import to_dot, write_graph
from flint.analysis.summary import spread, summarize
from flint.cli import main
from flint.devices import Device
from flint.errors import FlintError
from flint.schema import et_def_pb2 as pb
from flint.trace.reader import locate_traces, read_trace
from flint.trace.timing import Compute, Link, NodeTimer

DEVICE_ARGS = ("--link-gbps", "1", "--link-latency-us", "2")


def device_file(tmp_path: Path) -> Path:
    path = tmp_path.parent / f"{tmp_path.name}-device.json"
    path.write_text(json.dumps({"name": "test", "peak_tflops": 1.0, "mem_bw_gbps": 1.0}))
    return path


def timer(directory: Path) -> NodeTimer:
    files = locate_traces(directory)
    return NodeTimer(Compute(Device("test", 1.0, 1.0), "roofline"), Link(1.0, 2.0), files.groups, files.num_ranks)


def test_inspect_json_has_group_sizes_peers_and_heaviest(tmp_path: Path) -> None:
    directory = valid_trace().write(tmp_path)
    run = flint("inspect", directory, "--json", "--device", device_file(tmp_path))
    assert run.returncode == 0, run.stderr
    ranks = {s["rank"]: s for s in json.loads(run.stdout)}
    assert ranks[1]["collectives_by_group_size"] == [
        {"kind": "all_gather", "group_size": 4, "count": 1, "bytes": 256},
        {"kind": "all_reduce", "group_size": 2, "count": 1, "bytes": 1024},
        {"kind": "broadcast", "group_size": 4, "count": 1, "bytes": 64},
    ]
    assert ranks[1]["sends_to"] == {"2": {"count": 1, "bytes": 512}} and ranks[1]["recvs_from"] == {}
    assert ranks[2]["recvs_from"] == {"1": {"count": 1, "bytes": 512}} and ranks[2]["sends_to"] == {}
    heaviest = ranks[1]["heaviest"]
    assert [(n["id"], n["type"]) for n in heaviest] == [
        (4, "send"), (3, "all_gather"), (2, "all_reduce"), (5, "broadcast"), (1, "comp"),
    ]
    # Ring LL on one of the hgx node's 16 channels (each below 512 threads x 8 B x the ranks)
    assert [n["micros"] for n in heaviest] == pytest.approx([
        11.8 + 512 / 370.8e3, 8.4 + 1024 * 16 / (141e3 * 4 / 3), 7.8 + 1024 * 16 / 141e3, 7.2 + 64 * 16 / 141e3,
        4.096])
    assert [(n["id"], n["micros"]) for n in ranks[0]["heaviest"]][-1] == (4, pytest.approx(0.128))  # MEM_LOAD


def test_spread_names_the_extreme_ranks(tmp_path: Path) -> None:
    trace = valid_trace()
    extra = pb.Node()
    extra.CopyFrom(trace.node(3, 1))
    extra.id = 9  # a second 1,000-op COMP node, on rank 3 only
    trace.nodes[3].append(extra)
    directory = trace.write(tmp_path)
    summaries = [summarize(read_trace(path), timer(directory)) for path in locate_traces(directory).paths]
    rows = {row.metric: (row.low, row.low_rank, row.high, row.high_rank) for row in spread(summaries)}
    assert rows["FLOPs"] == (1000, 0, 2000, 3)
    assert rows["nodes"] == (5, 0, 6, 3)
    assert rows["sends"] == (0, 0, 1, 1) and rows["recvs"] == (0, 0, 1, 2)
    assert rows["collective bytes"] == (1024 + 256 + 64, 0, 1024 + 256 + 64, 0)


def test_inspect_one_file_finds_its_groups(tmp_path: Path) -> None:
    directory = valid_trace().write(tmp_path)
    run = flint("inspect", directory / "flint.2.et", "--json")
    assert run.returncode == 0, run.stderr
    (summary,) = json.loads(run.stdout)
    assert {(c["kind"], c["group_size"]) for c in summary["collectives_by_group_size"]} == {
        ("all_gather", 4), ("all_reduce", 2), ("broadcast", 4)
    }


def test_dot_text_has_every_node_and_dependency(tmp_path: Path) -> None:
    directory = valid_trace().write(tmp_path)
    text = to_dot(read_trace(directory / "flint.1.et"), timer(directory))
    for node_id in (1, 2, 3, 4, 5):
        assert f"  n{node_id} [label=" in text
    # valid_trace chains each node to the previous one through ctrl deps
    assert all(f"  n{i} -> n{i + 1} [style=dashed];" in text for i in (1, 2, 3, 4))
    assert "all_reduce group 1" in text and "5.0 µs" in text and "comm_send 1 -> 2 tag 7" in text


def test_graph_draws_a_collective_no_groups_file_gives_as_untimed(tmp_path: Path) -> None:
    """Without the groups file, rank 0's all-reduce on group 1 cannot be timed: it was drawn as
    taking 0.0 µs with exit 0 and no word, where inspect warns and timeline refuses. The all-gather
    and broadcast (on all ranks) are still timed."""
    trace = valid_trace()
    trace.groups = None
    directory = trace.write(tmp_path)
    run = flint("graph", directory, "--rank", "0", "-o", tmp_path / "g.dot")
    assert run.returncode == 0, run.stderr
    text = (tmp_path / "g.dot").read_text()
    assert text.count("untimed: no group") == 1 and "all_reduce group 1\\n1,024 B\\nuntimed: no group" in text
    assert "warning: 1 collective names a group that no groups file gives" in run.stderr
    assert "drawn untimed" in run.stderr


def test_graph_command(tmp_path: Path) -> None:
    directory = valid_trace().write(tmp_path)
    run = flint("graph", directory, "--rank", "2", "-o", tmp_path / "g.dot")
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "g.dot").read_text().startswith('digraph "rank 2"')
    run = flint("graph", directory, "-o", tmp_path / "g.dot", "--max-nodes", "4")
    assert run.returncode == 2 and "rank 0 has 5 nodes, more than --max-nodes 4" in run.stderr
    if shutil.which("dot"):
        run = flint("graph", directory, "-o", tmp_path / "g.svg")
        assert run.returncode == 0, run.stderr
        assert "<svg" in (tmp_path / "g.svg").read_text()


def test_image_without_graphviz_names_the_missing_program(tmp_path: Path, monkeypatch) -> None:
    directory = valid_trace().write(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FlintError, match="Graphviz's `dot` program"):
        write_graph(read_trace(directory / "flint.0.et"), timer(directory), tmp_path / "g.svg", 100)


def test_inspect_names_what_the_schema_does_not(tmp_path: Path) -> None:
    """An unknown node type or comm_type is shown by number, and a size stored as text (which
    `flint check` refuses) is not added up."""
    trace = valid_trace()
    trace.node(1, 1).type = 82
    set_attr(trace.node(1, 2), "comm_type", "int64_val", 99)
    set_attr(trace.node(0, 1), "num_ops", "string_val", "1000")
    directory = trace.write(tmp_path)
    result = CliRunner().invoke(main, ["inspect", str(directory), "--json"])
    assert result.exit_code == 0, result.output
    ranks = {s["rank"]: s for s in json.loads(result.stdout)}
    assert ranks[1]["nodes_by_type"] == {"comm_coll": 3, "comm_send": 1, "node_type_82": 1}
    assert ranks[1]["collectives"]["comm_type_99"] == {"count": 1, "bytes": 1024}
    assert (ranks[0]["flops"], ranks[2]["flops"]) == (0, 1000)


def test_graph_of_an_undecodable_file_is_one_line(tmp_path: Path) -> None:
    directory = valid_trace().write(tmp_path)
    (directory / "flint.2.et").write_bytes((directory / "flint.2.et").read_bytes()[:-3])
    args = ["graph", str(directory), "--rank", "2", "-o", str(tmp_path / "g.dot")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert "flint.2.et: message at byte" in line
    assert line.endswith("`flint check` lists all its problems")


def test_inspect_warns_of_collectives_it_cannot_time(tmp_path: Path) -> None:
    """Groups 1 and 2 (each rank's pair all-reduce) missing from the named groups file: the whole set
    breaks the contract (4 pg-name errors, said once as simulate says it); one rank's file alone
    cannot be checked, and its one all-reduce is said to be untimed. Either way the all-reduces are
    left out of the heaviest nodes; all-ranks collectives need no file."""
    directory = valid_trace().write(tmp_path)
    other = tmp_path.parent / f"{tmp_path.name}-other.json"
    other.write_text(json.dumps({"3": [0, 1, 2, 3]}))
    run = flint("inspect", directory, "--json", "--groups", other)
    assert run.returncode == 0, run.stderr
    assert f"{directory} breaks the trace contract (4 violations, first: rank 0 node 2: group 1" in run.stderr
    assert run.stderr.rstrip().endswith(f"run `flint check {directory} --groups {other}`")
    ranks = {s["rank"]: s for s in json.loads(run.stdout)}
    assert {"kind": "all_reduce", "group_size": None, "count": 1, "bytes": 1024} in \
        ranks[1]["collectives_by_group_size"]
    assert "all_reduce" not in [n["type"] for n in ranks[1]["heaviest"]]
    run = flint("inspect", directory / "flint.1.et", "--json", "--groups", other)
    assert run.returncode == 0, run.stderr
    assert f"1 collective names a group that {other} lacks: untimed" in run.stderr
    run = flint("inspect", directory, "--json")
    assert run.returncode == 0 and "warning" not in run.stderr


def test_inspect_warns_of_a_groups_file_that_breaks_the_contract(tmp_path: Path) -> None:
    """A rank outside the set in group 1 would time its all-reduce as if it spanned ranks that do
    not exist."""
    trace = valid_trace()
    trace.groups["1"] = [0, 9]
    directory = trace.write(tmp_path)
    run = flint("inspect", directory)
    assert run.returncode == 0
    assert "breaks the trace contract" in run.stderr and "group 1 has ranks [9] outside 0..3" in run.stderr


def test_a_rank_the_path_does_not_hold_is_one_line_naming_what_it_holds(tmp_path: Path) -> None:
    directory = valid_trace().write(tmp_path)
    run = flint("graph", directory / "flint.2.et", "--rank", "3", "-o", tmp_path / "g.dot")
    assert run.returncode == 2 and "flint.2.et holds rank 2, not rank 3: drop --rank" in run.stderr
    assert not (tmp_path / "g.dot").exists()
    run = flint("graph", directory / "flint.2.et", "-o", tmp_path / "g.dot")
    assert run.returncode == 0 and (tmp_path / "g.dot").read_text().startswith('digraph "rank 2"')
    run = flint("inspect", directory, "--rank", "7")
    assert run.returncode == 2 and "no trace file for rank 7; it holds ranks 0 to 3: choose one of those" in run.stderr


def test_a_groups_file_that_is_no_object_names_that_file(tmp_path: Path) -> None:
    directory = valid_trace().write(tmp_path)
    other = tmp_path.parent / f"{tmp_path.name}-list.json"
    other.write_text("[]")
    run = flint("inspect", directory, "--groups", other)
    assert run.returncode == 2
    assert run.stderr.strip() == f"error: {other}: comm groups must be a JSON object: correct it, or name the " \
                                 "trace's groups file with --groups"


@pytest.mark.parametrize("command", [("graph", "-o"), ("timeline", "-o"), ("timeline", "-o", "t.json", "--plot")])
def test_an_output_file_in_a_missing_directory_is_refused_before_any_work(tmp_path: Path, command) -> None:
    directory = valid_trace().write(tmp_path)
    run = flint(command[0], directory, *command[1:], tmp_path / "missing" / "out.png", cwd=tmp_path)
    assert run.returncode == 2 and f"directory '{tmp_path / 'missing'}'" in run.stderr
    assert "does not exist: create it first" in run.stderr and not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("options, words", [
    (("--link-gbps", "nan"), "'nan' is not a finite number"),
    (("--collectives", "astra-sim", "--link-latency-us", "inf"), "'inf' is not a finite number"),
    (("--network", "hgx", "--link-gbps", "100"), "--network hgx and --link-gbps or --link-latency-us each say"),
], ids=["nan", "inf", "network-and-link"])
def test_a_link_that_is_no_number_or_a_second_network_is_refused(tmp_path: Path, options, words) -> None:
    """nan passes every range check (it compares false); a network given twice would drop one silently."""
    directory = valid_trace().write(tmp_path)
    run = flint("inspect", directory, *options)
    assert run.returncode == 2 and words in run.stderr and not run.stdout


def test_two_trace_sets_in_one_directory_ask_for_a_prefix(tmp_path: Path) -> None:
    valid_trace().write(tmp_path)
    other = valid_trace()
    other.prefix = "other"
    other.write(tmp_path)
    run = flint("inspect", tmp_path)
    assert run.returncode == 2
    assert run.stderr.strip() == f"error: {tmp_path}: several trace prefixes (flint, other): pick one with --prefix"
    assert flint("inspect", tmp_path, "--prefix", "other").returncode == 0

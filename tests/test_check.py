"""`flint check`: the rank count a manifest records, and files recognised by their bytes.

Files that repeat an already checked clean file but for their per-rank values are not decoded
(`flint.trace.shapes`). The tests count decodes to see that this happens, and compare every verdict
with that of a check that decodes every file (no memory for shapes), on traces whose per-rank
values were changed in place, and on randomly mutated ones.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_fuzz import RANK_MUTATIONS
from test_trace_contract import TraceSet, coll, comp, p2p, valid_trace

from flint.cli import main
from flint.schema import et_def_pb2 as pb
from flint.trace import contract
from flint.trace.contract import check_traces


def ring_trace(num_ranks: int) -> TraceSet:
    """Ranks alike but for their values: COMP 1 -> ALL_REDUCE 2 of 1,024 B on the rank's pair group
    (ranks 2g-2, 2g-1 are group g) -> SEND 3 to the next rank and RECV 4 from the previous one (tag 7,
    512 B) -> ALL_GATHER 5 of 256 B on all ranks."""
    trace = TraceSet(groups={str(g + 1): [2 * g, 2 * g + 1] for g in range(num_ranks // 2)})
    for rank in range(num_ranks):
        after, before = (rank + 1) % num_ranks, (rank - 1) % num_ranks
        trace.nodes[rank] = [
            comp(1),
            coll(2, pb.ALL_REDUCE, 1024, str(rank // 2 + 1), (1,)),
            p2p(3, True, rank, after, (2,)),
            p2p(4, False, before, rank, (2,)),
            coll(5, pb.ALL_GATHER, 256, "", (3, 4)),
        ]
        trace.metadata[rank] = pb.GlobalMetadata(version="0.0.4")
    return trace


def set_in_place(node: pb.Node, name: str, value: str | int) -> None:
    """Change an attribute's value where it stands, so the file keeps its layout."""
    attr = next(attr for attr in node.attr if attr.name == name)
    setattr(attr, attr.WhichOneof("value"), value)


@pytest.fixture
def decodes(monkeypatch) -> list[int]:
    """Counts the rank files the checker decodes."""
    count = [0]
    decode = contract.decode_trace

    def counting(data: bytes):
        count[0] += 1
        return decode(data)

    monkeypatch.setattr(contract, "decode_trace", counting)
    return count


def full_check(directory: Path, monkeypatch) -> list:
    """The verdict of a check that decodes every file."""
    with monkeypatch.context() as patch:
        patch.setattr(contract, "SHAPE_BYTES", 0)
        return check_traces(directory)


@pytest.mark.parametrize(("num_ranks", "shapes"), [(8, 1), (24, 2)])
def test_one_file_per_shape_is_decoded(tmp_path: Path, decodes, num_ranks: int, shapes: int) -> None:
    """Group ids 1-9 and 10-12 are written with one and two digits: two shapes at 24 ranks."""
    ring_trace(num_ranks).write(tmp_path)
    seen = []
    assert check_traces(tmp_path, progress=lambda done, total: seen.append((done, total))) == []
    assert decodes[0] == shapes
    assert seen[-1] == (num_ranks, num_ranks)


def test_files_with_other_nodes_are_each_decoded(tmp_path: Path, decodes) -> None:
    """The contract tests' trace has a SEND on rank 1, its RECV on rank 2, a MEM_LOAD on rank 0
    and a MEM_STORE on rank 3: four shapes, as a producer without templates may write."""
    valid_trace().write(tmp_path)
    assert check_traces(tmp_path) == []
    assert decodes[0] == 4


@pytest.mark.parametrize(
    ("node_id", "name", "value", "rule", "decoded"),
    [
        (2, "pg_name", "1", "group-member", 2),  # rank 5 is in group 3; group 1 is ranks 0, 1
        (2, "pg_name", "9", "pg-name", 2),  # no group 9
        (2, "pg_name", "x", "pg-name", 2),
        (3, "comm_src", 4, "comm-peer", 2),  # a SEND from rank 4 in rank 5's file
        (4, "comm_src", 5, "comm-peer", 2),  # a RECV from itself
        (3, "comm_dst", 9, "comm-peer", 2),  # no rank 9
        (3, "comm_dst", 3, "send-recv-match", 1),  # a valid SEND, that rank 3 does not expect
    ],
)
def test_a_changed_value_is_caught(
    tmp_path: Path, decodes, monkeypatch, node_id: int, name: str, value, rule: str, decoded: int
) -> None:
    """Rank 5's file keeps rank 0's shape: a value that breaks a rule of its own file has it
    decoded as well; one that only a cross-rank rule refuses needs no decoding to be caught."""
    trace = ring_trace(8)
    set_in_place(trace.node(5, node_id), name, value)
    trace.write(tmp_path)
    violations = check_traces(tmp_path)
    assert decodes[0] == decoded
    assert (rule, 5) in {(v.rule, v.rank) for v in violations}
    assert violations == full_check(tmp_path, monkeypatch)


def _attr(node: pb.Node, name: str) -> pb.AttributeProto:
    return next(attr for attr in node.attr if attr.name == name)


@pytest.mark.parametrize(
    ("node_id", "edit"),
    [
        (2, lambda node: node.attr.append(_attr(node, "pg_name"))),  # the checker reads the first
        (2, lambda node: setattr(_attr(node, "pg_name"), "doc_string", "the pair")),
        (3, lambda node: setattr(_attr(node, "comm_src"), "sint32_val", _attr(node, "comm_src").int32_val)),
    ],
    ids=["repeated", "documented", "zigzag"],
)
def test_values_not_plainly_written_are_decoded_in_every_file(
    tmp_path: Path, decodes, node_id: int, edit
) -> None:
    """Where a per-rank value is not the whole of its attribute, its span alone cannot tell what
    the checker reads: no shape is made, and rank 5's bad group is caught by decoding its file."""
    trace = ring_trace(8)
    for rank in range(8):
        edit(trace.node(rank, node_id))
    set_in_place(trace.node(5, 2), "pg_name", "1")
    trace.write(tmp_path)
    assert ("group-member", 5) in {(v.rule, v.rank) for v in check_traces(tmp_path)}
    assert decodes[0] == 8


@pytest.mark.parametrize("trace", ["ring", "mlp"])
def test_mutated_files_get_the_verdict_of_a_full_check(
    tmp_path: Path, monkeypatch, mlp_traces, trace: str
) -> None:
    """A mutation of one file of a shape (not the first: that one is the shape) is caught as a
    check that decodes every file catches it."""
    (tmp_path / "ring").mkdir()
    source = ring_trace(8).write(tmp_path / "ring") if trace == "ring" else mlp_traces("2x4")
    target = tmp_path / "mutated"
    for case in range(60):
        rng = random.Random(case)
        shutil.copytree(source, target)
        victim = target / f"{'flint' if trace == 'ring' else 'mlp'}.{rng.randrange(1, 8)}.et"
        mutation = rng.choice(RANK_MUTATIONS)
        victim.write_bytes(mutation(victim.read_bytes(), rng))
        assert check_traces(target) == full_check(target, monkeypatch), f"case {case}: {mutation}"
        shutil.rmtree(target)


def without_collectives() -> TraceSet:
    trace = TraceSet()
    for rank in range(4):
        trace.nodes[rank] = [comp(1), comp(2, (1,))]
        trace.metadata[rank] = pb.GlobalMetadata(version="0.0.4")
    return trace


def run_check(directory: Path, *args: str):
    return CliRunner().invoke(main, ["check", str(directory), *args])


@pytest.mark.parametrize("make", [valid_trace, without_collectives], ids=["collectives", "none"])
def test_the_manifest_sets_the_rank_count(tmp_path: Path, make) -> None:
    make().write(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"name": "flint", "ranks": 4}))
    (tmp_path / "flint.3.et").unlink()
    result = run_check(tmp_path)
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        "rank 3: flint.3.et is missing (manifest.json records 4 ranks) [rank-files]"
    ]


def test_ranks_option_wins_over_the_manifest(tmp_path: Path) -> None:
    valid_trace().write(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"name": "flint", "ranks": 4}))
    result = run_check(tmp_path, "--ranks", "5")
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        "rank 4: flint.4.et is missing (5 ranks expected) [rank-files]"
    ]


def test_a_manifest_of_another_trace_is_ignored(tmp_path: Path) -> None:
    valid_trace().write(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"name": "other", "ranks": 9}))
    result = run_check(tmp_path)
    assert result.exit_code == 0, result.stdout
    assert result.stderr == ""  # no progress bar away from a terminal


@pytest.mark.parametrize("text, words", [
    ('{"name": "flint", "ranks": "four"}', "manifest.json: 'ranks' is 'four', not a positive integer: fix or delete it"),
    ("[]", "manifest.json: a manifest is a JSON object, not list: fix or delete it"),
], ids=["ranks", "not-an-object"])
def test_an_unreadable_manifest_is_reported(tmp_path: Path, text, words) -> None:
    valid_trace().write(tmp_path)
    (tmp_path / "manifest.json").write_text(text)
    result = run_check(tmp_path)
    assert result.exit_code == 1
    (line,) = result.stdout.splitlines()
    assert words in line
    assert run_check(tmp_path, "--ranks", "4").exit_code == 0


def test_a_missing_directory_is_named_with_what_each_command_takes(tmp_path: Path) -> None:
    """check takes a directory; inspect a directory or one rank's file."""
    missing = tmp_path / "missing"
    for command, what in (("check", "a trace directory"), ("inspect", "a trace directory or one .et file")):
        run = CliRunner().invoke(main, [command, str(missing)])
        assert run.exit_code == 2 and run.stderr.strip() == f"error: '{missing}' does not exist: give {what}"

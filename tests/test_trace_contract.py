"""The trace contract: a hand-built valid trace passes, and each planted fault is caught
by exactly its own rule, at the rank and node where it was planted."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from flint.schema import et_def_pb2 as pb
from flint.trace import (
    RULES,
    TraceFormatError,
    Violation,
    attr_kind,
    attr_value,
    check_traces,
    encode_delimited,
    find_traces,
    iter_delimited,
    read_comm_groups,
    read_trace,
)

REPO = Path(__file__).resolve().parents[1]
NUM_RANKS = 4
GROUPS = {"1": [0, 1], "2": [2, 3]}


def set_attr(node: pb.Node, name: str, kind: str, value: object) -> None:
    """Replace (or add) attribute ``name`` with a value of the given oneof kind."""
    kept = [attr for attr in node.attr if attr.name != name]
    del node.attr[:]
    node.attr.extend(kept)
    attr = node.attr.add(name=name)
    if kind.endswith("_list"):
        getattr(attr, kind).values.extend(value)
    else:
        setattr(attr, kind, value)


def drop_attr(node: pb.Node, name: str) -> None:
    kept = [attr for attr in node.attr if attr.name != name]
    del node.attr[:]
    node.attr.extend(kept)


def make_node(node_id: int, node_type: int, deps: tuple[int, ...] = (), **attrs) -> pb.Node:
    node = pb.Node(id=node_id, name=f"n{node_id}", type=node_type, ctrl_deps=deps)
    for name, (kind, value) in attrs.items():
        set_attr(node, name, kind, value)
    return node


def comp(node_id: int, deps: tuple[int, ...] = ()) -> pb.Node:
    return make_node(
        node_id, pb.COMP_NODE, deps,
        num_ops=("int64_val", 1000), tensor_size=("uint64_val", 4096),
        is_cpu_op=("bool_val", False),
    )


def coll(node_id: int, comm_type: int, size: int, pg: str, deps: tuple[int, ...]) -> pb.Node:
    return make_node(
        node_id, pb.COMM_COLL_NODE, deps,
        comm_type=("int64_val", comm_type), comm_size=("int64_val", size),
        pg_name=("string_val", pg), involved_dim=("bool_list", [True]),
    )


def p2p(node_id: int, send: bool, src: int, dst: int, deps: tuple[int, ...]) -> pb.Node:
    return make_node(
        node_id, pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE, deps,
        comm_src=("int32_val", src), comm_dst=("int32_val", dst),
        comm_tag=("int32_val", 7), comm_size=("int64_val", 512),
    )


@dataclass
class TraceSet:
    """A trace in memory: faults edit it, then ``write`` puts it on disk."""

    metadata: dict[int, pb.GlobalMetadata | None] = field(default_factory=dict)
    nodes: dict[int, list[pb.Node]] = field(default_factory=dict)
    groups: dict[str, list[int]] | None = None
    prefix: str = "flint"

    def node(self, rank: int, node_id: int) -> pb.Node:
        return next(node for node in self.nodes[rank] if node.id == node_id)

    def write(self, directory: Path) -> Path:
        for rank, nodes in self.nodes.items():
            messages = [self.metadata[rank]] if self.metadata[rank] is not None else []
            data = b"".join(encode_delimited(m.SerializeToString()) for m in messages + nodes)
            (directory / f"{self.prefix}.{rank}.et").write_bytes(data)
        if self.groups is not None:
            groups_file = directory / f"{self.prefix}.comm_groups.json"
            groups_file.write_text(json.dumps(self.groups))
        return directory


def valid_trace() -> TraceSet:
    """Per rank: COMP -> all-reduce on its pair group -> all-gather on all ranks -> a
    SEND 1->2 / RECV, or a MEM node -> BROADCAST on all ranks via pg_name "0"."""
    trace = TraceSet(groups=dict(GROUPS))
    for rank in range(NUM_RANKS):
        pair = "1" if rank < 2 else "2"
        nodes = [
            comp(1),
            coll(2, pb.ALL_REDUCE, 1024, pair, (1,)),
            coll(3, pb.ALL_GATHER, 256, "", (2,)),
        ]
        if rank in (1, 2):
            nodes.append(p2p(4, rank == 1, 1, 2, (3,)))
        else:
            mem_type = pb.MEM_LOAD_NODE if rank == 0 else pb.MEM_STORE_NODE
            nodes.append(make_node(4, mem_type, (3,), tensor_size=("uint64_val", 128)))
        broadcast = coll(5, pb.BROADCAST, 64, "0", (4,))
        broadcast.duration_micros = 10
        nodes.append(broadcast)
        trace.nodes[rank] = nodes
        trace.metadata[rank] = pb.GlobalMetadata(
            version="0.0.4", attr=[pb.AttributeProto(name="producer", string_val="flint")]
        )
    return trace


# --- faults: (rule, edit of the in-memory trace or of the written directory, rank, node) ---

def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-3])


def _set_type(rank: int, node_id: int, node_type: int) -> Callable[[TraceSet], None]:
    return lambda t: setattr(t.node(rank, node_id), "type", node_type)


def _attr(rank: int, node_id: int, name: str, kind: str, value) -> Callable[[TraceSet], None]:
    return lambda t: set_attr(t.node(rank, node_id), name, kind, value)


def _extra(rank: int, node: pb.Node) -> Callable[[TraceSet], None]:
    return lambda t: t.nodes[rank].append(node)


def _remove(rank: int, node_id: int) -> Callable[[TraceSet], None]:
    return lambda t: t.nodes[rank].remove(t.node(rank, node_id))


def _to_comp(rank: int, node_id: int) -> Callable[[TraceSet], None]:
    """Swap a node for a COMP node with the same id and deps, so dependents stay valid."""

    def edit(t: TraceSet) -> None:
        old = t.node(rank, node_id)
        t.nodes[rank][t.nodes[rank].index(old)] = comp(node_id, tuple(old.ctrl_deps))

    return edit


def _groups(groups: dict | None) -> Callable[[TraceSet], None]:
    return lambda t: setattr(t, "groups", groups)


def _empty_prefix(t: TraceSet) -> None:
    t.prefix = "empty_run"


FAULTS: list[tuple[str, str, Callable[[TraceSet], None] | None,
                   Callable[[Path], None] | None, int | None, int | None]] = [
    # id, rule, trace edit, directory edit, rank, node
    ("missing-rank", "rank-files", None, lambda d: (d / "flint.1.et").unlink(), 1, None),
    ("truncated", "framing", None, lambda d: _truncate(d / "flint.2.et"), 2, None),
    ("no-metadata", "metadata-first", lambda t: t.metadata.update({0: None}), None, 0, None),
    ("empty-file", "metadata-first", None, lambda d: (d / "flint.0.et").write_bytes(b""), 0, None),
    ("no-version", "metadata-first",
     lambda t: t.metadata.update({0: pb.GlobalMetadata()}), None, 0, None),
    ("duplicate-id", "unique-ids", _extra(3, comp(1)), None, 3, 1),
    ("dangling-dep", "dep-exists", lambda t: t.node(1, 2).data_deps.append(99), None, 1, 2),
    ("cycle", "dep-cycle", lambda t: t.node(0, 1).ctrl_deps.append(3), None, 0, 1),
    ("metadata-node", "no-metadata-node", _extra(2, make_node(10, pb.METADATA_NODE)), None, 2, 10),
    ("invalid-node", "no-invalid-node", _extra(2, make_node(10, pb.INVALID_NODE)), None, 2, 10),
    ("unknown-type", "no-invalid-node", _set_type(3, 1, 42), None, 3, 1),
    ("zero-ops", "num-ops", _attr(1, 1, "num_ops", "int64_val", 0), None, 1, 1),
    ("missing-ops", "num-ops", lambda t: drop_attr(t.node(1, 1), "num_ops"), None, 1, 1),
    ("zero-tensor", "tensor-size", _attr(3, 1, "tensor_size", "uint64_val", 0), None, 3, 1),
    ("mem-no-tensor", "tensor-size", lambda t: drop_attr(t.node(3, 4), "tensor_size"), None, 3, 4),
    ("reduce", "comm-type", _attr(2, 2, "comm_type", "int64_val", pb.REDUCE), None, 2, 2),
    ("type-string", "comm-type", _attr(2, 2, "comm_type", "string_val", "0"), None, 2, 2),
    ("broadcast-0us", "broadcast-duration",
     lambda t: setattr(t.node(0, 5), "duration_micros", 0), None, 0, 5),
    ("coll-size-0", "comm-size", _attr(0, 2, "comm_size", "int64_val", 0), None, 0, 2),
    ("send-no-size", "comm-size", lambda t: drop_attr(t.node(1, 4), "comm_size"), None, 1, 4),
    ("pg-int", "pg-name", _attr(1, 2, "pg_name", "int64_val", 1), None, 1, 2),
    ("pg-text", "pg-name", _attr(1, 2, "pg_name", "string_val", "tp"), None, 1, 2),
    ("pg-undefined", "pg-name", _attr(1, 2, "pg_name", "string_val", "5"), None, 1, 2),
    ("no-group-file", "pg-name", _groups(None), None, 0, 2),
    ("not-member", "group-member", _attr(2, 2, "pg_name", "string_val", "1"), None, 2, 2),
    ("group-0", "group-file", _groups({**GROUPS, "0": [0, 1, 2, 3]}), None, None, None),
    ("singleton", "group-file", _groups({**GROUPS, "3": [1]}), None, None, None),
    ("out-of-range", "group-file", _groups({**GROUPS, "3": [0, 9]}), None, None, None),
    ("repeated-rank", "group-file", _groups({**GROUPS, "3": [0, 0, 1]}), None, None, None),
    ("bad-id", "group-file", _groups({**GROUPS, "x": [0, 1]}), None, None, None),
    ("empty-path", "group-file", _empty_prefix, None, None, None),
    ("dims-int", "involved-dim", _attr(0, 2, "involved_dim", "int64_val", 1), None, 0, 2),
    ("recv-not-mine", "comm-peer", _attr(2, 4, "comm_dst", "int32_val", 3), None, 2, 4),
    ("src-string", "comm-peer", _attr(1, 4, "comm_src", "string_val", "1"), None, 1, 4),
    ("peer-range", "comm-peer", _attr(1, 4, "comm_dst", "int32_val", 4), None, 1, 4),
    ("tag-int64", "comm-tag", _attr(1, 4, "comm_tag", "int64_val", 2**40), None, 1, 4),
    ("gather-size", "collective-match", _attr(3, 3, "comm_size", "int64_val", 512), None, 3, 3),
    ("pair-size", "collective-match", _attr(1, 2, "comm_size", "int64_val", 2048), None, 1, 2),
    ("missing-coll", "collective-match", _remove(3, 5), None, 3, None),
    ("recv-tag", "send-recv-match", _attr(2, 4, "comm_tag", "int32_val", 8), None, 2, 4),
    ("no-recv", "send-recv-match", _to_comp(2, 4), None, 1, 4),
    ("ops-double", "integer-types", _attr(0, 1, "num_ops", "double_val", 1000.0), None, 0, 1),
    ("size-float", "integer-types", _attr(1, 4, "comm_size", "float_val", 512.0), None, 1, 4),
    ("type-double", "integer-types", _attr(0, 2, "comm_type", "double_val", 0.0), None, 0, 2),
    ("cpu-int", "is-cpu-op", _attr(0, 1, "is_cpu_op", "int32_val", 0), None, 0, 1),
]


def test_valid_trace_is_clean(tmp_path: Path) -> None:
    assert check_traces(valid_trace().write(tmp_path)) == []


@pytest.mark.parametrize(
    ("rule", "edit_trace", "edit_dir", "rank", "node_id"),
    [pytest.param(*fault[1:], id=fault[0]) for fault in FAULTS],
)
def test_each_fault_is_reported_by_its_rule(
    tmp_path: Path, rule, edit_trace, edit_dir, rank, node_id
) -> None:
    trace = valid_trace()
    if edit_trace:
        edit_trace(trace)
    trace.write(tmp_path)
    if edit_dir:
        edit_dir(tmp_path)
    violations = check_traces(tmp_path)
    assert {v.rule for v in violations} == {rule}, [str(v) for v in violations]
    assert (rank, node_id) in {(v.rank, v.node_id) for v in violations}


def test_a_repeated_kernel_is_judged_on_every_copy(tmp_path: Path) -> None:
    """A pipelined file repeats each kernel in every microbatch: copies of a clean kernel are
    checked once, but every copy of a bad one is reported, and a warning is counted per copy."""
    trace = valid_trace()
    bad = [comp(10 + k) for k in range(3)]
    for node in bad:
        set_attr(node, "num_ops", "double_val", 1000.0)
    habit = [comp(20 + k) for k in range(4)]
    for node in habit:
        set_attr(node, "is_cpu_op", "int32_val", 0)
    trace.nodes[0] += [comp(30), comp(31)] + bad + habit
    violations = check_traces(trace.write(tmp_path))
    assert sorted(v.node_id for v in violations if v.rule == "integer-types") == [10, 11, 12]
    (warning,) = [v for v in violations if v.rule == "is-cpu-op"]
    assert (warning.node_id, warning.count) == (20, 4)
    assert {v.rule for v in violations} == {"integer-types", "is-cpu-op"}


def test_files_checked_in_processes_find_what_one_process_finds(tmp_path: Path) -> None:
    """The extraction's check of large files runs in a process per core: the same findings, the
    comm-groups file's once, every file's in rank order."""
    from flint.trace.contract import check_rank_files

    trace = valid_trace()
    bad = comp(10)
    set_attr(bad, "num_ops", "double_val", 1000.0)
    trace.nodes[0].append(bad)
    trace.nodes[2].append(comp(11, deps=(99,)))
    trace.write(tmp_path)
    (tmp_path / "flint.comm_groups.json").write_text("{")
    alone = check_rank_files(tmp_path, "flint", 3, [2, 0, 1])
    assert [(v.rule, v.rank) for v in alone] == [
        ("group-file", None), ("integer-types", 0), ("dep-exists", 2)]
    assert check_rank_files(tmp_path, "flint", 3, [2, 0, 1], workers=2) == alone


def test_rank_count_catches_a_missing_last_rank(tmp_path: Path) -> None:
    valid_trace().write(tmp_path)
    assert ("rank-files", 3) in {(v.rule, v.rank) for v in check_traces(tmp_path, num_ranks=3)}
    (tmp_path / "flint.3.et").unlink()
    violations = check_traces(tmp_path, num_ranks=4)
    assert [(v.rule, v.rank) for v in violations] == [("rank-files", 3)]


def test_every_rule_has_a_planted_fault() -> None:
    assert {fault[1] for fault in FAULTS} == set(RULES)


def test_violation_reads_as_one_line() -> None:
    assert str(Violation("num-ops", 3, 17, "num_ops must be > 0")) == (
        "rank 3 node 17: num_ops must be > 0 [num-ops]"
    )
    assert str(Violation("group-file", None, None, "bad")) == "bad [group-file]"
    assert str(Violation("rank-files", 2, None, "missing")) == "rank 2: missing [rank-files]"


def test_round_trip(tmp_path: Path) -> None:
    trace = valid_trace()
    trace.write(tmp_path)
    read = read_trace(tmp_path / "flint.1.et")
    assert read.rank == 1
    assert read.metadata == trace.metadata[1]
    assert read.nodes == trace.nodes[1]


def test_gzip_trace_reads_and_checks(tmp_path: Path) -> None:
    trace = valid_trace()
    trace.write(tmp_path)
    for path in sorted(tmp_path.glob("*.et")):
        gz_path = path.with_name(path.name + ".gz")
        gz_path.write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    read = read_trace(tmp_path / "flint.2.et.gz")
    assert (read.rank, read.nodes) == (2, trace.nodes[2])
    assert check_traces(tmp_path) == []


def test_framing() -> None:
    payloads = [b"", b"x" * 300, b"abc"]
    stream = b"".join(encode_delimited(p) for p in payloads)
    assert encode_delimited(b"x" * 300)[:2] == b"\xac\x02"
    assert list(iter_delimited(stream)) == payloads
    with pytest.raises(TraceFormatError):
        list(iter_delimited(stream[:-1]))
    with pytest.raises(TraceFormatError):
        list(iter_delimited(b"\xac"))
    with pytest.raises(TraceFormatError):
        list(iter_delimited(b"\xff\xff\xff\xff\xff\x01"))


def test_read_trace_rejects_missing_metadata(tmp_path: Path) -> None:
    trace = valid_trace()
    trace.metadata[0] = None
    trace.write(tmp_path)
    with pytest.raises(TraceFormatError, match="GlobalMetadata"):
        read_trace(tmp_path / "flint.0.et")


def test_find_traces(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        find_traces(tmp_path)
    valid_trace().write(tmp_path)
    prefix, paths = find_traces(tmp_path)
    assert prefix == "flint"
    assert [p.name for p in paths] == [f"flint.{r}.et" for r in range(NUM_RANKS)]
    (tmp_path / "other.0.et").write_bytes(b"")
    with pytest.raises(TraceFormatError, match="several"):
        find_traces(tmp_path)
    assert find_traces(tmp_path, "other")[1] == [tmp_path / "other.0.et"]


def test_read_comm_groups(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    path.write_text(json.dumps(GROUPS))
    assert read_comm_groups(path) == {1: (0, 1), 2: (2, 3)}
    path.write_text(json.dumps({"1": [0, "1"]}))
    with pytest.raises(TraceFormatError):
        read_comm_groups(path)


def test_attr_helpers() -> None:
    node = coll(2, pb.ALL_REDUCE, 1024, "1", ())
    assert (attr_kind(node, "comm_size"), attr_value(node, "comm_size")) == ("int64_val", 1024)
    assert (attr_kind(node, "pg_name"), attr_value(node, "pg_name")) == ("string_val", "1")
    assert (attr_kind(node, "involved_dim"), attr_value(node, "involved_dim")) == (
        "bool_list", [True],
    )
    assert attr_kind(node, "absent") is None and attr_value(node, "absent") is None


def test_generated_schema_is_reproducible(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    subprocess.run(
        [sys.executable, str(REPO / "schemas" / "generate.py"), str(tmp_path)], check=True
    )
    committed = REPO / "src" / "flint" / "schema"
    for name in ("et_def_pb2.py", "hlo_envelope_pb2.py"):
        assert (tmp_path / name).read_bytes() == (committed / name).read_bytes(), name

"""Traces decode the same through `flint inspect` and through protobuf's own parser."""

from __future__ import annotations

import json

from conftest import flint
from google.protobuf.internal.decoder import _DecodeVarint32

from flint.schema import et_def_pb2 as pb

BF16, F32 = 2, 4


def decode_independently(path):
    """Split the varint-delimited stream with protobuf's decoder, not Flint's framing code."""
    buf, pos, messages = path.read_bytes(), 0, []
    while pos < len(buf):
        size, pos = _DecodeVarint32(buf, pos)
        messages.append(buf[pos : pos + size])
        pos += size
    return pb.GlobalMetadata.FromString(messages[0]), [pb.Node.FromString(m) for m in messages[1:]]


def test_protobuf_parser_sees_contract_types(mlp_traces):
    directory = mlp_traces("8x8")
    metadata, nodes = decode_independently(directory / "mlp.5.et")
    assert metadata.version == "0.0.4"
    assert len({n.id for n in nodes}) == len(nodes)
    kinds = {}
    for node in nodes:
        for attr in node.attr:
            kinds.setdefault((pb.NodeType.Name(node.type), attr.name), attr.WhichOneof("value"))
    assert kinds[("COMP_NODE", "num_ops")] == "int64_val"
    assert kinds[("COMP_NODE", "tensor_size")] == "uint64_val"
    assert kinds[("COMM_COLL_NODE", "comm_type")] == "int64_val"
    assert kinds[("COMM_COLL_NODE", "comm_size")] == "int64_val"
    assert kinds[("COMM_COLL_NODE", "pg_name")] == "string_val"
    assert all(n.type in (pb.COMP_NODE, pb.COMM_COLL_NODE) for n in nodes)


def test_inspect_reports_hand_derived_collectives(mlp_traces):
    directory = mlp_traces("8x8")
    run = flint("inspect", directory, "--json")
    assert run.returncode == 0, run.stderr
    summaries = json.loads(run.stdout)
    assert [s["rank"] for s in summaries] == list(range(64))
    b, h = 256 // 8, 4096 // 8
    expected = {"all_reduce": {"count": 4, "bytes": b * 1024 * BF16 + 2 * 1024 * h * BF16 + F32}}
    manifest = json.loads((directory / "manifest.json").read_text())
    for summary in summaries:
        assert summary["collectives"] == expected
        assert summary["nodes"] == manifest["rank_totals"][0]["nodes"]


def test_inspect_one_rank_and_check_command(mlp_traces):
    directory = mlp_traces("2x4")
    run = flint("inspect", directory / "mlp.3.et", "--json")
    assert run.returncode == 0 and [s["rank"] for s in json.loads(run.stdout)] == [3]
    run = flint("check", directory)
    assert run.returncode == 0 and "follows the trace contract" in run.stdout

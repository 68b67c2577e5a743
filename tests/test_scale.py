"""Emission at scale: files patched from class templates equal files serialized rank by rank, the
extraction-time check catches what it must, big traces pass every contract rule, runs repeat byte for
byte, and the TPU backend partitions like the CPU one."""

from __future__ import annotations

import importlib.util
import json
import pickle
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest
from conftest import EXAMPLES, MODELS, extract, matmuls_and_collectives

import flint
from flint.devices import load_device
from flint.emit import ChakraEmitter, GraphPlan, check_emitted, write_ranks
from flint.emit.durations import RunningMicros
from flint.emit.first_nodes import FIRST_NODE_BYTES
from flint.graph import WorkloadGraph
from flint.schema import et_def_pb2 as pb
from flint.trace.contract import check_traces
from flint.trace.framing import encode_delimited

H100 = load_device("h100")
COMM_TYPE = {"all_reduce": pb.ALL_REDUCE, "all_gather": pb.ALL_GATHER}


def _attr(name: str, **value) -> pb.AttributeProto:
    return pb.AttributeProto(name=name, **value)


def origin(data: dict) -> list[pb.AttributeProto]:
    """A communication node's op path and source line, where the graph has them."""
    return [_attr(key, string_val=data[key]) for key in ("source_op", "source") if data.get(key)]


def serialized_rank_by_rank(graph: WorkloadGraph, groups_file: Path, metadata: dict, rank: int) -> bytes:
    """`rank`'s file built message by message from the graph and the written group file, the way a
    single-rank writer would: no templates, no caches, nothing shared with other ranks."""
    group_id = {tuple(ranks): int(gid) for gid, ranks in json.loads(groups_file.read_text()).items()}
    header = pb.GlobalMetadata(
        version="0.0.4", attr=[_attr(k, string_val=v) for k, v in sorted(metadata.items())]
    )
    out = [encode_delimited(header.SerializeToString())]
    nodes = sorted(graph.graph.nodes(data=True))
    permutes = [n for n, data in nodes if data.get("collective") == "collective_permute"]
    stands_for: dict[int, list[int]] = {}
    durations = RunningMicros()
    for node, data in nodes:
        deps = sorted({d for p in graph.graph.predecessors(node) for d in stands_for.get(p, [p])})
        message = pb.Node(id=node, name=data["name"], data_deps=deps)
        message.attr.extend([_attr("is_cpu_op", bool_val=False), _attr("op", string_val=data["op"])])
        if data["kind"] != "collective":
            nbytes = data["bytes"] if deps else max(data["bytes"], FIRST_NODE_BYTES)  # issued at time 0
            message.type = pb.COMP_NODE
            message.duration_micros = durations.next(H100.micros(data["flops"], nbytes))
            message.attr.extend([
                _attr("num_ops", int64_val=max(1, data["flops"])),
                _attr("tensor_size", uint64_val=max(1, nbytes)),
            ])
            if data["transcendentals"]:
                message.attr.append(_attr("transcendentals", int64_val=data["transcendentals"]))
            out.append(encode_delimited(message.SerializeToString()))
        elif node in permutes:
            target_of = {src: dst for src, dst in data["pairs"]}
            source_of = {dst: src for src, dst in data["pairs"]}
            recv_id = len(nodes) + permutes.index(node)
            stands_for[node] = deps  # a rank outside the pairs does nothing here
            for own_id, kind, src, dst in (
                (node, pb.COMM_SEND_NODE, rank, target_of.get(rank)),  # SEND first
                (recv_id, pb.COMM_RECV_NODE, source_of.get(rank), rank),
            ):
                if src is None or dst is None:
                    continue
                p2p = pb.Node(id=own_id, name=data["name"], type=kind, data_deps=deps)
                p2p.attr.extend([
                    *message.attr,
                    _attr("comm_tag", int32_val=node),
                    _attr("comm_size", int64_val=data["comm_bytes"]),
                    *origin(data),
                    _attr("comm_src", int32_val=src),
                    _attr("comm_dst", int32_val=dst),
                ])
                out.append(encode_delimited(p2p.SerializeToString()))
                stands_for[node] = [own_id]  # the RECV, when there is one: the data has arrived
        else:
            (group,) = [g for g in data["groups"] if rank in g]
            message.type = pb.COMM_COLL_NODE
            message.attr.extend([
                _attr("comm_type", int64_val=COMM_TYPE[data["collective"]]),
                _attr("comm_size", int64_val=data["comm_bytes"]),
                *origin(data),
                _attr("pg_name", string_val=str(group_id[group])),
            ])
            out.append(encode_delimited(message.SerializeToString()))
    return b"".join(out)


def extract_with_graph(model: Path, mesh: str, out: Path, tmp_path: Path) -> WorkloadGraph:
    """Run the pipeline in a fresh process (JAX fixes its device count once) and keep its graph."""
    saved = tmp_path / "graph.pickle"
    script = (
        "import pickle, sys\nfrom pathlib import Path\nfrom flint.devices import load_device\n"
        "from flint.mesh import parse_mesh\nfrom flint.pipeline import ExtractRequest, extract\n"
        "request = ExtractRequest(model=Path(sys.argv[1]), mesh=parse_mesh(sys.argv[2]), "
        "output=Path(sys.argv[3]), device=load_device('h100'))\n"
        "pickle.dump(extract(request).graph, open(sys.argv[4], 'wb'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(model), mesh, str(out), str(saved)],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return pickle.loads(saved.read_bytes())


def test_patched_files_equal_files_serialized_rank_by_rank(tmp_path):
    """8x8 ranks in three classes (first, middle and last data row of an open chain of permutes)
    and 16 groups, so group ids of one and two digits patch the same template."""
    out = tmp_path / "t"
    graph = extract_with_graph(MODELS / "chain.py", "8x8", out, tmp_path)
    metadata = {"producer": f"flint {flint.__version__}", "mesh": "data=8,tensor=8"}
    for rank in range(64):
        expected = serialized_rank_by_rank(graph, out / "chain.comm_groups.json", metadata, rank)
        assert (out / f"chain.{rank}.et").read_bytes() == expected, rank


def _synthetic_graph(num_ranks: int, name_length: int) -> WorkloadGraph:
    """compute -> all_reduce over pairs of ranks -> compute -> ring shift: no JAX needed."""
    g = nx.DiGraph()
    compute = dict(kind="compute", op="dot_general", flops=1000, bytes=64, transcendentals=0)
    g.add_node(0, name="a" * name_length, **compute)
    pairs = tuple((r, r + 1) for r in range(0, num_ranks, 2))
    g.add_node(1, name="b" * name_length, op="all_reduce", kind="collective", collective="all_reduce",
               comm_bytes=4096, groups=pairs, bytes=4096, flops=0, transcendentals=0)
    g.add_node(2, name="c", **compute)
    ring = tuple((r, (r + 1) % num_ranks) for r in range(num_ranks))
    g.add_node(3, name="d", op="collective_permute", kind="collective",
               collective="collective_permute", comm_bytes=512, pairs=ring, bytes=512, flops=0,
               transcendentals=0)
    g.add_node(4, name="e", **compute)
    g.add_edges_from([(0, 1), (1, 2), (2, 3), (3, 4), (0, 4)])
    return WorkloadGraph(g, num_ranks, ())


def _length_prefix_sizes(data: bytes) -> list[int]:
    """Bytes taken by each frame's varint length prefix."""
    sizes, pos = [], 0
    while pos < len(data):
        length, shift, start = 0, 0, pos
        while True:
            byte = data[pos]
            length |= (byte & 0x7F) << shift
            pos, shift = pos + 1, shift + 7
            if not byte & 0x80:
                break
        sizes.append(pos - start)
        pos += length
    return sizes


def test_group_ids_of_every_length_across_a_length_prefix_boundary(tmp_path):
    """256 ranks in 128 pair groups: group ids of 1 to 3 digits. Over a range of name lengths the
    collective's message passes 127 bytes, where a longer id needs a longer varint prefix than a
    shorter one; every patched file must still equal its rank-by-rank serialization."""
    metadata = {"producer": "test", "mesh": "data=256"}
    crossed = False
    for name_length in range(30, 45):
        directory = tmp_path / str(name_length)
        directory.mkdir()
        graph = _synthetic_graph(256, name_length)
        plan = GraphPlan(graph)
        groups = plan.groups
        emitter = ChakraEmitter(plan, H100, metadata)
        (directory / "s.comm_groups.json").write_text(json.dumps(groups.as_json()))
        assert write_ranks(emitter, directory, "s", workers=3) > 0
        files = {}
        for rank in (0, 1, 17, 18, 254, 255):  # group ids 1, 1, 9, 10, 128, 128
            files[rank] = (directory / f"s.{rank}.et").read_bytes()
            groups_file = directory / "s.comm_groups.json"
            assert files[rank] == serialized_rank_by_rank(graph, groups_file, metadata, rank)
        crossed |= _length_prefix_sizes(files[0])[2] != _length_prefix_sizes(files[255])[2]
        assert check_emitted(directory, "s", emitter) == []
    assert crossed, "no name length put the collective at the 127-byte boundary: widen the range"
    assert check_traces(directory, "s", num_ranks=256) == []


def test_extraction_check_finds_ranks_outside_their_groups_and_missing_files(tmp_path):
    graph = _synthetic_graph(8, 10)
    plan = GraphPlan(graph)
    groups = plan.groups
    emitter = ChakraEmitter(plan, H100, {"mesh": "data=8"})
    written = groups.as_json()
    assert written["1"] == [0, 1] and written["2"] == [2, 3]
    written["1"], written["2"] = [0, 2], [1, 3]  # ranks 1 and 2 swap groups in the file only
    (tmp_path / "s.comm_groups.json").write_text(json.dumps(written))
    write_ranks(emitter, tmp_path, "s")
    (tmp_path / "s.5.et").unlink()
    found = {(v.rule, v.rank) for v in check_emitted(tmp_path, "s", emitter)}
    assert found == {
        ("group-member", 1),  # its file names group 1, which the file says is [0, 2]
        ("group-member", 2),
        ("collective-match", 1),  # a member of group 2 that never issues the collective on it
        ("collective-match", 2),
        ("rank-files", 5),
    }


@pytest.fixture(scope="module")
def mlp_512(tmp_path_factory):
    out = tmp_path_factory.mktemp("mlp512") / "t"
    extract(EXAMPLES / "mlp.py", "64x8", out)
    return out


def test_every_rank_of_a_512_rank_trace_follows_the_contract(mlp_512):
    assert len(list(mlp_512.glob("mlp.*.et"))) == 512
    assert check_traces(mlp_512, num_ranks=512) == []  # reads back every file


def test_two_512_rank_runs_are_byte_identical(mlp_512, tmp_path):
    again = tmp_path / "t"
    extract(EXAMPLES / "mlp.py", "64x8", again)
    names = sorted(p.name for p in mlp_512.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        if name != "manifest.json":  # its command line names the output directory
            assert (mlp_512 / name).read_bytes() == (again / name).read_bytes(), name


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu (flint-traces[tpu])")
def test_tpu_backend_matches_cpu_backend_on_64_ranks(tmp_path):
    """The same 8x8 mesh from 64 virtual CPU devices and from a v5p 4x4x4 topology: every rank does
    the same matmuls and the same collectives over the same ranks."""
    cpu, tpu = tmp_path / "cpu", tmp_path / "tpu"
    extract(EXAMPLES / "mlp.py", "8x8", cpu)
    summary = extract(EXAMPLES / "mlp.py", "8x8", tpu, "--backend", "tpu:v5p:4x4x4")
    assert summary["ranks"] == 64
    assert json.loads((tpu / "manifest.json").read_text())["backend"] == "tpu:v5p:4x4x4"
    for rank in range(64):
        assert matmuls_and_collectives(cpu, rank) == matmuls_and_collectives(tpu, rank), rank
    assert check_traces(tpu) == []

"""Flint among other Chakra tools: its schema module beside Chakra's own, and traces of other
producers read by every command.

Other producer: a hand-made trace with STAGE's habits, which ASTRA-sim runs: a GlobalMetadata with
an empty version, `is_cpu_op` as an int64 0 on every node, a SEND without `comm_src` (ASTRA-sim
sends from the file's own rank) and the communicator groups in `stage_groups.json`, not
`workload.comm_groups.json`. Four ranks, groups {"1": [0, 1], "2": [2, 3]}:

    every rank: 1 COMP 1,000 ops, 4,096 B -> 2 ALL_REDUCE 1,024 B on its pair group ->
    3 (rank 1) SEND to 2 / (rank 2) RECV from 1, 512 B, tag 7 / (ranks 0, 3) COMP as node 1 ->
    4 ALL_GATHER 256 B on all ranks

By hand, with a 1 TFLOP/s, 1 GB/s device and a 1 GB/s link with alpha = 2 µs: COMP
max(0.001, 4.096) = 4.096 µs; ALL_REDUCE n = 2: 2 * 2 + 1,024 / 1,000 = 5.024 µs; SEND/RECV
2 + 0.512 = 2.512 µs; ALL_GATHER n = 4: 3 * 2 + 3 * 256 / 1,000 = 6.768 µs. The gather starts when
ranks 0 and 3 finish their second COMP, at 4.096 + 5.024 + 4.096 = 13.216 µs, so every rank
finishes at 13.216 + 6.768 = 19.984 µs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import flint, load_example
from test_trace_contract import TraceSet, drop_attr, make_node, set_attr

from flint.schema import et_def_pb2 as pb

REPO = Path(__file__).resolve().parents[1]
GROUPS = {"1": [0, 1], "2": [2, 3]}
GROUPS_FILE = "stage_groups.json"
STEP_US = 4.096 + 5.024 + 4.096 + 6.768
TIMING = ("--link-gbps", "1", "--link-latency-us", "2")
BF16, F32 = 2, 4


# -- Chakra's own schema module beside Flint's ---------------------------------------------------

CHAKRA_PACKAGE = "ChakraProtoMsg"


@pytest.fixture(scope="module")
def chakra_module(tmp_path_factory) -> Path:
    """Chakra's `et_def_pb2` as Chakra ships it: `et_def.proto` of package ChakraProtoMsg,
    compiled by protoc from its own directory. Its text is Flint's schema with upstream's package
    line, which is upstream's schema field for field (the same messages, enums and numbers)."""
    pytest.importorskip("grpc_tools")
    text = (REPO / "schemas" / "et_def.proto").read_text()
    text, replaced = re.subn(r"(?m)^package [\w.]+;$", f"package {CHAKRA_PACKAGE};", text)
    assert replaced == 1
    out = tmp_path_factory.mktemp("chakra")
    (out / "et_def.proto").write_text(text)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"--proto_path={out}",
                    f"--python_out={out}", "et_def.proto"], check=True)
    return out


READ_WITH_CHAKRA = """
import json, sys
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "chakra-first":
    import et_def_pb2 as chakra
    from flint.schema import et_def_pb2 as flint
else:
    from flint.schema import et_def_pb2 as flint
    import et_def_pb2 as chakra
from google.protobuf.internal.decoder import _DecodeVarint32

buf, pos, messages = open(sys.argv[3], "rb").read(), 0, []
while pos < len(buf):
    size, pos = _DecodeVarint32(buf, pos)
    messages.append(buf[pos:pos + size])
    pos += size
metadata = chakra.GlobalMetadata.FromString(messages[0])
nodes = [chakra.Node.FromString(m) for m in messages[1:]]
attrs = [{a.name: getattr(a, a.WhichOneof("value")) for a in n.attr} for n in nodes]
coll = [a for n, a in zip(nodes, attrs) if n.type == chakra.COMM_COLL_NODE]
print(json.dumps({
    "names": [chakra.Node.DESCRIPTOR.full_name, flint.Node.DESCRIPTOR.full_name],
    "version": metadata.version,
    "all_reduce_bytes": [a["comm_size"] for a in coll if a["comm_type"] == chakra.ALL_REDUCE],
    "comp_nodes": sum(n.type == chakra.COMP_NODE for n in nodes),
    "same_bytes": all(chakra.Node.FromString(m).SerializeToString() == m for m in messages[1:]),
}))
"""


@pytest.mark.parametrize("order", ["chakra-first", "flint-first"])
def test_chakra_schema_and_flint_schema_in_one_process(chakra_module, mlp_traces, order):
    """Both modules import in either order, and Chakra's classes read Flint's MLP trace (2x4, rank
    5): 4 all-reduces, as tests/test_mlp.py derives them."""
    mlp = load_example("mlp")
    rank_file = mlp_traces("2x4") / "mlp.5.et"
    done = subprocess.run([sys.executable, "-c", READ_WITH_CHAKRA, str(chakra_module), order,
                           str(rank_file)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    read = json.loads(done.stdout)
    assert read["names"] == ["ChakraProtoMsg.Node", "flint.chakra.Node"]
    assert read["version"] == "0.0.4"
    b, h = mlp.BATCH // 2, mlp.D_HIDDEN // 4
    assert sorted(read["all_reduce_bytes"]) == sorted(
        [b * mlp.D_MODEL * BF16, mlp.D_MODEL * h * BF16, mlp.D_MODEL * h * BF16, F32]
    )
    assert read["comp_nodes"] > 0 and read["same_bytes"]


# -- traces of other producers -------------------------------------------------------------------

def stage_trace() -> TraceSet:
    """The module docstring's trace, with STAGE's habits (its groups written by `write_stage`)."""
    trace = TraceSet(prefix="workload")
    cpu = {"is_cpu_op": ("int64_val", 0)}
    for rank in range(4):
        def comp(node_id: int, deps: tuple[int, ...]) -> pb.Node:
            return make_node(node_id, pb.COMP_NODE, deps, num_ops=("int64_val", 1000),
                             tensor_size=("uint64_val", 4096), **cpu)

        nodes = [
            comp(1, ()),
            make_node(2, pb.COMM_COLL_NODE, (1,), comm_type=("int64_val", pb.ALL_REDUCE),
                      comm_size=("int64_val", 1024), pg_name=("string_val", "1" if rank < 2 else "2"),
                      **cpu),
        ]
        if rank in (1, 2):
            peers = {"comm_dst": ("int32_val", 2)}
            if rank == 2:
                peers["comm_src"] = ("int32_val", 1)
            nodes.append(make_node(3, pb.COMM_SEND_NODE if rank == 1 else pb.COMM_RECV_NODE, (2,),
                                   comm_tag=("int32_val", 7), comm_size=("int64_val", 512),
                                   **peers, **cpu))
        else:
            nodes.append(comp(3, (2,)))
        nodes.append(make_node(4, pb.COMM_COLL_NODE, (3,), comm_type=("int64_val", pb.ALL_GATHER),
                               comm_size=("int64_val", 256), pg_name=("string_val", ""), **cpu))
        trace.nodes[rank] = nodes
        trace.metadata[rank] = pb.GlobalMetadata(
            version="", attr=[pb.AttributeProto(name="producer", string_val="stage")]
        )
    return trace


def write_stage(trace: TraceSet, directory: Path) -> Path:
    trace.write(directory)
    (directory / GROUPS_FILE).write_text(json.dumps(GROUPS))
    return directory


def device_file(tmp_path: Path) -> Path:
    path = tmp_path.parent / f"{tmp_path.name}-device.json"
    path.write_text(json.dumps({"name": "test", "peak_tflops": 1.0, "mem_bw_gbps": 1.0}))
    return path


def test_check_warns_on_what_astra_sim_tolerates(tmp_path: Path) -> None:
    directory = write_stage(stage_trace(), tmp_path)
    run = flint("check", directory, "--groups", directory / GROUPS_FILE, "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert (report["ok"], report["errors"], report["warnings"]) == (True, 0, 3)
    found = {(v["rule"], v["severity"], v["rank"], v["node_id"], v["count"]) for v in report["violations"]}
    assert found == {
        ("metadata-first", "warning", 0, None, 4),  # every rank's metadata
        ("is-cpu-op", "warning", 0, 1, 4 * 4),  # every node of every rank
        ("comm-peer", "warning", 1, 3, 1),  # rank 1's SEND
    }
    run = flint("check", directory, "--groups", directory / GROUPS_FILE)
    assert run.returncode == 0 and "every rank follows the trace contract" in run.stdout
    assert len(run.stderr.strip().splitlines()) == 3
    assert "warning: rank 0 node 1: is_cpu_op is int64_val, not bool_val" in run.stderr
    assert "(16 times, the first here)" in run.stderr


def test_without_its_group_file_the_groups_are_missing(tmp_path: Path) -> None:
    directory = write_stage(stage_trace(), tmp_path)
    run = flint("check", directory)
    assert run.returncode == 1
    assert run.stdout.splitlines() == [
        f"rank {rank} node 2: group {rank // 2 + 1} is not defined in workload.comm_groups.json "
        "(absent) [pg-name]"
        for rank in range(4)
    ]
    run = flint("check", directory, "--groups", tmp_path / "nothing.json")
    assert run.returncode == 2 and "'--groups'" in run.stderr and "does not exist" in run.stderr


def test_inspect_timeline_and_graph_read_it(tmp_path: Path) -> None:
    directory = write_stage(stage_trace(), tmp_path)
    groups = ("--groups", directory / GROUPS_FILE)
    run = flint("inspect", directory, "--json", *groups)
    assert run.returncode == 0, run.stderr
    ranks = {s["rank"]: s for s in json.loads(run.stdout)}
    assert ranks[1]["sends_to"] == {"2": {"count": 1, "bytes": 512}}
    assert ranks[2]["recvs_from"] == {"1": {"count": 1, "bytes": 512}}
    assert {(c["kind"], c["group_size"]) for c in ranks[3]["collectives_by_group_size"]} == {
        ("all_reduce", 2), ("all_gather", 4)
    }
    assert [ranks[r]["flops"] for r in range(4)] == [2000, 1000, 1000, 2000]

    events = tmp_path / "step.json"
    run = flint("timeline", directory, "-o", events, "--json", "--device", device_file(tmp_path),
                *TIMING, "--collectives", "astra-sim", *groups)
    assert run.returncode == 0, run.stderr
    steps = [r["step_us"] for r in json.loads(run.stdout)["ranks"]]
    # another producer's trace, no manifest: timed by the same model as flint simulate, one link,
    # reductions at the memory bandwidth of --device
    from flint.devices import Device
    from flint.step.models import reader_collectives
    from flint.step.schedule import AS_ASTRA_SIM, load_timeline
    from flint.trace.timing import Compute, Link, NodeTimer

    device = Device("test", peak_tflops=1.0, mem_bw_gbps=1.0)
    collectives = reader_collectives(None, None, 4, 1.0, 2.0, model="astra-sim", device=device)
    expected = load_timeline(directory, None, lambda g, n: NodeTimer(Compute(device, "roofline"), Link(), g, n,
                                                                     collectives), directory / GROUPS_FILE,
                             issue=AS_ASTRA_SIM)
    assert steps == pytest.approx([r.step for r in expected.ranks])
    assert len(set(steps)) == 1 and steps[0] > STEP_US  # chunking and per-hop latency cost more

    run = flint("graph", directory, "--rank", "1", "-o", tmp_path / "g.dot", *groups)
    assert run.returncode == 0, run.stderr
    assert "comm_send 1 -> 2 tag 7" in (tmp_path / "g.dot").read_text()


def _comm_on_cpu(trace: TraceSet) -> None:
    set_attr(trace.node(0, 2), "is_cpu_op", "int64_val", 1)


def _cpu_as_text(trace: TraceSet) -> None:
    set_attr(trace.node(0, 1), "is_cpu_op", "string_val", "0")


def _send_without_destination(trace: TraceSet) -> None:
    drop_attr(trace.node(1, 3), "comm_dst")


BREAKS_ASTRA_SIM = [
    # id, edit, rule, rank, node
    ("comm-on-cpu", _comm_on_cpu, "is-cpu-op", 0, 2),  # "Comm node should not be on CPU"
    ("cpu-as-text", _cpu_as_text, "is-cpu-op", 0, 1),  # std::bad_cast
    ("send-no-dst", _send_without_destination, "comm-peer", 1, 3),  # "Attribute comm_dst not found"
]


@pytest.mark.parametrize(("edit", "rule", "rank", "node_id"),
                         [pytest.param(*case[1:], id=case[0]) for case in BREAKS_ASTRA_SIM])
def test_what_breaks_astra_sim_is_an_error(tmp_path: Path, edit, rule, rank, node_id) -> None:
    trace = stage_trace()
    edit(trace)
    directory = write_stage(trace, tmp_path)
    run = flint("check", directory, "--groups", directory / GROUPS_FILE, "--json")
    assert run.returncode == 1
    errors = [v for v in json.loads(run.stdout)["violations"] if v["severity"] == "error"]
    assert [(v["rule"], v["rank"], v["node_id"]) for v in errors] == [(rule, rank, node_id)]


SIMULATOR = os.environ.get("ASTRA_SIM", "")
NETWORK = "topology: [ Switch ]\nnpus_count: [ 4 ]\nbandwidth: [ 400.0 ]\nlatency: [ 936.25 ]\n"
SYSTEM = {"scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 2,
          "preferred-dataset-splits": 4, "all-reduce-implementation": ["ring"],
          "all-gather-implementation": ["ring"], "reduce-scatter-implementation": ["ring"],
          "all-to-all-implementation": ["ring"], "collective-optimization": "localBWAware",
          "boost-mode": 0}


def finished_ranks(directory: Path) -> int:
    """How many ranks of the trace in `directory` ASTRA-sim runs to the end."""
    (directory / "network.yml").write_text(NETWORK)
    (directory / "system.json").write_text(json.dumps(SYSTEM))
    (directory / "memory.json").write_text(json.dumps({"memory-type": "NO_MEMORY_EXPANSION"}))
    done = subprocess.run(
        [SIMULATOR, f"--workload-configuration={directory / 'workload'}",
         f"--comm-group-configuration={directory / GROUPS_FILE}",
         f"--system-configuration={directory / 'system.json'}",
         f"--network-configuration={directory / 'network.yml'}",
         f"--remote-memory-configuration={directory / 'memory.json'}"],
        capture_output=True, text=True, timeout=120, check=False, cwd=directory,  # its log/ goes there
    )
    return len(re.findall(r"sys\[\d+\] finished", done.stdout))


@pytest.mark.skipif(not (SIMULATOR and os.access(SIMULATOR, os.X_OK)),
                    reason="needs ASTRA-sim: set ASTRA_SIM to its astra-sim wrapper")
@pytest.mark.parametrize("edit", [None] + [pytest.param(c[1], id=c[0]) for c in BREAKS_ASTRA_SIM])
def test_astra_sim_agrees(tmp_path: Path, edit) -> None:
    """The trace with warnings only runs on every rank of the real simulator; each error stops it."""
    trace = stage_trace()
    if edit:
        edit(trace)
    directory = write_stage(trace, tmp_path)
    assert finished_ranks(directory) == (0 if edit else 4)

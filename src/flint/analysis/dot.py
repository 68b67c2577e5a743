"""One rank's dependency graph as Graphviz DOT, rendered to an image by Graphviz's `dot` if asked.

Meant for small traces (a toy step, a single layer): a graph of thousands of nodes is unreadable and
slow to lay out, so the node count is capped. The DOT text itself needs nothing installed; `.svg`,
`.png` and `.pdf` need the `dot` program on PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from flint.errors import FlintError
from flint.schema import et_def_pb2 as pb
from flint.trace.reader import RankTrace, attr_value, integer_attr, transfer_peers
from flint.trace.timing import NodeTimer
from flint.trace.vocabulary import collective_name, compute_flops, node_type_name

MAX_NODES = 500
TEXT_SUFFIXES = (".dot", ".gv")
IMAGE_SUFFIXES = (".svg", ".png", ".pdf")
_FILL = {
    pb.COMP_NODE: "#c6dbef",
    pb.COMM_COLL_NODE: "#fdd0a2",
    pb.COMM_SEND_NODE: "#c7e9c0",
    pb.COMM_RECV_NODE: "#c7e9c0",
    pb.MEM_LOAD_NODE: "#d9d9d9",
    pb.MEM_STORE_NODE: "#d9d9d9",
}
_NAME_CHARS = 48


def to_dot(trace: RankTrace, timer: NodeTimer) -> str:
    """DOT text: a box per node (id, name, type, cost, time), data deps solid, ctrl deps dashed."""
    lines = [
        f'digraph "rank {trace.rank}" {{',
        "  rankdir=TB;",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
    ]
    for node in trace.nodes:
        time = "untimed: no group" if untimed(timer, node) else f"{timer.micros(node):,.1f} µs"
        label = "\n".join((f"{node.id}: {_short(node.name)}", _kind(node, trace.rank), _cost(node), time))
        lines.append(f'  n{node.id} [label="{_escape(label)}", fillcolor="{_FILL.get(node.type, "white")}"];')
    for node in trace.nodes:
        lines += [f"  n{dep} -> n{node.id};" for dep in node.data_deps]
        lines += [f"  n{dep} -> n{node.id} [style=dashed];" for dep in node.ctrl_deps]
    lines.append("}")
    return "\n".join(lines) + "\n"


def untimed(timer: NodeTimer, node: pb.Node) -> bool:
    """A collective whose group no groups file gives: nothing can time it (inspect and timeline
    say so too), so it is not drawn as taking no time."""
    return node.type == pb.COMM_COLL_NODE and timer.group_ranks(node) is None


def write_graph(trace: RankTrace, timer: NodeTimer, path: str | os.PathLike[str], max_nodes: int) -> None:
    """Write `.dot`/`.gv` text, or an `.svg`/`.png`/`.pdf` image laid out by `dot`."""
    path = Path(path)
    if len(trace.nodes) > max_nodes:
        raise FlintError(
            f"rank {trace.rank} has {len(trace.nodes):,} nodes, more than --max-nodes {max_nodes} "
            "that a drawing can show: use a smaller step or mesh, or raise --max-nodes"
        )
    suffix = path.suffix.lower()
    if suffix not in TEXT_SUFFIXES + IMAGE_SUFFIXES:
        raise FlintError(f"cannot tell the format of {path.name!r}: end it in "
                         f"{', '.join(TEXT_SUFFIXES + IMAGE_SUFFIXES)}")
    text = to_dot(trace, timer)
    if suffix in TEXT_SUFFIXES:
        path.write_text(text)
        return
    dot = shutil.which("dot")
    if dot is None:
        raise FlintError(
            f"drawing {suffix} needs Graphviz's `dot` program on PATH (apt install graphviz, or "
            "brew install graphviz); `-o graph.dot` writes the DOT text without it"
        )
    done = subprocess.run([dot, f"-T{suffix[1:]}", "-o", str(path)], input=text.encode(),
                          capture_output=True, check=False)
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        message = lines[0] if lines else f"exit {done.returncode}"
        raise FlintError(f"dot failed on rank {trace.rank}'s graph: {message}")


def _kind(node: pb.Node, rank: int) -> str:
    if node.type == pb.COMM_COLL_NODE:
        comm_type = integer_attr(node, "comm_type")
        return f"{collective_name(comm_type)} group {attr_value(node, 'pg_name') or 'all'}"
    name = node_type_name(node.type)
    if node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
        src, dst = transfer_peers(node, rank)
        return f"{name} {src} -> {dst} tag {attr_value(node, 'comm_tag')}"
    op = attr_value(node, "op")
    return f"{name} {op}" if op else name


def _cost(node: pb.Node) -> str:
    if node.type == pb.COMP_NODE:
        flops = compute_flops(integer_attr(node, "num_ops") or 0)
        nbytes = integer_attr(node, "tensor_size") or 0
        return f"{flops:,} FLOPs, {nbytes:,} B"
    if node.type in (pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE):
        return f"{integer_attr(node, 'tensor_size') or 0:,} B"
    return f"{integer_attr(node, 'comm_size') or 0:,} B"


def _short(name: str) -> str:
    return name if len(name) <= _NAME_CHARS else "…" + name[-(_NAME_CHARS - 1):]


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

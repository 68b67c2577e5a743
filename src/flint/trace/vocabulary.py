"""The words of Flint's machine-readable output, one name and one definition per quantity.

`extract --json` and `manifest.json` (from the workload graph), `inspect --json` (from the trace
files) and every other command that prints JSON name things through this module, so a script reads
the same key for the same thing whichever command printed it:

- a collective by its Chakra kind in lower case (`all_reduce`, `all_gather`, `reduce_scatter`,
  `all_to_all`, `broadcast`), `comm_type_<N>` for a value the schema does not name and
  `comm_type_unknown` where a node has no integer `comm_type`; the halves of a point-to-point
  transfer as `send` and `recv`. A rank's `collectives` are keyed by these names, send and recv
  included, each `{"count": ..., "bytes": ...}` (`comm_size` summed).
- a node type by its Chakra name in lower case without `_node` (`comp`, `comm_coll`, `comm_send`,
  `comm_recv`, `mem_load`, `mem_store`, ...), `node_type_<N>` for a value the schema lacks.
- FLOPs per rank: the `num_ops` of the COMP nodes that compute, i.e. those with more than one
  operation. The contract forbids a `num_ops` of 0, so a node that only moves data (a broadcast,
  slice, copy or transpose) carries 1, which a reader cannot tell from a one-FLOP scalar op; both
  count 0. The graph side counts the same way (`compute_flops` of its FLOPs), so `extract` and
  `inspect` agree to the FLOP; the scalar ops this leaves out are a few FLOPs in billions.
- bytes per rank: the `tensor_size` of COMP nodes (bytes read and written by compute).
"""

from __future__ import annotations

from collections.abc import Mapping

from flint.schema import et_def_pb2 as pb

SEND, RECV = "send", "recv"
UNKNOWN_COLLECTIVE = "comm_type_unknown"
NO_ARITHMETIC = 1
"""The `num_ops` that a node without arithmetic carries (the contract's floor)."""


def collective_name(comm_type: int | None) -> str:
    """A collective's kind: `all_reduce` for `ALL_REDUCE`, ...; None is a node without one."""
    if comm_type is None:
        return UNKNOWN_COLLECTIVE
    if comm_type in pb.CollectiveCommType.values():
        return pb.CollectiveCommType.Name(comm_type).lower()
    return f"comm_type_{comm_type}"


def node_type_name(node_type: int) -> str:
    """A node type: `comp` for `COMP_NODE`, `comm_send` for `COMM_SEND_NODE`, ..."""
    if node_type in pb.NodeType.values():
        return pb.NodeType.Name(node_type).lower().removesuffix("_node")
    return f"node_type_{node_type}"


def compute_flops(num_ops: int) -> int:
    """The FLOPs a node's operation count stands for (see the module docstring)."""
    return num_ops if num_ops > NO_ARITHMETIC else 0


def communication_json(counts: Mapping[str, int], sizes: Mapping[str, int]) -> dict[str, dict]:
    """`{name: {"count": ..., "bytes": ...}}` in name order."""
    return {name: {"count": counts[name], "bytes": sizes[name]} for name in sorted(counts)}


def totals_json(
    nodes: int,
    flops: int,
    transcendentals: int,
    nbytes: int,
    counts: Mapping[str, int],
    sizes: Mapping[str, int],
) -> dict:
    """A rank's totals under the keys every command uses: `nodes`, `flops`, `transcendentals`,
    `bytes` and `collectives` (by `collective_name`, `send` and `recv`)."""
    return {
        "nodes": nodes,
        "flops": flops,
        "transcendentals": transcendentals,
        "bytes": nbytes,
        "collectives": communication_json(counts, sizes),
    }

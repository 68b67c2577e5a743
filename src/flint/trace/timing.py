"""How long one Chakra node takes: the roofline for compute, alpha-beta for communication.

`flint timeline` schedules with these times, `flint inspect` ranks nodes by them and `flint validate`
sets them beside measured ones, so all three agree on what "heavy" means.

- COMP nodes: `Device.micros(num_ops, tensor_size)`, unrounded: the roofline whose running sum
  `duration_micros` follows (`flint.emit.durations`) and that ASTRA-sim's roofline mode applies;
  MEM nodes: their bytes at memory bandwidth. A node without those attributes (a foreign trace) keeps its `duration_micros`.
- Collectives over a group of n ranks, ring algorithm, `comm_size` S in Chakra's convention:
  `steps * alpha + moved / bandwidth` with

  | collective     | S is               | steps    | bytes each rank moves |
  |----------------|--------------------|----------|-----------------------|
  | ALL_REDUCE     | the full buffer    | 2(n-1)   | 2(n-1)/n * S          |
  | REDUCE_SCATTER | the full input     | n-1      | (n-1)/n * S           |
  | ALL_GATHER     | the per-rank input | n-1      | (n-1) * S             |
  | ALL_TO_ALL     | the per-rank input | n-1      | (n-1)/n * S           |

  BROADCAST is replayed from `duration_micros`, as ASTRA-sim does.
- SEND/RECV: `alpha + S / bandwidth`, one hop.

The link model is deliberately simple: one bandwidth for every link and no sharing between
concurrent transfers, so communication times are a lower bound.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from flint.devices import Device
from flint.schema import et_def_pb2 as pb
from flint.trace.node_rules import ALL_RANKS, parse_group_id
from flint.trace.reader import INTEGER_KINDS, attr_value, attribute_value, attributes

DEFAULT_LINK_GBPS = 400.0
"""GB/s (10^9 bytes/s) per rank, about one direction of an H100's NVLink."""
DEFAULT_LINK_LATENCY_US = 5.0
"""Microseconds per ring step: a collective launch plus one hop."""

_RING = {
    # comm_type: (steps, bytes moved per rank) as functions of n and S
    pb.ALL_REDUCE: (lambda n: 2 * (n - 1), lambda n, s: 2 * (n - 1) / n * s),
    pb.REDUCE_SCATTER: (lambda n: n - 1, lambda n, s: (n - 1) / n * s),
    pb.ALL_GATHER: (lambda n: n - 1, lambda n, s: (n - 1) * s),
    pb.ALL_TO_ALL: (lambda n: n - 1, lambda n, s: (n - 1) / n * s),
}


@dataclass(frozen=True)
class Link:
    """The alpha-beta link model: `latency_us` per step (alpha), `bandwidth_gbps` in GB/s (1/beta)."""

    bandwidth_gbps: float = DEFAULT_LINK_GBPS
    latency_us: float = DEFAULT_LINK_LATENCY_US

    def transfer_micros(self, steps: int, nbytes: float) -> float:
        return steps * self.latency_us + nbytes / (self.bandwidth_gbps * 1e3)


@dataclass(frozen=True)
class NodeTimer:
    """Times the nodes of one trace set; `groups` maps a `pg_name` id to its ranks. With
    `link_among`, traffic among some ranks takes the link it returns for them (a network whose
    tiers differ), else `link`."""

    device: Device
    link: Link
    groups: Mapping[int, Sequence[int]]
    num_ranks: int
    link_among: Callable[[Sequence[int]], Link] | None = None

    def _link(self, ranks: Sequence[int]) -> Link:
        return self.link_among(ranks) if self.link_among else self.link

    def group_size(self, node: pb.Node) -> int | None:
        """How many ranks take part in a collective, or None for a group the groups file lacks."""
        ranks = self.group_ranks(node)
        return None if ranks is None else len(ranks)

    def group_ranks(self, node: pb.Node) -> Sequence[int] | None:
        """The ranks taking part in a collective, or None for a group the groups file lacks."""
        group = group_id(node)
        if group == ALL_RANKS:
            return range(self.num_ranks)
        return self.groups.get(group)

    def micros(self, node: pb.Node) -> float:
        """The node's time in microseconds under the roofline and the link model."""
        attrs = {name: attribute_value(attr) for name, attr in attributes(node).items()
                 if attr.WhichOneof("value") in INTEGER_KINDS}
        if node.type == pb.COMP_NODE and "num_ops" in attrs and "tensor_size" in attrs:
            return self.device.micros(attrs["num_ops"], attrs["tensor_size"])
        if node.type in (pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE) and "tensor_size" in attrs:
            return self.device.micros(0, attrs["tensor_size"])
        size = attrs.get("comm_size")
        if node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE) and size is not None:
            peers = [attrs[k] for k in ("comm_src", "comm_dst") if k in attrs]
            return self._link(peers).transfer_micros(1, size)
        ranks = self.group_ranks(node) if node.type == pb.COMM_COLL_NODE else None
        if ranks and size is not None and attrs.get("comm_type") in _RING:
            steps, moved = _RING[attrs["comm_type"]]
            n = len(ranks)
            return self._link(ranks).transfer_micros(steps(n), moved(n, size))
        return float(node.duration_micros)


def group_id(node: pb.Node) -> int:
    """A collective's group id; `ALL_RANKS` (0) for `pg_name` absent, "" or "0"."""
    name = attr_value(node, "pg_name")
    group = parse_group_id(name) if isinstance(name, str) else None
    return ALL_RANKS if group is None else group

"""How long one Chakra node takes: the trace's own durations for compute, the network's model for
communication.

`flint timeline` schedules with these times, `flint inspect` ranks nodes by them, `flint validate`
sets them beside measured ones and `flint simulate` estimates with them, so all of them agree with
each other and with the trace.

- COMP and MEM nodes: their `duration_micros`, what the extraction's kernel model wrote (the
  calibrated model by default on GPU backends, see `flint.devices.kernels`), so every command
  gives the trace's own compute time. Asked to (`--durations calibrated|roofline`, or `--device`),
  a reader times them again from `num_ops`, `tensor_size` and `gemm` on a device (by default the
  one the manifest records); a node without those attributes (a foreign trace) keeps its
  `duration_micros`.
- Communication, given a model of it on a network (`collectives`, from `flint.step`): as NCCL runs
  it (`flint.step.nccl`, the default), or as ASTRA-sim times it (`flint.step.astra_sim`,
  `--collectives astra-sim`). Every reader passes one (`--network`, hgx by default).
- Communication without a network (a bare `Link`, e.g. in unit tests): collectives over a group of
  n ranks, ring algorithm, `comm_size` S in Chakra's convention: `steps * alpha + moved / bandwidth` with

  | collective     | S is               | steps    | bytes each rank moves |
  |----------------|--------------------|----------|-----------------------|
  | ALL_REDUCE     | the full buffer    | 2(n-1)   | 2(n-1)/n * S          |
  | REDUCE_SCATTER | the full input     | n-1      | (n-1)/n * S           |
  | ALL_GATHER     | the per-rank input | n-1      | (n-1) * S             |
  | ALL_TO_ALL     | the per-rank input | n-1      | (n-1)/n * S           |

  BROADCAST is replayed from `duration_micros`, as ASTRA-sim does.
- SEND/RECV: `alpha + S / bandwidth`, one hop.

The bare link model is deliberately simple: one bandwidth for every link and no sharing between
concurrent transfers, so communication times are a lower bound.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from flint.devices import BUILTIN, Device, load_device
from flint.devices.kernels import kernel_micros
from flint.errors import FlintError
from flint.schema import et_def_pb2 as pb
from flint.trace.node_rules import ALL_RANKS, parse_group_id
from flint.trace.reader import INTEGER_KINDS, attr_value, attribute_value, attributes, gemm_shape, kernel_kind

DEFAULT_LINK_GBPS = 400.0
"""GB/s (10^9 bytes/s) per rank, about one direction of an H100's NVLink."""
DEFAULT_LINK_LATENCY_US = 5.0
"""Microseconds per ring step: a collective launch plus one hop."""

COMPUTE_TYPES = frozenset({pb.COMP_NODE, pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE})
"""Node types that run on a rank's compute stream, timed as compute."""

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


READER_DURATIONS = ("trace", "calibrated", "roofline")
"""How a reader times compute: as the trace says, or again by a kernel model on a device."""


@dataclass(frozen=True)
class Compute:
    """How compute nodes are timed: `device` None keeps each node's `duration_micros`; else
    `durations` (`calibrated` or `roofline`) on that device."""

    device: Device | None = None
    durations: str = "trace"

    @property
    def label(self) -> str:
        return "the trace's durations" if self.device is None else f"{self.durations} on {self.device.name}"


def reader_compute(device_spec: str | None, durations: str | None, manifest: Mapping | None) -> Compute:
    """What `--device` and `--durations` of a reader ask for, or one line where they disagree:
    by default the trace's own durations; `--device` alone, the calibrated model on it; a kernel
    model without `--device`, the device the trace's manifest records."""
    durations = durations or ("calibrated" if device_spec else "trace")
    if durations == "trace":
        if device_spec:
            raise FlintError("--device times compute again: use it with --durations calibrated or roofline")
        return Compute()
    if device_spec:
        return Compute(load_device(device_spec), durations)
    recorded = (manifest or {}).get("device")
    if not isinstance(recorded, Mapping):
        raise FlintError(f"--durations {durations} times compute on a device, and this trace has no "
                         "manifest that names one: give --device")
    return Compute(_device_of(recorded), durations)


def _device_of(recorded: Mapping) -> Device:
    """The device a manifest records (one of before device files: the built-in of its name)."""
    if "calibration" not in recorded and recorded.get("name") in BUILTIN:
        return BUILTIN[recorded["name"]]
    return Device.from_json(dict(recorded), "the manifest's device")


def recorded_device(manifest: Mapping | None) -> Device:
    """The device the trace's manifest records; an H100's for a trace with none (another producer's)."""
    recorded = (manifest or {}).get("device")
    return _device_of(recorded) if isinstance(recorded, Mapping) else BUILTIN["h100"]


class CommunicationModel(Protocol):
    """What times communication on a machine (`flint.step`: NCCL's model or ASTRA-sim's)."""

    def times(self, comm_type: int) -> bool: ...

    def collective_micros(self, comm_type: int, nbytes: int, ranks: Sequence[int]) -> float: ...

    def transfer_micros(self, src: int, dst: int, nbytes: float) -> float: ...

    def group_shape(self, ranks: Sequence[int]) -> Hashable: ...

    def shaped_micros(self, comm_type: int, nbytes: int, shape: Hashable) -> float: ...


@dataclass(frozen=True)
class NodeTimer:
    """Times the nodes of one trace set; `groups` maps a `pg_name` id to its ranks. With
    `collectives`, communication is timed on its network by that model; else by `link`."""

    compute: Compute
    link: Link
    groups: Mapping[int, Sequence[int]]
    num_ranks: int
    collectives: CommunicationModel | None = None

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
        """The node's time in microseconds: compute as `compute` says, communication by the
        link model."""
        if node.type in COMPUTE_TYPES and self.compute.device is None:
            return float(node.duration_micros)
        attrs = {name: attribute_value(attr) for name, attr in attributes(node).items()
                 if attr.WhichOneof("value") in INTEGER_KINDS}
        device, durations = self.compute.device, self.compute.durations
        if node.type == pb.COMP_NODE and "num_ops" in attrs and "tensor_size" in attrs:
            return kernel_micros(device, durations, attrs["num_ops"], attrs["tensor_size"], gemm_shape(node),
                                 kernel_kind(node))
        if node.type in (pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE) and "tensor_size" in attrs:
            return device.micros(0, attrs["tensor_size"])
        size = attrs.get("comm_size")
        if node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE) and size is not None:
            if self.collectives is not None and "comm_src" in attrs and "comm_dst" in attrs:
                return self.collectives.transfer_micros(attrs["comm_src"], attrs["comm_dst"], size)
            return self.link.transfer_micros(1, size)
        ranks = self.group_ranks(node) if node.type == pb.COMM_COLL_NODE else None
        if (ranks and size is not None and self.collectives is not None and isinstance(attrs.get("comm_type"), int)
                and self.collectives.times(attrs["comm_type"])):
            return self.collectives.collective_micros(attrs["comm_type"], size, ranks)
        if ranks and size is not None and attrs.get("comm_type") in _RING:
            steps, moved = _RING[attrs["comm_type"]]
            n = len(ranks)
            return self.link.transfer_micros(steps(n), moved(n, size))
        return float(node.duration_micros)


def group_id(node: pb.Node) -> int:
    """A collective's group id; `ALL_RANKS` (0) for `pg_name` absent, "" or "0"."""
    name = attr_value(node, "pg_name")
    group = parse_group_id(name) if isinstance(name, str) else None
    return ALL_RANKS if group is None else group

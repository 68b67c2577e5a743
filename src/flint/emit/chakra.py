"""Chakra `Node` messages for each rank, following `chakra-contract.md`.

Every rank runs one SPMD program, so a node's message is the same on every rank except for the
communicator group of a collective and the peers of a SEND/RECV. Those per-rank attributes are the
last ones of their message: protobuf writes repeated fields in order, so a message is its constant
part followed by the serialized per-rank attributes, and a rank's file is assembled from bytes
serialized once (see `template.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from flint.devices import Device
from flint.devices.kernels import kernel_micros
from flint.emit.durations import RunningMicros
from flint.emit.plan import COLLECTIVE, COMM_TYPE, COMPUTE, SEND, Planned, TracePlan
from flint.emit.summary import RankTotals, TotalsCounter
from flint.emit.template import GroupSlot, PeerSlot, RankTemplate
from flint.schema import et_def_pb2 as pb
from flint.trace.framing import encode_delimited
from flint.trace.timing import Link

SCHEMA_VERSION = "0.0.4"


def _attr(name: str, **value) -> pb.AttributeProto:
    return pb.AttributeProto(name=name, **value)


def _every_node(data: dict) -> list[pb.AttributeProto]:
    """The attributes every node starts with: accelerator work, and the op it runs."""
    return [_attr("is_cpu_op", bool_val=False), _attr("op", string_val=data["op"])]


def _origin(data: dict) -> list[pb.AttributeProto]:
    """Where a communication node came from, now that its name says what it is: the op path
    (`source_op`) and source line (`source`) it was compiled from, where known. Compute nodes carry
    their source line in their name; their op path stays in the graph file only (on every node it
    would add more than half to a trace's size: 56% on gpt.py's)."""
    return [_attr(key, string_val=data[key]) for key in ("source_op", "source") if data.get(key)]


def attributes_bytes(*attrs: pb.AttributeProto) -> bytes:
    """Attributes serialized as they appear at the end of a `Node` message (field 10, in order)."""
    return pb.Node(attr=attrs).SerializeToString()


def group_bytes(group_id: int) -> bytes:
    return attributes_bytes(_attr("pg_name", string_val=str(group_id)))


def peer_bytes(src: int, dst: int) -> bytes:
    return attributes_bytes(_attr("comm_src", int32_val=src), _attr("comm_dst", int32_val=dst))


class NodeMessages:
    """The rank-independent part of each planned node's message.

    A compute node's attributes and exact time depend only on what it computes, which a pipelined
    graph repeats in every forward and backward copy of its piece: they are serialized and timed
    once per distinct kernel (`_kernel`), and each node adds what differs (its id, name,
    dependencies and rounded duration) in front, as protobuf writes fields in number order."""

    def __init__(self, device: Device, durations: str, estimates: Mapping[int, float] | None = None):
        self.device = device
        self.durations = durations
        self.estimates = estimates
        self._kernels: dict[tuple, tuple[bytes, float]] = {}

    def _kernel(self, data: dict) -> tuple[bytes, float]:
        """A compute node's serialized attributes and exact time."""
        gemm = data.get("gemm")
        key = (data["op"], data["flops"], data["bytes"], data["transcendentals"], data.get("kernel"),
               data.get("kernel_name"), tuple(gemm) if gemm is not None else None,
               data.get("instruction") if self.durations == "xla" else None)
        found = self._kernels.get(key)
        if found is None:
            attrs = [*_every_node(data), _attr("num_ops", int64_val=max(1, data["flops"])),
                     _attr("tensor_size", uint64_val=max(1, data["bytes"]))]
            if data["transcendentals"]:
                attrs.append(_attr("transcendentals", int64_val=data["transcendentals"]))
            if "kernel" in data:
                attrs.append(_attr("kernel", string_val=data["kernel"]))
            if "kernel_name" in data:
                attrs.append(_attr("kernel_name", string_val=data["kernel_name"]))
            if gemm is not None:
                attrs.append(_attr("gemm", int64_list=pb.Int64List(values=gemm)))
            found = self._kernels[key] = (attributes_bytes(*attrs), self.micros(data))
        return found

    def compute_bytes(self, planned: Planned, durations: RunningMicros) -> bytes:
        """A compute node's serialized message. Memory nodes become COMP nodes with one op, so
        roofline mode times them by bytes alone."""
        attrs, micros = self._kernel(planned.data)
        head = pb.Node(id=planned.id, name=planned.name, type=pb.COMP_NODE, ctrl_deps=planned.ctrl,
                       data_deps=planned.deps, duration_micros=durations.next(micros))
        return head.SerializeToString() + attrs

    def micros(self, data: dict) -> float:
        """The node's exact time: XLA's estimate for its instruction under `--durations xla`
        (the pipeline makes sure every kernel has one), else the device's kernel model."""
        if self.durations == "xla":
            return self.estimates[data["instruction"]]
        return kernel_micros(self.device, self.durations, data["flops"], data["bytes"], data.get("gemm"),
                             data.get("kernel"))

    def message(self, planned: Planned, durations: RunningMicros) -> pb.Node:
        """A communication node's message (compute nodes: `compute_bytes`)."""
        data = planned.data
        message = pb.Node(
            id=planned.id,
            name=planned.name,
            data_deps=planned.deps,
            ctrl_deps=planned.ctrl,
            attr=_every_node(data),
        )
        if planned.kind == COLLECTIVE:
            message.type = pb.COMM_COLL_NODE
            if data["collective"] == "collective_broadcast":
                # ASTRA-sim replays BROADCAST from its duration: a pipelined chain over the group.
                steps = len(data["groups"][0]) - 1
                message.duration_micros = max(1, math.ceil(Link().transfer_micros(steps, data["comm_bytes"])))
            message.attr.extend(
                [
                    _attr("comm_type", int64_val=COMM_TYPE[data["collective"]]),
                    _attr("comm_size", int64_val=data["comm_bytes"]),
                    *_origin(data),
                ]
            )
        else:
            message.type = pb.COMM_SEND_NODE if planned.kind == SEND else pb.COMM_RECV_NODE
            message.attr.extend(
                [
                    _attr("comm_tag", int32_val=planned.tag),
                    _attr("comm_size", int64_val=data["comm_bytes"]),
                    *_origin(data),
                ]
            )
        return message


class ChakraEmitter:
    """Serializes a trace plan into per-rank `.et` byte streams, one template per rank class, and
    counts each class's totals as it goes (`totals`, once every class's template was built)."""

    def __init__(
        self,
        plan: TracePlan,
        device: Device,
        metadata: dict,
        durations: str = "roofline",
        estimates: Mapping[int, float] | None = None,
    ):
        self.plan = plan
        self.groups = plan.groups
        self.classes = plan.classes
        self.totals: dict[int, RankTotals] = {}
        self._messages = NodeMessages(device, durations, estimates)
        self._header = encode_delimited(
            pb.GlobalMetadata(
                version=SCHEMA_VERSION,
                attr=[_attr(k, string_val=str(v)) for k, v in sorted(metadata.items())],
            ).SerializeToString()
        )
        self._tails = [b""] + [group_bytes(gid) for gid in range(1, len(self.groups.ids) + 1)]
        self._tail_sizes = frozenset(len(tail) for tail in self._tails[1:])

    def template(self, cls: int) -> RankTemplate:
        """The files of every rank in class `cls`, as constant bytes around per-rank slots."""
        constants: list[bytes] = []
        slots: list[GroupSlot | PeerSlot] = []
        run = [self._header]
        durations = RunningMicros()
        counter = TotalsCounter()
        for planned in self.plan.planned(cls):
            counter.add(planned)
            if planned.kind == COMPUTE:
                run.append(encode_delimited(self._messages.compute_bytes(planned, durations)))
                continue
            message = self._messages.message(planned, durations).SerializeToString()
            constants.append(b"".join(run))
            run = []
            if planned.kind == COLLECTIVE:
                slots.append(GroupSlot(message, planned.partition, self._tails, self._tail_sizes))
            else:
                slots.append(PeerSlot(message, planned.peer_of, planned.kind == SEND, peer_bytes))
        constants.append(b"".join(run))
        self.totals[cls] = counter.totals()
        return RankTemplate(constants, slots, self.groups.ids_of_rank)

"""Chakra `Node` messages for each rank, following `chakra-contract.md`.

Every rank runs one SPMD program, so a node's message is the same on every rank except for the
communicator group of a collective. Messages are therefore serialized once per node (and once per group
for collectives) and each rank's file is the concatenation of cached bytes.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from flint.devices import Device
from flint.graph import WorkloadGraph
from flint.schema import et_def_pb2 as pb
from flint.trace.framing import encode_delimited

SCHEMA_VERSION = "0.0.4"

COMM_TYPE = {
    "all_reduce": pb.ALL_REDUCE,
    "all_gather": pb.ALL_GATHER,
    "reduce_scatter": pb.REDUCE_SCATTER,
    "all_to_all": pb.ALL_TO_ALL,
}


class GroupTable:
    """Every distinct rank group of the trace, numbered from 1 in order of first use.

    Ids are what `pg_name` holds and what the communicator-group file maps back to ranks.
    """

    def __init__(self, graph: WorkloadGraph):
        self.ids: dict[tuple[int, ...], int] = {}
        self._rank_maps: dict[tuple, np.ndarray] = {}
        for _, data in graph.nodes():
            for group in data.get("groups", ()):
                self.ids.setdefault(group, len(self.ids) + 1)

    def group_of(self, groups: tuple[tuple[int, ...], ...], num_ranks: int) -> np.ndarray:
        """Group id of each rank for a collective with these groups (0 where a rank is in none)."""
        found = self._rank_maps.get(groups)
        if found is None:
            found = np.zeros(num_ranks, dtype=np.int64)
            for group in groups:
                found[list(group)] = self.ids[group]
            self._rank_maps[groups] = found
        return found

    def as_json(self) -> dict[str, list[int]]:
        return {str(gid): list(group) for group, gid in self.ids.items()}


def _attr(name: str, **value) -> pb.AttributeProto:
    return pb.AttributeProto(name=name, **value)


class ChakraEmitter:
    """Serializes the graph into per-rank `.et` byte streams."""

    def __init__(self, graph: WorkloadGraph, device: Device, groups: GroupTable, metadata: dict):
        self.graph = graph
        self.device = device
        self.groups = groups
        self.metadata = metadata
        self._nodes = graph.nodes()
        self._static: dict[int, bytes] = {}
        self._per_group: dict[tuple[int, int], bytes] = {}

    def header(self) -> bytes:
        message = pb.GlobalMetadata(
            version=SCHEMA_VERSION,
            attr=[_attr(k, string_val=str(v)) for k, v in sorted(self.metadata.items())],
        )
        return encode_delimited(message.SerializeToString())

    def _node(self, node_id: int, data: dict, group_id: int | None) -> bytes:
        deps = sorted(self.graph.graph.predecessors(node_id))
        message = pb.Node(id=node_id, name=data["name"], data_deps=deps)
        attrs = [_attr("is_cpu_op", bool_val=False), _attr("op", string_val=data["op"])]
        if data["kind"] == "collective":
            message.type = pb.COMM_COLL_NODE
            attrs += [
                _attr("comm_type", int64_val=COMM_TYPE[data["collective"]]),
                _attr("comm_size", int64_val=data["comm_bytes"]),
                _attr("pg_name", string_val=str(group_id)),
            ]
        else:
            # Memory nodes become COMP nodes with one op, so roofline mode times them by bytes alone.
            message.type = pb.COMP_NODE
            message.duration_micros = self.device.duration_micros(data["flops"], data["bytes"])
            attrs += [
                _attr("num_ops", int64_val=max(1, data["flops"])),
                _attr("tensor_size", uint64_val=max(1, data["bytes"])),
            ]
            if data["transcendentals"]:
                attrs.append(_attr("transcendentals", int64_val=data["transcendentals"]))
        message.attr.extend(attrs)
        return encode_delimited(message.SerializeToString())

    def rank_bytes(self, rank: int) -> Iterator[bytes]:
        """The framed messages of `rank`'s file, metadata first."""
        yield self.header()
        num_ranks = self.graph.num_ranks
        for node_id, data in self._nodes:
            if data["kind"] != "collective":
                cached = self._static.get(node_id)
                if cached is None:
                    cached = self._static[node_id] = self._node(node_id, data, None)
                yield cached
                continue
            group_id = int(self.groups.group_of(data["groups"], num_ranks)[rank])
            if group_id == 0:
                raise AssertionError(f"rank {rank} is in no group of collective node {node_id}")
            key = (node_id, group_id)
            cached = self._per_group.get(key)
            if cached is None:
                cached = self._per_group[key] = self._node(node_id, data, group_id)
            yield cached

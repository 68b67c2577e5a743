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
    """Serializes the graph into per-rank `.et` byte streams.

    A `collective_permute` becomes, on each rank, a SEND to its target and/or a RECV from its source
    (ranks outside the pairs get neither). The SEND keeps the graph node's id, the RECV gets an id past
    the graph's; both use the node id as tag, so every pair matches. Dependents of a permute depend on
    the RECV where the rank receives, else on the SEND, else on what the permute itself depended on.
    """

    def __init__(self, graph: WorkloadGraph, device: Device, groups: GroupTable, metadata: dict):
        self.graph = graph
        self.device = device
        self.groups = groups
        self.metadata = metadata
        self._nodes = graph.nodes()
        permutes = [n for n, data in self._nodes if data.get("collective") == "collective_permute"]
        total = graph.graph.number_of_nodes()
        self._recv_id = {node: total + i for i, node in enumerate(permutes)}
        self._peers = {node: self._peer_maps(graph.graph.nodes[node]["pairs"]) for node in permutes}
        self._after_permute = {
            node for node in graph.graph if any(p in self._recv_id for p in graph.graph.predecessors(node))
        }
        self._cache: dict[tuple, bytes] = {}

    @staticmethod
    def _peer_maps(pairs) -> tuple[dict[int, int], dict[int, int]]:
        return {s: t for s, t in pairs}, {t: s for s, t in pairs}

    def header(self) -> bytes:
        message = pb.GlobalMetadata(
            version=SCHEMA_VERSION,
            attr=[_attr(k, string_val=str(v)) for k, v in sorted(self.metadata.items())],
        )
        return encode_delimited(message.SerializeToString())

    def _message(self, node_id: int, data: dict, deps: tuple[int, ...]) -> pb.Node:
        return pb.Node(
            id=node_id,
            name=data["name"],
            data_deps=deps,
            attr=[_attr("is_cpu_op", bool_val=False), _attr("op", string_val=data["op"])],
        )

    def _compute(self, node_id: int, data: dict, deps: tuple[int, ...]) -> bytes:
        # Memory nodes become COMP nodes with one op, so roofline mode times them by bytes alone.
        message = self._message(node_id, data, deps)
        message.type = pb.COMP_NODE
        message.duration_micros = self.device.duration_micros(data["flops"], data["bytes"])
        message.attr.extend(
            [
                _attr("num_ops", int64_val=max(1, data["flops"])),
                _attr("tensor_size", uint64_val=max(1, data["bytes"])),
            ]
        )
        if data["transcendentals"]:
            message.attr.append(_attr("transcendentals", int64_val=data["transcendentals"]))
        return encode_delimited(message.SerializeToString())

    def _collective(self, node_id: int, data: dict, deps: tuple[int, ...], group_id: int) -> bytes:
        message = self._message(node_id, data, deps)
        message.type = pb.COMM_COLL_NODE
        message.attr.extend(
            [
                _attr("comm_type", int64_val=COMM_TYPE[data["collective"]]),
                _attr("comm_size", int64_val=data["comm_bytes"]),
                _attr("pg_name", string_val=str(group_id)),
            ]
        )
        return encode_delimited(message.SerializeToString())

    def _point_to_point(self, node_id, data, deps, node_type, src: int, dst: int, tag: int) -> bytes:
        message = self._message(node_id, data, deps)
        message.type = node_type
        message.attr.extend(
            [
                _attr("comm_src", int32_val=src),
                _attr("comm_dst", int32_val=dst),
                _attr("comm_tag", int32_val=tag),
                _attr("comm_size", int64_val=data["comm_bytes"]),
            ]
        )
        return encode_delimited(message.SerializeToString())

    def _cached(self, key: tuple, build) -> bytes:
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = build()
        return found

    def rank_bytes(self, rank: int) -> Iterator[bytes]:
        """The framed messages of `rank`'s file, metadata first."""
        yield self.header()
        graph = self.graph.graph
        stands_for: dict[int, tuple[int, ...]] = {}  # permute node -> ids that stand for it here

        def deps_of(node_id: int) -> tuple[int, ...]:
            found: set[int] = set()
            for pred in graph.predecessors(node_id):
                found.update(stands_for.get(pred, (pred,)))
            return tuple(sorted(found))

        for node_id, data in self._nodes:
            deps = deps_of(node_id) if node_id in self._after_permute else tuple(
                sorted(graph.predecessors(node_id))
            )
            if data["kind"] != "collective":
                yield self._cached((node_id, deps), lambda: self._compute(node_id, data, deps))
            elif node_id in self._recv_id:
                targets, sources = self._peers[node_id]
                recv_id = self._recv_id[node_id]
                stands_for[node_id] = deps  # a rank outside the pairs does nothing here
                if rank in targets:
                    stands_for[node_id] = (node_id,)
                    yield self._point_to_point(
                        node_id, data, deps, pb.COMM_SEND_NODE, rank, targets[rank], node_id
                    )
                if rank in sources:
                    stands_for[node_id] = (recv_id,)  # the data has arrived: what dependents wait for
                    yield self._point_to_point(
                        recv_id, data, deps, pb.COMM_RECV_NODE, sources[rank], rank, node_id
                    )
            else:
                group_id = int(self.groups.group_of(data["groups"], self.graph.num_ranks)[rank])
                if group_id == 0:
                    raise AssertionError(f"rank {rank} is in no group of collective node {node_id}")
                yield self._cached(
                    (node_id, deps, group_id), lambda: self._collective(node_id, data, deps, group_id)
                )

"""Contract rules that one node can break on its own (types and attributes).

A node with an error yields no communication record: its collective or point-to-point operation
cannot be trusted, so cross-rank matching for it is left to a rerun after the fix rather than
reported twice. Warnings (what ASTRA-sim tolerates: an integer `is_cpu_op`, a SEND without
`comm_src` or a RECV without `comm_dst`) leave the node trusted, read as ASTRA-sim reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flint.schema import et_def_pb2 as pb
from flint.trace.reader import (
    GROUP_ID_DIGITS,
    INTEGER_KINDS,
    attribute_value,
    attributes,
    enum_name,
)
from flint.trace.violation import WARNING, Violation

ALL_RANKS = 0
"""Group key of the implicit all-ranks communicator (``pg_name`` absent, ``""`` or ``"0"``)."""

FLOAT_KINDS = frozenset({"double_val", "double_list", "float_val", "float_list"})
INTEGER_ATTRS = frozenset(
    {"num_ops", "tensor_size", "comm_type", "comm_size", "comm_src", "comm_dst", "comm_tag"}
)
COMMUNICATION = frozenset({pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE})
SIMULATED_COLLECTIVES = frozenset(
    {pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_TO_ALL, pb.BROADCAST}
)
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True)
class Collective:
    node_id: int
    group: int
    comm_type: int
    comm_size: int


@dataclass(frozen=True)
class PointToPoint:
    node_id: int
    is_send: bool
    src: int
    dst: int
    tag: int
    size: int


@dataclass(frozen=True)
class RankContext:
    """What node checks need to know beyond the node itself."""

    rank: int
    num_ranks: int
    groups: Mapping[int, frozenset[int]] | None
    """None when the comm-groups file is unusable: that is reported once, not per node."""
    groups_file: str


@dataclass
class NodeCheck:
    """Findings for one node; ``comm`` is set only for a communication node that is trusted."""

    ctx: RankContext
    node: pb.Node
    attrs: dict[str, pb.AttributeProto]
    violations: list[Violation] = field(default_factory=list)
    comm: Collective | PointToPoint | None = None
    unresolved: bool = False
    """Its group could not be looked up, so its rank's collectives cannot be matched."""

    @property
    def trusted(self) -> bool:
        return not self.unresolved and not any(v.is_error for v in self.violations)

    def kind(self, name: str) -> str | None:
        attr = self.attrs.get(name)
        return attr.WhichOneof("value") if attr is not None else None

    def value(self, name: str) -> Any:
        attr = self.attrs.get(name)
        return attribute_value(attr) if attr is not None else None

    def fail(self, rule: str, message: str) -> None:
        self.violations.append(Violation(rule, self.ctx.rank, self.node.id, message))

    def warn(self, rule: str, message: str) -> None:
        self.violations.append(Violation(rule, self.ctx.rank, self.node.id, message, WARNING))

    def integer(self, name: str, rule: str) -> int | None:
        """An integer attribute's value; floats return None because the integer-types rule
        already reported them (ASTRA-sim dies on them with std::bad_cast)."""
        kind = self.kind(name)
        if kind in FLOAT_KINDS:
            return None
        if kind not in INTEGER_KINDS:
            self.fail(rule, f"{name} must be an integer attribute, got {kind or 'nothing'}")
            return None
        return self.value(name)

    def positive(self, name: str, rule: str) -> int | None:
        value = self.integer(name, rule)
        if value is not None and value <= 0:
            self.fail(rule, f"{name} must be > 0, got {value}")
            return None
        return value


def check_node(node: pb.Node, ctx: RankContext) -> NodeCheck:
    check = NodeCheck(ctx, node, attributes(node))
    _check_attribute_kinds(check)
    if node.type == pb.METADATA_NODE:
        check.fail("no-metadata-node", "METADATA_NODE aborts ASTRA-sim")
    elif node.type == pb.COMP_NODE:
        check.positive("num_ops", "num-ops")
        check.positive("tensor_size", "tensor-size")
    elif node.type in (pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE):
        check.positive("tensor_size", "tensor-size")
    elif node.type == pb.COMM_COLL_NODE:
        _check_collective(check)
    elif node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
        _check_point_to_point(check)
    else:
        name = enum_name(pb.NodeType, node.type)
        check.fail("no-invalid-node", f"{name} is not an executable node type")
    if not check.trusted:
        check.comm = None
    return check


def _check_attribute_kinds(check: NodeCheck) -> None:
    for attr in check.node.attr:
        kind = attr.WhichOneof("value")
        if kind in FLOAT_KINDS and _is_integer_attr(attr.name):
            check.fail("integer-types", f"{attr.name} is stored as {kind}; it must be an integer")
    if "is_cpu_op" not in check.attrs:
        return
    kind = check.kind("is_cpu_op")
    if kind in INTEGER_KINDS:
        check.warn("is-cpu-op", f"is_cpu_op is {kind}, not bool_val; ASTRA-sim reads it as a bool")
    elif kind != "bool_val":
        check.fail("is-cpu-op", f"is_cpu_op must be bool_val, got {kind or 'nothing'} (std::bad_cast)")
        return
    if check.value("is_cpu_op") and check.node.type in COMMUNICATION:
        check.fail("is-cpu-op", "is_cpu_op is true on a communication node, which aborts ASTRA-sim")


def _is_integer_attr(name: str) -> bool:
    """Sizes and counts by name too, so a new size attribute cannot slip in as a double."""
    return name in INTEGER_ATTRS or name.endswith("_size") or name.startswith("num_")


def _check_collective(check: NodeCheck) -> None:
    node = check.node
    comm_type = check.integer("comm_type", "comm-type")
    if comm_type is not None and comm_type not in SIMULATED_COLLECTIVES:
        name = enum_name(pb.CollectiveCommType, comm_type)
        check.fail("comm-type", f"comm_type {name} is not simulated")
        comm_type = None
    if comm_type == pb.BROADCAST and node.duration_micros == 0:
        check.fail("broadcast-duration", "BROADCAST is replayed from duration_micros, which is 0")
    comm_size = check.positive("comm_size", "comm-size")
    group = _group_of(check)
    dims_kind = check.kind("involved_dim")
    if dims_kind not in (None, "bool_list"):
        check.fail("involved-dim", f"involved_dim must be bool_list, got {dims_kind}")
    if comm_type is not None and comm_size is not None and group is not None:
        check.comm = Collective(node.id, group, comm_type, comm_size)


def _group_of(check: NodeCheck) -> int | None:
    """The node's communicator group key, or None after reporting why it has none."""
    kind = check.kind("pg_name")
    if kind is None:
        return ALL_RANKS
    if kind != "string_val":
        check.fail("pg-name", f"pg_name must be string_val, got {kind} (std::bad_cast)")
        return None
    group, problem = named_group(check.value("pg_name"), check.ctx)
    if problem is not None:
        check.fail(*problem)
    elif group is None:
        check.unresolved = True
    return group


def parse_group_id(text: str) -> int | None:
    """The group key a `pg_name` spells: `ALL_RANKS` for "" and "0", an id for a decimal
    string, None for anything else."""
    if text == "":
        return ALL_RANKS
    if text.isascii() and text.isdigit() and len(text) <= GROUP_ID_DIGITS:
        return int(text)
    return None


def named_group(text: str, ctx: RankContext) -> tuple[int | None, tuple[str, str] | None]:
    """(group key, None) for a `pg_name` that names a group of this rank; else (None, the broken
    rule and why), or (None, None) when the groups are unknown (reported once, elsewhere)."""
    group = parse_group_id(text)
    if group is None:
        return None, ("pg-name", f"pg_name {text[:40]!r} is not a decimal group id")
    if group == ALL_RANKS:
        return ALL_RANKS, None
    if ctx.groups is None:
        return None, None
    if group not in ctx.groups:
        return None, ("pg-name", f"group {group} is not defined in {ctx.groups_file}")
    if ctx.rank not in ctx.groups[group]:
        return None, ("group-member", f"rank {ctx.rank} is not a member of group {group}")
    return group, None


def _check_point_to_point(check: NodeCheck) -> None:
    ctx, node = check.ctx, check.node
    is_send = node.type == pb.COMM_SEND_NODE
    own = "comm_src" if is_send else "comm_dst"
    peers = {}
    for name in ("comm_src", "comm_dst"):
        if name == own and name not in check.attrs:
            side = "sends from" if is_send else "receives at"
            check.warn("comm-peer", f"{own} is missing; ASTRA-sim {side} the file's own rank")
            peers[name] = ctx.rank
        else:
            peers[name] = check.integer(name, "comm-peer")
    src, dst = peers["comm_src"], peers["comm_dst"]
    tag = check.integer("comm_tag", "comm-tag")
    size = check.positive("comm_size", "comm-size")
    for problem in peer_problems(is_send, src, dst, ctx):
        check.fail("comm-peer", problem)
    if tag is not None and not _INT32_MIN <= tag <= _INT32_MAX:
        check.fail("comm-tag", f"comm_tag {tag} does not fit int32")
    if None not in (src, dst, tag, size):
        check.comm = PointToPoint(node.id, is_send, src, dst, tag, size)


def peer_problems(is_send: bool, src: int | None, dst: int | None, ctx: RankContext) -> list[str]:
    """What breaks the `comm-peer` rule in a SEND's or RECV's peers (None: not an integer,
    reported already): each in range, the sender's or receiver's own one this file's rank."""
    problems = [
        f"{name} {peer} is outside ranks 0..{ctx.num_ranks - 1}"
        for name, peer in (("comm_src", src), ("comm_dst", dst))
        if peer is not None and not 0 <= peer < ctx.num_ranks
    ]
    own_name, own = ("comm_src", src) if is_send else ("comm_dst", dst)
    if own is not None and own != ctx.rank:
        problems.append(f"{own_name} is {own} but this file is rank {ctx.rank}")
    if src is not None and src == dst:
        problems.append(f"comm_src and comm_dst are both {src}")
    return problems

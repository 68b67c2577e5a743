"""Rank files that repeat a checked file but for their per-rank values, recognised by their bytes.

All ranks run one program, so their files hold the same nodes and differ only in the group each
collective names (`pg_name`) and the peers of each SEND/RECV (`comm_src`, `comm_dst`): Flint renders
every file of a rank class from one template, patching those values in, and any SPMD producer
writes files alike. Decoding and checking a file costs a hundred times more than reading it, so the
contract checker decodes one file per *shape* and recognises the other files of it by their bytes.

A shape is a file that was decoded and found clean (no rule broken, all its communication known),
seen as constant bytes around the spans that hold its per-rank values. Another file has the shape
when it is as long, has the same constant bytes, and holds in each span a value of the same encoded
length. Protobuf then decodes it exactly as the clean file but for those values, so every rule that
does not read them holds for it as it did for the clean file, and the rules that do (`pg-name`,
`group-member`, `comm-peer`) are applied to its values by the functions the full check uses. A value
they refuse, or any other difference, and the file is decoded and checked in full instead. A shape
is only made where every per-rank value is plainly written (one attribute of its name, holding only
a name and a value of the kind expected), so that its span is the whole of what protobuf reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from flint.schema import et_def_pb2 as pb
from flint.trace.framing import message_spans
from flint.trace.matching import record, sequence_digest
from flint.trace.node_rules import (
    ALL_RANKS,
    Collective,
    PointToPoint,
    RankContext,
    named_group,
    peer_problems,
)

_NODE_ATTR = pb.Node.DESCRIPTOR.fields_by_name["attr"].number
_ATTRIBUTE = pb.AttributeProto.DESCRIPTOR.fields_by_name
_NAME = _ATTRIBUTE["name"].number
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
"""Wire types; 3 and 4 (groups) appear in no Chakra message."""
_TEXT = {_ATTRIBUTE["string_val"].number: _LEN}
_INTEGER = {
    _ATTRIBUTE[kind].number: _VARINT for kind in ("int32_val", "int64_val", "uint32_val", "uint64_val")
}
_GROUP_NAMES = {"pg_name": _TEXT}
_PEER_NAMES = {"comm_src": _INTEGER, "comm_dst": _INTEGER}
"""Per-rank attributes by name, with the value fields (and their wire types) read in place: for
peers, the plain varint kinds, which all read a value below 2**31 alike."""
_PEER_LIMIT = 2**31


@dataclass(frozen=True)
class Shape:
    """A clean file's constant bytes, and its communication with the spans of per-rank values."""

    size: int
    constants: tuple[tuple[int, bytes], ...]
    """(offset, bytes) of everything between the spans."""
    collectives: tuple[tuple[bytes, slice | None, int], ...]
    """Each collective in node-id order: its `matching.record`, the span of its `pg_name` and its
    group in the clean file (the span None: all ranks, the same in every file)."""
    point_to_point: tuple[tuple[PointToPoint, slice, slice], ...]
    """Each SEND/RECV with the spans of its `comm_src` and `comm_dst`."""

    def substitute(
        self, data: bytes, ctx: RankContext
    ) -> tuple[dict[int, bytes], list[PointToPoint]] | None:
        """The communication of `data` as rank `ctx.rank`'s file, if it has this shape and values
        that break no rule (the digest of its collectives on each group, its SEND/RECVs); else
        None."""
        if len(data) != self.size:
            return None
        for offset, constant in self.constants:
            if not data.startswith(constant, offset):
                return None
        by_group = self._collectives_by_group(data, ctx)
        if by_group is None:
            return None
        point_to_point = []
        for op, src_span, dst_span in self.point_to_point:
            src, dst = _peer(data[src_span]), _peer(data[dst_span])
            if src is None or dst is None or peer_problems(op.is_send, src, dst, ctx):
                return None
            point_to_point.append(PointToPoint(op.node_id, op.is_send, src, dst, op.tag, op.size))
        digests = {group: sequence_digest(records) for group, records in by_group.items()}
        return digests, point_to_point

    def _collectives_by_group(self, data: bytes, ctx: RankContext) -> dict[int, list[bytes]] | None:
        """The records of `data`'s collectives on each of its groups; None if a `pg_name` does
        not name a group of this rank. Each distinct value is judged once."""
        named: dict[bytes, int | None] = {}
        by_group: dict[int, list[bytes]] = {}
        for item, span, group in self.collectives:
            if span is not None:
                raw = data[span]
                if raw not in named:
                    named[raw] = _group(raw, ctx)
                group = named[raw]
                if group is None:
                    return None
            by_group.setdefault(group, []).append(item)
        return by_group


def shape_of(
    data: bytes,
    nodes: list[pb.Node],
    collectives: list[Collective],
    point_to_point: list[PointToPoint],
) -> Shape | None:
    """The shape of a clean file: its bytes, decoded as `nodes` (after the metadata) with this
    communication; None where a per-rank value is not plainly written."""
    frames = list(message_spans(data))[1:]
    wanted = {op.node_id: _GROUP_NAMES for op in collectives}
    wanted.update((op.node_id, _PEER_NAMES) for op in point_to_point)
    spans: dict[int, dict[str, slice]] = {}
    for node, (start, end) in zip(nodes, frames):
        if node.id in wanted:
            found = _value_spans(data, start, end, wanted[node.id])
            if found is None:
                return None
            spans[node.id] = found
    ordered = sorted(collectives, key=lambda op: op.node_id)  # as each group's sequence is
    groups = [(record(op), spans[op.node_id].get("pg_name"), op.group) for op in ordered]
    if any(span is None and group != ALL_RANKS for _, span, group in groups):
        return None
    if any(len(spans[op.node_id]) != len(_PEER_NAMES) for op in point_to_point):
        return None
    return Shape(
        size=len(data),
        constants=_constants(data, [span for found in spans.values() for span in found.values()]),
        collectives=tuple(groups),
        point_to_point=tuple(
            (op, spans[op.node_id]["comm_src"], spans[op.node_id]["comm_dst"])
            for op in point_to_point
        ),
    )


class Shapes:
    """The shapes seen so far, the most recently matched last, within a budget of bytes: a trace
    whose files all differ must not fill the memory with shapes that never match."""

    def __init__(self, budget: int):
        self.budget = budget
        self._shapes: list[Shape] = []
        self._held = 0

    def match(
        self, data: bytes, ctx: RankContext
    ) -> tuple[list[Collective], list[PointToPoint]] | None:
        """The communication of `data` if it has a known shape with valid values, else None."""
        for index in range(len(self._shapes) - 1, -1, -1):
            shape = self._shapes[index]
            found = shape.substitute(data, ctx) if shape.size == len(data) else None
            if found is not None:
                self._shapes.append(self._shapes.pop(index))
                return found
        return None

    def add(self, shape: Shape) -> None:
        self._shapes.append(shape)
        self._held += shape.size
        while self._held > self.budget:
            self._held -= self._shapes.pop(0).size


def _constants(data: bytes, spans: list[slice]) -> tuple[tuple[int, bytes], ...]:
    """The bytes around `spans`, with their offsets (none empty)."""
    pieces, offset = [], 0
    for span in sorted(spans, key=lambda span: span.start):
        pieces.append((offset, data[offset : span.start]))
        offset = span.stop
    pieces.append((offset, data[offset:]))
    return tuple((at, piece) for at, piece in pieces if piece)


def _value_spans(
    data: bytes, pos: int, end: int, names: dict[str, dict[int, int]]
) -> dict[str, slice] | None:
    """Where the values of the attributes `names` of the Node message `data[pos:end]` lie; None
    if one is repeated or not plainly written, or an attribute's name is not (then which
    attribute the checker reads is not plain either)."""
    spans: dict[str, slice] = {}
    for number, wire, span in _fields(data, pos, end):
        if wire is None:
            return None
        if number != _NODE_ATTR or wire != _LEN:
            continue
        name, value = _attribute(data, span, names)
        if name is None:
            return None
        if name in names:
            if value is None or name in spans:
                return None
            spans[name] = value
    return spans


def _attribute(
    data: bytes, span: slice, names: dict[str, dict[int, int]]
) -> tuple[str | None, slice | None]:
    """(name, span of its value) of an AttributeProto, the name None unless it has exactly one; the
    value's span is None unless it has one value, of a field and wire type `names` expects."""
    fields = list(_fields(data, span.start, span.stop))
    named = [value for number, wire, value in fields if number == _NAME and wire == _LEN]
    if len(named) != 1:
        return None, None
    name = data[named[0]].decode("utf-8", "replace")
    values = [(number, wire, value) for number, wire, value in fields if number != _NAME]
    expected = names.get(name, {})
    if len(values) == 1 and expected.get(values[0][0]) == values[0][1]:
        return name, values[0][2]
    return name, None


def _fields(data: bytes, pos: int, end: int):
    """(field number, wire type, span of the value) of each field of a message that protobuf has
    already parsed; wire type None for a group, after which nothing more is read."""
    while pos < end:
        key, pos = _varint(data, pos)
        wire = key & 7
        start = pos
        if wire == _VARINT:
            _, pos = _varint(data, pos)
        elif wire == _LEN:
            length, start = _varint(data, pos)
            pos = start + length
        elif wire in (_I64, _I32):
            pos += 8 if wire == _I64 else 4
        else:
            yield key >> 3, None, None
            return
        yield key >> 3, wire, slice(start, pos)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it) of a varint that protobuf has already read."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _group(raw: bytes, ctx: RankContext) -> int | None:
    """The group a `pg_name` value names, if that is a group of this rank."""
    if not raw.isascii():
        return None
    group, problem = named_group(raw.decode("ascii"), ctx)
    return None if problem else group


def _peer(raw: bytes) -> int | None:
    """The value of a varint encoded in exactly `raw`, if below 2**31 (as every integer kind then
    reads it); else None."""
    value = 0
    last = len(raw) - 1
    for index, byte in enumerate(raw):
        if bool(byte & 0x80) == (index == last):
            return None
        value |= (byte & 0x7F) << (7 * index)
    return value if value < _PEER_LIMIT else None

"""Protobuf length-delimited framing, the container of Chakra ``.et`` files.

Each message is a varint32 byte count followed by the serialized message. The varint codec is
written here rather than borrowed from ``google.protobuf.internal``, which is not public API.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator

from flint.trace.errors import TraceFormatError

_GZIP_MAGIC = b"\x1f\x8b"
_MAX_LENGTH = 0xFFFFFFFF
_MAX_VARINT32_BYTES = 5


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _decode_varint32(buf: bytes, pos: int) -> tuple[int, int]:
    """Return (value, position after the varint); reject truncated or over-long prefixes."""
    value = 0
    for i in range(_MAX_VARINT32_BYTES):
        if pos + i >= len(buf):
            raise TraceFormatError(f"truncated length prefix at byte {pos}")
        byte = buf[pos + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if value > _MAX_LENGTH:
                break
            return value, pos + i + 1
    raise TraceFormatError(f"length prefix at byte {pos} exceeds 32 bits")


def length_prefix(size: int) -> bytes:
    """The varint32 that frames a message of `size` bytes (for writers that assemble it in parts)."""
    if size > _MAX_LENGTH:
        raise ValueError(f"message of {size} bytes does not fit a varint32 length prefix")
    return _encode_varint(size)


def encode_delimited(data: bytes) -> bytes:
    """Frame one serialized message: varint32 length prefix, then the bytes."""
    return length_prefix(len(data)) + data


def iter_delimited(buf: bytes) -> Iterator[bytes]:
    """Yield the serialized messages of a framed stream, failing loudly on a truncated tail."""
    for start, end in message_spans(buf):
        yield bytes(buf[start:end])


def message_spans(buf: bytes) -> Iterator[tuple[int, int]]:
    """Yield where each serialized message of a framed stream starts and ends."""
    pos = 0
    while pos < len(buf):
        length, start = _decode_varint32(buf, pos)
        end = start + length
        if end > len(buf):
            raise TraceFormatError(
                f"message at byte {pos} declares {length} bytes but only {len(buf) - start} remain"
            )
        yield start, end
        pos = end


def load_bytes(path: str | os.PathLike[str]) -> bytes:
    """Read a trace file, decompressing it when it is gzip (Chakra readers accept both)."""
    with open(path, "rb") as handle:
        data = handle.read()
    if data.startswith(_GZIP_MAGIC):
        try:
            return gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise TraceFormatError(f"{os.fspath(path)}: corrupt gzip data: {exc}") from exc
    return data

"""Reading, writing and validating Chakra execution traces (``.et``) for ASTRA-sim."""

from flint.trace.contract import RULES, Violation, check_traces
from flint.trace.errors import TraceFormatError
from flint.trace.framing import encode_delimited, iter_delimited, load_bytes
from flint.trace.reader import (
    RankTrace,
    attr_kind,
    attr_value,
    attribute_value,
    attributes,
    comm_groups_path,
    decode_trace,
    find_traces,
    parse_trace_name,
    read_comm_groups,
    read_trace,
)

__all__ = [
    "RULES",
    "RankTrace",
    "TraceFormatError",
    "Violation",
    "attr_kind",
    "attr_value",
    "attribute_value",
    "attributes",
    "check_traces",
    "comm_groups_path",
    "decode_trace",
    "encode_delimited",
    "find_traces",
    "iter_delimited",
    "load_bytes",
    "parse_trace_name",
    "read_comm_groups",
    "read_trace",
]

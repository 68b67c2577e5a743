"""The Chakra execution-trace format (``.et``) as ASTRA-sim reads it: framing, reading, the contract.

What `flint.emit` writes with and what the tools of `flint.analysis` read with: length-delimited
framing, a reader for rank files and the communicator-group file, the rules of the trace contract
checked across ranks (files that repeat a checked one but for their per-rank values are recognised
by their bytes: `shapes`), how long a node takes (`timing`; communication by a model of
`flint.step`), and the names and definitions that
every command's JSON output uses (`vocabulary`). It knows nothing of how a trace was made, so it
reads any producer's traces: what ASTRA-sim tolerates is read as ASTRA-sim reads it.

Imports: the foundation modules only (`flint.schema`, `flint.devices`).
"""

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

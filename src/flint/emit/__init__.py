"""Stage 7, emit: write the workload graph as Chakra traces, one file per rank, plus files for humans.

In: a `WorkloadGraph` (from `flint.graph`, or laid out over stages by `flint.pipelining`), the mesh's
rank count and a `Device`. Out: one `.et` per rank, the communicator-group file and the per-rank
totals for the manifest, written into a staging directory that replaces the output only when
everything succeeded (`writer`). Ranks that send and receive alike share one serialized template
(`classes`, `plan`, `template`, `chakra`), written by threads (`parallel`) and checked against the
trace contract (`verify`).

Imports: `flint.graph`, `flint.trace` (the format) and the foundation modules.
"""

from flint.emit.chakra import ChakraEmitter
from flint.emit.classes import RankClasses, rank_classes
from flint.emit.first_nodes import first_nodes_take_time
from flint.emit.groups import GroupTable
from flint.emit.parallel import TraceSize, trace_bytes, write_ranks
from flint.emit.summary import RankTotals, rank_totals
from flint.emit.verify import check_emitted
from flint.emit.writer import OutputDir, check_name, disk_errors, prepare_output

__all__ = [
    "ChakraEmitter",
    "GroupTable",
    "OutputDir",
    "RankClasses",
    "RankTotals",
    "TraceSize",
    "check_emitted",
    "check_name",
    "disk_errors",
    "first_nodes_take_time",
    "prepare_output",
    "rank_classes",
    "rank_totals",
    "trace_bytes",
    "write_ranks",
]

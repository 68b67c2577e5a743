"""Stage 7, emit: write the workload graph as Chakra traces, one file per rank, plus files for humans.

In: a `WorkloadGraph` (from `flint.graph`), or a pipelined step (from `flint.pipelining`: a piece and
each stage's units), and a `Device`. Out: one `.et` per rank, the communicator-group file and the
per-rank totals for the manifest, written into a staging directory that replaces the output only
when everything succeeded (`writer`). A trace plan (`plan`; `pipelined` for a pipelined step) says
which ranks send and receive alike (`classes`) and what each class's file holds, node by node; a
class shares one serialized template (`template`, `chakra`), written by threads (`parallel`) and
checked against the trace contract (`verify`).

Imports: `flint.graph`, `flint.pipelining`, `flint.trace` (the format) and the foundation modules.
"""

from flint.emit.chakra import ChakraEmitter
from flint.emit.classes import RankClasses, rank_classes
from flint.emit.groups import GroupTable
from flint.emit.parallel import TraceSize, trace_bytes, write_ranks
from flint.emit.pipelined import PipelinedPlan
from flint.emit.plan import GraphPlan, Planned, TracePlan
from flint.emit.summary import RankTotals, merged_totals
from flint.emit.verify import check_emitted
from flint.emit.writer import OutputDir, check_dump_dir, check_name, disk_errors, prepare_output

__all__ = [
    "ChakraEmitter",
    "GraphPlan",
    "GroupTable",
    "OutputDir",
    "PipelinedPlan",
    "Planned",
    "RankClasses",
    "RankTotals",
    "TracePlan",
    "TraceSize",
    "check_dump_dir",
    "check_emitted",
    "check_name",
    "disk_errors",
    "merged_totals",
    "prepare_output",
    "rank_classes",
    "trace_bytes",
    "write_ranks",
]

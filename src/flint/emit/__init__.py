"""Stage 6: write the workload graph as Chakra traces, one file per rank, plus files for humans."""

from flint.emit.chakra import ChakraEmitter, GroupTable
from flint.emit.summary import RankTotals, rank_totals
from flint.emit.writer import OutputDir, prepare_output

__all__ = ["ChakraEmitter", "GroupTable", "OutputDir", "RankTotals", "prepare_output", "rank_totals"]

"""Stage 4, ir: the captured module as typed ops, with what each op costs.

In: a `PartitionedModule`. Out: a `Program` of plain dataclasses (`parse`, through jaxlib's MLIR
bindings; calls inlined, control flow as nested regions), and the rules read from it: the cost of
an op (`costs`), the static trip count of a loop (`loops`) and the integer values known while
loops unroll (`folding`).

Imports: `flint.compile` and the foundation modules.
"""

from flint.ir.parse import Op, Program, Region, parse_module

__all__ = ["Op", "Program", "Region", "parse_module"]

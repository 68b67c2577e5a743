"""Stage 5, graph: the workload graph of one step, straight-line code in a networkx DiGraph.

In: a `Program`. Out: a `WorkloadGraph` of compute, memory and collective nodes with exact data
dependencies: loops unrolled, branches chosen, calls inlined (`build`); each collective's groups and
bytes from the compiler's attributes (`collectives`); all-reduces that are reduce-scatters fused
as the GPU and TPU compilers fuse them (`reduce_scatter`); readable node names (`names`).

Imports: `flint.ir` and the foundation modules (`flint.mesh` names a collective's axes).
"""

from flint.graph.build import WorkloadGraph, build_graph

__all__ = ["WorkloadGraph", "build_graph"]

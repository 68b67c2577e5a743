"""Stage 3, compile: XLA partitions the step for a virtual mesh, and the module it wrote is captured.

In: a laid-out `Workload` and the `jax.sharding.Mesh` of virtual devices (`backend`: the CPU client
or a TPU topology, from a `MeshSpec`). Out: a `PartitionedModule`, the StableHLO of one rank right
after the SPMD partitioner (or after the whole optimisation pipeline), with the mesh its replica
groups name (`capture`, `replica_groups`).

Imports: the frontend and the foundation modules.
"""

from flint.compile.backend import CPU, Backend, make_virtual_mesh, parse_backend
from flint.compile.capture import STAGES, PartitionedModule, partition

__all__ = ["CPU", "STAGES", "Backend", "PartitionedModule", "make_virtual_mesh", "parse_backend", "partition"]

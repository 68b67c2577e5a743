"""Stage 1, frontend: a model file becomes a `Workload` (the step and its abstract inputs).

In: the path of a model file, the `jax.sharding.Mesh` its `workload(mesh, **model_args)` is
called with, and the model arguments.
Out: a `Workload` whose inputs are `jax.ShapeDtypeStruct`s (or `flint.sharding.logical` arrays),
named by path (`params/layers/w_in`). A JAX file (`model_file`) gives its step directly; a PyTorch
file (`torch_model`) is traced by torch and lowered to StableHLO (`torch_step`, `torch_bridge`),
with its own tensor-parallel plan as the model's layout (`torch_workload`).

Imports: the foundation modules only (`flint.errors`, `flint.mesh`, `flint.sharding`).
"""

from flint.frontend.model_file import load_workload, parse_model_arg
from flint.frontend.workload import Workload, input_path

__all__ = ["Workload", "input_path", "load_workload", "parse_model_arg"]

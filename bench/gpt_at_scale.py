"""`examples/gpt.py` with two sequences per data-parallel rank, so that every DP x TP mesh divides
its batch (the example's fixed batch of 16 stops dividing beyond 16-way data parallelism)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "gpt_example", Path(__file__).resolve().parent.parent / "examples" / "gpt.py"
)
gpt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpt)

SEQUENCES_PER_RANK = 2


def workload(mesh):
    _, tensor = gpt.mesh_axes(mesh)
    return gpt.workload(mesh, batch=SEQUENCES_PER_RANK * mesh.size // (mesh.shape[tensor] if tensor else 1))

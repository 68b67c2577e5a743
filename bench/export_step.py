"""Serialize the steps of a suite that name an `exported` file, lowered for CUDA, for
`bench/measure_gpu.py` to run under XLA on a GPU machine that cannot lower them itself (a PyTorch
model file needs torch-mlir, which the GPU machine lacks).

    python bench/export_step.py [--suite bench/torch_steps.toml] [--only NAME,...]

Each such step is loaded as `flint extract` loads it (`flint.frontend.model_file`, one device),
exported with `jax.export` for the `cuda` platform and written to its `exported` path; the
arguments its outputs replace must be the step's `donated` list. `jax.export`'s serialization needs
`flatbuffers` (`pip install flatbuffers`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from measure_gpu import ROOT, suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", type=Path, default=ROOT / "bench" / "torch_steps.toml")
    parser.add_argument("--only", default="", help="comma-separated step names")
    options = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    import jax
    import numpy as np

    from flint.compile.donation import donated_arguments
    from flint.frontend.model_file import load_workload

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    for step in suite(options.suite, options.only):
        if "exported" not in step:
            continue
        workload = load_workload(ROOT / step["model"], mesh, step.get("args", {}))
        with jax.set_mesh(mesh):
            donated = donated_arguments(workload)
        if list(donated) != step["donated"]:
            raise SystemExit(f"{step['name']}: the step donates {list(donated)}, the suite says {step['donated']}")
        plain = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), workload.args)
        exported = jax.export.export(jax.jit(workload.step, donate_argnums=donated), platforms=["cuda"])(*plain)
        path = ROOT / step["exported"]
        path.write_bytes(exported.serialize())
        print(f"{step['name']}: {path.relative_to(ROOT)}, {path.stat().st_size:,} bytes", flush=True)


if __name__ == "__main__":
    main()

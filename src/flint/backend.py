"""Stage 2b: virtual devices for the mesh.

The CPU client of jaxlib can pretend to have many devices; XLA partitions for them exactly as it would
for real accelerators, and nothing is ever executed. The device count must be fixed before JAX creates
its backends, so this runs before the user's model file is imported.
"""

from __future__ import annotations

import numpy as np

from flint.errors import FlintError
from flint.mesh import MeshSpec

CPU_DEVICE_LIMIT = 2048
"""The most virtual CPU devices jaxlib creates here; 4,096 fails inside the client."""


def make_virtual_mesh(spec: MeshSpec):
    """A `jax.sharding.Mesh` of `spec.size` virtual CPU devices with `Auto` axes.

    Auto axes let the compiler propagate shardings from the inputs, which is what a model written for
    `jit` expects. If JAX already made its CPU devices in this process (a library user calling Flint
    twice), the first `spec.size` of them are used.
    """
    if spec.size > CPU_DEVICE_LIMIT:
        raise FlintError(
            f"mesh {spec} needs {spec.size} devices but the CPU backend makes at most "
            f"{CPU_DEVICE_LIMIT}: use a mesh of at most {CPU_DEVICE_LIMIT} ranks"
        )
    import jax
    from jax.sharding import AxisType, Mesh

    try:
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", spec.size)
    except RuntimeError:
        pass  # backends already exist; reuse their devices below
    devices = jax.devices("cpu")
    if len(devices) < spec.size:
        raise FlintError(
            f"mesh {spec} needs {spec.size} devices but this process already created "
            f"{len(devices)} CPU devices: run Flint in a fresh process"
        )
    grid = np.array(devices[: spec.size], dtype=object).reshape(spec.shape)
    return Mesh(grid, spec.axis_names, axis_types=(AxisType.Auto,) * len(spec.shape))

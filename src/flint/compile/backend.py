"""Virtual devices for the mesh: the CPU client, a GPU cluster or a TPU topology.

Nothing is ever executed: XLA only has to compile the step for the devices. The CPU client of
jaxlib pretends to have many devices and is always there, but compiles for at most 2,048 of them. A
GPU cluster (`flint.compile.gpu`, the default: `gpu:h100`) is any number of NVIDIA GPUs of one kind,
compiled for by XLA's GPU compiler with no GPU attached. A TPU topology (`libtpu`, the `flint[tpu]`
extra) describes a pod, or several pod slices, likewise: 16 slices of v5p 16x16x32 are 131,072
devices.

Rank r is the r-th device in row-major mesh order, which for a TPU topology is the topology's own
device order (slice by slice). The partitioned module numbers ranks the same way on every backend.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import numpy as np

from flint.compile.gpu import GPUS, device_memory, gpu_devices, target_config
from flint.compile.native_stderr import native_stderr_held
from flint.devices import BUILTIN
from flint.errors import FlintError
from flint.mesh import MeshSpec

DEFAULT_BACKEND = "gpu:h100"
"""What `--backend` is when not given: the GPU compiler's kernels are what a simulator of a GPU
cluster wants, and it compiles for any number of devices. The CPU backend stays for `flint
validate`, which executes the step."""
CPU_DEVICE_LIMIT = 2048
"""The most devices the CPU client compiles for; beyond, XLA refuses ("multiprocess")."""


@dataclass(frozen=True)
class Backend:
    """Where the virtual devices come from: `cpu`, a `gpu` (a built-in name such as `h100`, or a
    target-config file), or a TPU `topology` such as `v5p:16x16x32` repeated over `slices` pod
    slices (multi-slice, joined by the data-center network)."""

    topology: str | None = None
    slices: int = 1
    gpu: str | None = None

    @property
    def device_memory(self) -> int | None:
        """Bytes of memory of one device, where the backend describes real ones (GPUs)."""
        return None if self.gpu is None else device_memory(self.gpu)

    @property
    def roofline_device(self) -> str:
        """The `--device` roofline to time its kernels by when none is given: the backend's own
        chip where Flint has its numbers (gpu:b200 -> b200, tpu:v5p:... -> tpu-v5p), else h100."""
        own = self.gpu if self.gpu is not None else f"tpu-{self.topology.partition(':')[0]}" if self.topology else ""
        return own if own in BUILTIN else "h100"

    @property
    def default_durations(self) -> str:
        """The calibrated kernel model on a GPU compiler's kernels; elsewhere (one node per op
        of the partitioned module, or a TPU) the roofline, which has no per-kernel costs."""
        return "calibrated" if self.gpu is not None else "roofline"

    @property
    def default_stage(self) -> str:
        """The GPU compiler's optimised module is its kernels; the others' are their hosts'."""
        return "optimized" if self.gpu is not None else "partitioned"

    def __str__(self) -> str:
        if self.gpu is not None:
            return f"gpu:{self.gpu}"
        return "cpu" if self.topology is None else f"tpu:{self.topology}"


CPU = Backend()


def parse_backend(text: str, slices: int = 1) -> Backend:
    """`cpu`, `gpu[:<name or file>]` or `tpu:<topology>` (`--backend`), with `--slices` for a TPU
    topology."""
    if slices < 1:
        raise FlintError(f"invalid --slices {slices}: give a positive number of pod slices")
    kind, colon, topology = text.strip().partition(":")
    if kind == "tpu" and topology:
        return Backend(topology, slices)
    if slices != 1:
        raise FlintError("--slices needs a TPU backend: use --backend tpu:<topology>")
    if kind == "cpu" and not topology:
        return CPU
    if kind == "gpu" and (topology or not colon):  # `gpu:` names no GPU: refused below
        target_config(topology or "h100")  # an unknown name or unreadable file fails here, early
        return Backend(gpu=topology or "h100")
    raise FlintError(
        f"invalid --backend {text!r}: use cpu, gpu:<{'|'.join(GPUS)}|FILE> or tpu:<topology> "
        "such as tpu:v5p:16x16x32"
    )


def make_virtual_mesh(spec: MeshSpec, backend: Backend = CPU):
    """A `jax.sharding.Mesh` of `spec.size` virtual devices with `Auto` axes.

    Auto axes let the compiler propagate shardings from the inputs, which is what a model written for
    `jit` expects.
    """
    with native_stderr_held(replay_on_error=True):  # the CUDA plugin's no-driver line
        from jax.sharding import AxisType, Mesh

        if backend.gpu is not None:
            _before_backends_start(jax_platforms="cpu")  # JAX itself runs nothing, on no GPU
            devices = gpu_devices(spec.size, backend.gpu)
        elif backend.topology is not None:
            devices = _tpu_devices(spec, backend)
        else:
            devices = _cpu_devices(spec)
        grid = np.array(devices, dtype=object).reshape(spec.shape)
        return Mesh(grid, spec.axis_names, axis_types=(AxisType.Auto,) * len(spec.shape))


def _before_backends_start(**settings) -> None:
    """JAX options that take effect only before it starts its backends. Where they have started
    (a library user calling Flint twice), the devices they made are used as they are."""
    import jax

    for name, value in settings.items():
        try:
            jax.config.update(name, value)
        except RuntimeError:
            pass


def _cpu_devices(spec: MeshSpec) -> list:
    """The first `spec.size` CPU devices; the count must be set before JAX creates its backends, so
    this runs before the user's model file is imported. If JAX already made its CPU devices in this
    process (a library user calling Flint twice), those are reused."""
    if spec.size > CPU_DEVICE_LIMIT:
        raise FlintError(
            f"mesh {spec} needs {spec.size} devices but the CPU backend compiles for at most "
            f"{CPU_DEVICE_LIMIT}: use --backend tpu:<topology> (pip install 'flint-traces[tpu]')"
        )
    import jax

    _before_backends_start(jax_platforms="cpu", jax_num_cpu_devices=spec.size)
    devices = jax.devices("cpu")
    if len(devices) < spec.size:
        raise FlintError(
            f"mesh {spec} needs {spec.size} devices but this process already created "
            f"{len(devices)} CPU devices: run Flint in a fresh process"
        )
    return devices[: spec.size]


def _tpu_devices(spec: MeshSpec, backend: Backend) -> list:
    """Compile-only devices of the TPU topology; its device count must be the mesh's."""
    if importlib.util.find_spec("libtpu") is None:
        raise FlintError(
            f"--backend {backend} needs libtpu: pip install 'flint-traces[tpu]' (or use the cpu "
            f"backend for meshes of up to {CPU_DEVICE_LIMIT} ranks)"
        )
    # No TPU is attached: name a one-host slice of the same generation and this host, rather than
    # let libtpu query a metadata server and warn that there is none. Neither changes the topology.
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", backend.topology.partition(":")[0] + "-8")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    from jax.experimental import topologies

    _before_backends_start(jax_platforms="cpu")  # JAX itself runs nothing, on no TPU
    try:
        topology = topologies.get_topology_desc(
            backend.topology, "tpu", num_slices=backend.slices
        )
    except Exception as exc:  # libtpu reports bad names as JaxRuntimeError
        raise FlintError(
            f"invalid --backend {backend}: {str(exc).splitlines()[0]} "
            "(write e.g. tpu:v5p:16x16x32, tpu:v5e:16x16 or tpu:v4:4x4x4)"
        ) from None
    devices = topology.devices
    if len(devices) != spec.size:
        per_slice = len(devices) // backend.slices
        raise FlintError(
            f"mesh {spec} has {spec.size} ranks but {backend} x {backend.slices} slice(s) has "
            f"{len(devices)} devices ({per_slice} per slice): use a mesh of {len(devices)} ranks "
            "or another topology"
        )
    return devices

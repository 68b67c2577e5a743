"""Virtual NVIDIA GPU clusters for XLA's GPU compiler, with no GPU attached.

The CUDA plugin of jaxlib (`jax-cuda12-plugin`, with `nvidia-cuda-nvcc-cu12` for libdevice only,
both dependencies of Flint) compiles ahead of time for a topology of `partitions x hosts x devices per
host` GPUs described by a `GpuTargetConfigProto`, the same description XLA would read off a real
device. No CUDA driver is needed and nothing runs; the compiler fuses kernels, picks library calls
and schedules asynchronous collectives exactly as for the real cluster.

Built-in targets are written here from the vendors' data sheets (SXM parts); `--backend
gpu:FILE.txtpb` takes any other `GpuTargetConfigProto` in text form.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from flint.errors import FlintError

GPUS_PER_HOST = 8
"""Devices per host in the topology (an HGX board); a mesh of fewer ranks is one host."""

GPU_RANK_LIMIT = 1 << 20
"""The most ranks a GPU cluster may have. XLA's topology holds every virtual GPU in memory (5.9 GB
for 2^20 of them on a 2-core machine, in 7 s), so a mesh far beyond it would fill the memory before
any check of the model could run."""


@dataclass(frozen=True)
class GpuTarget:
    """The numbers of a `GpuDeviceInfoProto` that differ between the built-in GPUs."""

    description: str
    compute_capability: tuple[int, int]
    core_count: int
    fpus_per_core: int
    clock_rate_ghz: float
    memory_bandwidth: int
    """Bytes per second."""
    l2_cache_size: int
    device_memory_size: int
    shared_memory_per_core: int
    shared_memory_per_block_optin: int

    def config(self) -> str:
        """The target config as text proto."""
        major, minor = self.compute_capability
        return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {self.shared_memory_per_core}
  threads_per_core_limit: 2048
  core_count: {self.core_count}
  fpus_per_core: {self.fpus_per_core}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {self.memory_bandwidth}
  l2_cache_size: {self.l2_cache_size}
  clock_rate_ghz: {self.clock_rate_ghz}
  device_memory_size: {self.device_memory_size}
  shared_memory_per_block_optin: {self.shared_memory_per_block_optin}
  cuda_compute_capability {{ major: {major} minor: {minor} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 }}
device_description_str: "{self.description}"
"""


GIB = 1 << 30
GPUS = {
    "h100": GpuTarget("NVIDIA H100 80GB HBM3", (9, 0), 132, 128, 1.98, 3_350_000_000_000,
                      50 << 20, 80 * GIB, 233472, 232448),
    "h200": GpuTarget("NVIDIA H200", (9, 0), 132, 128, 1.98, 4_800_000_000_000,
                      50 << 20, 141 * 10**9, 233472, 232448),
    "a100": GpuTarget("NVIDIA A100-SXM4-80GB", (8, 0), 108, 64, 1.41, 2_039_000_000_000,
                      40 << 20, 80 * GIB, 167936, 166912),
    "b200": GpuTarget("NVIDIA B200", (10, 0), 148, 128, 1.965, 8_000_000_000_000,
                      126 << 20, 180 * GIB, 233472, 232448),
}
"""Built-in targets: SM count, clock, HBM bandwidth and size, L2 and shared memory per SM."""


def target_config(name: str) -> str:
    """The text `GpuTargetConfigProto` of a built-in GPU or of a file."""
    if name in GPUS:
        return GPUS[name].config()
    path = Path(name)
    if not path.is_file():
        raise FlintError(
            f"--backend gpu:{name}: no such GPU or target-config file: use gpu:{', gpu:'.join(GPUS)} "
            "or gpu:FILE with a GpuTargetConfigProto in text form"
        )
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise FlintError(f"--backend gpu:{name}: cannot read the target config ({exc})") from None


def device_memory(name: str) -> int | None:
    """Bytes of device memory of a built-in GPU, or as a target-config file states it."""
    if name in GPUS:
        return GPUS[name].device_memory_size
    for line in target_config(name).splitlines():
        key, _, value = line.strip().partition(":")
        if key == "device_memory_size" and value.strip().isdigit():
            return int(value)
    return None


CUDA_PLUGINS = ("xla_cuda12", "xla_cuda13")
"""jaxlib's CUDA plugins (`jax-cuda12-plugin`, installed with Flint, or `jax-cuda13-plugin`): either
compiles for a GPU topology without a GPU."""


def topology(ranks: int) -> str:
    """`partitions x hosts x devices per host` for `ranks` GPUs: whole HGX hosts where they divide."""
    if ranks > GPUS_PER_HOST and ranks % GPUS_PER_HOST == 0:
        return f"1x{ranks // GPUS_PER_HOST}x{GPUS_PER_HOST}"
    return f"1x1x{ranks}"


def gpu_devices(ranks: int, name: str) -> list:
    """Compile-only devices of a cluster of `ranks` GPUs of one kind."""
    if ranks > GPU_RANK_LIMIT:
        raise FlintError(
            f"a mesh of {ranks:,} ranks is more than the GPU backend compiles for ({GPU_RANK_LIMIT:,}: XLA "
            "keeps every virtual GPU in memory): use a smaller mesh"
        )
    if not any(importlib.util.find_spec(f"jax_plugins.{plugin}") for plugin in CUDA_PLUGINS):
        raise FlintError(
            f"--backend gpu:{name} needs XLA's GPU compiler, which is missing from this environment: "
            "reinstall flint-traces (pip install --force-reinstall flint-traces), or use --backend cpu"
        )
    config = target_config(name)
    from jax.experimental import topologies

    try:
        described = topologies.get_topology_desc(
            platform="cuda", topology=topology(ranks), target_config=config
        )
    except Exception as exc:  # the plugin reports a bad config as JaxRuntimeError
        raise FlintError(
            f"--backend gpu:{name}: XLA rejected the GPU target: {str(exc).splitlines()[0]}"
        ) from None
    return list(described.devices)

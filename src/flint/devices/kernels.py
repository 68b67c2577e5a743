"""How long one kernel takes on a device: the roofline, or the calibrated model.

Every command that times compute calls `kernel_micros`: the emitter when it writes
`duration_micros`, and the readers (`inspect`, `timeline`, `graph`, `validate`, `simulate`'s
estimate) when asked to time a trace again on another device or model.

The calibrated model, per kernel, in microseconds:

    overhead + max(compute, bytes / (bandwidth x memory_efficiency))

- a GEMM's compute is `flops / (peak(bits) x gemm_efficiency x fill x k / (k + k_overhead))`:
  `peak(bits)` the matrix peak for 16-bit operands, twice it for 8-bit, half for 32-bit (TF32),
  and for 8-bit operands `gemm_efficiency_8bit` where the device has one;
  `fill` the share of the compute units' tile slots that real output fills, with the product cut
  into `gemm_tile` tiles run in waves of one tile per unit (a 129-row product wastes most of a
  second row of tiles; 133 tiles on 132 units take two waves); a side narrower than the tile
  gets a tile of the power of two at or above it, down to 16;
- a GEMM streams its operands at `gemm_efficiency` of the memory bandwidth too (a GEMM of few
  rows, as in decoding, is bound by reading its weights);
- any other kernel's compute is its FLOPs at the vector peak (element-wise work and reductions do
  not run on the matrix units), its bytes at `memory_efficiency` of the bandwidth, or at
  `transpose_efficiency` for an untiled transpose of the minor dimension (`kernel` TRANSPOSE),
  or at `triton_efficiency` for a Triton block-level fusion (`kernel` TRITON);
- `overhead` is the device's fixed cost per kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from flint.devices.spec import Device

DURATIONS = ("calibrated", "roofline", "xla")
"""What a node's time is when a trace is written: the calibrated kernel model, the device's
roofline, or (GPU compiler) XLA's own estimate for the kernel."""


def matrix_tflops(device: Device, bits: int) -> float:
    """The matrix peak for operands of `bits` bits."""
    return device.peak_tflops * (2.0 if bits <= 8 else 0.5 if bits >= 32 else 1.0)


SMALLEST_TILE = 16
"""The narrowest tile side GEMM kernels use (Triton's smallest block; Hopper's wgmma takes N from 8)."""


def tile_side(tile: int, side: int) -> int:
    """A product narrower than the device's tile runs on a narrower one: the power of two at or
    above its side, down to `SMALLEST_TILE` (a decode step's 4-row product is not charged a
    128-row tile)."""
    return min(tile, max(SMALLEST_TILE, 1 << max(0, side - 1).bit_length()))


def gemm_fill(device: Device, batch: int, m: int, n: int) -> float:
    """The share of the tile slots of all waves that the product's output fills."""
    tile_m, tile_n = (tile_side(t, side) for t, side in zip(device.calibration.gemm_tile, (m, n)))
    tiles = math.ceil(m / tile_m) * math.ceil(n / tile_n) * batch
    waves = math.ceil(tiles / device.compute_units)
    return (m * n * batch) / (waves * device.compute_units * tile_m * tile_n)


def gemm_micros(device: Device, flops: int, gemm: Sequence[int]) -> float:
    """A GEMM's compute time, `gemm` being (batch, m, n, k, operand bits)."""
    batch, m, n, k, bits = gemm
    if flops <= 0 or min(batch, m, n, k) <= 0:
        return 0.0
    c = device.calibration
    efficiency = c.gemm_efficiency_8bit if bits <= 8 and c.gemm_efficiency_8bit is not None else c.gemm_efficiency
    rate = matrix_tflops(device, bits) * efficiency * gemm_fill(device, batch, m, n) * k / (k + c.gemm_k_overhead)
    return flops / (rate * 1e12) * 1e6


TRANSPOSE = "transpose"
"""The kernel kind (a node's `kernel`) of a fusion that writes an untiled minor-dimension transpose."""
TRITON = "triton"
"""The kernel kind of a fusion the GPU compiler emits as a Triton block-level kernel."""


def bandwidth_efficiency(device: Device, kernel: str | None) -> float:
    """The share of the memory bandwidth a kernel that is not a GEMM reaches."""
    c = device.calibration
    own = {TRANSPOSE: c.transpose_efficiency, TRITON: c.triton_efficiency}.get(kernel or "")
    return c.memory_efficiency if own is None else own


def calibrated_micros(device: Device, flops: int, nbytes: int, gemm: Sequence[int] | None = None,
                      kernel: str | None = None) -> float:
    """The calibrated model's time for one kernel (see the module's docstring); `kernel` is the
    node's kernel kind."""
    c = device.calibration
    if gemm is not None:
        compute = gemm_micros(device, flops, gemm)
        memory = nbytes / (device.mem_bw_gbps * c.gemm_efficiency * 1e3)
    else:
        compute = flops / ((device.vector_tflops or device.peak_tflops) * 1e6)
        memory = nbytes / (device.mem_bw_gbps * bandwidth_efficiency(device, kernel) * 1e3)
    return c.kernel_overhead_us + max(compute, memory)


def kernel_micros(device: Device, durations: str, flops: int, nbytes: int,
                  gemm: Sequence[int] | None = None, kernel: str | None = None) -> float:
    """A kernel's time under `durations` (`calibrated` or `roofline`)."""
    if durations == "roofline":
        return device.micros(flops, nbytes)
    if durations == "calibrated":
        return calibrated_micros(device, flops, nbytes, gemm, kernel)
    raise ValueError(f"no kernel model {durations!r}")

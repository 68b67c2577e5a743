"""What a device is, for timing kernels: its peaks, and how close real kernels come to them.

A device is a data file (`flint/devices/data/NAME.toml`, or one a user writes or `flint calibrate`
fits), each number with its source. Two models time a kernel from it (`flint.devices.kernels`):

- the roofline, `max(flops / peak, bytes / bandwidth)`: the vendor's peaks, the same bound ASTRA-sim
  applies in its roofline mode;
- the calibrated model, the default on GPU backends: a GEMM at the throughput its shape reaches
  (tiles over the compute units, waves, depth), other kernels at achievable bandwidth, and a fixed
  cost per kernel, with efficiencies measured on real hardware.
"""

from __future__ import annotations

from flint.devices.spec import BUILTIN, Device, load_device

__all__ = ["BUILTIN", "Device", "load_device"]

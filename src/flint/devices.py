"""Roofline device models for `duration_micros`.

A compute node's time is `max(flops / peak, bytes / bandwidth)`, the same roofline ASTRA-sim applies in
its roofline mode, so replay mode (which reads `duration_micros`) and roofline mode agree. Peaks are the
vendors' published dense bf16 matrix throughput and HBM bandwidth.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from flint.errors import FlintError


@dataclass(frozen=True)
class Device:
    """A roofline: peak FLOP/s in TFLOP/s and memory bandwidth in GB/s (10^9 bytes/s)."""

    name: str
    peak_tflops: float
    mem_bw_gbps: float

    def micros(self, flops: int, nbytes: int) -> float:
        """The roofline time in microseconds, unrounded: `flint timeline` schedules with it, and
        the emitted whole microseconds add up to it (`flint.emit.durations`)."""
        return max(flops / (self.peak_tflops * 1e12), nbytes / (self.mem_bw_gbps * 1e9)) * 1e6


BUILTIN = {
    d.name: d
    for d in (
        Device("h100", 989.0, 3350.0),
        Device("h200", 989.0, 4800.0),
        Device("b200", 2250.0, 8000.0),
        Device("a100", 312.0, 2039.0),
        Device("mi300x", 1307.0, 5300.0),
        Device("tpu-v5p", 459.0, 2765.0),
        Device("tpu-v5e", 197.0, 819.0),
    )
}


def load_device(spec: str) -> Device:
    """A built-in name, or a JSON file `{"name": ..., "peak_tflops": ..., "mem_bw_gbps": ...}`."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    path = Path(spec)
    if path.suffix != ".json":
        raise FlintError(
            f"unknown --device {spec!r}: use one of {', '.join(BUILTIN)} or a .json spec file"
        )
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise TypeError(f"the JSON is a {type(data).__name__}, not an object")
        device = Device(str(data["name"]), _rate(data, "peak_tflops"), _rate(data, "mem_bw_gbps"))
    except FileNotFoundError:
        raise FlintError(f"device spec file {spec!r} not found") from None
    except OSError as exc:  # a directory, or a file this user may not read
        raise FlintError(
            f"cannot read device spec {spec!r}: {exc.strerror}: give a readable JSON file"
        ) from None
    except (ValueError, KeyError, TypeError, OverflowError) as exc:
        raise FlintError(
            f"device spec {spec!r} is not valid: it needs JSON with name, peak_tflops and mem_bw_gbps "
            f"({type(exc).__name__}: {exc})"
        ) from None
    if device.peak_tflops <= 0 or device.mem_bw_gbps <= 0:
        raise FlintError(f"device spec {spec!r}: peak_tflops and mem_bw_gbps must be positive")
    return device


def _rate(data: dict, key: str) -> float:
    """`data[key]` as a finite number. Python's JSON reads NaN and Infinity, which pass a check for
    being positive (NaN) or reach the manifest, which JSON cannot hold (Infinity)."""
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{key} is {value!r}, not a number")
    if not math.isfinite(value):
        raise ValueError(f"{key} is {value!r}, not a finite number")
    return float(value)

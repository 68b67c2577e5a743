"""Device files: a device's peaks and calibrated efficiencies, read from TOML (or JSON).

The built-in devices are the files in `data/`; `--device FILE` takes any file of the same form,
and `flint calibrate` writes one. Only `name`, `peak_tflops` and `mem_bw_gbps` are required: a
file without a `[calibration]` table times kernels at the peaks (efficiency 1, no fixed cost), so
its calibrated times equal the roofline.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path

import tomllib

from flint.errors import FlintError, fraction_field, invalid, known_keys, number_field, optional_field, sources_field


@dataclass(frozen=True)
class Calibration:
    """How close real kernels come to the peaks, measured (see each device file's sources).

    - `gemm_efficiency`: a large GEMM's throughput over the matrix peak;
    - `gemm_efficiency_8bit`: the same for 8-bit operands (FP8, INT8) over the 8-bit peak, which
      GEMM kernels reach a smaller share of; None: as `gemm_efficiency`;
    - `gemm_tile`: the output tile one compute unit works on (rows, columns), which sets how a
      product's tiles fill the chip in waves;
    - `gemm_k_overhead`: a tile's fixed cost in contraction depth: a GEMM of depth k runs at
      k / (k + overhead) of its rate (the pipeline's fill and the epilogue);
    - `memory_efficiency`: the achievable memory bandwidth over the peak;
    - `transpose_efficiency`: the same for a kernel that writes a transpose moving the minor
      dimension without tiling it (XLA's `loop_*transpose*` fusions), whose reads or writes
      stride across rows; None: as `memory_efficiency`;
    - `triton_efficiency`: the same for a fusion the GPU compiler emits as a Triton block-level
      kernel (softmax- and normalization-like rows; `kernel` triton in a trace), whose tiles of
      whole rows run at fewer programs per SM than XLA's own kernels; None: as `memory_efficiency`;
    - `kernel_overhead_us`: what every kernel costs beyond its work (launch, ramp, tail).
    """

    gemm_efficiency: float = 1.0
    gemm_efficiency_8bit: float | None = None
    gemm_tile: tuple[int, int] = (128, 128)
    gemm_k_overhead: float = 0.0
    memory_efficiency: float = 1.0
    transpose_efficiency: float | None = None
    triton_efficiency: float | None = None
    kernel_overhead_us: float = 0.0


@dataclass(frozen=True)
class Device:
    """A device: `peak_tflops` dense 16-bit matrix throughput (TFLOP/s), `mem_bw_gbps` memory
    bandwidth (GB/s, 10^9 bytes/s), `vector_tflops` for work outside the matrix units (element-wise,
    reductions), `compute_units` (SMs, CUs) and the `calibration` of its kernels."""

    name: str
    peak_tflops: float
    mem_bw_gbps: float
    vector_tflops: float | None = None
    compute_units: int = 1
    calibration: Calibration = field(default_factory=Calibration)
    sources: tuple[tuple[str, str], ...] = ()

    def micros(self, flops: int, nbytes: int) -> float:
        """The roofline time in microseconds, unrounded: the emitted whole microseconds add up to
        it (`flint.emit.durations`), and ASTRA-sim's roofline mode applies the same bound."""
        return max(flops / (self.peak_tflops * 1e12), nbytes / (self.mem_bw_gbps * 1e9)) * 1e6

    def as_json(self) -> dict:
        """Everything a reader needs to time the trace again as it was timed (the manifest's)."""
        data = asdict(self)
        data["calibration"]["gemm_tile"] = list(self.calibration.gemm_tile)
        data["sources"] = dict(self.sources)
        return data

    @classmethod
    def from_json(cls, data: dict, origin: str = "device") -> Device:
        """A device from a file's or a manifest's table, each number checked."""
        return _device(data, origin)


DATA = "data"


def _builtin() -> dict[str, Device]:
    folder = resources.files(__package__) / DATA
    devices = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            device = _device(tomllib.loads(entry.read_text()), entry.name)
            devices[device.name] = device
    return devices


def load_device(spec: str) -> Device:
    """A built-in name (`h100`, ...), or a `.toml` or `.json` device file."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    path = Path(spec)
    if path.suffix not in (".toml", ".json"):
        raise FlintError(
            f"unknown --device {spec!r}: use one of {', '.join(BUILTIN)} or a .toml or .json device file"
        )
    try:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except FileNotFoundError:
        raise FlintError(f"device file {spec!r} not found") from None
    except OSError as exc:  # a directory, or a file this user may not read
        raise FlintError(
            f"cannot read device file {spec!r}: {exc.strerror}: give a readable .toml or .json file") from None
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise FlintError(f"device file {spec!r} is not valid {path.suffix[1:].upper()}: {exc}") from None
    return _device(data, spec)


def _device(data, origin: str) -> Device:
    try:
        if not isinstance(data, dict):
            raise TypeError(f"it is a {type(data).__name__}, not an object (a table)")
        known_keys(data, [f.name for f in fields(Device)])
        calibration = data.get("calibration", {})
        if not isinstance(calibration, dict):
            raise TypeError("calibration is not a table")
        known_keys(calibration, [f.name for f in fields(Calibration)], "calibration")
        tile = calibration.get("gemm_tile", Calibration.gemm_tile)
        if not (isinstance(tile, (list, tuple)) and len(tile) == 2 and all(
                isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in tile)):
            raise ValueError(f"gemm_tile is {tile!r}, not two positive integers")
        device = Device(
            name=str(data["name"]),
            peak_tflops=number_field(data, "peak_tflops", positive=True),
            mem_bw_gbps=number_field(data, "mem_bw_gbps", positive=True),
            vector_tflops=optional_field(number_field, data, "vector_tflops", positive=True),
            compute_units=int(number_field(data, "compute_units", positive=True)) if "compute_units" in data else 1,
            calibration=Calibration(
                gemm_efficiency=fraction_field(calibration, "gemm_efficiency", default=1.0),
                gemm_efficiency_8bit=optional_field(fraction_field, calibration, "gemm_efficiency_8bit"),
                gemm_tile=(tile[0], tile[1]),
                gemm_k_overhead=number_field(calibration, "gemm_k_overhead", default=0.0),
                memory_efficiency=fraction_field(calibration, "memory_efficiency", default=1.0),
                transpose_efficiency=optional_field(fraction_field, calibration, "transpose_efficiency"),
                triton_efficiency=optional_field(fraction_field, calibration, "triton_efficiency"),
                kernel_overhead_us=number_field(calibration, "kernel_overhead_us", default=0.0),
            ),
            sources=sources_field(data),
        )
    except (ValueError, KeyError, TypeError, OverflowError) as exc:
        raise FlintError(f"device file {origin!r} is not valid: "
                         f"{invalid(exc, 'it needs name, peak_tflops and mem_bw_gbps')}") from None
    return device


BUILTIN: dict[str, Device] = _builtin()
"""The devices of the files in `data/`, by name."""

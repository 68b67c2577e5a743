"""ASTRA-sim's inputs for one trace: system, network, remote memory and logging files, and the
command line that reads them.

The system file follows ASTRA-sim's validated HGX-H100 system (LIFO scheduling, ring collectives
on every dimension, local-bandwidth-aware all-reduce). Replay mode, the default, times every COMP
node by its `duration_micros`, which Flint wrote from the same roofline (or from XLA's estimates
with `--durations xla`); roofline mode lets ASTRA-sim time them from `num_ops` and `tensor_size`.

The logging file makes the two loggers whose lines are read (`workload`, `statistics`) synchronous:
ASTRA-sim logs asynchronously by default, and a run that crashes at teardown (a known upstream
issue with traces whose ranks use two or more communicator groups) loses the lines still queued.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flint.devices import Device
from flint.errors import FlintError
from flint.step.astra_sim import SYSTEM, check_system
from flint.step.network import Network

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")
MEMORY = {"memory-type": "NO_MEMORY_EXPANSION"}
LOGGING = """\
# Synchronous loggers for the lines Flint reads; ASTRA-sim adds its own sinks to each.
[[sink]]
name = "none"
type = "null_sink_st"

[[logger]]
name = "workload"
sinks = ["none"]
level = "info"
flush_level = "info"

[[logger]]
name = "statistics"
sinks = ["none"]
level = "info"
flush_level = "info"
"""


@dataclass(frozen=True)
class SimulationInputs:
    """The files of one simulation, written into `directory`, and the command that runs them."""

    directory: Path
    workload: Path
    groups: Path | None
    network: Network
    device: Device
    roofline: bool
    system_overrides: Mapping[str, Any] = field(default_factory=dict)

    @property
    def files(self) -> dict[str, Path]:
        names = {"system": "system.json", "network": "network.yml", "memory": "memory.json",
                 "logging": "logging.toml"}
        return {key: self.directory / name for key, name in names.items()}

    def system(self) -> dict:
        per_dimension = ["ring"] * len(self.network.dimensions)
        system = {**SYSTEM, **{f"{kind}-implementation": per_dimension for kind in COLLECTIVES}}
        system["local-mem-bw"] = self.device.mem_bw_gbps
        if self.roofline:
            system.update({"roofline-enabled": 1, "peak-perf": self.device.peak_tflops})
        return {**system, **self.system_overrides}

    def write(self) -> None:
        files = self.files
        self.directory.mkdir(parents=True, exist_ok=True)
        files["system"].write_text(json.dumps(self.system(), indent=2) + "\n")
        files["network"].write_text(self.network.to_yaml())
        files["memory"].write_text(json.dumps(MEMORY, indent=2) + "\n")
        files["logging"].write_text(LOGGING)

    def command(self, simulator: str | Path) -> list[str]:
        files = self.files
        command = [str(simulator), f"--workload-configuration={self.workload}"]
        if self.groups is not None:
            command.append(f"--comm-group-configuration={self.groups}")
        return command + [
            f"--system-configuration={files['system']}",
            f"--network-configuration={files['network']}",
            f"--remote-memory-configuration={files['memory']}",
            f"--logging-configuration={files['logging']}",
            f"--logging-folder={self.directory / 'log'}",
        ]

    def shell_command(self, simulator: str | Path) -> str:
        return shlex.join(self.command(simulator))


def read_system_overrides(path: Path) -> dict[str, Any]:
    """A JSON object of ASTRA-sim system keys that replace Flint's (e.g. "preferred-dataset-splits"),
    those the estimator reads checked as it and ASTRA-sim read them."""
    try:
        overrides = json.loads(path.read_text())
    except FileNotFoundError:
        raise FlintError(f"system file {path} not found") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise FlintError(f"cannot read system file {path}: {exc}") from None
    if not isinstance(overrides, dict):
        raise FlintError(f"system file {path} must hold a JSON object of ASTRA-sim system keys")
    try:
        check_system(overrides)
    except (TypeError, ValueError) as exc:
        raise FlintError(f"system file {path}: {exc}") from None
    return overrides

"""Simulate a trace on a machine with ASTRA-sim: a tool beside the pipeline, like `analysis`.

In: a trace directory (Flint's, with its manifest, or another producer's) and the machine (network
preset or ASTRA-sim YAML, device, replay or roofline). Out: ASTRA-sim's input files, the command
that runs them, and, where ASTRA-sim is installed, each rank's step, compute, exposed communication
and idle time beside `flint timeline`'s estimate.

May import: the foundation, `trace`, `analysis`.
"""

from flint.simulation.driver import SimulateRequest, Simulation, simulate
from flint.simulation.network import PRESETS, Network, network_for

__all__ = ["PRESETS", "Network", "SimulateRequest", "Simulation", "network_for", "simulate"]

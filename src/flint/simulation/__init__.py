"""Simulate a trace on a machine with ASTRA-sim or Flint's estimator: a tool beside the pipeline,
like `analysis`.

In: a trace directory (Flint's, with its manifest, or another producer's) and the machine (network
file or ASTRA-sim YAML, device, replay or roofline). Out: ASTRA-sim's input files, the command that
runs them, and each rank's step, compute, exposed communication and idle time from the engine that
ran: Flint's estimator (`flint.step`'s schedule with collectives as NCCL runs them, by default), or
ASTRA-sim, beside whose step the estimator's stands.

May import: the foundation, `trace`, `step`, and `emit`'s all-or-nothing output directories.
"""

from flint.simulation.driver import SimulateRequest, Simulation, simulate
from flint.step.network import PRESETS, Network, network_for

__all__ = ["PRESETS", "Network", "SimulateRequest", "Simulation", "network_for", "simulate"]

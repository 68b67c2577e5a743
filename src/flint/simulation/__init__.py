"""Simulate a trace on a machine with ASTRA-sim or Flint's estimator: a tool beside the pipeline,
like `analysis`.

In: a trace directory (Flint's, with its manifest, or another producer's) and the machine (network
preset or ASTRA-sim YAML, device, replay or roofline). Out: ASTRA-sim's input files, the command
that runs them, and each rank's step, compute, exposed communication and idle time from the engine
that ran: ASTRA-sim where it is installed and within reach, else Flint's estimator (`flint
timeline`'s schedule with communication timed as ASTRA-sim times it), whose step also stands
beside ASTRA-sim's.

May import: the foundation, `trace`, `analysis`.
"""

from flint.simulation.driver import SimulateRequest, Simulation, simulate
from flint.trace.network import PRESETS, Network, network_for

__all__ = ["PRESETS", "Network", "SimulateRequest", "Simulation", "network_for", "simulate"]

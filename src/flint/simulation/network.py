"""The simulated machine's network: see `flint.trace.network`, where it lives so that every reader
(`flint timeline`, `flint simulate`'s estimate, sweep) times collectives on the same network."""

from flint.trace.network import PRESETS, TOPOLOGIES, Dimension, Network, Tier, network_for, read_network

__all__ = ["PRESETS", "TOPOLOGIES", "Dimension", "Network", "Tier", "network_for", "read_network"]

"""Flint: Chakra execution traces from JAX steps, partitioned by the XLA compiler on a virtual mesh."""

__version__ = "0.1.0"

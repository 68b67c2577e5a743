"""Chakra execution-trace messages (generated from ``schemas/et_def.proto``).

Import messages through this package so callers never depend on the generated file's location.
"""

from flint.schema import et_def_pb2

__all__ = ["et_def_pb2"]

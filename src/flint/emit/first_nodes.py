"""A rank's first kernels take time: ASTRA-sim aborts on a node of 0 ns at time 0.

In its roofline mode ASTRA-sim times a COMP node as `max(num_ops / peak, tensor_size / bandwidth)`
truncated to whole nanoseconds, and a node that takes 0 ns while issued at time 0 fails an event
queue assertion before any rank finishes (upstream). Only nodes with no dependencies are issued at
time 0, and only tiny ones (a few hundred bytes: a position index, a random-number state) take under
a nanosecond. Such a node is written as moving `FIRST_NODE_BYTES`: a nanosecond at the fastest
built-in device's bandwidth, so at any of theirs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from flint.devices import BUILTIN

FIRST_NODE_BYTES = math.ceil(max(d.mem_bw_gbps for d in BUILTIN.values()))
"""Bytes that take at least a nanosecond on every built-in device (GB/s is bytes per ns)."""


def taking_time(data: Mapping) -> Mapping:
    """A compute node without dependencies, its bytes raised to `FIRST_NODE_BYTES`: the planners
    apply it as they plan each file, so the totals and every command count the same bytes."""
    if data["bytes"] >= FIRST_NODE_BYTES:
        return data
    return {**data, "bytes": FIRST_NODE_BYTES}

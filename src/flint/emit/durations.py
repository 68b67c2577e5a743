"""Whole microseconds for `duration_micros` whose sum is the exact modelled time.

Chakra stores a node's duration in whole microseconds, and most kernels of a step take less than
one: rounding each node up (or down) on its own would make a rank's compute several times too long
(or free). Instead each node gets the whole microseconds by which the rounded running total of the
exact times grows, so every prefix of a rank's nodes, and the whole rank, is within half a
microsecond of the exact sum, and a replaying simulator adds up to the modelled time.

A node of 0 µs is fine in replay mode (ASTRA-sim gives it a nanosecond). In roofline mode ASTRA-sim
times nodes from `num_ops` and `tensor_size` instead, and there a node of under a nanosecond at
time 0 aborts it (upstream bug): that depends on the system configuration's peak and bandwidth.
"""

from __future__ import annotations

class RunningMicros:
    """The durations of one rank's nodes, in file order."""

    def __init__(self) -> None:
        self.exact = 0.0
        self.emitted = 0

    def next(self, micros: float) -> int:
        """Whole microseconds for the next node, which takes `micros` exactly."""
        self.exact += micros
        duration = round(self.exact) - self.emitted
        self.emitted += duration
        return duration

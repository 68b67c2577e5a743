"""How long a collective or a transfer takes on a network, timed as ASTRA-sim times it.

One model for every reader: `flint timeline`, `flint simulate --engine flint` (and the estimate
beside ASTRA-sim's result) and `flint sweep` time communication here, on the network of
`flint.step.network` and the system keys Flint writes for ASTRA-sim (`SYSTEM`, which a
`--system` file may override). It follows ASTRA-sim's analytical, congestion-unaware backend:

- **A message** from NPU a to NPU b travels on the lowest network dimension in which their
  addresses differ and takes `hops * latency + bytes / bandwidth` there, plus, within a collective,
  the system's `endpoint-delay` (ns); a SEND/RECV is one such message without it. Hops: 2 on a
  Switch (up and down), 1 on FullyConnected, the shorter way round on a Ring. Bandwidth is in GB/s
  of 2^30 bytes, as ASTRA-sim reads its network file.
- **Chunks**: a collective of S bytes is split into `preferred-dataset-splits` chunks of
  floor(S / splits) bytes (at least the machine's NPU count, except for an all-gather); each
  chunk passes through the collective's phases, and each network dimension holds at most
  `active-chunks-per-dimension` chunks at once, so chunks pipeline through the phases.
- **Phases.** A collective over every rank runs hierarchically, one phase per network dimension
  with more than one NPU: an all-reduce (with the `localBWAware` optimisation Flint asks for) is a
  reduce-scatter up the dimensions, an all-reduce on the last, an all-gather back down; a
  reduce-scatter or all-to-all goes up the dimensions, an all-gather down. Each phase is a ring
  over the dimension's NPUs, on that dimension's links. A collective over a smaller group is one
  phase: a ring over the group's members in rank order, each hop on the dimension that hop's two
  ranks first differ in (so a group that spans nodes pays the scale-out tier on the hops that
  cross nodes and, where its neighbours also differ inside a node, rides the node's links).
- **A ring phase** over n members of a chunk of C bytes (integer division, as ASTRA-sim):

  | collective     | steps        | bytes per step | steps that reduce |
  |----------------|--------------|----------------|-------------------|
  | ALL_REDUCE     | 2(n-1)       | C / n          | n-1               |
  | REDUCE_SCATTER | n-1          | C / n          | n-1               |
  | ALL_GATHER     | n-1          | C              | 0                 |
  | ALL_TO_ALL     | n(n-1)/2     | C / n          | 0                 |

  and passes on C / n (reduce-scatter), C (all-reduce, all-to-all) or n C (all-gather) bytes to
  the next phase. Each member sends its k-th message once it has received its (k-1)-th, so a
  chunk that every member starts at once ends as the slowest run of `steps` consecutive hops
  round the ring (every hop alike: `steps` times one hop). A step that reduces also reads and
  writes its message three times in local memory, at `local-mem-bw`.
- **A group ring whose hops differ** (a hop that crosses more of a Ring's links, or another
  dimension, than the rest): each member ends a chunk when it has received its last message, the
  members down the slow hops later than the rest, and starts its next chunk as soon as one of
  its own slots is free, as ASTRA-sim's streams do. Its k-th message then goes out once it has
  received its (k-1)-th and sent its (k-1)-th, and the collective lasts until its last member
  ends its last chunk: less than one slowest run per round of chunks.

Congestion is not modelled (nor does ASTRA-sim's congestion-unaware backend model it): concurrent
collectives do not slow each other down.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flint.errors import number_field
from flint.schema import et_def_pb2 as pb
from flint.step.network import GIB, Network

SYSTEM: dict[str, Any] = {
    "scheduling-policy": "LIFO",
    "endpoint-delay": 10,
    "active-chunks-per-dimension": 2,
    "preferred-dataset-splits": 4,
    "collective-optimization": "localBWAware",
    "boost-mode": 0,
}
"""The ASTRA-sim system keys Flint writes (besides each collective's implementation, `ring` on
every dimension, and the device's `local-mem-bw`); the model reads the same keys."""
WHOLE = {"endpoint-delay": 0, "preferred-dataset-splits": 1, "active-chunks-per-dimension": 1}
"""The system keys the model reads that ASTRA-sim reads as C++ integers, with the least of each."""
OPTIMIZATIONS = ("baseline", "localBWAware")


def check_system(system: Mapping[str, Any]) -> None:
    """Refuse a value of a system key the model reads that ASTRA-sim cannot run with, or would read
    otherwise than the model: NaN hung the model and Infinity reached the result, which JSON (and
    ASTRA-sim's reader) cannot hold; ASTRA-sim finishes no rank with a negative `endpoint-delay` or
    a count below 1, stops at a `collective-optimization` other than its two, and cuts a fraction
    to its whole part (2.5 splits are 2 there; a delay of 2.5 ns, 2 there and 2.5 here); a
    `local-mem-bw` must be a bandwidth. A TypeError or ValueError names the key."""
    for key, least in WHOLE.items():
        value = system.get(key, least)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and value == int(value) and value >= least):
            raise ValueError(f"{key} is {value!r}, not a whole number of at least {least} (ASTRA-sim reads an "
                             "integer)")
    if "local-mem-bw" in system:
        number_field(system, "local-mem-bw", positive=True)
    value = system.get("collective-optimization", OPTIMIZATIONS[0])
    if value not in OPTIMIZATIONS:
        raise ValueError(f"collective-optimization is {value!r}, not one of {', '.join(OPTIMIZATIONS)}")


_FINAL = {  # bytes a ring phase passes on, from the C bytes it took and its n members
    pb.ALL_REDUCE: lambda c, n: c,
    pb.REDUCE_SCATTER: lambda c, n: c // n,
    pb.ALL_GATHER: lambda c, n: c * n,
    pb.ALL_TO_ALL: lambda c, n: c,
}
TIMED = frozenset(_FINAL)
"""The collectives the model times; others (BROADCAST) keep the trace's duration, as ASTRA-sim
replays them."""


@dataclass(frozen=True, eq=False)
class CollectiveModel:
    """Communication times on `network` with ASTRA-sim's `system` keys (see the module docstring);
    `mem_bw_gbps` is the device's memory bandwidth (`local-mem-bw`, GB/s of 10^9 bytes), None for
    reductions that cost nothing."""

    network: Network
    mem_bw_gbps: float | None = None
    system: Mapping[str, Any] = field(default_factory=lambda: dict(SYSTEM))
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def splits(self) -> int:
        return max(1, int(self.system.get("preferred-dataset-splits", 1) or 1))

    @property
    def active(self) -> int:
        return max(1, int(self.system.get("active-chunks-per-dimension", 1) or 1))

    @property
    def endpoint_ns(self) -> float:
        return float(self.system.get("endpoint-delay", 10))

    def times(self, comm_type: int) -> bool:
        """Whether this model times a collective of `comm_type` (else it keeps its duration)."""
        return comm_type in TIMED

    def unmodelled(self) -> list[str]:
        """The system keys that ask ASTRA-sim for what this model does not time: a collective
        implementation other than a ring."""
        found = []
        for key, value in self.system.items():
            if key.endswith("-implementation"):
                values = value if isinstance(value, list) else [value]
                if any(str(v).lower() not in ("ring", "onering") for v in values):
                    found.append(f"{key}: {value}")
        return found

    @property
    def hierarchical_all_reduce(self) -> bool:
        return self.system.get("collective-optimization", "baseline") == "localBWAware"

    # -- one message ---------------------------------------------------------------------------

    def route(self, src: int, dst: int) -> tuple[int, int] | None:
        """The dimension a message from NPU `src` to `dst` travels on (the lowest one their
        addresses differ in) and its hops there; None from an NPU to itself."""
        a, b = src, dst
        for index, dim in enumerate(self.network.dimensions):
            (a, ca), (b, cb) = divmod(a, dim.npus), divmod(b, dim.npus)
            if ca != cb:
                if dim.topology == "Switch":
                    return index, 2
                if dim.topology == "Ring":
                    distance = (cb - ca) % dim.npus
                    return index, min(distance, dim.npus - distance)
                return index, 1
        return None

    def routed_ns(self, route: tuple[int, int] | None, nbytes: float) -> float:
        """One message of `nbytes` on `route` (see `route`), ns."""
        if route is None:
            return self.endpoint_ns
        dim = self.network.dimensions[route[0]]
        return self.endpoint_ns + route[1] * dim.latency_ns + nbytes / (dim.bandwidth_gbps * GIB) * 1e9

    def message_ns(self, src: int, dst: int, nbytes: float) -> float:
        """One message from NPU `src` to `dst`: on the lowest dimension their addresses differ in."""
        return self.routed_ns(self.route(src, dst), nbytes)

    def transfer_micros(self, src: int, dst: int, nbytes: float) -> float:
        """A SEND/RECV of `nbytes` from rank `src` to `dst`, in µs: one message, without the
        collectives' endpoint delay (ASTRA-sim sends it straight to the network)."""
        return (self.message_ns(src, dst, nbytes) - self.endpoint_ns) / 1e3

    # -- collectives ----------------------------------------------------------------------------

    def collective_micros(self, comm_type: int, nbytes: int, ranks: Sequence[int]) -> float:
        """A collective of `nbytes` (Chakra's `comm_size`) over `ranks`, in µs."""
        if len(ranks) < 2 or comm_type not in TIMED:
            return 0.0
        return self.shaped_micros(comm_type, nbytes, self.group_shape(ranks))

    def group_shape(self, ranks: Sequence[int]) -> tuple | None:
        """What a collective's time depends on besides its kind and size: the route of each hop of
        the ring over a group's members in rank order, or None for a group of every rank (which
        runs hierarchically over the dimensions). Groups of one shape take the same time."""
        if len(ranks) >= self.network.npus:
            return None
        key = ("shape", ranks if isinstance(ranks, tuple) else tuple(ranks))
        shape = self._cache.get(key)
        if shape is None:
            members = sorted(key[1])
            shape = self._cache[key] = tuple(self.route(a, b) for a, b in zip(members, members[1:] + members[:1]))
        return shape

    def shaped_micros(self, comm_type: int, nbytes: int, shape: tuple | None) -> float:
        """A collective of `nbytes` over a group of `shape` (see `group_shape`), in µs."""
        key = (comm_type, int(nbytes), shape)
        if key not in self._cache:
            self._cache[key] = _collective_ns(self, comm_type, int(nbytes), shape) / 1e3
        return self._cache[key]

    def phases(self, comm_type: int, shape: tuple | None) -> list[tuple[int, tuple | None, int]]:
        """The ring phases of a collective: (comm type, the ring's hop routes or None for a network
        dimension's own ring, that dimension or -1)."""
        if shape is not None:
            return [(comm_type, shape, -1)]
        dims = [d for d, dim in enumerate(self.network.dimensions) if dim.npus > 1]
        if comm_type == pb.ALL_GATHER:
            return [(pb.ALL_GATHER, None, d) for d in reversed(dims)]
        if comm_type != pb.ALL_REDUCE or not self.hierarchical_all_reduce:
            return [(comm_type, None, d) for d in dims]
        up = [(pb.REDUCE_SCATTER, None, d) for d in dims[:-1]]
        return up + [(pb.ALL_REDUCE, None, dims[-1])] + [(pb.ALL_GATHER, None, d) for d in reversed(dims[:-1])]

    def chunks(self, comm_type: int, nbytes: int) -> tuple[int, int]:
        """(chunk bytes, how many chunks), as ASTRA-sim splits a collective."""
        chunk = nbytes // self.splits
        if comm_type != pb.ALL_GATHER and self.network.npus > chunk:
            chunk, nbytes = self.network.npus, self.splits * self.network.npus
        chunk = max(chunk, 1)
        return chunk, max(1, math.ceil(nbytes / chunk))

    def ring_steps(self, comm_type: int, chunk: int, n: int) -> tuple[int, int, int]:
        """A ring phase over `n` members of a `chunk`: (steps, bytes per step, steps that reduce)."""
        if comm_type == pb.ALL_REDUCE:
            return 2 * (n - 1), chunk // n, n - 1
        if comm_type == pb.REDUCE_SCATTER:
            return n - 1, chunk // n, n - 1
        if comm_type == pb.ALL_GATHER:
            return n - 1, chunk, 0
        return n * (n - 1) // 2, chunk // n, 0

    def reduction_ns(self, message: int) -> float:
        """Reducing one received message: read, read and write it at `local-mem-bw`, whole ns each."""
        return 3 * math.floor(message / self.mem_bw_gbps) if self.mem_bw_gbps else 0  # ns: bytes / (GB/s)

    def ring_ns(self, comm_type: int, chunk: int, hops: Sequence[tuple[int, int] | None], n: int) -> float:
        """One ring phase over `n` members of a `chunk`, every member starting at once; `hops` are
        the routes round the ring (for a dimension's own ring, one representative)."""
        steps, message, reducing = self.ring_steps(comm_type, chunk, n)
        times = [self.routed_ns(route, message) for route in hops]
        return _slowest_window(times, steps) + reducing * self.reduction_ns(message)


def _collective_ns(model: CollectiveModel, comm_type: int, nbytes: int, shape: tuple | None) -> float:
    chunk, count = model.chunks(comm_type, nbytes)
    if shape is not None and count > model.active and len({model.routed_ns(route, 1) for route in shape}) > 1:
        return _uneven_ring_ns(model, comm_type, chunk, count, shape)
    stages = []
    size = chunk
    for kind, ring, dim in model.phases(comm_type, shape):
        if ring is not None:
            hops, n = ring, len(ring)
        else:
            n = model.network.dimensions[dim].npus
            stride = math.prod(d.npus for d in model.network.dimensions[:dim])
            hops = [model.route(0, stride)]
        stages.append((dim, model.ring_ns(kind, size, hops, n)))
        size = _FINAL[kind](size, n)
    return _pipeline(stages, count, model.active)


def _uneven_ring_ns(model: CollectiveModel, comm_type: int, chunk: int, count: int, hops: tuple) -> float:
    """A group ring whose hops differ, in `count` chunks (see the module docstring): member i's
    k-th message goes out at t_i(k) = max(t_i(k-1), t_{i-1}(k-1) + hop into i) (+ its reduction,
    on a step that reduces), its first at the start of its chunk, the earliest it has a free slot;
    a chunk ends on a member at its last message received (and reduced)."""
    n = len(hops)
    steps, message, reducing = model.ring_steps(comm_type, chunk, n)
    into = np.roll(np.array([model.routed_ns(route, message) for route in hops]), 1)  # into[i]: i-1 -> i
    reduction = model.reduction_ns(message)
    members = np.arange(n)
    lanes = np.zeros((model.active, n))
    for _ in range(count):
        lane = lanes.argmin(axis=0)  # each member's first free slot
        t = lanes[lane, members]
        k, lap = 0, None
        while k < steps:
            t = np.maximum(np.roll(t, 1) + into, t) + (reduction if k < reducing else 0.0)
            k += 1
            if k > reducing and (k - reducing) % n == 0:
                # past the reductions every step is the same map, which commutes with adding a
                # constant: once a lap of n steps adds the same time to every member, so does each
                # lap after it (all-to-all's n(n-1)/2 steps in a few laps)
                if lap is not None:
                    gained = t - lap
                    if np.ptp(gained) <= 1e-9 * max(1.0, float(gained.max())):
                        laps = (steps - k) // n
                        t, k = t + laps * gained, k + laps * n
                lap = t.copy()
        lanes[lane, members] = t
    return float(lanes.max())


def _pipeline(stages: Sequence[tuple[int, float]], chunks: int, slots: int) -> float:
    """When the last of `chunks` equal chunks leaves its last stage: each stage (dimension, time)
    runs on its dimension, which holds at most `slots` chunks at once (a reduce-scatter and the
    all-gather back down the same dimension share them); a free slot goes to the chunk that has
    waited longest."""
    if not stages or chunks <= 0:
        return 0.0
    free: dict[int, list[float]] = {dim: [0.0] * slots for dim, _ in stages}
    ready = [0.0] * chunks
    stage = [0] * chunks
    pending = set(range(chunks))
    while pending:
        def start(j: int) -> float:
            return max(ready[j], min(free[stages[stage[j]][0]]))
        j = min(pending, key=lambda c: (start(c), ready[c], c))
        dim, duration = stages[stage[j]]
        begin = start(j)
        lanes = free[dim]
        lanes[lanes.index(min(lanes))] = ready[j] = begin + duration
        stage[j] += 1
        if stage[j] == len(stages):
            pending.discard(j)
    return max(ready)


def _slowest_window(times: Sequence[float], steps: int) -> float:
    """The largest sum of `steps` consecutive entries of `times`, read round a ring."""
    n = len(times)
    if steps <= 0 or n == 0:
        return 0.0
    if len(set(times)) == 1:
        return steps * times[0]
    laps, rest = divmod(steps, n)
    base = laps * sum(times)
    if rest == 0:
        return base
    doubled = list(times) + list(times[:rest])
    window = sum(doubled[:rest])
    best = window
    for i in range(1, n):
        window += doubled[i + rest - 1] - doubled[i - 1]
        best = max(best, window)
    return base + best

"""The simulated machine's network: ASTRA-sim's multi-dimensional topology, laid over the mesh.

ASTRA-sim numbers NPUs with its first network dimension varying fastest (NPU id = a0 + n0 * (a1 +
n1 * ...)), and Flint numbers ranks with the mesh's last axis varying fastest. So network dimension
0 carries the mesh's innermost axes: on the `hgx` preset the innermost 8 ranks (a tensor-parallel
group of up to 8) share one NVLink node, and the outer axes cross the scale-out fabric. An axis that
straddles a node boundary is split (its low factor inside the node, its high factor outside), which
keeps the numbering exact.

How ASTRA-sim routes (astra-network-analytical, congestion unaware): a message between two NPUs
travels on the lowest dimension in which their addresses differ, at that dimension's bandwidth and
latency; a collective on a communicator group smaller than the machine runs as a ring over the
group's members. So a group's collectives run on the dimensions its members span, and changing a
dimension no group spans changes nothing. `flint.step.astra_sim` times collectives this way.

The presets are the network files of `flint.step.network_files` (their `astra_sim_*` figures);
a network also keeps its file (`cluster`), which NCCL's model (`flint.step.nccl`) times on. It
lives in `trace` so that every reader of a trace (`flint timeline`, `flint simulate`, sweep) lays
the same network over the mesh.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from flint.errors import FlintError
from flint.step.network_files import (
    BUILTIN_NETWORKS, NetworkFile, NodeTier, ScaleOut, channels_per_nic, load_network_file,
)

TOPOLOGIES = ("Ring", "Switch", "FullyConnected")
GIB = 2**30
"""ASTRA-sim's GB: bandwidths in its network file are GB/s of 2^30 bytes."""
"""The basic topologies of ASTRA-sim's analytical network backends."""


@dataclass(frozen=True)
class Dimension:
    """One network dimension: `npus` ranks on a `topology`, each link at `bandwidth_gbps` GB/s
    (10^9 bytes/s) and `latency_ns` per hop; `axes` names the mesh axes (or parts) it carries."""

    topology: str
    npus: int
    bandwidth_gbps: float
    latency_ns: float
    axes: tuple[str, ...] = ()
    tier: int = field(default=0, compare=False)
    """Which tier of the network file it lays out: 0 the node, 1 the scale-out network."""

    def as_json(self) -> dict:
        return {"topology": self.topology, "npus": self.npus, "bandwidth_gbps": self.bandwidth_gbps,
                "latency_ns": self.latency_ns, "axes": list(self.axes)}


@dataclass(frozen=True)
class Tier:
    """A preset's building block: a fabric whose domain holds `size` ranks (None: all the rest)."""

    topology: str
    size: int | None
    bandwidth_gbps: float
    latency_ns: float


def tiers(network: NetworkFile) -> tuple[Tier, ...]:
    """The tiers ASTRA-sim is handed for a network file: its node's switch, then the scale-out's."""
    node = network.node
    first = Tier("Switch", node.gpus, node.astra_sim_gbps, node.astra_sim_latency_ns)
    out = network.scale_out
    if out is None:
        return (first,)
    return first, Tier("Switch", None, out.astra_sim_gbps, out.astra_sim_latency_ns)


PRESETS: dict[str, tuple[Tier, ...]] = {name: tiers(network) for name, network in BUILTIN_NETWORKS.items()}
"""Built-in networks for `--network`, as ASTRA-sim's tiers; a network file (.toml) or a YAML file
in ASTRA-sim's format is the alternative."""


@dataclass(frozen=True)
class Network:
    """ASTRA-sim's network configuration, dimension 0 first."""

    dimensions: tuple[Dimension, ...]
    name: str
    cluster: NetworkFile | None = None
    """The network file it was laid out from (None: one given as ASTRA-sim's dimensions)."""

    @property
    def npus(self) -> int:
        return math.prod(d.npus for d in self.dimensions)

    def to_yaml(self) -> str:
        """The `--network-configuration` file of ASTRA-sim's analytical backends."""
        rows = {
            "topology": [d.topology for d in self.dimensions],
            "npus_count": [d.npus for d in self.dimensions],
            "bandwidth": [d.bandwidth_gbps for d in self.dimensions],
            "latency": [d.latency_ns for d in self.dimensions],
        }
        lines = [f"# {self.name}: " + ", ".join(_describe(d) for d in self.dimensions)]
        lines += [f"{key}: [ {', '.join(map(str, values))} ]" for key, values in rows.items()]
        return "\n".join(lines) + "\n"

    def dimensions_spanned(self, ranks: Sequence[int]) -> list[int]:
        """The dimensions in which some of `ranks` differ: where their traffic travels."""
        addresses = {self.address(rank) for rank in ranks}
        return [dim for dim in range(len(self.dimensions)) if len({a[dim] for a in addresses}) > 1]

    def address(self, rank: int) -> tuple[int, ...]:
        coords = []
        for dim in self.dimensions:
            rank, coord = divmod(rank, dim.npus)
            coords.append(coord)
        return tuple(coords)

    def as_json(self) -> dict:
        return {"name": self.name, "nccl": self.cluster.release if self.cluster else None,
                "dimensions": [d.as_json() for d in self.dimensions]}


def _describe(dim: Dimension) -> str:
    axes = "+".join(dim.axes) or "ranks"
    return f"{axes} {dim.npus} on {dim.topology} {dim.bandwidth_gbps:g} GB/s {dim.latency_ns:g} ns"


def mesh_axes(manifest: dict | None, num_ranks: int) -> list[tuple[str, int]]:
    """The mesh's (axis, size) pairs, outermost first, from a trace's manifest; one axis of every
    rank without one (another producer's trace)."""
    mesh = (manifest or {}).get("mesh") or {}
    names, shape = mesh.get("axis_names"), mesh.get("shape")
    if isinstance(names, list) and isinstance(shape, list) and len(names) == len(shape):
        return list(zip(names, shape))
    return [("ranks", num_ranks)]


def one_link(num_ranks: int, bandwidth_gbps: float, latency_ns: float, latency_named: bool = True) -> Network:
    """Every rank one hop from every other at one bandwidth and latency: `--link-gbps` and
    `--link-latency-us`; its name leaves the latency out where nothing times by it (NCCL's model)."""
    dimension = Dimension("FullyConnected", num_ranks, bandwidth_gbps, latency_ns, ("ranks",))
    name = f"one link of {bandwidth_gbps:g} GB/s" + (f", {latency_ns / 1e3:g} µs" if latency_named else "")
    return Network((dimension,), name, _cluster_of((dimension,), name))


def read_network_spec(spec: str) -> NetworkFile | Network:
    """What `spec` names, read and checked before any mesh: a preset's or network file's fabric,
    or an ASTRA-sim YAML file's dimensions (whose NPUs must then match the mesh's ranks)."""
    path = Path(spec)
    if spec in BUILTIN_NETWORKS or path.suffix == ".toml":
        return BUILTIN_NETWORKS.get(spec) or load_network_file(path)
    if path.suffix not in (".yml", ".yaml"):
        raise FlintError(f"unknown --network {spec!r}: use one of {', '.join(PRESETS)}, a network file "
                         "(.toml) or an ASTRA-sim network (.yml)")
    return read_network(path)


def network_for(spec: str, axes: Sequence[tuple[str, int]]) -> Network:
    """The network `spec` (a preset name, a network file or an ASTRA-sim YAML file) for a mesh of
    `axes` (name and size, outermost first, as the manifest records them)."""
    network = read_network_spec(spec)
    ranks = math.prod(size for _, size in axes)
    if isinstance(network, NetworkFile):
        gpus = network.node.gpus
        if network.scale_out is None and gpus is not None and ranks > gpus:
            # the one tier would otherwise take every rank: a node of `ranks` GPUs, its `gpus` ignored
            raise FlintError(f"network {spec} is one node of {gpus} GPUs and no [scale_out], but the trace has "
                             f"{ranks} ranks: add a [scale_out] to it, or give a network that has one")
        return Network(_lay_out(tiers(network), axes), network.name, network)
    if network.npus != ranks:
        sizes = "x".join(str(d.npus) for d in network.dimensions)
        raise FlintError(f"network {spec} has {network.npus} NPUs ({sizes}) but the trace has {ranks} ranks: "
                         "make npus_count multiply to the rank count")
    return network


def _lay_out(tiers: Sequence[Tier], axes: Sequence[tuple[str, int]]) -> tuple[Dimension, ...]:
    """One dimension per tier, over the mesh axes (innermost first), or their low factors, that fit
    in its domain; the last tier takes the rest. Once an axis spills over, every outer axis is
    outside too: a domain is a block of consecutive ranks. Of an axis, the largest factor that fits
    in the room left goes inside, so that a domain holds whole groups of the axes inside it and
    leaves GPUs idle where they do not divide it: 64 ranks in a 72-GPU NVL72 rack, or tensor 8 x
    data 16 as two racks of 64 (not 16 nodes of 8, as a factor that divides the room would give)."""
    pending = [(name, size) for name, size in reversed(axes) if size > 1]
    dimensions = []
    for index, tier in enumerate(tiers):
        last = index == len(tiers) - 1
        room, npus, names = tier.size or 1, 1, []
        outside: list[tuple[str, int]] = []
        for name, size in pending:
            inside = 1 if outside else size if last else _largest_factor(size, room)
            if inside > 1:
                npus, room, names = npus * inside, room // inside, [*names, name]
            if inside < size:
                outside.append((name, size // inside))
        if npus > 1:
            dimensions.append(Dimension(tier.topology, npus, tier.bandwidth_gbps, tier.latency_ns, tuple(names), index))
        pending = outside
    first = tiers[0]
    return tuple(dimensions) or (Dimension(first.topology, 1, first.bandwidth_gbps, first.latency_ns),)


def _largest_factor(size: int, room: int) -> int:
    """The largest factor of `size` that is at most `room`."""
    return max(f for f in range(1, min(size, room) + 1) if size % f == 0)


def read_network(path: Path) -> Network:
    """An ASTRA-sim network YAML (topology, npus_count, bandwidth, latency: one entry per dimension)."""
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise FlintError(f"network file {path} not found") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise FlintError(f"cannot read network file {path}: {_first_line(exc)}") from None
    keys = ("topology", "npus_count", "bandwidth", "latency")
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in keys):
        raise FlintError(f"network file {path} needs lists {', '.join(keys)} (ASTRA-sim's format)")
    if len({len(data[k]) for k in keys}) != 1 or not data["topology"]:
        raise FlintError(f"network file {path}: {', '.join(keys)} must have one entry per dimension each")
    dimensions = []
    for topology, npus, bandwidth, latency in zip(*(data[k] for k in keys)):
        if topology not in TOPOLOGIES:
            raise FlintError(f"network file {path}: topology {topology!r} is not one of {', '.join(TOPOLOGIES)}")
        if not (isinstance(npus, int) and npus >= 1 and _positive(bandwidth) and _positive(latency, zero=True)):
            raise FlintError(f"network file {path}: npus_count must be positive integers, bandwidth (GB/s) "
                             "positive and latency (ns) non-negative numbers")
        dimensions.append(Dimension(topology, npus, float(bandwidth), float(latency), tier=min(len(dimensions), 1)))
    return Network(tuple(dimensions), str(path), _cluster_of(tuple(dimensions), str(path)))


def _cluster_of(dimensions: Sequence[Dimension], name: str) -> NetworkFile:
    """What NCCL's model times on for a network given as ASTRA-sim's dimensions: dimension 0 is a
    node of NVLink-connected GPUs at its bandwidth, the second one NIC per GPU at its own (a third
    NCCL's model refuses: `flint.step.models.collective_model`)."""
    first = dimensions[0]
    node = NodeTier(first.npus if len(dimensions) > 1 else None, "nvlink", first.bandwidth_gbps * GIB / 1e9,
                    astra_sim_gbps=first.bandwidth_gbps, astra_sim_latency_ns=first.latency_ns)
    out = None
    if len(dimensions) > 1:
        second = dimensions[1]
        out = ScaleOut(first.npus, second.bandwidth_gbps * GIB / 1e9, channels_per_nic(first.npus, node),
                       astra_sim_gbps=second.bandwidth_gbps,
                       astra_sim_latency_ns=second.latency_ns)
    return NetworkFile(name, "hopper", "other", node, out,
                       (("network", "ASTRA-sim's dimensions: the first a node of NVLink-connected GPUs, the rest "
                                     "one NIC per GPU; NCCL's Hopper constants"),))


def _positive(value, zero: bool = False) -> bool:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return ok and (value >= 0 if zero else value > 0)


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__

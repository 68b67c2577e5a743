"""Network files: a cluster's fabric, each number with its source, as device files are for GPUs.

A network file (TOML; the built-in ones are `networks/*.toml`) describes two tiers:

- `[node]`: the GPUs that share a scale-up fabric (`gpus`; absent: every rank), its `link` (nvlink
  or pci: NCCL's latency class), the bus bandwidth NCCL's rings reach (`bus_gbps`, GB/s of 10^9
  bytes), a GPU's NVLinks together as NCCL's topology counts them (`nvlink_gbps`: topo.h's
  bandwidth per link times the links; absent: `bus_gbps`), in which NCCL's search fits NVLS's
  channels, its `channels`, and where the switches reduce in the network (NVLink SHARP, NCCL's NVLS)
  the all-reduce bus bandwidth by GPUs in the node (`nvls_bus_gbps`, 1, 2, ... GPUs; the last entry
  holds for more: what the largest sizes reach), NVLS's latency (an all-reduce's time for no bytes)
  and what each round of its chunks costs besides its bytes (`nvls_latency_us`, `nvls_step_us`;
  `flint.step.nccl`; NVLS-Tree across nodes moves through each node alike); where a node's rings
  run slower than NCCL's tuner constants say, one step of a Simple ring within the node
  (`ring_simple_hop_us`; absent: NCCL's hardware latency for the link) and the share of the ring's
  bus bandwidth LL128 reaches there (`ll128_bus_fraction`; absent: NCCL's 0.92), both fitted by
  `flint calibrate --network` to runs on one node and applied to rings of one node;
- `[scale_out]` (absent: one node): `nics` per node at `nic_gbps` each, the `channels` NCCL's graph
  search finds between nodes for a whole node's GPUs (absent: one per NIC, at most the node's
  `channels`; NCCL's per-channel caps multiply it), a network latency (`latency_us`, NCCL's
  `latencyInter`), and `sharp` where the scale-out switches reduce (CollNet).

`architecture` (ampere, hopper, blackwell) and `cpu` (intel, amd, other: not x86) pick NCCL's
constants (`networks/nccl.toml`). `nccl` (a release, such as "2.26.2", or a minor version, "2.26",
for its newest release; absent: the newest release Flint has) is the NCCL the cluster runs: its
tuner picks each collective's algorithm and protocol as that release would, and Flint times it
(`flint.step.nccl`).
Each tier also gives the link bandwidth and hop latency ASTRA-sim's analytical backend is handed
(`astra_sim_gbps`, `astra_sim_latency_ns`): `flint.step.network` lays those out over the mesh.
`flint calibrate --network` writes a file of this form.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path

import tomllib

from flint.errors import (
    FlintError, fraction_field, invalid, known_keys, number_field, optional_field, read_toml, sources_field,
)

FOLDER = "networks"
CONSTANTS = "nccl.toml"
"""NCCL's constants, beside the network files and not one of them."""
ARCHITECTURES = ("ampere", "hopper", "blackwell")
CPUS = ("intel", "amd", "other")
X86 = ("intel", "amd")
"""The CPUs NCCL knows as x86; `other` stands for the rest (Arm's Grace, POWER)."""
LINKS = ("nvlink", "pci")
TOP_LEVEL = ("name", "architecture", "cpu", "nccl", "node", "scale_out", "sources")
"""A network file's keys and tables."""


@dataclass(frozen=True)
class NodeTier:
    """The GPUs of one node and their fabric (see the module docstring); `gpus` None: every rank."""

    gpus: int | None
    link: str
    bus_gbps: float
    channels: int = 16
    nvlink_gbps: float | None = None
    nvls_bus_gbps: tuple[float, ...] = ()
    nvls_latency_us: float = 0.0
    nvls_step_us: float = 0.0
    ring_simple_hop_us: float | None = None
    ll128_bus_fraction: float | None = None
    astra_sim_gbps: float = 400.0
    astra_sim_latency_ns: float = 936.25

    @property
    def nvls(self) -> bool:
        return bool(self.nvls_bus_gbps)

    @property
    def topology_gbps(self) -> float:
        """A GPU's NVLinks together as NCCL's topology counts them: `nvlink_gbps`, else `bus_gbps`.
        Kept apart from the rings' measured bandwidth, which a fit moves: NCCL's search fits NVLS's
        channels in the topology's figure at speeds of a fixed table, so a ring fitted a little
        below it would otherwise lose NVLS a whole speed."""
        return self.bus_gbps if self.nvlink_gbps is None else self.nvlink_gbps

    def nvls_bus(self, gpus: float) -> float:
        """NVLS all-reduce bus bandwidth for `gpus` GPUs of one node."""
        table = self.nvls_bus_gbps
        return table[max(0, min(len(table), math.ceil(gpus)) - 1)]


@dataclass(frozen=True)
class ScaleOut:
    """The network between nodes: `nics` per node of `nic_gbps` each, and NCCL's `channels` between
    nodes for a whole node (its graph search's, before it doubles a few fast ones)."""

    nics: int
    nic_gbps: float
    channels: float
    latency_us: float = 0.0
    sharp: bool = False
    astra_sim_gbps: float = 50.0
    astra_sim_latency_ns: float = 2000.0


def channels_per_nic(nics: int, node: NodeTier) -> float:
    """NCCL's channels between nodes where a network does not give them: its graph search gives each
    NIC one channel, at most the node's `channels`."""
    return min(nics, node.channels)


@dataclass(frozen=True)
class NetworkFile:
    """A cluster's fabric: its node, the network between nodes (None: one node), NCCL's constants'
    `architecture` and `cpu`, the NCCL release the file names (None: none; `release` is the one
    whose tuner picks), and each number's source."""

    name: str
    architecture: str
    cpu: str
    node: NodeTier
    scale_out: ScaleOut | None = None
    sources: tuple[tuple[str, str], ...] = ()
    nccl: str | None = None

    @property
    def release(self) -> str:
        """The NCCL release whose tuner picks the collectives: the file's `nccl`, else the newest
        Flint has, as a cluster that states none most likely runs a current NCCL."""
        return self.nccl or nccl_releases()[-1]

    def with_sources(self, **sources: str) -> NetworkFile:
        return replace(self, sources=tuple(sorted({**dict(self.sources), **sources}.items())))


@functools.cache
def nccl_constants() -> dict:
    """NCCL's tuner constants and releases (`networks/nccl.toml`)."""
    return tomllib.loads((resources.files(__package__) / FOLDER / CONSTANTS).read_text())


def nccl_releases() -> list[str]:
    """The NCCL releases Flint has the tuners of, oldest first."""
    return [entry["version"] for entry in reversed(nccl_constants()["release"])]


def nccl_release(version: str) -> str:
    """The release of NCCL `version` names: itself, or for a minor version ("2.26") its newest."""
    releases = nccl_releases()
    found = [r for r in releases if version in (r, r.rsplit(".", 1)[0])]
    if not found:
        raise ValueError(f"nccl is {version!r}: Flint has the tuners of NCCL {releases[0]} to {releases[-1]} "
                         f"({', '.join(releases)}); give one of those, or leave nccl out")
    return found[-1]


def _builtin() -> dict[str, NetworkFile]:
    folder = resources.files(__package__) / FOLDER
    found = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml") and entry.name != CONSTANTS:
            network = parse_network(tomllib.loads(entry.read_text()), entry.name)
            found[network.name] = network
    return found


def load_network_file(path: Path) -> NetworkFile:
    """A user's network file (.toml)."""
    return parse_network(read_toml(path, "network file"), str(path))


def parse_network(data: dict, origin: str) -> NetworkFile:
    """A network from a file's table, each number checked; one line where one is wrong."""
    try:
        known_keys(data, TOP_LEVEL)
        node = data["node"]
        if not isinstance(node, dict):
            raise TypeError("node is not a table")
        known_keys(node, [f.name for f in fields(NodeTier)], "node")
        tier = NodeTier(
            gpus=_count(node, "gpus") if "gpus" in node else None,
            link=_choice(node, "link", LINKS, "nvlink"),
            bus_gbps=number_field(node, "bus_gbps", positive=True),
            channels=_count(node, "channels") if "channels" in node else NodeTier.channels,
            nvlink_gbps=optional_field(number_field, node, "nvlink_gbps", positive=True),
            nvls_bus_gbps=tuple(_numbers(node, "nvls_bus_gbps")),
            nvls_latency_us=number_field(node, "nvls_latency_us", default=NodeTier.nvls_latency_us),
            nvls_step_us=number_field(node, "nvls_step_us", default=NodeTier.nvls_step_us),
            ring_simple_hop_us=optional_field(number_field, node, "ring_simple_hop_us"),
            ll128_bus_fraction=optional_field(fraction_field, node, "ll128_bus_fraction"),
            astra_sim_gbps=number_field(node, "astra_sim_gbps", positive=True, default=NodeTier.astra_sim_gbps),
            astra_sim_latency_ns=number_field(node, "astra_sim_latency_ns", default=NodeTier.astra_sim_latency_ns),
        )
        out = data.get("scale_out")
        scale_out = None
        if out is not None:
            if not isinstance(out, dict):
                raise TypeError("scale_out is not a table")
            known_keys(out, [f.name for f in fields(ScaleOut)], "scale_out")
            nics = _count(out, "nics")
            scale_out = ScaleOut(
                nics=nics,
                nic_gbps=number_field(out, "nic_gbps", positive=True),
                channels=number_field(out, "channels", positive=True, default=channels_per_nic(nics, tier)),
                latency_us=number_field(out, "latency_us", default=ScaleOut.latency_us),
                sharp=_flag(out, "sharp", ScaleOut.sharp),
                astra_sim_gbps=number_field(out, "astra_sim_gbps", positive=True, default=ScaleOut.astra_sim_gbps),
                astra_sim_latency_ns=number_field(out, "astra_sim_latency_ns", default=ScaleOut.astra_sim_latency_ns),
            )
        if tier.gpus is None and scale_out is not None:
            raise ValueError("a [scale_out] needs node.gpus: how many GPUs share a node")
        network = NetworkFile(
            name=str(data["name"]),
            architecture=_choice(data, "architecture", ARCHITECTURES, "hopper"),
            cpu=_choice(data, "cpu", CPUS, "other"),
            nccl=_release(data["nccl"]) if "nccl" in data else None,
            node=tier,
            scale_out=scale_out,
            sources=sources_field(data),
        )
    except (KeyError, TypeError, ValueError) as exc:
        needs = "it needs name, [node] bus_gbps, and in a [scale_out] nics and nic_gbps"
        raise FlintError(f"network file {origin!r} is not valid: {invalid(exc, needs)}") from None
    return network


def _release(value) -> str:
    """The `nccl` key: a release in quotes. A bare number is refused, as TOML reads 2.30 as 2.3."""
    if not isinstance(value, str):
        raise TypeError(f"nccl is {value!r}, not text: give the release in quotes (nccl = \"2.26.2\")")
    return nccl_release(value)


def network_toml(network: NetworkFile, header: str) -> str:
    """The file of `network`, as `parse_network` reads it back."""
    node, out = network.node, network.scale_out
    lines = [f"# {_escaped(header)}", f"name = {toml_string(network.name)}",
             f"architecture = {toml_string(network.architecture)}", f"cpu = {toml_string(network.cpu)}"]
    if network.nccl is not None:
        lines.append(f"nccl = {toml_string(network.nccl)}")
    lines += ["", "[node]"]
    if node.gpus is not None:
        lines.append(f"gpus = {node.gpus}")
    lines += [f"link = {toml_string(node.link)}", f"bus_gbps = {node.bus_gbps:g}", f"channels = {node.channels}"]
    if node.nvlink_gbps is not None:
        lines.append(f"nvlink_gbps = {node.nvlink_gbps:g}")
    if node.nvls:
        lines += [f"nvls_bus_gbps = [{', '.join(f'{v:g}' for v in node.nvls_bus_gbps)}]",
                  f"nvls_latency_us = {node.nvls_latency_us:g}", f"nvls_step_us = {node.nvls_step_us:g}"]
    if node.ring_simple_hop_us is not None:
        lines.append(f"ring_simple_hop_us = {node.ring_simple_hop_us:g}")
    if node.ll128_bus_fraction is not None:
        lines.append(f"ll128_bus_fraction = {node.ll128_bus_fraction:g}")
    lines += [f"astra_sim_gbps = {node.astra_sim_gbps:g}", f"astra_sim_latency_ns = {node.astra_sim_latency_ns:g}"]
    if out is not None:
        lines += ["", "[scale_out]", f"nics = {out.nics}", f"nic_gbps = {out.nic_gbps:g}",
                  f"channels = {out.channels:g}", f"latency_us = {out.latency_us:g}",
                  f"sharp = {'true' if out.sharp else 'false'}",
                  f"astra_sim_gbps = {out.astra_sim_gbps:g}", f"astra_sim_latency_ns = {out.astra_sim_latency_ns:g}"]
    if network.sources:
        lines += ["", "[sources]"] + [f"{toml_string(key)} = {toml_string(value)}" for key, value in network.sources]
    return "\n".join(lines) + "\n"


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _escaped(text: str) -> str:
    """`text` as the inside of a TOML basic string: TOML forbids a bare quotation mark, backslash or
    control character there (a name such as a"b would end the string early: the file would not
    load), and a newline in a comment would start a line of its own."""
    return "".join(_ESCAPES.get(c, f"\\u{ord(c):04x}" if c < " " or c == "\x7f" else c) for c in text)


def toml_string(text: str) -> str:
    """`text` as a TOML basic string, for the files Flint writes (network and device files)."""
    return f'"{_escaped(text)}"'


def _numbers(table: dict, key: str) -> list[float]:
    values = table.get(key, [])
    if not isinstance(values, list):
        raise TypeError(f"{key} is {values!r}, not a list of numbers")
    return [number_field({key: v}, key, positive=True) for v in values]


def _count(table: dict, key: str) -> int:
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} is {value!r}, not a positive integer")
    return value


def _flag(table: dict, key: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{key} is {value!r}, not true or false")
    return value


def _choice(table: dict, key: str, choices: tuple[str, ...], default: str) -> str:
    value = table.get(key, default)
    if value not in choices:
        raise ValueError(f"{key} is {value!r}, not one of {', '.join(choices)}")
    return value


BUILTIN_NETWORKS: dict[str, NetworkFile] = _builtin()
"""The networks of the files in `networks/`, by name: `--network NAME`."""


def network_named(name: str) -> NetworkFile:
    """`--network NAME` where only a network file will do (a fit's starting point): a built-in
    network or a .toml file; one line where it is neither."""
    network = BUILTIN_NETWORKS.get(name) or (load_network_file(Path(name)) if name.endswith(".toml") else None)
    if network is None:
        raise FlintError(f"unknown --network {name!r}: use one of {', '.join(BUILTIN_NETWORKS)} or a .toml file")
    return network

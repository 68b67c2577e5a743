"""How long a collective takes as NCCL runs it: its algorithms, protocols and tuner.

NCCL predicts, for each collective, size and communicator, the time of every algorithm and protocol
it has on the machine and runs the one it predicts fastest (NVIDIA/nccl src/graph/tuning.cc). Flint
picks as that tuner does (below, "Which runs") and times the pick with NCCL's constants
(`networks/nccl.toml`, each from tuning.cc) and the machine's bandwidths from its network file
(`flint.step.network_files`, each with its source). For a group of N ranks on
`nodes` nodes, ppn = N / nodes of them per node, and nBytes as NCCL counts them (the whole buffer;
an all-gather's output, a reduce-scatter's input):

    time = latency(algorithm, protocol) + nBytes / (algorithm bandwidth x launched / channels)

NCCL chooses by that time with every channel launched; its runtime then launches fewer for a small
Ring or Tree collective (see `_launched_share`), which the time counts. NVLS and NVLS-Tree are
timed by their chunks (below, "NVLS's chunks").

**Which runs.** What NCCL's tuner predicts fastest, whether or not it is: the tuner of the release
the network file names (`nccl`, 2.18.1 to 2.30.7), else of the newest (`NetworkFile.release`)
(`Tuner`: NCCL's own constants where Flint fitted its own, no size correction of NVLS but
NVLS-Tree's on Blackwell with x86 hosts from 2.29.2, NVLS in one node from the graph NCCL's search
finds there rather than from the measured bandwidth, the release's tables, and the formulas that
changed: NVLS's before 2.28 and 2.19, Ring LL's share before 2.21, the tree's latency, a ring's
network steps and PAT before 2.23), timed as above: releases differ in where they leave the tree
for NVLS-Tree and Ring LL for NVLS, and the measured runs follow their own.

**Bandwidths.** The bus bandwidth B of the fabric a step crosses: the node's `bus_gbps` inside one
node; between nodes the least of it and the NICs of the group's GPUs (ppn x nics / gpus x
nic_gbps), of which NCCL's graph reaches at most one per channel (`scale_out.channels` for a whole
node, so 16 of NVL72's 72). Then, per algorithm and protocol (tuning.cc's "model refinements"):

| algorithm (when)                      | bus bandwidth                                   | algorithm bandwidth    |
|---------------------------------------|-------------------------------------------------|------------------------|
| Ring, LL                              | min(B / 2, llMax)                               | bus x N / steps        |
| Ring, LL128                           | min(f B, channels x ringLL128 per channel)      | bus x N / steps        |
| Ring, Simple                          | B                                               | bus x N / steps        |
| Tree (all-reduce, > 1 node)           | min(0.92 B, channels x tree per channel), then  | bus / 2, x NCCL's tree |
|                                       | LL: min(x / 3.8, llMax); LL128: min(x 120/128,  | correction by size     |
|                                       | channels x treeLL128 per channel)               | below 512 MB           |
| NVLS (all-reduce; 1 node, or SHARP)   | min(nvls_bus_gbps[ppn], B between nodes)        | bus x N / steps, by    |
|                                       |                                                 | its chunks             |
| NVLS (all-gather, reduce-scatter;     | nvls_bus_gbps[ppn]                              | bus x (ppn-1) / 2 ppn, |
| 1 node)                               |                                                 | by its chunks          |
| NVLS-Tree (all-reduce, > 1 node)      | min(nvls_bus_gbps[ppn], NICs (x2 on 2 nodes),   | bus x N / steps, by    |
|                                       | channels x NVLS-tree per channel)               | its chunks             |
| CollNet Direct (all-reduce, SHARP)    | 0.85 B                                          | bus / 2                |
| PAT (all-gather, reduce-scatter,      | 0.75 B                                          | bus                    |
| one GPU per node)                     |                                                 |                        |

The correction is NCCL's tree correction by size (Simple's row), which NCCL's tuner applies to
NVLS-Tree only on Blackwell with x86 hosts; Flint's times give NVLS-Tree its ramp by its chunks.

**NVLS's chunks** (`_nvls_pipeline`). NCCL's kernel moves NVLS in rounds: each of its channels (in
one node 16 on Hopper, 24 on Blackwell: transport/nvls.cc) has a head per GPU, and channels x heads
chunks move at once (128 on 8x H100). The chunk is 128 KiB, halved as the bytes shrink (enqueue.cc
calcCollChunking: on 8x H100 64 KiB below 1 GiB, 32 KiB below 64 MiB, 16 KiB below 8 MiB), and
each chunk passes through the kernel's warp groups in turn (an all-reduce's scatter, reduce and
broadcast, gather: 3 stages; an all-gather's or reduce-scatter's 2). So R rounds of W bytes take

    time = nvls_latency_us - 3 step + (R + stages - 1) x (step + W / P),   R = nBytes / W >= 1

(one round of fewer bytes: stages x (step + nBytes / P)), with the node's `nvls_step_us` as step
and P the algorithm bandwidth at which rounds of the largest chunks reach the table's (from
`nvls_bus_gbps`, which the largest sizes measure): 1 / P = 1 / table - step / W(largest). An
all-reduce of no bytes takes `nvls_latency_us`. Fitted to NVIDIA's 8x H100 sample (21.0 µs, 4.8 µs
a round), this gives its 2 MiB to 16 GiB within 0.98 to 1.04 (8 MiB: 1.00, where the tree
correction gave 0.86). NCCL's tuner has no such term: it predicts NVLS by its latency and bandwidth.

Across nodes the chunks move through each node alike, after the network's hops (below), at
NVLS-Tree's bandwidth: 16 channels on Hopper, 32 on Blackwell; the chunk at most 128 KiB, 64 KiB
from 4 nodes, halved below 4 rounds and again below one (enqueue.cc); 3 stages, as the tree's root
runs them (its kernel reduces what its children send and broadcasts in one warp group, as one node
does; the other nodes split that group in two around the network). NVLS with SHARP across nodes
takes NVLS's chunks, at most 32 KiB where its algorithm bandwidth is below 150 GB/s. On the
XE9680, gj-aion and Nebius runs of two 8x H100 nodes this gives 0.95 to 1.02 of the measured time
from 32 MB (the tree correction by size, which Flint borrowed before, 0.86 to 1.06).

steps = 2(N-1) for an all-reduce, N-1 for an all-gather or reduce-scatter, N for a broadcast:
so nccl-tests' bus bandwidth of a ring is B. f is NCCL's 0.92, or on one node the network's
`ll128_bus_fraction` where a fit to measured collectives gives one. channels: those of NCCL's
graph, which its caps per channel (by architecture and 1, 2 or more nodes) multiply: in one node
the node's `channels`; between nodes `scale_out.channels` for a whole node (one per NIC: 8 on 8x
H100), in proportion for fewer of its GPUs, doubled for a ring or tree where NCCL doubles them.

**Latencies** (base[a][p] + hops; intra = hwLat[nvlink or pci][a][p], or for a Simple ring on
one node the network's `ring_simple_hop_us` where a fit gives one; inter = hwLat[net][a][p] +
latencyInter, twice latencyInter for Simple, and the Tree's hwLat with one GPU per node):

- Ring: base + (steps - inter steps) x max(intra, net overhead (x3 for Simple) across nodes) +
  inter steps x inter, with inter steps 2(nodes-1) for an all-reduce, nodes-1 otherwise; a
  broadcast pays one hop; a Simple all-reduce across nodes of at least 64 B per channel and rank
  pays its latency 1.4 times (the ring's plateau).
- Tree: base + 2((ppn-1) intra + log2(nodes) inter).
- NVLS: the node's `nvls_latency_us`, and its chunks (above); across nodes (SHARP) + inter;
  NVLS-Tree: + 2 log2(nodes) inter.
- CollNet Direct: base + 2(min(1, ppn-1) intra + 0.4 (ppn-1)) + inter.
- PAT: base + log2(nodes) inter / 3.5 + 2.8 N.

Which exist (tuning.cc, enqueue.cc): Tree and NVLS-Tree only across nodes; NVLS on nodes with
NVLink SHARP, across nodes only with SHARP in the network (as CollNet Direct, which needs at most 8
GPUs in the node); LL128 on NVLink nodes (not over PCI); PAT with one GPU per node; broadcast on
the ring only; NVLS for an all-gather or reduce-scatter in one node (across nodes NCCL needs
CollNet for it) of at most 32 GPUs (NCCL's runtime skips it above NCCL_MAX_NVLS_ARITY from 2.26;
Flint in every release), at (ppn - 1) / 2 ppn of NVLS's all-reduce bus bandwidth as NCCL's tuner
has it (`_nvls_gather_share`; before 2.28 its tuner predicts the NVLS graph's nChannels x bwIntra,
with no 5/6 from 2.23). By these times a ring is faster on 8-GPU nodes, and from a few megabytes
on 32 GPUs of an NVL72 rack; NCCL's tuners predict NVLS for 16 to 32 GPUs of an NVL72 rack at some
sizes, so it runs there, as Flint times it.

**All-to-all and SEND/RECV** are not tuned collectives in NCCL but grouped point-to-point
transfers: latency base[ring][Simple] + intra hop (+ inter across nodes), and the bytes for other
nodes through the NICs (per GPU: nics / gpus x nic_gbps), those for the node over its links (B),
both at once: a SEND/RECV of S bytes moves S, an all-to-all of S bytes per rank (S / N to each
member) moves S (N - ppn) / N between nodes and S (ppn - 1) / N inside.

Concurrent collectives do not slow each other down (NCCL's model does not model it either).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from flint.errors import FlintError
from flint.schema import et_def_pb2 as pb
from flint.step.network import Network
from flint.step.network_files import X86, NetworkFile, nccl_constants, nccl_releases

PROTOCOLS = ("LL", "LL128", "Simple")
ALGORITHMS = ("Ring", "Tree", "NVLS", "NVLS-Tree", "CollNet", "PAT")
_KEYS = {"Ring": "ring", "Tree": "tree", "NVLS": "nvls", "NVLS-Tree": "nvls_tree", "CollNet": "collnet_direct",
         "PAT": "pat"}
TIMED = frozenset({pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_TO_ALL, pb.BROADCAST})
"""The collectives this model times (every one Chakra names)."""
SEND_RECV = -1
"""Not a Chakra collective: a SEND/RECV pair, for `choose` (as nccl-tests' sendrecv_perf times one,
each rank sending to the next)."""


NCCL = nccl_constants()
"""NCCL's tuner constants (`networks/nccl.toml`)."""
NVLS_RATIO_BEFORE_2_28 = 5 / 6
"""NVLS's and NVLS-Tree's algorithm bandwidth per bus bandwidth in NCCL's tuner before 2.28
(tuning.cc: ratio *= 5.0/6.0)."""
NVLS_TREE_RATIO_BEFORE_2_19 = 0.70
"""NVLS-Tree's before 2.19, times nodes / 2(nodes - 1) (tuning.cc: ratio = .70 * nNodes / (2*(nNodes-1)))."""


@dataclass(frozen=True)
class Tuner:
    """What one NCCL release's tuner predicts a collective's time with (`nccl.toml`'s [[release]],
    where each setting is explained): its tables and the formulas that changed between releases.
    NCCL runs what this predicts fastest, whether or not it is. Flint's own times take the newest
    release's (`NEWEST`) except where it fitted its own to measured runs (NVLS's latency, a Simple
    ring's step inside a node, LL128's share of a ring) and NVLS's chunks."""

    release: str
    architecture: dict
    base_latency_us: dict
    hop_latency_us: dict
    nvls_tree_corrected: bool
    nvls_before_2_28: bool
    nvls_before_2_19: bool
    nvls_gather_ratio: float
    ring_ll_bus_fraction: list
    ring_ll128_one_per_node_fraction: float
    ring_all_reduce_extra_net_steps: int
    one_per_node_net_hop_from_tree: bool
    pat_bus_fraction: float
    collnet_arity_us: float


TABLES = ("architecture", "base_latency_us", "hop_latency_us")
"""The tables of `nccl.toml` a release may change entries of."""


@functools.cache
def release_tuner(release: str) -> Tuner:
    """The tuner of NCCL `release` (one `nccl.toml` lists): 2.30.7's tables, then each newer
    release's changes back to it."""
    tables = {key: copy.deepcopy(NCCL[key]) for key in TABLES}
    settings: dict = {}
    for entry in NCCL["release"]:
        settings.update({k: v for k, v in entry.items() if k != "version" and k not in TABLES})
        for key in TABLES:
            _merge(tables[key], entry.get(key, {}))
        if entry["version"] == release:
            return Tuner(release, **tables, **settings)
    raise FlintError(f"Flint has no tuner of NCCL {release}: give a release that nccl.toml lists")


def _merge(into: dict, changes: dict) -> None:
    for key, value in changes.items():
        if isinstance(value, dict):
            _merge(into[key], value)
        else:
            into[key] = value


NEWEST = release_tuner(nccl_releases()[-1])
"""The newest release's tuner, whose constants Flint's own times take."""


@dataclass(frozen=True)
class Choice:
    """What NCCL runs for one collective: the algorithm, the protocol and the time (µs)."""

    algorithm: str
    protocol: str
    micros: float


@dataclass(frozen=True)
class Placement:
    """A group as NCCL sees it: its ranks, and on how many nodes."""

    ranks: int
    nodes: int

    @property
    def ppn(self) -> float:
        return self.ranks / self.nodes


@dataclass(frozen=True, eq=False)
class NcclModel:
    """Communication times as NCCL's tuner would pick them on `network` (laid over the mesh; its
    file, `network.cluster`, holds the bandwidths). See the module docstring."""

    network: Network
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def cluster(self) -> NetworkFile:
        assert self.network.cluster is not None
        return self.network.cluster

    def unmodelled(self) -> list[str]:
        return []

    def times(self, comm_type: int) -> bool:
        return comm_type in TIMED

    # -- where a group's ranks are ---------------------------------------------------------------

    @property
    def node_ranks(self) -> int:
        """How many consecutive ranks share a node (the dimensions laid out for the node tier)."""
        return math.prod(d.npus for d in self.network.dimensions if d.tier == 0)

    def group_shape(self, ranks: Sequence[int]) -> Placement:
        """What a collective's time depends on besides its kind and size: the group's size and
        how many nodes it spans. Groups of one shape take the same time."""
        key = ("shape", ranks if isinstance(ranks, tuple) else tuple(ranks))
        if key not in self._cache:
            per_node = self.node_ranks
            self._cache[key] = Placement(len(ranks), len({rank // per_node for rank in key[1]}))
        return self._cache[key]

    # -- timing --------------------------------------------------------------------------------

    def collective_micros(self, comm_type: int, nbytes: int, ranks: Sequence[int]) -> float:
        """A collective of `nbytes` (Chakra's `comm_size`) over `ranks`, in µs."""
        if len(ranks) < 2 or comm_type not in TIMED:
            return 0.0
        return self.shaped_micros(comm_type, nbytes, self.group_shape(ranks))

    def shaped_micros(self, comm_type: int, nbytes: int, shape: Placement) -> float:
        key = (comm_type, int(nbytes), shape)
        if key not in self._cache:
            self._cache[key] = self.choose(comm_type, int(nbytes), shape).micros
        return self._cache[key]

    def transfer_micros(self, src: int, dst: int, nbytes: float) -> float:
        """A SEND/RECV of `nbytes` from rank `src` to `dst`, in µs."""
        per_node = self.node_ranks
        return self._pair_micros(nbytes, src // per_node != dst // per_node)

    def choose(self, comm_type: int, nbytes: int, shape: Placement, algorithm: str | None = None,
               protocol: str | None = None) -> Choice:
        """NCCL's choice for a collective of Chakra's `comm_type` and `nbytes` over a group of
        `shape`: what its tuner predicts fastest of what the machine has (of that `algorithm` and
        `protocol` where given, as NCCL_ALGO and NCCL_PROTO hold NCCL to them), as Flint times it."""
        if comm_type == pb.ALL_TO_ALL:
            return Choice("P2P", "Simple", self._all_to_all(nbytes, shape))
        if comm_type == SEND_RECV:  # the slowest pair: between nodes where the group spans several
            return Choice("P2P", "Simple", self._pair_micros(nbytes, shape.nodes > 1))
        total = nbytes * shape.ranks if comm_type == pb.ALL_GATHER else nbytes
        options = [(a, p, lat, bw) for a, p, lat, bw in self.candidates(comm_type, total, shape)
                   if bw > 0 and algorithm in (None, a) and protocol in (None, p)]
        if not options:
            raise FlintError(f"NCCL has no {forced_name(algorithm, protocol)} here for this collective: "
                             "choose another algorithm or protocol")
        # the tuner's pick, predicted as if every channel ran; then Flint's time on the channels launched
        tuner = release_tuner(self.cluster.release)
        predicted = {(a, p): lat + total / (bw * 1e3)
                     for a, p, lat, bw in self.candidates(comm_type, total, shape, tuner) if bw > 0}
        name, proto, latency, bandwidth = min(options, key=lambda o: predicted.get(o[:2], math.inf))
        share = self._launched_share(name, proto, total, shape)
        return Choice(name, proto, latency + total / (bandwidth * share * 1e3))

    def candidates(self, comm_type: int, total: int, shape: Placement,
                   tuner: Tuner | None = None) -> list[tuple[str, str, float, float]]:
        """(algorithm, protocol, latency µs, algorithm bandwidth GB/s) of everything NCCL can run
        for this collective of `total` bytes (as NCCL counts them) on this group: as Flint times
        them, or as `tuner` predicts them."""
        found = []
        for algorithm in self._algorithms(comm_type, shape):
            for protocol in PROTOCOLS:
                if algorithm in ("NVLS", "NVLS-Tree", "CollNet", "PAT") and protocol != "Simple":
                    continue
                if protocol == "LL128" and not self._ll128():
                    continue
                bus = self._bus(algorithm, protocol, comm_type, shape, tuner)
                bandwidth = self._algorithm_bandwidth(bus, algorithm, protocol, comm_type, total, shape, tuner)
                latency = self._latency(algorithm, protocol, comm_type, total, shape, tuner)
                if _chunked(algorithm, tuner) and bandwidth > 0:
                    latency, bandwidth = self._nvls_pipeline(algorithm, comm_type, latency, bandwidth, total, shape)
                found.append((algorithm, protocol, latency, bandwidth))
        return found

    def _nvls_pipeline(self, algorithm: str, comm_type: int, latency: float, bandwidth: float, total: int,
                       shape: Placement) -> tuple[float, float]:
        """NVLS or NVLS-Tree as its kernel moves `total` bytes through each node (Flint's times;
        `nvls_chunks` and `nvls_tree_chunks` in nccl.toml): in rounds of channels x heads chunks
        (on 8x H100 16 x 8 = 128 at once), each round costing the node's `nvls_step_us` plus its
        bytes at the pipeline's bandwidth and passing through the kernel's stages in turn (3 for
        an all-reduce), so that R rounds take R + stages - 1 rounds' time; one round of less than
        whole chunks takes `stages` of its own. NCCL halves the chunk as the bytes shrink (16 KB
        below 8 MiB on one 8x H100 node), which is the ramp measured runs show between a latency
        and the bandwidth, and which NCCL's tuner does not model. `latency` is the node's
        `nvls_latency_us` (an all-reduce's time for no bytes in one node) and across nodes the
        network's hops; the pipeline's bandwidth is what makes rounds of the largest chunks reach
        `bandwidth` (NVLS's from the node's `nvls_bus_gbps`, which the largest sizes measure;
        NVLS-Tree's bounded by the NICs too). Returned as the (latency, bandwidth) that give that
        time for these bytes."""
        stages = NCCL["nvls_chunks"]["stages"]
        step, depth = self.cluster.node.nvls_step_us, stages[_STAGES[comm_type]]
        ops, largest = self._nvls_ops(algorithm, shape), self.largest_nvls_chunk(shape, algorithm, bandwidth)
        chunk = self.nvls_chunk(total, shape, algorithm, bandwidth)
        per_byte = 1 / (bandwidth * 1e3) - step / (ops * largest)  # µs a byte at the pipeline's bandwidth
        if per_byte <= 0:
            raise FlintError(f"network {self.cluster.name}: NVLS's step ({step:g} µs, node.nvls_step_us) outlasts a "
                             f"round of its largest chunks at node.nvls_bus_gbps ({ops * largest / (bandwidth * 1e3):.1f}"
                             f" µs on {math.ceil(shape.ppn)} GPUs): give a shorter step or a higher bandwidth")
        start = latency - stages["all_reduce"] * step
        whole = ops * chunk
        if total < whole:
            return start + depth * step, 1 / (depth * per_byte * 1e3)
        return start + (depth - 1) * (step + whole * per_byte), 1 / ((step / whole + per_byte) * 1e3)

    def _launched_share(self, algorithm: str, protocol: str, total: int, shape: Placement) -> float:
        """The share of its channels NCCL's runtime launches a Ring or Tree collective of `total`
        bytes on (enqueue.cc topoGetAlgoInfo): as many as give each of their threads at least the
        protocol's threshold of bytes, at least one. Each launched channel carries its bytes at
        its share of the bandwidth, so from one channel's worth of bytes to every channel's the
        time holds at a plateau. Below one channel's worth NCCL also halves its threads; that is
        not counted (NVIDIA's 8x H100 sample gains 0.7 µs from 4 to 16 KB, where a channel with
        as few threads as the bytes would hold at the plateau). NVLS and NVLS-Tree keep their
        own channels, PAT all of them (NCCL sets no thread count for PAT that would reduce them).
        CollNet Direct has a reduction of its own, by its heads, which is not modelled: it keeps
        every channel here."""
        if algorithm not in ("Ring", "Tree"):
            return 1.0
        launch, p = NCCL["launch"], PROTOCOLS.index(protocol)
        threads = launch["max_threads"][p]
        if algorithm == "Ring" and protocol == "Simple" and self.cluster.node.bus_gbps <= launch["pci_gbps"]:
            threads = launch["pci_ring_simple_threads"]
        threshold = launch["thread_threshold"][p] * (shape.ranks if algorithm == "Ring" and protocol == "LL" else 1)
        channels = self._channels(algorithm, shape)
        return max(1, min(channels, total // (threads * threshold))) / channels

    # -- which algorithms exist ------------------------------------------------------------------

    def _algorithms(self, comm_type: int, shape: Placement) -> list[str]:
        cluster, many = self.cluster, shape.nodes > 1
        sharp = cluster.scale_out is not None and cluster.scale_out.sharp
        if comm_type == pb.BROADCAST:
            return ["Ring"]
        if comm_type in (pb.ALL_GATHER, pb.REDUCE_SCATTER):  # NVLS in one node (across nodes NCCL needs CollNet)
            nvls = self._nvls() and not many and 1 < shape.ppn <= NCCL["launch"]["max_nvls_arity"]
            return ["Ring"] + (["PAT"] if many and shape.ppn == 1 else []) + (["NVLS"] if nvls else [])
        found = ["Ring"]
        if many:
            found.append("Tree")
        if self._nvls() and shape.ppn > 1 and (not many or sharp):
            found.append("NVLS")
        if self._nvls() and many and shape.ppn > 1:
            found.append("NVLS-Tree")
        if many and sharp and shape.ppn <= NCCL["launch"]["collnet_direct_max_ranks"]:
            found.append("CollNet")
        return found

    def _nvls(self) -> bool:
        """Whether NCCL has NVLS here: the file gives the node NVLS bandwidths, and the GPUs are
        Hopper or later (below compute capability 9.0 NCCL's search finds no NVLS graph, search.cc;
        its tuner's nvlsEfficiency is 0 there)."""
        return self.cluster.node.nvls and NEWEST.architecture[self.cluster.architecture]["nvls_efficiency"] > 0

    def _ll128(self) -> bool:
        """NCCL enables LL128 only where a node's GPUs reach each other over NVLink (tuning.cc:
        typeIntra at most PATH_NVB), on every architecture."""
        return self.cluster.node.link == "nvlink"

    # -- bandwidths --------------------------------------------------------------------------------

    def _nic_share(self) -> float:
        """Scale-out GB/s per GPU: its node's NICs shared by the node's GPUs."""
        out, node = self.cluster.scale_out, self.cluster.node
        if out is None:
            return node.bus_gbps
        return out.nics * out.nic_gbps / (node.gpus or 1)

    def _nics(self, shape: Placement) -> float:
        """Scale-out GB/s of the group's GPUs in one node, as NCCL's graphs reach it: each channel
        leaves a node through one NIC, at most at that NIC's speed (search.cc; the tuner's
        nChannels x bwInter), so the NICs of the group's GPUs, but at most as many as the graph has
        channels before ncclTopoDupChannels doubles them at half speed. Where a node has a NIC per
        channel (8x H100: 8 and 8) that is every GPU's NIC; NVL72's 72 GPUs reach 16."""
        group = shape.ppn * self._nic_share()
        out = self.cluster.scale_out
        return group if out is None else min(group, self._graph_channels(shape) * out.nic_gbps)

    def _fabric(self, shape: Placement) -> float:
        """B: the bus bandwidth of the slowest fabric the group's rings cross."""
        node = self.cluster.node.bus_gbps
        if shape.nodes == 1:
            return node
        return min(node, self._nics(shape))

    def _column(self, shape: Placement) -> int:
        return min(shape.nodes, 3) - 1

    def _channels(self, algorithm: str, shape: Placement) -> float:
        """The channels NCCL's tuner multiplies its per-channel caps by: its graph search's
        (search.cc). In one node, the node's `channels`. Across nodes, the network file's
        `scale_out.channels` for a whole node, in proportion for fewer of its GPUs (at least one);
        then ncclTopoDupChannels doubles a ring or tree graph's channels at half their speed
        where that speed (the NIC's) is at least 25 GB/s, unless on Hopper and later it is below
        50 with more than 4 channels: so 8 for a whole 8x H100 node, 4 for 2 of its GPUs. NVLS's
        graph is not doubled."""
        node, out = self.cluster.node, self.cluster.scale_out
        if shape.nodes == 1 or out is None:
            return node.channels
        channels = self._graph_channels(shape)
        kept = out.nic_gbps < 25 or (self.cluster.architecture != "ampere" and out.nic_gbps < 50 and channels > 4)
        return channels if algorithm == "NVLS-Tree" or kept else 2 * channels

    def _graph_channels(self, shape: Placement) -> float:
        """The channels NCCL's search finds between nodes for the group's GPUs in one node:
        `scale_out.channels` for a whole node, in proportion for fewer of its GPUs, at least one."""
        node, out = self.cluster.node, self.cluster.scale_out
        assert out is not None
        return max(1.0, out.channels * shape.ppn / (node.gpus or shape.ppn))

    def _bus(self, algorithm: str, protocol: str, comm_type: int, shape: Placement, tuner: Tuner | None) -> float:
        rules = tuner or NEWEST
        arch = rules.architecture[self.cluster.architecture]
        column, channels = self._column(shape), self._channels(algorithm, shape)
        if shape.nodes == 1:
            ll_max = arch["ll_max_gbps"][0]
        else:
            ll_max = NCCL["multi_node_ll_max_gbps"][self.cluster.cpu][column - 1]
        fabric = self._fabric(shape)
        if algorithm == "Ring":
            if protocol == "LL":
                reduces_or_spans = comm_type == pb.ALL_REDUCE or shape.nodes > 1
                return min(ll_max, fabric * rules.ring_ll_bus_fraction[0 if reduces_or_spans else 1])
            if protocol == "LL128":
                fraction = self.cluster.node.ll128_bus_fraction if shape.nodes == 1 and tuner is None else None
                if fraction is None:
                    fraction = rules.ring_ll128_one_per_node_fraction if shape.ppn < 2 else 0.92
                return min(fabric * fraction, channels * arch["ring_ll128_per_channel_gbps"][column])
            return fabric
        if algorithm == "Tree":
            bus = min(fabric * 0.92, channels * arch["tree_per_channel_gbps"][column])
            if protocol == "LL":
                return min(bus / 3.8, ll_max)
            if protocol == "LL128":
                return min(bus * 120 / 128, channels * arch["tree_ll128_per_channel_gbps"][column])
            return bus
        nvls = self.cluster.node.nvls_bus(shape.ppn) if self.cluster.node.nvls else 0.0
        if tuner is not None and algorithm in ("NVLS", "NVLS-Tree"):
            efficiency = tuner.architecture[self.cluster.architecture]["nvls_efficiency"]
            if shape.nodes == 1:
                return self._nvls_bus_in_one_node(efficiency, shape, tuner)
            if tuner.nvls_before_2_28:
                return self._nvls_bus_before_2_28(algorithm, nvls, efficiency, shape, tuner)
        if algorithm == "NVLS":
            return nvls if shape.nodes == 1 else min(nvls, self._nics(shape))
        if algorithm == "NVLS-Tree":
            nics = self._nics(shape) * (2 if shape.nodes <= 2 else 1)
            return min(nvls, nics, channels * arch["nvls_tree_per_channel_gbps"][column])
        if algorithm == "CollNet":
            return fabric * 0.85
        return fabric * rules.pat_bus_fraction  # PAT

    def _nvls_bus_in_one_node(self, efficiency: float, shape: Placement, tuner: Tuner) -> float:
        """NVLS's bus bandwidth in one node as NCCL's tuner predicts it: its NVLS graph's nChannels
        x bwIntra (`_nvls_graph_gbps`); from 2.28 times nvlsEfficiency x (nChannels - 1) /
        nChannels x 2 for an all-reduce (the x 2 that `_nvls_gather_share` takes back for a
        gather). On 8x H100, 8 x 40 x 0.85 x 7/8 x 2 = 476 GB/s (480 measured); on 4 of its GPUs
        4 x 60 x 0.85 x 3/4 x 2 = 306, below the ring's, where the measured 370 would tie it."""
        graph = self._nvls_graph_gbps(shape, tuner)
        if tuner.nvls_before_2_28:
            return graph
        channels = self._nvls_channels(shape)
        return graph * efficiency * (channels - 1) / channels * 2

    def _nvls_channels(self, shape: Placement) -> int:
        """The NVLS graph's channels in one node: one per GPU (search.cc forces as many as the
        node's GPUs, so that each pulls alike), at most NCCL_MAX_NVLS_ARITY."""
        return min(math.ceil(shape.ppn), NCCL["launch"]["max_nvls_arity"])

    def _nvls_graph_gbps(self, shape: Placement, tuner: Tuner) -> float:
        """nChannels x bwIntra of NCCL's NVLS graph in one node (search.cc
        ncclTopoSearchTryNvls): each channel crosses every GPU's NVLink to the switches once and
        its head GPU's twice, so at speed s a GPU's link (its NVLinks together as NCCL's topology
        has them, the node's `topology_gbps`) carries (channels + 1) x s. The search keeps the
        fastest of its speeds (the release's `nvls_speeds_gbps`) that fits: on 8x H100 (370.8 GB/s
        a GPU) 40 for 8 channels, 60 for 4; where none fits, NCCL has no NVLS graph."""
        channels = self._nvls_channels(shape)
        speeds = tuner.architecture[self.cluster.architecture]["nvls_speeds_gbps"]
        fitting = [s for s in speeds if (channels + 1) * s <= self.cluster.node.topology_gbps]
        return channels * max(fitting) if fitting else 0.0

    def _nvls_bus_before_2_28(self, algorithm: str, nvls: float, efficiency: float, shape: Placement,
                              tuner: Tuner) -> float:
        """NVLS's and NVLS-Tree's bus bandwidth across nodes as NCCL's tuner before 2.28 predicts
        it: the NVLS graph's channels times the least of its speed in the node and between nodes
        (for NVLS-Tree beyond 2 nodes half that; before 2.19 the node's speed on up to 2 nodes,
        the network's beyond). From 2.28 the node's part is nChannels x bwIntra x nvlsEfficiency
        x (nChannels - 1) / nChannels x 2 for an all-reduce, which `nvls_bus_gbps` (measured)
        stands for; so nChannels x bwIntra is that over the rest (`efficiency`: the
        architecture's nvlsEfficiency), with one channel per GPU of the node. On 8x H100, 480
        GB/s gives 323 (NCCL's search: 8 channels of 40)."""
        gpus = math.ceil(shape.ppn)
        intra = nvls / (2 * efficiency * (gpus - 1) / gpus)
        nics = self._nics(shape)
        if tuner.nvls_before_2_19:
            return intra if shape.nodes <= 2 else nics
        return min(intra, nics / 2 if algorithm == "NVLS-Tree" and shape.nodes > 2 else nics)

    def _algorithm_bandwidth(self, bus: float, algorithm: str, protocol: str, comm_type: int, total: int,
                             shape: Placement, tuner: Tuner | None) -> float:
        gathers = comm_type in (pb.ALL_GATHER, pb.REDUCE_SCATTER)
        before_2_28 = tuner is not None and tuner.nvls_before_2_28
        if algorithm == "NVLS" and gathers:
            bandwidth = bus * tuner.nvls_gather_ratio if before_2_28 else _nvls_gather_share(bus, shape)
        elif algorithm == "NVLS-Tree" and tuner is not None and tuner.nvls_before_2_19:
            bandwidth = bus * NVLS_TREE_RATIO_BEFORE_2_19 * shape.nodes / (2 * (shape.nodes - 1))
        elif algorithm in ("NVLS", "NVLS-Tree") and before_2_28:
            bandwidth = bus * NVLS_RATIO_BEFORE_2_28
        elif algorithm in ("Ring", "NVLS", "NVLS-Tree"):
            bandwidth = bus * shape.ranks / _steps(comm_type, shape.ranks)
        elif algorithm == "PAT":
            bandwidth = bus
        else:
            bandwidth = bus * 0.5
        if self._corrected(algorithm, tuner):
            log_size = int(math.log2(total >> 6)) if total >= 64 else -1
            entries = 23 if algorithm == "Tree" else 24  # NCCL's: below 512 MB, below 1 GB
            if 0 <= log_size < entries:
                bandwidth *= NCCL["tree_correction"][protocol.lower()][log_size]
        return bandwidth

    def _nvls_ops(self, algorithm: str, shape: Placement) -> int:
        """The chunks NVLS or NVLS-Tree moves at once in a node: its channels x heads (one per GPU)."""
        return _chunk_rules(algorithm)["channels"][self.cluster.architecture] * self._nvls_channels(shape)

    def largest_nvls_chunk(self, shape: Placement, algorithm: str = "NVLS", bandwidth: float = math.inf) -> int:
        """The chunk NCCL cuts NVLS or NVLS-Tree into at the largest sizes: NVLS-Tree's from 4
        nodes, NVLS's across nodes where its algorithm `bandwidth` is low, are smaller."""
        rules = _chunk_rules(algorithm)
        if algorithm == "NVLS-Tree":
            return rules["largest_from_4_nodes"] if shape.nodes >= 4 else rules["largest_bytes"]
        slow, capped = rules["across_nodes_slow"]
        return capped if shape.nodes > 1 and bandwidth < slow else rules["largest_bytes"]

    def nvls_chunk(self, total: int, shape: Placement, algorithm: str = "NVLS", bandwidth: float = math.inf) -> int:
        """The chunk NCCL's runtime cuts NVLS or NVLS-Tree of `total` bytes into (enqueue.cc
        calcCollChunking): its largest, halved below so many rounds of it. `bandwidth`: the
        algorithm's (GB/s), which only NVLS across nodes depends on."""
        ops, chunk = self._nvls_ops(algorithm, shape), self.largest_nvls_chunk(shape, algorithm, bandwidth)
        for rounds, smaller in _chunk_rules(algorithm)["halving"]:
            if total < rounds * ops * chunk and chunk > smaller:
                chunk = smaller
        return chunk

    def _corrected(self, algorithm: str, tuner: Tuner | None) -> bool:
        """Whether the tree correction by size applies: to Tree; in NCCL's tuner to NVLS-Tree on
        Blackwell with x86 hosts, from 2.29.2 (Flint's times give NVLS-Tree its ramp by its
        chunks, `_chunked`)."""
        if algorithm == "Tree":
            return True
        return (tuner is not None and algorithm == "NVLS-Tree" and tuner.nvls_tree_corrected
                and self.cluster.architecture == "blackwell" and self.cluster.cpu in X86)

    # -- latencies ---------------------------------------------------------------------------------

    def _latency(self, algorithm: str, protocol: str, comm_type: int, total: int, shape: Placement,
                 tuner: Tuner | None) -> float:
        rules = tuner or NEWEST
        key, p = _KEYS[algorithm], PROTOCOLS.index(protocol)
        base = rules.base_latency_us[key][p]
        hops = rules.hop_latency_us
        intra = hops[self.cluster.node.link][key][p]
        inter = self._inter(key, p, shape, rules)
        n, nodes, ppn = shape.ranks, shape.nodes, shape.ppn
        if algorithm == "Ring":
            if (protocol == "Simple" and nodes == 1 and tuner is None
                    and self.cluster.node.ring_simple_hop_us is not None):
                intra = self.cluster.node.ring_simple_hop_us
            steps = _steps(comm_type, n)
            if comm_type == pb.BROADCAST:
                return base + (hops["net"][key][p] if nodes > 1 else intra)
            if nodes > 1:
                overhead = NCCL["net_overhead_us"][self.cluster.cpu] * (3 if protocol == "Simple" else 1)
                intra = max(intra, overhead)
            inter_steps = (0 if nodes == 1 else nodes - 1 if comm_type != pb.ALL_REDUCE
                           else 2 * (nodes - 1) + rules.ring_all_reduce_extra_net_steps)
            latency = base + (steps - inter_steps) * intra + inter_steps * inter
            channels = self.cluster.node.channels
            if (protocol == "Simple" and nodes > 1 and comm_type == pb.ALL_REDUCE
                    and total / (channels * n) >= 64):
                latency *= 1.4
            return latency
        log_nodes = int(math.log2(nodes))
        if algorithm == "Tree":
            return base + 2 * ((ppn - 1) * intra + log_nodes * inter)
        if algorithm in ("NVLS", "NVLS-Tree"):
            if tuner is not None and tuner.nvls_before_2_19:  # the network's hop alone, without its latency
                hops_between = 1 if algorithm == "NVLS" else 2 * (nodes - 1)
                return base + (hops["net"][key][p] * hops_between if nodes > 1 else 0.0)
            # Flint's fitted latency in the node (NVLS's chunks add to it); NCCL's tuner its base and NVLink hop
            start = base + intra if tuner is not None else self.cluster.node.nvls_latency_us
            return start + (inter if nodes > 1 else 0.0) if algorithm == "NVLS" else start + 2 * log_nodes * inter
        if algorithm == "CollNet":
            return base + 2 * (min(1, ppn - 1) * intra + (ppn - 1) * rules.collnet_arity_us) + inter
        return base + log_nodes * inter / 3.5 + n * 2.8  # PAT

    def _inter(self, key: str, p: int, shape: Placement, rules: Tuner = NEWEST) -> float:
        """One step between nodes: NCCL's network hop for the algorithm as `rules`' release has it
        (from 2.23 the Tree's with one GPU per node) and the network's latency (twice for Simple,
        which flushes)."""
        one_per_node = shape.ppn == 1 and rules.one_per_node_net_hop_from_tree
        inter = rules.hop_latency_us["net"]["tree" if one_per_node else key][p]
        network = self.cluster.scale_out.latency_us if self.cluster.scale_out else 0.0
        return inter + network * (2 if PROTOCOLS[p] == "Simple" else 1)

    def _p2p_latency(self, apart: bool) -> float:
        simple = PROTOCOLS.index("Simple")
        hops = NEWEST.hop_latency_us
        latency = NEWEST.base_latency_us["ring"][simple] + hops[self.cluster.node.link]["ring"][simple]
        if apart:
            latency += self._inter("ring", simple, Placement(2, 2))
        return latency

    def _pair_micros(self, nbytes: float, apart: bool) -> float:
        latency = self._p2p_latency(apart)
        bandwidth = self._nic_share() if apart else self.cluster.node.bus_gbps
        return latency + nbytes / (bandwidth * 1e3)

    def _all_to_all(self, nbytes: int, shape: Placement) -> float:
        n, ppn = shape.ranks, shape.ppn
        inside = nbytes * (ppn - 1) / n / (self.cluster.node.bus_gbps * 1e3)
        outside = nbytes * (n - ppn) / n / (self._nic_share() * 1e3) if shape.nodes > 1 else 0.0
        return self._p2p_latency(shape.nodes > 1) + max(inside, outside)


def _chunked(algorithm: str, tuner: Tuner | None) -> bool:
    """Whether Flint times this by NVLS's chunks (`NcclModel._nvls_pipeline`): NVLS and NVLS-Tree,
    in Flint's own times (NCCL's tuner has no such term)."""
    return tuner is None and algorithm in ("NVLS", "NVLS-Tree")


def _chunk_rules(algorithm: str) -> dict:
    """How NCCL's runtime cuts NVLS or NVLS-Tree into chunks (nccl.toml)."""
    return NCCL["nvls_tree_chunks" if algorithm == "NVLS-Tree" else "nvls_chunks"]


_STAGES = {pb.ALL_REDUCE: "all_reduce", pb.ALL_GATHER: "all_gather", pb.REDUCE_SCATTER: "reduce_scatter"}


def forced_name(algorithm: str | None, protocol: str | None) -> str:
    """What NCCL_ALGO and NCCL_PROTO held a collective to, as messages name it: 'Ring LL128',
    'Ring', '' for neither."""
    return " ".join(filter(None, (algorithm, protocol)))


def _nvls_gather_share(all_reduce_bus: float, shape: Placement) -> float:
    """NVLS's algorithm bandwidth for an all-gather or reduce-scatter, from its all-reduce bus
    bandwidth: NCCL's tuner (2.28 on) takes the NVLS graph's nChannels x bwIntra x nvlsEfficiency
    x (nChannels - 1) / nChannels times 2 for an all-reduce, times (ppn - 1) / ppn for these, and
    converts only the all-reduce's to algorithm bandwidth (x n / 2(n - 1)); the same measured
    hardware then gives these (ppn - 1) / 2 ppn of the all-reduce's bus bandwidth."""
    return all_reduce_bus * (shape.ppn - 1) / (2 * shape.ppn)


def _steps(comm_type: int, n: int) -> int:
    """NCCL's nsteps: what a ring's bus bandwidth is converted to the algorithm's by (n / steps)."""
    if comm_type == pb.ALL_REDUCE:
        return 2 * (n - 1)
    if comm_type in (pb.ALL_GATHER, pb.REDUCE_SCATTER):
        return n - 1
    return n

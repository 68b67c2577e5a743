"""Collectives as NCCL runs them (`flint.step.nccl`), derived by hand from NCCL's cost model.

Constants from NVIDIA/nccl src/graph/tuning.cc (Hopper, Intel CPU): base latencies Ring
LL/LL128/Simple 6.6 / 14.0 / 8.4 µs, Tree 6.8 / 14.0 / 8.4; NVLink hops Ring 0.6 / 1.9 / 3.4, Tree
0.6 / 1.25 / 4.0; network hops Tree 5.0 / 8.5 / 14, NVLS-Tree 20.9, CollNet Direct 31; LL at most
141 GB/s on one node, 39 GB/s on two (Intel); per channel: Ring LL128 36.7, Tree 41.4 (2 nodes),
NVLS-Tree 57.7 (2 nodes). The hgx network: 8 GPUs per node, ring bus bandwidth 370.8 GB/s, 16
channels, NVLS 480 GB/s at 8 GPUs, 21.0 µs for no bytes and 4.8 µs a round of chunks, eight 47 GB/s
NICs per node and 8 channels between nodes (one per NIC), no network latency. NCCL's tree
correction for Simple (treeCorrectionFactor), which Flint gives NVLS-Tree below 1 GiB: 0.7 at
2^16 x 64 B (4 MiB) and 2^19 x 64 B (32 MiB), 0.9 at 2^23 x 64 B (512 MiB). Where a network file
names no release, NCCL 2.30.7's tuner picks the algorithm and protocol (by NCCL's own constants:
NVLS 25 µs, no chunks), which Flint then times.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from conftest import DEVICES, ROOT, flint, nvls_pipelined
from test_collectives import one_collective

from flint.devices import load_device
from flint.errors import FlintError
from flint.schema import et_def_pb2 as pb
from flint.step.nccl import SEND_RECV, NcclModel, Placement, release_tuner
from flint.step.network import network_for
from flint.step.network_files import load_network_file, network_toml

MIB, GIB = 2**20, 2**30
NODE = NcclModel(network_for("hgx", [("tensor", 8)]))
TWO_NODES = NcclModel(network_for("hgx", [("data", 2), ("tensor", 8)]))


def candidate(model: NcclModel, kind: int, total: int, shape: Placement, algorithm: str, protocol: str):
    """(latency µs, algorithm bandwidth GB/s) of one algorithm and protocol."""
    found = {(a, p): (lat, bw) for a, p, lat, bw in model.candidates(kind, total, shape)}
    return found[algorithm, protocol]


def test_a_tiny_all_reduce_on_one_node_is_ring_ll():
    """8 B: Ring LL, 6.6 + 14 steps x 0.6 = 15.0 µs; bandwidth min(141, 370.8 / 2) x 8 / 14, on one
    of the 16 channels (NCCL launches one below 512 threads x 8 B x 8 ranks a channel)."""
    choice = NODE.choose(pb.ALL_REDUCE, 8, Placement(8, 1))
    assert (choice.algorithm, choice.protocol) == ("Ring", "LL")
    assert choice.micros == pytest.approx(15.0 + 8 / (141 * 8 / 14 / 16 * 1e3))


def test_nccl_launches_small_collectives_on_fewer_channels():
    """NCCL's runtime gives each thread of a Ring or Tree channel at least the protocol's
    threshold (LL 8 B x the ranks for a ring, LL128 8 B, Simple 64 B) over 512 threads (LL128:
    640), so it launches floor(bytes / (threads x threshold)) of the channels, at least one.
    - one node, Ring LL: 32 KiB a channel; 256 KiB runs on 8 of 16, so at half the algorithm
      bandwidth, 15.0 + 256 KiB / 40.3 GB/s = 21.5 µs, as 512 KiB (all 16) and 16 KiB (one);
      100 KiB on 3; 1 MiB on all 16;
    - 2 nodes, Tree LL128 (forced): 5 KiB a channel, 20 KiB on 4 of 8 at min(319.8, 8 x 36.7) / 2
      x NCCL's tree correction for 2^8 x 64 B (0.8) x 4 / 8;
    - Ring Simple (forced): 32 KiB a channel, 64 KiB on 2 of 16; on a PCI node whose ring carries
      12 GB/s (NCCL's PCI_BW) it gets 256 threads, so 16 KiB a channel: 64 KiB on 4, at 12 x 8 / 14
      after 8.4 + 14 x 5.7 µs;
    - NVLS keeps its channels: 8 B forced onto it take its 21.0 µs and 3 x 8 B at its pipeline's
      bandwidth (one round of less than 128 chunks of 16 KiB, three stages deep)."""
    node, ring_ll = Placement(8, 1), 141 * 8 / 14
    for size, launched in ((256 * 1024, 8), (512 * 1024, 16), (16 * 1024, 1), (100 * 1024, 3), (MIB, 16)):
        micros = NODE.choose(pb.ALL_REDUCE, size, node).micros
        assert micros == pytest.approx(15.0 + size / (ring_ll * launched / 16 * 1e3))
    assert NODE.choose(pb.ALL_REDUCE, 256 * 1024, node).micros == pytest.approx(21.5, abs=0.05)
    tree = TWO_NODES.choose(pb.ALL_REDUCE, 20 * 1024, Placement(16, 2), algorithm="Tree", protocol="LL128")
    assert tree.micros == pytest.approx(48.5 + 20 * 1024 / (8 * 36.7 / 2 * 0.8 * 4 / 8 * 1e3))
    simple = NODE.choose(pb.ALL_REDUCE, 64 * 1024, node, algorithm="Ring", protocol="Simple")
    assert simple.micros == pytest.approx(8.4 + 14 * 3.4 + 64 * 1024 / (370.8 * 8 / 14 * 2 / 16 * 1e3))
    pci = NcclModel(replace(NODE.network, cluster=replace(
        NODE.cluster, node=replace(NODE.cluster.node, link="pci", bus_gbps=12.0, nvls_bus_gbps=()))))
    narrow = pci.choose(pb.ALL_REDUCE, 64 * 1024, node, algorithm="Ring", protocol="Simple")
    assert narrow.micros == pytest.approx(8.4 + 14 * 5.7 + 64 * 1024 / (12 * 8 / 14 * 4 / 16 * 1e3))
    nvls = NODE.choose(pb.ALL_REDUCE, 8, node, algorithm="NVLS")
    assert nvls.micros == pytest.approx(nvls_pipelined(8, 16 * 1024, 16 * 8, 480 * 8 / 14))
    assert nvls.micros == pytest.approx(21.0, abs=0.001)


def test_four_mib_is_nvls_timed_by_its_chunks():
    """4 MiB: 2.30.7's tuner predicts NVLS at 25 + 4 MiB / (476 x 8 / 14) = 40.4 µs (its graph: 8
    channels of 40 GB/s x 0.85 x 7/8 x 2 = 476), before Ring LL128 (14.0 + 14 x 1.9 = 40.6 µs at
    min(0.92 x 370.8, 16 x 36.7) x 8 / 14 GB/s: 62.1). Flint times NVLS by its chunks: 16 channels x
    8 heads of 16 KiB (4 MiB is below 2 x 128 x 32 KiB), two rounds of 2 MiB, three stages deep:
    21.0 - 14.4 + 4 x (4.8 + 2 MiB at 1 / (14 / 480 - 4.8 µs / 16 MiB) GB/s) = 54.0 µs, still
    before its Ring LL128 (62.1), LL (67.1) and Simple (75.8)."""
    choice = NODE.choose(pb.ALL_REDUCE, 4 * MIB, Placement(8, 1))
    assert (choice.algorithm, choice.protocol) == ("NVLS", "Simple")
    predicted = {(a, p): lat + 4 * MIB / (bw * 1e3) for a, p, lat, bw in
                 NODE.candidates(pb.ALL_REDUCE, 4 * MIB, Placement(8, 1), release_tuner("2.30.7"))}
    assert predicted["NVLS", "Simple"] == pytest.approx(25 + 4 * MIB / (8 * 40 * 0.85 * 7 / 8 * 2 * 8 / 14 * 1e3))
    assert predicted["NVLS", "Simple"] == pytest.approx(40.4, abs=0.05)
    assert predicted["Ring", "LL128"] == pytest.approx(62.1, abs=0.05)
    assert choice.micros == pytest.approx(6.6 + 4 * (4.8 + 2 * MIB * (14 / (480 * 8e3) - 4.8 / (16 * MIB))))
    assert choice.micros == pytest.approx(nvls_pipelined(4 * MIB, 16 * 1024, 128, 480 * 8 / 14))
    assert choice.micros == pytest.approx(54.0, abs=0.05)
    ll128 = candidate(NODE, pb.ALL_REDUCE, 4 * MIB, Placement(8, 1), "Ring", "LL128")
    assert ll128 == pytest.approx((40.6, 0.92 * 370.8 * 8 / 14))
    simple = candidate(NODE, pb.ALL_REDUCE, 4 * MIB, Placement(8, 1), "Ring", "Simple")
    assert simple == pytest.approx((8.4 + 14 * 3.4, 370.8 * 8 / 14))


def test_a_large_all_reduce_on_one_node_is_nvls():
    """1 GiB: NVLS in 64 rounds of 128 chunks of 128 KiB (1 GiB is not below 64 x 128 x 128 KiB),
    which move at 480 GB/s bus bandwidth (x 8 / 14 for the algorithm's), three stages deep:
    21.0 - 14.4 + 66 x 16 MiB / (480 x 8 / 14) = 4,043.6 µs. Four GPUs of the node reach 370
    GB/s with 16 x 4 = 64 chunks a round; 32 MiB on eight runs 8 rounds of 32 KiB chunks (below
    8 x 128 x 64 KiB, not below 2 x 128 x 32 KiB)."""
    choice = NODE.choose(pb.ALL_REDUCE, GIB, Placement(8, 1))
    assert (choice.algorithm, choice.protocol) == ("NVLS", "Simple")
    assert choice.micros == pytest.approx(6.6 + 66 * 16 * MIB / (480 * 8 / 14 * 1e3))
    assert choice.micros == pytest.approx(4043.6, abs=0.05)
    four = NODE.choose(pb.ALL_REDUCE, GIB, Placement(4, 1), algorithm="NVLS")
    assert four.micros == pytest.approx(6.6 + (128 + 2) * 8 * MIB / (370 * 4 / 6 * 1e3))
    thirty_two = NODE.choose(pb.ALL_REDUCE, 32 * MIB, Placement(8, 1))
    assert thirty_two.micros == pytest.approx(nvls_pipelined(32 * MIB, 32 * 1024, 128, 480 * 8 / 14))
    assert thirty_two.micros == pytest.approx(6.6 + 10 * (4.8 + 4 * MIB * (14 / (480 * 8e3) - 4.8 / (16 * MIB))))


def test_all_gather_is_a_ring_at_the_node_bus_bandwidth():
    """1 GiB gathered over 8 (128 MiB per rank): Ring Simple, 8.4 + 7 x 3.4 = 32.2 µs at 370.8 x
    8 / 7 GB/s: nccl-tests' bus bandwidth (algorithm bandwidth x 7 / 8) just under 370.8 GB/s."""
    micros = NODE.collective_micros(pb.ALL_GATHER, GIB // 8, range(8))
    assert micros == pytest.approx(32.2 + GIB / (370.8 * 8 / 7 * 1e3))
    assert NODE.collective_micros(pb.REDUCE_SCATTER, GIB, range(8)) == pytest.approx(micros)
    assert GIB / micros / 1e3 * 7 / 8 == pytest.approx(366.1, abs=0.1)


def test_nvls_gathers_in_one_node_of_at_most_32_gpus():
    """NVLS all-gather and reduce-scatter: in one node of at most 32 GPUs (NCCL_MAX_NVLS_ARITY), at
    (ppn - 1) / 2 ppn of NVLS's all-reduce bus bandwidth (NCCL's tuner from 2.28), by its chunks
    two stages deep (gather and broadcast; scatter and reduce). 32 GPUs of an NVL72 rack (24
    channels x 32 heads: 768 chunks a round), 1 GiB in all: 64 KiB chunks (below 64 x 768 x 128
    KiB, not below 8 x 768 x 64 KiB), 21.3 rounds of 48 MiB at 845.4 x 31/64 = 409.5 GB/s for
    128 KiB chunks, 2,805.3 µs, against Ring Simple's 8.4 + 31 x 3.4 = 113.8 µs at 721.8 x 32/31 =
    745.1: the ring, 1,555 µs. By these times NVLS is faster up to 1 MiB (at 32 KiB its 16.4 µs
    against Ring LL's 6.6 + 31 x 0.6 + 0.1 = 25.3), Ring LL128 at 32 MiB. NCCL 2.30.7's tuner, with
    no chunks and its own 25 µs, runs NVLS up to 32 MiB and the ring at 1 GiB. 72 GPUs: none;
    8x H100: 480 x 7/16 = 210 GB/s; across nodes: none."""
    rack = nvl72_racks(1)
    shape = Placement(32, 1)
    nvls = rack.choose(pb.ALL_GATHER, GIB // 32, shape, algorithm="NVLS")
    assert nvls.micros == pytest.approx(nvls_pipelined(GIB, 64 * 1024, 24 * 32, 845.4 * 31 / 64, stages=2))
    assert nvls.micros == pytest.approx(2805.3, abs=0.05)
    assert candidate(rack, pb.ALL_GATHER, GIB, shape, "Ring", "Simple") == pytest.approx((113.8, 721.8 * 32 / 31))
    for total, fastest in ((32 * 1024, "NVLS"), (MIB, "NVLS"), (32 * MIB, "Ring"), (GIB, "Ring")):
        timed = {(a, p): lat + total / (bw * 1e3) for a, p, lat, bw in rack.candidates(pb.ALL_GATHER, total, shape)}
        assert min(timed, key=timed.get)[0] == fastest
        for kind, nbytes in ((pb.ALL_GATHER, total // 32), (pb.REDUCE_SCATTER, total)):
            assert rack.choose(kind, nbytes, shape).algorithm == ("Ring" if total == GIB else "NVLS")
    assert "NVLS" not in {a for a, *_ in rack.candidates(pb.ALL_GATHER, GIB, Placement(72, 1))}
    assert "NVLS" in {a for a, *_ in rack.candidates(pb.ALL_REDUCE, GIB, Placement(72, 1))}
    eight = NODE.choose(pb.ALL_GATHER, GIB // 8, Placement(8, 1), algorithm="NVLS")
    assert eight.micros == pytest.approx(6.6 + 65 * 16 * MIB / (480 * 7 / 16 * 1e3))
    assert "NVLS" not in {a for a, *_ in TWO_NODES.candidates(pb.ALL_GATHER, GIB, Placement(16, 2))}


def test_nccls_tuners_predict_nvls_gathers_by_their_own_formula():
    """32 GPUs of an NVL72 rack, whose NVLS graph has 32 channels of 20 GB/s (33 x 20 within a
    GPU's 721.8; 24 would not fit): 2.30.7's tuner predicts NVLS's all-gather at 25 µs and 640 x
    0.74 x 31/32 x 31/32 = 444.5 GB/s, uncorrected; 2.26.2's (before 2.28) nChannels x bwIntra,
    640 GB/s, not converted (from 2.23); 2.22.3's that x 5/6; 2.18.5's none. So 2.26.2 runs NVLS
    for 32 KiB, 25 + 0.05 µs against Ring LL's 6.6 + 31 x 0.6 + 32 KiB / (min(282, 721.8 / 2) x
    32/31) = 25.31, which Flint times by its chunks at 21.0 - 14.4 + 2 x (4.8 + 32 KiB at the
    pipeline's bandwidth) = 16.4 µs, as 2.30.7's (25 + 0.07 µs). Ring LL on the one channel of 16
    it launches would take 25.2 + 32 KiB / (291.1 / 16) = 27.0 µs."""
    rack, shape, total = nvl72_racks(1), Placement(32, 1), 32 * 1024
    graph = 32 * 20.0
    for release, bandwidth in (("2.30.7", graph * 0.74 * 31 / 32 * 31 / 32), ("2.26.2", graph),
                               ("2.22.3", graph * 5 / 6), ("2.18.5", 0.0)):
        found = {(a, p): (lat, bw) for a, p, lat, bw in rack.candidates(pb.ALL_GATHER, total, shape, release_tuner(release))}
        assert found["NVLS", "Simple"][1] == pytest.approx(bandwidth), release
        if bandwidth:
            assert found["NVLS", "Simple"][0] == 25.0
    ring_ll = 282 * 32 / 31
    assert 25 + total / (graph * 1e3) < 25.2 + total / (ring_ll * 1e3)
    for release in ("2.26.2", None):
        chosen = nvl72_racks(1, release).choose(pb.ALL_GATHER, total // 32, shape)
        assert chosen.algorithm == "NVLS"
        assert chosen.micros == pytest.approx(nvls_pipelined(total, 16 * 1024, 24 * 32, 845.4 * 31 / 64, stages=2))
        assert chosen.micros == pytest.approx(16.4, abs=0.05)
    ring = rack.choose(pb.ALL_GATHER, total // 32, shape, algorithm="Ring", protocol="LL")
    assert ring.micros == pytest.approx(25.2 + total / (ring_ll / 16 * 1e3))
    assert ring.micros == pytest.approx(27.0, abs=0.05)


def test_nccls_tuner_sizes_the_nvls_graph_of_part_of_a_node_by_its_search():
    """4 of 8 H100s: NCCL's search gives the NVLS graph 4 channels of 60 GB/s (5 x 60 within a
    GPU's 370.8), so 2.30.7's tuner predicts NVLS at 4 x 60 x 0.85 x 3/4 x 2 = 306 GB/s, not the
    370 measured. At 16 MiB it so predicts NVLS 25 + 16 MiB / (306 x 4/6) = 107.2 µs against
    Ring Simple's 8.4 + 6 x 3.4 + 16 MiB / (370.8 x 4/6) = 96.7: the ring, which Flint times
    alike (hgx fits no ring step of its own). 2 GPUs: 2 channels of 60 (3 x 60 within 370.8):
    2 x 60 x 0.85 x 1/2 x 2 = 102 GB/s."""
    four, total = Placement(4, 1), 16 * MIB
    tuned = NcclModel(replace(NODE.network, cluster=replace(NODE.cluster, nccl="2.30.7")))
    newest = release_tuner("2.30.7")
    found = {(a, p): (lat, bw) for a, p, lat, bw in tuned.candidates(pb.ALL_REDUCE, total, four, newest)}
    assert found["NVLS", "Simple"] == pytest.approx((25.0, 4 * 60 * 0.85 * 3 / 4 * 2 * 4 / 6))
    assert found["Ring", "Simple"] == pytest.approx((8.4 + 6 * 3.4, 370.8 * 4 / 6))
    assert 25.0 + total / (306 * 4 / 6 * 1e3) == pytest.approx(107.2, abs=0.05)
    chosen = tuned.choose(pb.ALL_REDUCE, total, four)
    assert (chosen.algorithm, chosen.protocol) == ("Ring", "Simple")
    assert chosen.micros == pytest.approx(28.8 + total / (370.8 * 4 / 6 * 1e3))
    two = {(a, p): bw for a, p, _, bw in tuned.candidates(pb.ALL_REDUCE, total, Placement(2, 1), newest)}
    assert two["NVLS", "Simple"] == pytest.approx(2 * 60 * 0.85 * 1 / 2 * 2 * 2 / 2)


def test_across_two_nodes_small_all_reduces_take_the_tree():
    """16 ranks on 2 nodes, 8 B: Tree LL, 6.8 + 2 (7 x 0.6 + 1 x 5.0) = 25.2 µs, at LL's 39 GB/s
    limit for two nodes, halved; 1 MiB: Tree LL128, 14.0 + 2 (7 x 1.25 + 8.5) = 48.5 µs at
    min(0.92 x 370.8 x 120 / 128 = 319.8, 8 x 36.7) / 2, x NCCL's tree correction for 2^14 x 64 B
    (0.6): NCCL's cap for 8 channels between nodes holds it."""
    shape = TWO_NODES.group_shape(range(16))
    assert shape == Placement(16, 2)
    tiny = TWO_NODES.choose(pb.ALL_REDUCE, 8, shape)
    assert (tiny.algorithm, tiny.protocol) == ("Tree", "LL")
    assert tiny.micros == pytest.approx(25.2 + 8 / (39.0 / 2 / 8 * 1e3))  # on one of 8 channels
    mib = TWO_NODES.choose(pb.ALL_REDUCE, MIB, shape)
    assert (mib.algorithm, mib.protocol) == ("Tree", "LL128")
    assert mib.micros == pytest.approx(48.5 + MIB / (8 * 36.7 / 2 * 0.6 * 1e3))


def test_tree_simple_across_nodes_and_where_the_tree_correction_ends():
    """Tree Simple on 2 nodes: 8.4 + 2 (7 x 4.0 + 1 x 14) = 92.4 µs (4 nodes: 2 x 14 between
    them, 120.4), at min(0.92 x 370.8 = 341.1, 8 x 41.4) / 2 GB/s, x NCCL's tree correction: 0.8 at 64 MiB
    (2^20 x 64 B); none at 512 MiB, past the table's entries for Tree (2^23 x 64 B)."""
    shape = Placement(16, 2)
    bus = 8 * 41.4
    for size, correction in ((64 * MIB, 0.8), (512 * MIB, 1.0)):
        tree = candidate(TWO_NODES, pb.ALL_REDUCE, size, shape, "Tree", "Simple")
        assert tree == pytest.approx((92.4, bus / 2 * correction))
    four = NcclModel(network_for("hgx", [("data", 4), ("tensor", 8)]))
    latency, _ = candidate(four, pb.ALL_REDUCE, 64 * MIB, Placement(32, 4), "Tree", "Simple")
    assert latency == pytest.approx(120.4)


def test_across_two_nodes_large_all_reduces_take_nvls_tree():
    """1 GiB on 2 nodes: NVLS-Tree at min(480, 2 x 8 x 47, 8 x 57.7) x 16 / 30 GB/s (NCCL's cap for
    its 8 channels between nodes, 461.6 GB/s, below NVLS's 480), through each node by NVLS's chunks
    after 21.0 + 2 x 1 x 20.9 = 62.8 µs (hgx's NVLS latency, two network steps of NVLS-Tree's hop):
    16 channels x 8 heads of 128 KiB (not below 4 rounds of them, 64 MiB), so 64 rounds of 16 MiB,
    3 deep: 4,546.2 µs."""
    choice = TWO_NODES.choose(pb.ALL_REDUCE, GIB, Placement(16, 2))
    assert (choice.algorithm, choice.protocol) == ("NVLS-Tree", "Simple")
    expected = nvls_pipelined(GIB, 128 * 1024, 16 * 8, 8 * 57.7 * 16 / 30, latency=62.8)
    assert expected == pytest.approx(4546.2, abs=0.05)
    assert choice.micros == pytest.approx(expected)


def test_nvls_tree_chunks_shrink_with_the_bytes_and_from_four_nodes():
    """NVLS-Tree's chunks (enqueue.cc): at most 128 KiB on 2 nodes, 64 KiB from 4; 64 KiB below 4
    rounds of the largest, 32 KiB below one round. On 2 hgx nodes (128 at once): 8 MiB is below 4 x
    16 MiB and one round of 64 KiB (8 MiB) is not below it: one round of 64 KiB chunks, 3 deep,
    62.8 - 14.4 + 3 (4.8 + 8 MiB / P) = 157.8 µs (measured on such nodes: 131.4 to 156.0). On 4
    nodes (4 network steps: 104.6 µs; min(480, 8 x 47, 8 x 45.5) = 364 GB/s bus), 64 MiB runs 8
    rounds of 64 KiB chunks: 104.6 - 14.4 + 10 (4.8 + 8 MiB / P), P from rounds of 64 KiB."""
    two = TWO_NODES.choose(pb.ALL_REDUCE, 8 * MIB, Placement(16, 2))
    assert two.algorithm == "NVLS-Tree"
    assert TWO_NODES.nvls_chunk(8 * MIB, Placement(16, 2), "NVLS-Tree") == 64 * 1024
    expected = nvls_pipelined(8 * MIB, 64 * 1024, 128, 8 * 57.7 * 16 / 30, latency=62.8)
    assert expected == pytest.approx(157.8, abs=0.05)
    assert two.micros == pytest.approx(expected)
    four = four_nodes("2.18.5")
    assert [four.nvls_chunk(size, Placement(32, 4), "NVLS-Tree") for size in (64 * MIB, 8 * MIB, 4 * MIB)] == [
        64 * 1024, 64 * 1024, 32 * 1024]
    candidates = {(a, p): (lat, bw) for a, p, lat, bw in four.candidates(pb.ALL_REDUCE, 64 * MIB, Placement(32, 4))}
    latency, bandwidth = candidates["NVLS-Tree", "Simple"]
    assert latency + 64 * MIB / (bandwidth * 1e3) == pytest.approx(
        nvls_pipelined(64 * MIB, 64 * 1024, 128, 364 * 32 / 62, latency=104.6, largest=64 * 1024))


def test_nvls_across_nodes_with_sharp_is_timed_by_its_chunks():
    """hgx with SHARP between nodes, 2 nodes of 8, NVLS held to: min(480, 8 x 47) = 376 GB/s bus x
    16 / 30 = 200.5 GB/s, after 21.0 + 18.0 µs (NVLS's network hop), by NVLS's chunks: 1 GiB in 64
    rounds of 128 x 128 KiB. With 4 NICs a node (100.3 GB/s, below NCCL's 150), NCCL cuts it in at
    most 32 KiB: 256 rounds of 4 MiB, each round's bytes at the rate that makes them reach 100.3."""
    sharp = NcclModel(replace(TWO_NODES.network, cluster=replace(
        TWO_NODES.cluster, scale_out=replace(TWO_NODES.cluster.scale_out, sharp=True))))
    nvls = sharp.choose(pb.ALL_REDUCE, GIB, Placement(16, 2), algorithm="NVLS")
    assert nvls.micros == pytest.approx(nvls_pipelined(GIB, 128 * 1024, 128, 376 * 16 / 30, latency=39.0))
    fewer = NcclModel(replace(sharp.network, cluster=replace(
        sharp.cluster, scale_out=replace(sharp.cluster.scale_out, nics=4))))
    assert fewer.nvls_chunk(GIB, Placement(16, 2), "NVLS", 188 * 16 / 30) == 32 * 1024
    slow = fewer.choose(pb.ALL_REDUCE, GIB, Placement(16, 2), algorithm="NVLS")
    assert slow.micros == pytest.approx(
        nvls_pipelined(GIB, 32 * 1024, 128, 188 * 16 / 30, latency=39.0, largest=32 * 1024))


def test_nvls_tree_is_timed_by_its_chunks_where_nccls_tuner_corrects_it():
    """hgx-b200 (Intel hosts; Blackwell: NVLS-Tree 96 GB/s per channel on 2 nodes), 16 ranks on 2
    nodes, 512 MiB: NVLS-Tree at min(845.4, 2 x 8 x 47, 8 x 96) = 752 x 16 / 30 GB/s, by its chunks
    (Blackwell: 32 channels x 8 heads of 128 KiB, 16 rounds of 32 MiB) after 62.8 µs, on Intel and
    Grace hosts alike: 1,554.3 µs. NCCL's tuner corrects its prediction by size there (0.9 at 512
    MiB, 2^23 x 64 B, the table's last entry) on these Intel hosts from 2.29.2, not on Grace's or
    before (2.28.9: the same caps on 2 nodes), not on Hopper."""
    model = NcclModel(network_for("hgx-b200", [("data", 2), ("tensor", 8)]))
    shape, bandwidth = Placement(16, 2), 752 * 16 / 30 * 1e3
    half = model.choose(pb.ALL_REDUCE, GIB // 2, shape)
    assert (half.algorithm, half.protocol) == ("NVLS-Tree", "Simple")
    expected = nvls_pipelined(GIB // 2, 128 * 1024, 32 * 8, 752 * 16 / 30, latency=62.8)
    assert expected == pytest.approx(1554.3, abs=0.05)
    assert half.micros == pytest.approx(expected)
    grace = NcclModel(replace(model.network, cluster=replace(model.cluster, cpu="other")))
    assert grace.choose(pb.ALL_REDUCE, GIB // 2, shape).micros == pytest.approx(expected)
    # as NCCL's tuners predict it: corrected on these Intel hosts from 2.29.2, not on Grace's or
    # before (2.28.9: the same caps on 2 nodes), not on Hopper
    predicted = {(name, release): nvls_tree_bandwidth(m, GIB // 2, shape, release)
                 for name, m in (("intel", model), ("grace", grace), ("hopper", TWO_NODES))
                 for release in ("2.28.9", "2.29.2")}
    assert predicted["intel", "2.29.2"] == pytest.approx(0.9 * predicted["intel", "2.28.9"])
    assert predicted["intel", "2.28.9"] == pytest.approx(bandwidth / 1e3)
    assert predicted["grace", "2.29.2"] == predicted["grace", "2.28.9"] == predicted["intel", "2.28.9"]
    assert predicted["hopper", "2.29.2"] == pytest.approx(8 * 57.7 * 16 / 30)


def nvls_tree_bandwidth(model: NcclModel, total: int, shape: Placement, release: str) -> float:
    """NVLS-Tree's algorithm bandwidth (GB/s) as NCCL `release`'s tuner predicts it."""
    found = {(a, p): bw for a, p, _, bw in model.candidates(pb.ALL_REDUCE, total, shape, release_tuner(release))}
    return found["NVLS-Tree", "Simple"]


def test_nccls_per_channel_caps_count_its_channels_between_nodes():
    """NCCL's caps multiply its graph's channels between nodes: one per NIC of the group's GPUs,
    doubled (at half the speed) for a ring or tree where they are 4 or fewer (ncclTopoDupChannels;
    47 GB/s NICs), never for NVLS. 4 nodes (Hopper's caps for more than 2 nodes: Tree LL128 29,
    NVLS-Tree 45.5 GB/s a channel):
    - all 8 GPUs of each node: Tree LL128 min(0.92 x 370.8 x 120 / 128 = 319.8, 8 x 29) = 232,
      NVLS-Tree min(480, 8 x 47 = 376, 8 x 45.5) = 364;
    - 2 GPUs of each: 2 NICs, Tree LL128 min(0.92 x 94 x 120 / 128 = 81.1, 4 x 29 = 116) = 81.1,
      NVLS-Tree min(370, 94, 2 x 45.5) = 91.
    Without the doubling, 2 x 29 = 58 would hold that Tree LL128."""
    four = NcclModel(network_for("hgx", [("data", 4), ("tensor", 8)]))
    for ppn, tree, nvls_tree in ((8, 8 * 29, 8 * 45.5), (2, 0.92 * 94 * 120 / 128, 2 * 45.5)):
        shape = Placement(4 * ppn, 4)
        steps = 2 * (shape.ranks - 1)
        _, tree_bw = candidate(four, pb.ALL_REDUCE, GIB, shape, "Tree", "LL128")
        _, nvls_bw = candidate(four, pb.ALL_REDUCE, GIB, shape, "NVLS-Tree", "Simple")
        assert (tree_bw, nvls_bw) == pytest.approx((tree / 2, nvls_tree * shape.ranks / steps))
    # hgx-a100's NICs carry 23.5 GB/s, below the 25 NCCL doubles at: one GPU per node keeps one
    # channel, and Ampere's Tree cap on more than 2 nodes (17.8) holds it below 0.92 x 23.5 = 21.6
    a100 = NcclModel(network_for("hgx-a100", [("data", 4), ("tensor", 8)]))
    _, one_each = candidate(a100, pb.ALL_REDUCE, GIB, a100.group_shape([0, 8, 16, 24]), "Tree", "Simple")
    assert one_each == pytest.approx(17.8 / 2)


def nvl72_racks(racks: int, release: str | None = None) -> NcclModel:
    """NVL72 racks, with NCCL `release`'s tuner picking (None: the newest's, 2.30.7)."""
    model = NcclModel(network_for("nvl72", [("data", racks), ("tensor", 72)]))
    return NcclModel(replace(model.network, cluster=replace(model.cluster, nccl=release)))


def test_between_nodes_a_graph_reaches_one_nic_per_channel():
    """NVL72: 72 GPUs a rack, each with a 47 GB/s NIC, but NCCL's graphs have 16 channels between
    racks, each leaving through one NIC: 16 x 47 = 752 GB/s, not 72 x 47 = 3384. 16 GiB:
    - 20 racks, NVLS-Tree: min(NVLS 845.4, 752, 16 x 80 (Blackwell's cap beyond 2 nodes)) = 752;
    - 2 racks: the NICs counted twice (1504), so NVLS's 845.4 holds it;
    - Ring Simple on 20 racks: min(the node's 721.8, 752) = 721.8."""
    twenty, two = Placement(1440, 20), Placement(144, 2)
    _, nvls_tree = candidate(nvl72_racks(20), pb.ALL_REDUCE, 16 * GIB, twenty, "NVLS-Tree", "Simple")
    assert nvls_tree == pytest.approx(752 * 1440 / 2878)
    _, two_racks = candidate(nvl72_racks(2), pb.ALL_REDUCE, 16 * GIB, two, "NVLS-Tree", "Simple")
    assert two_racks == pytest.approx(845.4 * 144 / 286)
    _, ring = candidate(nvl72_racks(20), pb.ALL_REDUCE, 16 * GIB, twenty, "Ring", "Simple")
    assert ring == pytest.approx(721.8 * 1440 / 2878)


def test_twenty_nvl72_racks_under_nccl_2_26_run_the_tree_at_its_blackwell_speed():
    """CoreWeave's 20 NVL72 racks state NCCL 2.26.2 and reach 405 GB/s of bus bandwidth at 16 GiB,
    about half of two racks' 821. NCCL 2.26.2's tuner, 1440 ranks on 20 racks (log2 20 = 4):
    - NVLS-Tree: 25 + 2 x 4 x 14 = 137 µs; its graph's NVLS, 845.4 / (2 x 0.74 x 71/72) = 579.3,
      against its 16 NICs' 752 halved beyond 2 nodes: 376 x 5/6 = 313.3 GB/s;
    - Tree Simple: 8.4 + 2 (71 x 4.0 + 4 x 14) = 688.4 µs; min(0.92 x 721.8, 16 x 72.0 (2.26's
      Blackwell cap)) / 2 = 332.0 GB/s.
    At 2 GiB NVLS-Tree is predicted faster (6991 against 7156 µs), at 4 GiB the tree (13624
    against 13844). Flint times that tree at 2.30.7's Blackwell cap beyond 2 nodes, 24 GB/s a
    channel: 16 x 24 / 2 = 192 GB/s, so 16 GiB takes 688.4 + 16 GiB / 192 GB/s = 90,166.9 µs, 381
    GB/s of bus bandwidth (measured 84,828 µs)."""
    shape, model = Placement(1440, 20), nvl72_racks(20, "2.26.2")
    nvls_tree = (137.0, 376 * 5 / 6)
    tree = (688.4, min(0.92 * 721.8, 16 * 72.0) / 2)
    assert 845.4 / (2 * 0.74 * 71 / 72) > 376
    for size, algorithm in ((2 * GIB, "NVLS-Tree"), (4 * GIB, "Tree")):
        by_tuner = {name: latency + size / (bandwidth * 1e3) for name, (latency, bandwidth)
                    in (("NVLS-Tree", nvls_tree), ("Tree", tree))}
        assert min(by_tuner, key=by_tuner.get) == algorithm
        assert model.choose(pb.ALL_REDUCE, size, shape).algorithm == algorithm
    choice = model.choose(pb.ALL_REDUCE, 16 * GIB, shape)
    assert (choice.algorithm, choice.protocol) == ("Tree", "Simple")
    assert choice.micros == pytest.approx(688.4 + 16 * GIB / (16 * 24.0 / 2 * 1e3))
    assert choice.micros == pytest.approx(90166.9, abs=0.1)


def test_a_ring_across_nodes_pays_the_network_per_step_and_the_nics():
    """Ring Simple on 2 nodes, 1 GiB: 30 steps, 2 of them between nodes: 8.4 + 28 x max(3.4, 3 x
    1.0) + 2 x 14 = 131.6 µs, x 1.4 for the ring's plateau; bus bandwidth min(370.8, 8 x 47)."""
    latency, bandwidth = candidate(TWO_NODES, pb.ALL_REDUCE, GIB, Placement(16, 2), "Ring", "Simple")
    assert latency == pytest.approx((8.4 + 28 * 3.4 + 2 * 14) * 1.4)
    assert bandwidth == pytest.approx(370.8 * 16 / 30)
    # one GPU per node (a data-parallel group across 2 nodes): one NIC's 47 GB/s
    _, one_nic = candidate(TWO_NODES, pb.ALL_REDUCE, GIB, TWO_NODES.group_shape([3, 11]), "Ring", "Simple")
    assert one_nic == pytest.approx(47 * 2 / 2)


def test_a_forced_algorithm_and_protocol_are_what_nccl_algo_and_nccl_proto_hold_nccl_to():
    """1 GiB on one node, Ring forced (NCCL_ALGO=Ring): not NVLS but the fastest ring, Simple:
    8.4 + 14 x 3.4 = 56 µs at 370.8 x 8 / 14 GB/s; Ring LL128 forced: 14.0 + 14 x 1.9 = 40.6 µs at
    0.92 x 370.8 x 8 / 14. NVLS has no LL: one line."""
    ring = NODE.choose(pb.ALL_REDUCE, GIB, Placement(8, 1), algorithm="Ring")
    assert (ring.algorithm, ring.protocol) == ("Ring", "Simple")
    assert ring.micros == pytest.approx(8.4 + 14 * 3.4 + GIB / (370.8 * 8 / 14 * 1e3))
    ll128 = NODE.choose(pb.ALL_REDUCE, GIB, Placement(8, 1), algorithm="Ring", protocol="LL128")
    assert ll128.micros == pytest.approx(40.6 + GIB / (0.92 * 370.8 * 8 / 14 * 1e3))
    with pytest.raises(FlintError, match="NCCL has no NVLS LL here"):
        NODE.choose(pb.ALL_REDUCE, GIB, Placement(8, 1), algorithm="NVLS", protocol="LL")


def four_nodes(release: str | None) -> NcclModel:
    """hgx over 4 nodes, with NCCL `release`'s tuner picking (None: the newest's, 2.30.7)."""
    model = NcclModel(network_for("hgx", [("data", 4), ("tensor", 8)]))
    return NcclModel(replace(model.network, cluster=replace(model.cluster, nccl=release)))


def test_a_release_runs_what_its_own_tuner_predicts_fastest():
    """4 nodes of 8 H100, 2 MiB (log2(2 MiB / 64) = 15: corrections LL128 0.6, Simple 0.6).
    - Tree LL128, as Flint times it and every tuner predicts it: 14 + 2(7 x 1.25 + 2 x 8.5) = 65.5
      µs, and min(0.92 x 370.8, 8 channels x 36.0) x 120/128, at most 8 x 29.0 = 232 GB/s, / 2 x
      0.6: 65.5 + 2 MiB / 69.6 GB/s = 95.63 µs.
    - NVLS-Tree as Flint times it: 21.0 + 4 x 20.9 = 104.6 µs, min(480, 8 x 47, 8 x 45.5) = 364 x
      32 / 62 GB/s, by its chunks: 128 of 32 KiB (64 KiB from 4 nodes, halved below one round of
      8 MiB), one round of 2 MiB 3 deep, 104.6 - 14.4 + 3 (4.8 + 2 MiB / P): 134.5 µs, slower than
      Tree LL128 by Flint's times too.
    - NCCL 2.26.2's tuner (before 2.28): 25 + 4 x 14 = 81 µs; the NVLS graph's 480 / (2 x 0.85 x
      7/8) = 322.7 GB/s, the NICs' 376 halved beyond 2 nodes, so 188 x 5/6, uncorrected: 81 + 2 MiB
      / 156.7 GB/s = 94.4 µs, below Tree LL128's 95.63: it runs NVLS-Tree, which takes Flint's
      134.5 µs (NCCL 2.26.2 measured 132.2 on such nodes, nccl-tests issue 309). At 1 MiB its
      81 + 6.7 = 87.7 is above Tree LL128's 65.5 + 15.1 = 80.6: Tree.
    - NCCL 2.30.7's tuner (a file's that names none): 25 + 4 x 20.9 = 108.6 µs + 2 MiB / (364 x 32 /
      62) = 119.8: Tree."""
    size, shape = 2 * MIB, Placement(32, 4)
    tree = 65.5 + size / (232 / 2 * 0.6 * 1e3)
    assert tree == pytest.approx(95.63, abs=0.01)
    nvls_tree = nvls_pipelined(size, 32 * 1024, 128, 364 * 32 / 62, latency=104.6, largest=64 * 1024)
    assert nvls_tree == pytest.approx(134.5, abs=0.05) and nvls_tree > tree
    tuner_2_26 = 81 + size / (min(480 / (2 * 0.85 * 7 / 8), 8 * 47 / 2) * 5 / 6 * 1e3)
    assert tuner_2_26 == pytest.approx(94.4, abs=0.05) and tuner_2_26 < tree
    assert 108.6 + size / (364 * 32 / 62 * 1e3) > tree
    for release, algorithm, micros in ((None, "Tree", tree), ("2.26.2", "NVLS-Tree", nvls_tree),
                                       ("2.30.7", "Tree", tree)):
        choice = four_nodes(release).choose(pb.ALL_REDUCE, size, shape)
        assert (choice.algorithm, choice.micros) == (algorithm, pytest.approx(micros)), release
    smaller = four_nodes("2.26.2").choose(pb.ALL_REDUCE, MIB, shape)
    assert (smaller.algorithm, smaller.protocol) == ("Tree", "LL128")
    assert smaller.micros == pytest.approx(65.5 + MIB / (232 / 2 * 0.6 * 1e3))


def test_simulate_times_what_the_network_files_release_runs(tmp_path):
    """The hgx file naming NCCL 2.26.2: flint simulate of one 2 MiB all-reduce over 32 ranks (4
    nodes) takes NVLS-Tree's 134.5 µs (above), and says whose tuner picked; hgx itself, naming
    none, 2.30.7's pick: Tree LL128's 95.63."""
    traces = one_collective(tmp_path / "one", [list(range(32))], pb.ALL_REDUCE, 2 * MIB)
    path = tmp_path / "hgx-2.26.toml"
    path.write_text((NETWORKS / "hgx.toml").read_text().replace('cpu = "intel"', 'cpu = "intel"\nnccl = "2.26.2"'))
    older = json.loads(flint("simulate", traces, "--network", str(path), "--json", "-o", tmp_path / "a").stdout)
    assert older["network"]["nccl"] == "2.26.2"
    assert older["step_us"] == pytest.approx(
        nvls_pipelined(2 * MIB, 32 * 1024, 128, 364 * 32 / 62, latency=104.6, largest=64 * 1024))
    newest = json.loads(flint("simulate", traces, "--json", "-o", tmp_path / "b").stdout)
    assert newest["network"]["nccl"] == "2.30.7"
    assert newest["step_us"] == pytest.approx(65.5 + 2 * MIB / (232 / 2 * 0.6 * 1e3))
    assert "NCCL 2.26.2's tuner picks" in flint("simulate", traces, "--network", str(path), "-o", tmp_path / "c").stdout


def test_each_release_takes_its_tables_from_its_own_tuning_cc():
    """NVIDIA/nccl src/graph/tuning.cc at each tag: NVLS-Tree's network hop 14 µs up to 2.28.7, 20.9
    from 2.28.9; NVLS-Tree corrected on Blackwell with x86 hosts from 2.29.2; the NVLS formula of
    before 2.28 up to 2.27.7; Blackwell's Tree caps per channel 2 x Hopper's (77.4, 82.8, 72.0) up
    to 2.27.7, then 70.0, 42.8, 24.0; its NVLS-Tree caps 43.1 (2.28.3 and 2.28.7), 43.8 (2.28.9 to
    2.29.7), 80.0 (2.30); before 2.25 it took Hopper's Tree caps (38.7, 41.4, 36.0)."""
    expected = {"2.24.3": (14.0, False, True, [38.7, 41.4, 36.0]), "2.27.7": (14.0, False, True, [77.4, 82.8, 72.0]),
                "2.28.7": (14.0, False, False, [70.0, 42.8, 24.0]), "2.28.9": (20.9, False, False, [70.0, 42.8, 24.0]),
                "2.29.2": (20.9, True, False, [70.0, 42.8, 24.0]), "2.30.7": (20.9, True, False, [70.0, 42.8, 24.0])}
    for release, (hop, corrected, before, tree) in expected.items():
        tuner = release_tuner(release)
        settings = (tuner.hop_latency_us["net"]["nvls_tree"][2], tuner.nvls_tree_corrected, tuner.nvls_before_2_28)
        assert settings == (hop, corrected, before), release
        assert tuner.architecture["blackwell"]["tree_per_channel_gbps"] == tree, release
        assert tuner.architecture["hopper"]["tree_per_channel_gbps"] == [38.7, 41.4, 36.0]
    caps = {r: release_tuner(r).architecture["blackwell"]["nvls_tree_per_channel_gbps"][2]
            for r in ("2.28.3", "2.28.7", "2.28.9", "2.29.7", "2.30.3")}
    assert caps == {"2.28.3": 43.1, "2.28.7": 43.1, "2.28.9": 43.8, "2.29.7": 43.8, "2.30.3": 80.0}


def test_older_releases_take_their_own_tuning_cc():
    """tuning.cc at each tag back to 2.18.1: PAT at 0.85 in 2.23.4 and none before; up to 2.22.3 a
    Simple tree's base 0 and 28 µs a step, Ring LL128 with one GPU per node at 0.7, 2 more network
    steps of a ring all-reduce, each algorithm's own network hop with one GPU per node; up to
    2.20.5 Ring LL at 1/4 (1/3 for a gather in one node), Hopper's LL limit 87.7, NVLS's NVLink hop
    23; up to 2.18.6 NVLS a base of 23 and no NVLink hop, NVLS-Tree's network hop 19, a Simple
    tree's steps 4, 6 and 14; 2.18.1 28 again, and Hopper's Tree cap beyond 2 nodes 33.0."""
    pat = {r: release_tuner(r).pat_bus_fraction for r in ("2.24.3", "2.23.4", "2.22.3")}
    assert pat == {"2.24.3": 0.75, "2.23.4": 0.85, "2.22.3": 0.0}
    for release, tree_simple, ll128_one, extra, from_tree in (("2.23.4", (8.4, 4.0, 4.0, 14.0), 0.92, 0, True),
                                                              ("2.22.3", (0.0, 28.0, 28.0, 28.0), 0.7, 2, False),
                                                              ("2.18.5", (0.0, 4.0, 6.0, 14.0), 0.7, 2, False),
                                                              ("2.18.1", (0.0, 28.0, 28.0, 28.0), 0.7, 2, False)):
        tuner = release_tuner(release)
        hops = tuner.hop_latency_us
        assert (tuner.base_latency_us["tree"][2], *(hops[link]["tree"][2] for link in ("nvlink", "pci", "net"))) == \
            tree_simple, release
        settings = (tuner.ring_ll128_one_per_node_fraction, tuner.ring_all_reduce_extra_net_steps,
                    tuner.one_per_node_net_hop_from_tree)
        assert settings == (ll128_one, extra, from_tree), release
    for release, ll, ll_max, nvls_hop in (("2.21.5", [0.5, 0.5], 141.0, 25.0), ("2.20.5", [0.25, 1 / 3], 87.7, 23.0),
                                          ("2.19.1", [0.25, 1 / 3], 87.7, 23.0), ("2.18.5", [0.25, 1 / 3], 87.7, 0.0)):
        tuner = release_tuner(release)
        assert tuner.ring_ll_bus_fraction == pytest.approx(ll), release
        assert tuner.architecture["hopper"]["ll_max_gbps"][0] == ll_max, release
        assert tuner.hop_latency_us["nvlink"]["nvls"][2] == nvls_hop, release
    old = release_tuner("2.18.5")
    assert (old.base_latency_us["nvls"][2], old.hop_latency_us["net"]["nvls_tree"][2], old.nvls_before_2_19) == (23.0, 19.0, True)
    assert not release_tuner("2.19.1").nvls_before_2_19
    assert release_tuner("2.18.1").architecture["hopper"]["tree_per_channel_gbps"] == [38.7, 41.4, 33.0]
    assert release_tuner("2.18.3").architecture["hopper"]["tree_per_channel_gbps"] == [38.7, 41.4, 36.0]


def test_before_2_21_ring_ll_took_a_quarter_so_nvls_ran_from_512_kib():
    """One 8x H100 node, 512 KiB all-reduce. 2.24.3's tuner: Ring LL 6.6 + 14 x 0.6 = 15.0 µs at
    min(141, 370.8 / 2) x 8/14 = 80.57 GB/s, 21.51 µs; NVLS 25 + 512 KiB / (322.7 x 5/6): 26.95:
    Ring LL, which Flint times so too. 2.20.5's: Ring LL at min(87.7, 370.8 / 4) x 8/14 = 50.11,
    25.46 µs; NVLS 23 + 1.97 = 24.97: NVLS, as 2.18.5's (its base 23): Flint times NVLS by its
    chunks, one round of 128 x 4 KiB (less than 16 KiB each), three stages: 21.0 + 3 x 512 KiB at
    1 / (14 / 480 - 4.8 µs / 16 MiB) GB/s = 26.28 µs. The NVLS graph: 8 channels of 40 GB/s in
    every release (9 x 40 within a GPU's 370.8; 50 would not fit)."""
    size, shape = 512 * 1024, Placement(8, 1)
    nvls_graph = 8 * 40.0
    flint_nvls = 21.0 + 3 * size * (14 / (480 * 8e3) - 4.8 / (16 * MIB))
    assert flint_nvls == pytest.approx(nvls_pipelined(size, 16 * 1024, 128, 480 * 8 / 14))
    assert flint_nvls == pytest.approx(26.28, abs=0.005)
    assert 15.0 + size / (141 * 8 / 14 * 1e3) < 25 + size / (nvls_graph * 5 / 6 * 1e3)
    assert 15.0 + size / (87.7 * 8 / 14 * 1e3) > 23 + size / (nvls_graph * 5 / 6 * 1e3)
    for release, algorithm, micros in (("2.24.3", "Ring", 15.0 + size / (141 * 8 / 14 * 1e3)),
                                       ("2.20.5", "NVLS", flint_nvls), ("2.18.5", "NVLS", flint_nvls)):
        model = NcclModel(replace(NODE.network, cluster=replace(NODE.cluster, nccl=release)))
        choice = model.choose(pb.ALL_REDUCE, size, shape)
        assert (choice.algorithm, choice.micros) == (algorithm, pytest.approx(micros)), release
        found = {(a, p): (lat, bw) for a, p, lat, bw in model.candidates(pb.ALL_REDUCE, size, shape, release_tuner(release))}
        assert found["NVLS", "Simple"] == pytest.approx((25.0 if release == "2.24.3" else 23.0, nvls_graph * 5 / 6))


def test_before_2_23_rings_trees_and_pat_as_their_tuning_cc_had_them():
    """2 nodes of 8 H100, as NCCL's tuners predict:
    - Ring Simple all-reduce, 1 GiB (30 steps, NVLink hop 3.4 above 3 x Intel's 1.0): 2.23.4
      (8.4 + 28 x 3.4 + 2 x 14) x 1.4 = 184.24 µs; 2.22.3 counts 4 network steps: (8.4 + 26 x
      3.4 + 4 x 14) x 1.4 = 213.92;
    - Tree Simple: 2.23.4 8.4 + 2 (7 x 4 + 14) = 92.4 µs; 2.22.3 0 + 2 (7 x 28 + 28) = 448;
      2.18.5 0 + 2 (7 x 4 + 14) = 84;
    - one GPU per node, an all-gather: Ring LL128 over 2 channels (one NIC, doubled): 2.23.4
      min(0.92 x 47, 2 x 36.7) x 2/1 with the Tree's network hop, 14 + 8.5 µs; 2.22.3 0.7 x 47,
      the ring's own hop, 14 + 4.0; PAT 0.85 x 47 in 2.23.4, none in 2.22.3."""
    two, one_each = Placement(16, 2), Placement(2, 2)

    def predicted(release, kind, shape, total=GIB):
        return {(a, p): (lat, bw) for a, p, lat, bw in TWO_NODES.candidates(kind, total, shape, release_tuner(release))}

    ring = {r: predicted(r, pb.ALL_REDUCE, two)["Ring", "Simple"][0] for r in ("2.23.4", "2.22.3")}
    assert ring == pytest.approx({"2.23.4": (8.4 + 28 * 3.4 + 2 * 14) * 1.4, "2.22.3": (8.4 + 26 * 3.4 + 4 * 14) * 1.4})
    tree = {r: predicted(r, pb.ALL_REDUCE, two)["Tree", "Simple"][0] for r in ("2.23.4", "2.22.3", "2.18.5")}
    assert tree == pytest.approx({"2.23.4": 92.4, "2.22.3": 448.0, "2.18.5": 84.0})
    newer, older = predicted("2.23.4", pb.ALL_GATHER, one_each), predicted("2.22.3", pb.ALL_GATHER, one_each)
    assert newer["Ring", "LL128"] == pytest.approx((22.5, 0.92 * 47 * 2))
    assert older["Ring", "LL128"] == pytest.approx((18.0, 0.7 * 47 * 2))
    assert newer["PAT", "Simple"][1] == pytest.approx(0.85 * 47) and older["PAT", "Simple"][1] == 0.0


def test_before_2_19_nvls_tree_took_its_own_ratio_and_latency():
    """4 nodes of 8 H100 under 2.18.5's tuner: NVLS-Tree's bandwidth the NVLS graph's network
    speed beyond 2 nodes, 8 NICs' 376 GB/s (not halved), x 0.7 x 4 / (2 x 3) = 175.5 GB/s; its
    latency 23 + 2 x 3 x 19 = 137 µs, without the network's latency. 64 MiB: Tree Simple 0 + 2 (7 x 4
    + 2 x 14) = 112 µs at min(0.92 x 370.8, 8 x 36.0) / 2 x 0.8 (the correction at 2^20) = 115.2
    GB/s, 694.5 µs; NVLS-Tree 137 + 382.5 = 519.5: NVLS-Tree, which Flint times by its chunks, 8
    rounds of 128 x 64 KiB after 21.0 + 4 x 20.9 µs."""
    size, shape = 64 * MIB, Placement(32, 4)
    model = four_nodes("2.18.5")
    found = {(a, p): (lat, bw) for a, p, lat, bw in model.candidates(pb.ALL_REDUCE, size, shape, release_tuner("2.18.5"))}
    assert found["NVLS-Tree", "Simple"] == pytest.approx((137.0, 376 * 0.7 * 4 / 6))
    assert found["Tree", "Simple"] == pytest.approx((112.0, 288 / 2 * 0.8))
    choice = model.choose(pb.ALL_REDUCE, size, shape)
    assert (choice.algorithm, choice.micros) == ("NVLS-Tree", pytest.approx(
        nvls_pipelined(size, 64 * 1024, 128, 364 * 32 / 62, latency=21.0 + 4 * 20.9, largest=64 * 1024)))


def test_no_release_runs_nvls_before_hopper():
    """NCCL's search finds no NVLS graph below compute capability 9.0, so a file that gives an
    Ampere node NVLS bandwidths has no NVLS (held to it, one line) and runs its ring under every
    release's tuner: 1 GiB on one node, Ring Simple, 8.4 + 14 x 3.4 µs + 1 GiB / (370.8 x 8 / 14)."""
    ampere = replace(NODE.cluster, architecture="ampere")
    model = NcclModel(replace(NODE.network, cluster=ampere))
    assert "NVLS" not in {a for a, *_ in model.candidates(pb.ALL_REDUCE, GIB, Placement(8, 1))}
    with pytest.raises(FlintError, match="NCCL has no NVLS here"):
        model.choose(pb.ALL_REDUCE, GIB, Placement(8, 1), algorithm="NVLS")
    for release in ("2.26.2", "2.30.7", None):
        tuned = NcclModel(replace(NODE.network, cluster=replace(ampere, nccl=release)))
        choice = tuned.choose(pb.ALL_REDUCE, GIB, Placement(8, 1))
        assert (choice.algorithm, choice.protocol) == ("Ring", "Simple")
        assert choice.micros == pytest.approx(8.4 + 14 * 3.4 + GIB / (370.8 * 8 / 14 * 1e3))


def test_a_network_file_names_the_nccl_its_cluster_runs(tmp_path):
    """`nccl` takes a release or a minor version (its newest release), is written back as the
    release, and refuses one Flint has no tuner of in one line that lists those it has."""
    path = tmp_path / "net.toml"
    body = '[node]\ngpus = 8\nbus_gbps = 370.8\n'
    path.write_text(f'name = "mine"\nnccl = "2.26"\n{body}')
    network = load_network_file(path)
    assert network.nccl == "2.26.6"
    assert 'nccl = "2.26.6"' in network_toml(network, "mine")
    path.write_text(f'name = "mine"\nnccl = "2.17.1"\n{body}')
    with pytest.raises(FlintError, match=r"is not valid: nccl is '2.17.1': Flint has the tuners of NCCL "
                                         r"2.18.1 to 2.30.7 \(2.18.1, 2.18.3, 2.18.5, .*\); give one of those"):
        load_network_file(path)
    traces = one_collective(tmp_path / "one", [list(range(8))], pb.ALL_REDUCE, MIB)
    run = flint("simulate", traces, "--network", str(path), "-o", tmp_path / "s")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1


def test_many_nodes_keep_a_small_all_reduce_to_tens_of_microseconds():
    """32 nodes of 8, 8 B: Tree LL, 6.8 + 2 (7 x 0.6 + log2(32) x 5.0) = 65.2 µs (a ring's 510
    steps would take 6.6 + 448 x 1.0 + 62 x 2.7 = 622 µs)."""
    model = NcclModel(network_for("hgx", [("data", 32), ("tensor", 8)]))
    choice = model.choose(pb.ALL_REDUCE, 8, model.group_shape(range(256)))
    assert (choice.algorithm, choice.protocol) == ("Tree", "LL")
    assert choice.micros == pytest.approx(65.2, abs=0.01)
    ring, _ = candidate(model, pb.ALL_REDUCE, 8, Placement(256, 32), "Ring", "LL")
    assert ring == pytest.approx(6.6 + 448 * 1.0 + 62 * 2.7)


def test_a_node_without_nvlink_runs_no_ll128(tmp_path):
    """NCCL enables LL128 only over NVLink (tuning.cc: typeIntra <= PATH_NVB), Hopper included. A
    PCI node of 8 H100 at 50 GB/s, 4 MiB: Ring Simple, 8.4 + 14 x 5.7 µs (PCI's Simple step) at 50 x
    8 / 14 GB/s, before Ring LL, 6.6 + 14 x 1.0 µs at 25 x 8 / 14."""
    path = tmp_path / "pcie.toml"
    path.write_text('name = "pcie"\narchitecture = "hopper"\ncpu = "intel"\n[node]\ngpus = 8\nlink = "pci"\n'
                    "bus_gbps = 50\n")
    model = NcclModel(network_for(str(path), [("tensor", 8)]))
    assert {p for _, p, _, _ in model.candidates(pb.ALL_REDUCE, 4 * MIB, Placement(8, 1))} == {"LL", "Simple"}
    choice = model.choose(pb.ALL_REDUCE, 4 * MIB, Placement(8, 1))
    assert (choice.algorithm, choice.protocol) == ("Ring", "Simple")
    assert choice.micros == pytest.approx(8.4 + 14 * 5.7 + 4 * MIB / (50 * 8 / 14 * 1e3))
    ll = candidate(model, pb.ALL_REDUCE, 4 * MIB, Placement(8, 1), "Ring", "LL")
    assert ll == pytest.approx((6.6 + 14 * 1.0, 25 * 8 / 14))


def test_a_network_file_without_channels_between_nodes_has_one_per_nic(tmp_path):
    """A user's file that does not give `scale_out.channels` gets one channel per NIC, at most the
    node's channels: 4 NICs, 4 channels; 32, the node's 16."""
    for nics, channels in ((4, 4), (32, 16)):
        path = tmp_path / f"{nics}.toml"
        path.write_text(f'name = "mine"\n[node]\ngpus = 8\nbus_gbps = 370.8\n[scale_out]\nnics = {nics}\n'
                        "nic_gbps = 47\n")
        assert load_network_file(path).scale_out.channels == channels


def test_collnet_where_the_network_switches_reduce(tmp_path):
    """With SHARP in the scale-out network, 4 nodes of 8: CollNet Direct, 2 (min(1, 7) x 3.7 + 7 x
    0.4) + 31 = 44.0 µs, at 0.85 x min(370.8, 8 x 47) / 2 GB/s; none with 16 GPUs of a node."""
    path = tmp_path / "sharp.toml"
    path.write_text('name = "sharp"\narchitecture = "hopper"\ncpu = "intel"\n[node]\ngpus = 8\nbus_gbps = 370.8\n'
                    "[scale_out]\nnics = 8\nnic_gbps = 47.0\nsharp = true\n")
    model = NcclModel(network_for(str(path), [("data", 4), ("tensor", 8)]))
    latency, bandwidth = candidate(model, pb.ALL_REDUCE, GIB, Placement(32, 4), "CollNet", "Simple")
    assert (latency, bandwidth) == pytest.approx((44.0, 0.85 * 370.8 / 2))
    # NCCL runs CollNet Direct with at most 8 GPUs in the node (NCCL_MAX_DIRECT_ARITY + 1)
    path.write_text(path.read_text().replace("gpus = 8", "gpus = 16").replace("nics = 8", "nics = 16"))
    wide = NcclModel(network_for(str(path), [("data", 4), ("tensor", 16)]))
    assert "CollNet" not in {a for a, *_ in wide.candidates(pb.ALL_REDUCE, GIB, Placement(64, 4))}
    assert "CollNet" in {a for a, *_ in wide.candidates(pb.ALL_REDUCE, GIB, Placement(32, 4))}


def test_pat_with_one_gpu_per_node():
    """An all-gather over one GPU of each of 4 nodes may run PAT: 8.0 + log2(4) x 14 / 3.5 + 4 x
    2.8 = 27.2 µs, at 0.75 of one NIC's 47 GB/s."""
    model = NcclModel(network_for("hgx", [("data", 4), ("tensor", 8)]))
    shape = model.group_shape([0, 8, 16, 24])
    assert shape == Placement(4, 4)
    assert candidate(model, pb.ALL_GATHER, 4 * MIB, shape, "PAT", "Simple") == pytest.approx((27.2, 0.75 * 47))


def test_all_to_all_and_send_recv_are_point_to_point():
    """All-to-all of 8 MiB per rank in a node: 8.4 + 3.4 µs, then 7/8 of it over the node's
    370.8 GB/s; a SEND of 1 MiB between nodes: 8.4 + 3.4 + 14 µs, at one NIC's 47 GB/s. nccl-tests'
    sendrecv_perf over 16 ranks on 2 nodes takes as long as its pairs that cross nodes."""
    assert NODE.collective_micros(pb.ALL_TO_ALL, 8 * MIB, range(8)) == pytest.approx(
        11.8 + 8 * MIB * 7 / 8 / 370.8e3)
    assert TWO_NODES.transfer_micros(0, 8, MIB) == pytest.approx(25.8 + MIB / 47e3)
    assert TWO_NODES.transfer_micros(0, 1, MIB) == pytest.approx(11.8 + MIB / 370.8e3)
    assert TWO_NODES.choose(SEND_RECV, MIB, Placement(16, 2)).micros == pytest.approx(25.8 + MIB / 47e3)
    assert NODE.choose(SEND_RECV, MIB, Placement(8, 1)).micros == pytest.approx(11.8 + MIB / 370.8e3)


def test_an_a100_node_has_no_nvls_and_its_rings_run_at_their_fitted_numbers():
    """hgx-a100: Ampere, no NVLink SHARP. Its file's one-node ring numbers are fitted to a
    published 8x A100 run: 234.1 GB/s bus, 11.9 µs a Simple step (NCCL's 3.4), LL128 at 0.44 of
    the bus (NCCL's 0.92). A 1 GiB all-reduce is Ring Simple: 8.4 + 14 x 11.9 + S / (234.1 x 8 /
    14 x 10^3) µs. At 8 MiB NCCL's tuner predicts Ring LL128 at its 0.92: 14 + 14 x 1.9 + S /
    (0.92 x 234.1 x 8 / 14 x 10^3) = 108.8 µs, before LL's 15 + S / (87.7 x 8 / 14 x 10^3) =
    182.4; so LL128 runs, and Flint times it at the fitted 0.44: 183.1 µs. Across two nodes the
    fitted numbers do not apply: the times are those of NCCL's constants."""
    model = NcclModel(network_for("hgx-a100", [("tensor", 8)]))
    choice = model.choose(pb.ALL_REDUCE, GIB, Placement(8, 1))
    assert (choice.algorithm, choice.protocol) == ("Ring", "Simple")
    assert choice.micros == pytest.approx(8.4 + 14 * 11.9 + GIB / (234.1 * 8 / 14 * 1e3))
    choice = model.choose(pb.ALL_REDUCE, 8 * MIB, Placement(8, 1))
    assert (choice.algorithm, choice.protocol) == ("Ring", "LL128")
    assert 40.6 + 8 * MIB / (0.92 * 234.1 * 8 / 14 * 1e3) == pytest.approx(108.8, abs=0.05)
    assert choice.micros == pytest.approx(14 + 14 * 1.9 + 8 * MIB / (0.44 * 234.1 * 8 / 14 * 1e3))
    assert choice.micros == pytest.approx(183.1, abs=0.05)
    cluster = model.cluster
    constants = replace(cluster, node=replace(cluster.node, ring_simple_hop_us=None, ll128_bus_fraction=None))
    two_nodes = NcclModel(network_for("hgx-a100", [("data", 2), ("tensor", 8)]))
    untuned = NcclModel(replace(two_nodes.network, cluster=constants))
    for size in (8 * MIB, GIB):
        assert two_nodes.choose(pb.ALL_REDUCE, size, Placement(16, 2)) == untuned.choose(
            pb.ALL_REDUCE, size, Placement(16, 2))


def test_simulate_times_one_collective_as_nccl_by_default(tmp_path):
    """flint simulate's estimator (the default engine) on one 1 GiB all-reduce over 8 ranks: NVLS's
    64 rounds of 16 MiB, three stages deep, 21.0 - 14.4 + 66 x 2^24 / (480 x 8 / 14 x 10^3) µs."""
    traces = one_collective(tmp_path / "one", [list(range(8))], pb.ALL_REDUCE, GIB)
    result = json.loads(flint("simulate", traces, "--json", "-o", tmp_path / "s").stdout)
    assert result["engine"] == "flint" and result["collectives"] == "nccl"
    assert result["step_us"] == pytest.approx(6.6 + 66 * 16 * MIB / (480 * 8 / 14 * 1e3))


def test_a_bad_network_file_is_one_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('name = "bad"\n[node]\ngpus = 8\nbus_gbps = -1\n')
    with pytest.raises(FlintError, match=r"network file '.*bad.toml' is not valid: .*bus_gbps is -1"):
        network_for(str(path), [("tensor", 8)])
    traces = one_collective(tmp_path / "one", [list(range(8))], pb.ALL_REDUCE, MIB)
    run = flint("simulate", traces, "--network", str(path), "-o", tmp_path / "s")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "bus_gbps is -1" in run.stderr
    path.write_text('name = "bad"\n[node]\ngpus = 8\nbus_gbps = 200\nll128_bus_fraction = 1.5\n')
    with pytest.raises(FlintError, match=r"is not valid: .*ll128_bus_fraction is 1.5, not a fraction"):
        network_for(str(path), [("tensor", 8)])
    path.write_text('name = "bad"\n[node]\ngpus = 8\nbus_gbps = 200\n'
                    '[scale_out]\nnics = 8\nnic_gbps = 47\nsharp = "no"\n')
    with pytest.raises(FlintError, match=r"is not valid: .*sharp is 'no', not true or false"):
        network_for(str(path), [("tensor", 8)])


def test_an_nvls_step_longer_than_its_largest_round_is_one_line(tmp_path):
    """A round of 128 chunks of 128 KiB at 480 GB/s of bus bandwidth (x 8 / 14) takes 16 MiB /
    274.3 GB/s = 61.2 µs on 8 GPUs: a step of 70 µs cannot fit in it whatever the bandwidth, so
    the file's numbers contradict each other, and a 1 GiB all-reduce (NVLS) says so in one line;
    60 µs fits."""
    text = ('name = "steep"\narchitecture = "hopper"\n[node]\ngpus = 8\nbus_gbps = 370.8\n'
            'nvls_bus_gbps = [480.0]\nnvls_latency_us = 21.0\nnvls_step_us = {}\n')
    path = tmp_path / "steep.toml"
    path.write_text(text.format(70))
    traces = one_collective(tmp_path / "one", [list(range(8))], pb.ALL_REDUCE, GIB)
    run = flint("simulate", traces, "--network", str(path), "-o", tmp_path / "s")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "NVLS's step (70 µs, node.nvls_step_us) outlasts a round of its largest chunks" in run.stderr
    assert "(61.2 µs on 8 GPUs)" in run.stderr
    path.write_text(text.format(60))
    model = NcclModel(network_for(str(path), [("tensor", 8)]))
    assert model.choose(pb.ALL_REDUCE, GIB, Placement(8, 1)).micros == pytest.approx(
        21.0 - 3 * 60 + 66 * 16 * MIB / (480 * 8 / 14 * 1e3))


@pytest.mark.parametrize("network_line, device_line, expected", [
    ("bus_gbps = inf", "mem_bw_gbps = inf", "is inf, not a finite number above 0"),
    ("bus_gbps = 200\nll128_bus_fraction = 1.5", "mem_bw_gbps = 100\n[calibration]\nmemory_efficiency = 1.5",
     "is 1.5, not a fraction \\(above 0, at most 1\\)"),
], ids=["infinite", "share-above-1"])
def test_network_and_device_files_name_a_bad_number_alike(tmp_path, network_line, device_line, expected):
    """One check reads the numbers of both kinds of file: each refuses TOML's `inf` as a bandwidth,
    and a share above 1, with the same words."""
    network, device = tmp_path / "net.toml", tmp_path / "gpu.toml"
    network.write_text(f'name = "n"\n[node]\ngpus = 8\n{network_line}\n')
    device.write_text(f'name = "d"\npeak_tflops = 100\n{device_line}\n')
    with pytest.raises(FlintError, match=expected):
        network_for(str(network), [("tensor", 8)])
    with pytest.raises(FlintError, match=expected):
        load_device(str(device))


NETWORKS = ROOT / "src" / "flint" / "step" / "networks"


@pytest.mark.parametrize("right, typo, expected", [
    ("[scale_out]", "[scaleout]", "unknown key or table 'scaleout': use name, architecture, cpu, nccl, node, "
                                  "scale_out, sources"),
    ("nvls_bus_gbps =", "nvls_bus_gbp =", "unknown [node] key 'nvls_bus_gbp': use gpus, link, bus_gbps, channels, "
                                          "nvlink_gbps, nvls_bus_gbps, "),
    ("sharp =", "sharpe =", "unknown [scale_out] key 'sharpe': use nics, nic_gbps, channels, latency_us, sharp, "),
], ids=["table", "node-key", "scale-out-key"])
def test_a_network_file_refuses_a_key_it_does_not_know(tmp_path, right, typo, expected):
    """The hgx file with a misspelt table or key, which was dropped (two nodes timed as one, a node
    without NVLS): one line naming the key and the ones a network file has, exit 2, nothing written."""
    path = tmp_path / "typo.toml"
    path.write_text((NETWORKS / "hgx.toml").read_text().replace(right, typo))
    with pytest.raises(FlintError, match=f"network file '.*typo.toml' is not valid: {re.escape(expected)}"):
        network_for(str(path), [("data", 2), ("tensor", 8)])
    traces = one_collective(tmp_path / "one", [list(range(16))], pb.ALL_REDUCE, MIB)
    run = flint("simulate", traces, "--network", path, "--json", "-o", tmp_path / "s")
    assert run.returncode == 2 and run.stdout == "" and not (tmp_path / "s").exists()
    assert run.stderr.startswith("error: ") and len(run.stderr.strip().splitlines()) == 1
    assert expected in run.stderr


@pytest.mark.parametrize("right, typo, expected", [
    ("[calibration]", "[calibraton]", "unknown key or table 'calibraton': use name, peak_tflops, mem_bw_gbps, "
                                      "vector_tflops, compute_units, calibration, sources"),
    ("compute_units = 132\n", "compute_units = 132\nbogus_key = 1\n", "unknown key or table 'bogus_key'"),
    ("gemm_tile =", "gemm_tiles =", "unknown [calibration] key 'gemm_tiles': use gemm_efficiency, "),
], ids=["table", "key", "calibration-key"])
def test_a_device_file_refuses_a_key_it_does_not_know(tmp_path, right, typo, expected):
    """The h100 file with a misspelt table or key, which was dropped (`[calibraton]`: compute timed
    at the roofline): one line naming it, exit 2, nothing written."""
    path = tmp_path / "typo.toml"
    path.write_text((DEVICES / "h100.toml").read_text().replace(right, typo))
    with pytest.raises(FlintError, match=f"device file '.*typo.toml' is not valid: {re.escape(expected)}"):
        load_device(str(path))
    traces = one_collective(tmp_path / "one", [list(range(8))], pb.ALL_REDUCE, MIB)
    run = flint("timeline", traces, "--device", path, "--durations", "calibrated", "--json", "-o", tmp_path / "t.json")
    assert run.returncode == 2 and run.stdout == "" and not (tmp_path / "t.json").exists()
    assert run.stderr.startswith("error: ") and len(run.stderr.strip().splitlines()) == 1
    assert expected in run.stderr


@pytest.mark.parametrize("sources, expected", [
    ('sources = "abc"', "sources is 'abc', not a table"),
    ("sources = [1]", "sources is [1], not a table"),
    ('[sources]\nbus_gbps = 1', "sources key 'bus_gbps' is 1, not text"),
], ids=["text", "list", "number"])
def test_network_and_device_files_refuse_sources_that_are_not_a_table_of_text(tmp_path, sources, expected):
    """`sources` that is not a table of text was a traceback (AttributeError) through timeline,
    simulate, sweep and calibrate: one line, with the same words for both kinds of file."""
    network, device = tmp_path / "net.toml", tmp_path / "gpu.toml"
    network.write_text(f'name = "n"\n{sources}\n[node]\ngpus = 8\nbus_gbps = 200\n')
    device.write_text(f'name = "d"\npeak_tflops = 100\nmem_bw_gbps = 100\n{sources}\n')
    with pytest.raises(FlintError, match=re.escape(expected)):
        network_for(str(network), [("tensor", 8)])
    with pytest.raises(FlintError, match=re.escape(expected)):
        load_device(str(device))
    traces = one_collective(tmp_path / "one", [list(range(8))], pb.ALL_REDUCE, MIB)
    run = flint("timeline", traces, "--network", network, "--json", "-o", tmp_path / "t.json")
    assert run.returncode == 2 and not (tmp_path / "t.json").exists()
    assert run.stderr.startswith("error: network file ") and len(run.stderr.strip().splitlines()) == 1
    assert expected in run.stderr


@pytest.mark.parametrize("text, words", [
    ('name = "n"\n[node]\ngpus = 8\nbus_gbps = 370.8\n[scale_out]\nnics = 8\n',
     "'nic_gbps' is missing: it needs name, [node] bus_gbps, and in a [scale_out] nics and nic_gbps"),
    ('name = "n"\nnccl = 2.30\n[node]\nbus_gbps = 370.8\n',
     'nccl is 2.3, not text: give the release in quotes (nccl = "2.26.2")'),
    ('name = "n"\nnccl = 2.26\n[node]\nbus_gbps = 370.8\n', "nccl is 2.26, not text"),
], ids=["scale-out key", "release 2.30", "release 2.26"])
def test_a_missing_key_or_a_bare_release_number_is_one_line_that_names_it(tmp_path, text, words):
    """A [scale_out] without nic_gbps was reported as needing name and [node] bus_gbps, which it had
    (with Python's KeyError); TOML reads nccl = 2.30 as the number 2.3, which was refused as release
    '2.3', and nccl = 2.26 was taken as 2.26.6 without a word."""
    path = tmp_path / "n.toml"
    path.write_text(text)
    with pytest.raises(FlintError, match=re.escape(words)):
        network_for(str(path), [("data", 2), ("tensor", 8)])

"""`flint calibrate --network`: a network fitted to nccl-tests output, on synthetic files whose
times follow NCCL's model of a known machine, by hand.

An 8-GPU node all-reducing with NVLS at 600 GB/s bus bandwidth, 60 µs for no bytes and 10 µs a
round of chunks: S bytes move in R = S / (128 x chunk) rounds of 128 chunks (16 channels x 8 heads)
of 64 KiB below 1 GiB, 128 KiB from it (enqueue.cc), three stages deep, each round 10 µs and its
bytes at B, where 1 / B = 14 / (8 x 600) - 10 µs / 16 MiB (rounds of 128 KiB chunks reach 600 GB/s
bus bandwidth; NCCL's algorithm bandwidth is the bus's times N / 2(N-1)): 60 - 3 x 10 + (R + 2) x
(10 + 128 x chunk / B) µs. NCCL's tuner, predicting by its own constants, runs NVLS at these sizes.
Some runs take 400 GB/s. An all-gather on a ring of 300 GB/s bus bandwidth: 8.4 + 7 x 3.4 µs
(NCCL's Ring Simple latency on NVLink) + S / (300 x 8 / 7 x 10^3).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import pytest
from conftest import ROOT, flint, nvls_pipelined

from flint.schema import et_def_pb2 as pb
from flint.step.nccl import NcclModel, Placement
from flint.step.network import network_for
from flint.step.network_files import load_network_file, toml_string

SIZES = [2**k for k in range(26, 35)]  # 64 MiB .. 16 GiB: where NVLS runs
MIB = 2**20


def nvls(latency_us: float, bus_gbps: float, step_us: float = 4.8) -> dict[int, float]:
    """One 8-GPU node's NVLS all-reduce times on SIZES at `bus_gbps` (x 8 / 14 its algorithm
    bandwidth), `latency_us` for no bytes and `step_us` a round (see the module docstring): 16
    channels x 8 heads of 128 KiB chunks from 1 GiB, 64 KiB below."""
    return {size: nvls_pipelined(size, (128 if size >= 2**30 else 64) * 1024, 128, bus_gbps * 8 / 14,
                                 latency=latency_us, step=step_us) for size in SIZES}


HEADER = "".join(f"#  Rank  {r} Group  0 Pid  {100 + r} on  node0 device  {r} [0x1b] NVIDIA H100\n" for r in range(8))


def nccl_tests(path, program: str, times: dict[int, float], header: str = HEADER):
    rows = "".join(f"{size:>12} {size // 4:>12} float sum -1 {t:9.1f} 0.0 0.0 0 {t:9.1f} 0.0 0.0 0\n"
                   for size, t in times.items())
    path.write_text(f"# nThread 1 nGpus 1 minBytes 8 maxBytes 17179869184 step: 2(factor)\n# {program}\n"
                    f"{header}#\n#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
                    f"{rows}# Avg bus bandwidth    : 0\n")
    return path


def assert_refused(run, written: Path, words: str) -> None:
    """Exit 2, one line on stderr that says `words`, and no file written."""
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert words in run.stderr and not written.exists()


def test_nvls_bandwidth_latency_and_step_are_recovered(tmp_path):
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", nvls(60, 600, 10))
    out = tmp_path / "fitted.toml"
    run = flint("calibrate", "--network", "hgx", measured, "-o", out, "--json")
    assert run.returncode == 0, run.stderr
    fit = json.loads(run.stdout)
    assert fit["fitted"]["node.nvls_latency_us"] == pytest.approx(60, abs=0.5)
    assert fit["fitted"]["node.nvls_step_us"] == pytest.approx(10, abs=0.05)
    assert fit["fitted"]["node.nvls_bus_gbps[7]"] == pytest.approx(600, rel=0.005)
    assert [r["ranks"] for r in fit["runs"]] == [8]  # from the file's Rank lines
    for row in fit["runs"][0]["rows"]:
        assert row["algorithm"] == "NVLS" and row["modelled_us"] == pytest.approx(row["measured_us"], rel=0.01)
    network = load_network_file(out)
    assert network.name == "hgx-calibrated" and network.node.nvls_bus_gbps[7] == pytest.approx(600, rel=0.005)
    assert "flint calibrate --network hgx on all_reduce_perf.txt" in dict(network.sources)["node.nvls_latency_us"]
    network_for(str(out), [("tensor", 8)])  # usable as --network


def test_a_latency_that_one_size_leaves_open_keeps_the_files_own_value(tmp_path):
    """One size (8 GiB): every NVLS latency and step fit it with a bandwidth of their own, so
    hgx's 21.0 and 4.8 µs stay and are not reported as fitted. The bandwidth is the one that takes
    the measured time after them: 512 rounds of 128 chunks of 128 KiB, three stages deep, so
    21.0 - 3 x 4.8 + 514 x 16 MiB / (bus x 8 / 14 x 10^3)."""
    size = 2**33
    measured_us = round(nvls(60, 400)[size], 1)  # as the file writes it
    measured = nccl_tests(tmp_path / "one.txt", "all_reduce_perf", {size: measured_us})
    run = flint("calibrate", "--network", "hgx", measured, "-o", tmp_path / "f.toml", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["fitted"] == {
        "node.nvls_bus_gbps[7]": pytest.approx(514 * 16 * MIB / ((measured_us - 6.6) * 8 / 14 * 1e3), rel=1e-6)}
    written = load_network_file(tmp_path / "f.toml")
    assert (written.node.nvls_latency_us, written.node.nvls_step_us) == (21.0, 4.8)


def test_a_ring_bandwidth_is_recovered_from_an_all_gather(tmp_path):
    times = {size: 8.4 + 7 * 3.4 + size / (300 * 8 / 7 * 1e3) for size in SIZES}
    measured = nccl_tests(tmp_path / "ag.txt", "all_gather_perf", times)
    run = flint("calibrate", "--network", "hgx", measured, "-o", tmp_path / "f.toml", "--json")
    assert run.returncode == 0, run.stderr
    # The ring's Simple step comes back as NCCL's 3.4 µs; no size runs LL128, so its share is not fitted.
    assert json.loads(run.stdout)["fitted"] == {"node.bus_gbps": pytest.approx(300, rel=0.001),
                                                "node.ring_simple_hop_us": pytest.approx(3.4, abs=1e-9)}
    text = flint("calibrate", "--network", "hgx", measured, "-o", tmp_path / "f.toml")
    assert "all_gather, 8 ranks on 1 node" in text.stdout and "Ring Simple" in text.stdout


def test_nic_bandwidth_is_recovered_from_a_sendrecv_between_two_nodes(tmp_path):
    """sendrecv_perf on one GPU of each of two nodes whose NICs carry 40 GB/s: 8.4 + 3.4 + 14 µs
    (NCCL's Ring Simple base, NVLink and network hops), then S / (40 x 10^3)."""
    times = {size: 25.8 + size / 40e3 for size in SIZES}
    measured = nccl_tests(tmp_path / "sendrecv_perf.txt", "sendrecv_perf", times,
                          header="#  Rank  0 Group  0 Pid 100 on a device 0 [0x1b] NVIDIA H100\n"
                                 "#  Rank  1 Group  0 Pid 100 on b device 0 [0x1b] NVIDIA H100\n")
    run = flint("calibrate", "--network", "hgx", measured, "-o", tmp_path / "f.toml", "--json")
    assert run.returncode == 0, run.stderr
    fit = json.loads(run.stdout)
    assert fit["fitted"] == {"scale_out.nic_gbps": pytest.approx(40, rel=0.001), "scale_out.latency_us": 0}
    assert (fit["runs"][0]["ranks"], fit["runs"][0]["nodes"]) == (2, 2)
    assert {row["algorithm"] for row in fit["runs"][0]["rows"]} == {"P2P"}
    # Faster than the model's latency (25.8 µs) no bandwidth reaches: refused, no file.
    fast = nccl_tests(tmp_path / "fast_sendrecv_perf.txt", "sendrecv_perf", {2**20: 20.0},
                      header="#  Rank  0 Group  0 Pid 100 on a device 0 [0x1b] NVIDIA H100\n"
                             "#  Rank  1 Group  0 Pid 100 on b device 0 [0x1b] NVIDIA H100\n")
    run = flint("calibrate", "--network", "hgx", fast, "-o", tmp_path / "fast.toml")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "(1,048,576 bytes) took 20.0 µs, and NCCL's model takes 25.8 at any scale_out.nic_gbps" in run.stderr
    assert not (tmp_path / "fast.toml").exists()


def test_a_malformed_file_is_one_line(tmp_path):
    bad = tmp_path / "all_reduce_perf.txt"
    bad.write_text("#  size count type\n        8   2  float  sum  -1  13.67  0.00\n")
    run = flint("calibrate", "--network", "hgx", bad, "--ranks", "8", "-o", tmp_path / "f.toml")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "line 2: not a row of nccl-tests' table" in run.stderr
    unnamed = tmp_path / "results.txt"
    unnamed.write_text("8 2 float sum -1 13.67 0.00 0.00 0 13.03 0.00 0.00 0\n")
    run = flint("calibrate", "--network", "hgx", unnamed, "--ranks", "8", "-o", tmp_path / "f.toml")
    assert run.returncode == 2 and "which collective?" in run.stderr
    no_ranks = tmp_path / "all_gather_perf.txt"
    no_ranks.write_text("8 2 float none -1 13.67 0.00 0.00 0 13.03 0.00 0.00 0\n")
    run = flint("calibrate", "--network", "hgx", no_ranks, "-o", tmp_path / "f.toml")
    assert run.returncode == 2 and "give --ranks" in run.stderr and not (tmp_path / "f.toml").exists()


def test_a_run_that_does_not_reach_its_bandwidth_is_refused(tmp_path):
    """An 8-GPU A100 node measured from 8 B to 16 KiB: every size runs Ring LL, 6.6 + 14 x 0.6 + S /
    (87.7 x 8 / 14 x c / 16 x 10^3) µs at NCCL's Ampere cap of 87.7 GB/s on c of its 16 channels
    (S / 32 KiB, at least one), as any bus bandwidth from twice that (LL's half of the bus) would
    give it. Before, the fit wrote the search's end, 100,000 GB/s."""
    times = {2**k: 6.6 + 14 * 0.6 + 2**k / (87.7 * 8 / 14 * max(1, 2**k // 2**15) / 16 * 1e3) for k in range(3, 15)}
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", times)
    run = flint("calibrate", "--network", "hgx-a100", measured, "-o", tmp_path / "f.toml")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "(16,384 bytes) NCCL's model runs Ring LL, whose time does not depend on node.bus_gbps" in run.stderr
    assert not (tmp_path / "f.toml").exists()


def test_a_latency_of_hundreds_of_microseconds_is_recovered(tmp_path):
    """350 µs before 400 GB/s, the order of what 72 GPUs' NVLS measures in a published rack, from 2
    GiB: every size runs chunks of 128 KiB, whose rounds reach the bandwidth whatever the step, so
    the times fix the latency less three steps only. The step is left as hgx has it (4.8 µs) and
    not reported as fitted, and the latency is the one that gives the times with it."""
    times = {size: t for size, t in nvls(350, 400).items() if size >= 2**31}
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", times)
    run = flint("calibrate", "--network", "hgx", measured, "-o", tmp_path / "f.toml", "--json")
    assert run.returncode == 0, run.stderr
    fit = json.loads(run.stdout)
    assert fit["fitted"]["node.nvls_latency_us"] == pytest.approx(350, abs=0.5)
    assert "node.nvls_step_us" not in fit["fitted"] and fit["at_limit"] == []
    assert load_network_file(tmp_path / "f.toml").node.nvls_step_us == 4.8


def test_a_latency_beyond_the_range_tried_is_said(tmp_path):
    # 2,500 µs: NVLS is still NCCL's choice at 8 and 16 GiB (its tuner predicts it by its own 25 µs).
    times = {size: t for size, t in nvls(2500, 400).items() if size >= 2**33}
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", times)
    fit = json.loads(flint("calibrate", "--network", "hgx", measured, "-o", tmp_path / "f.toml", "--json").stdout)
    assert fit["fitted"]["node.nvls_latency_us"] == 2000 and fit["at_limit"] == ["node.nvls_latency_us"]
    text = flint("calibrate", "--network", "hgx", measured, "-o", tmp_path / "f.toml")
    assert text.returncode == 0 and "node.nvls_latency_us ended at the end of the range tried (2000)" in text.stdout


def slow_a100_ring(ll128_share: float, powers: Sequence[int] = range(20, 31)) -> dict[int, float]:
    """2^k bytes all-reduced on 8 A100s whose rings run slower than NCCL's constants (235 GB/s bus,
    12 µs a Simple step, LL128 at `ll128_share` of the bus), by what NCCL 2.30.7's tuner predicts
    fastest with its own (LL: 6.6 + 14 x 0.6 + S / (87.7 x 8 / 14 x 10^3); LL128: 14 + 14 x 1.9 +
    S / (0.92 x 235 x 8 / 14 x 10^3); Simple: 8.4 + 14 x 3.4 + S / (235 x 8 / 14 x 10^3)): LL to 2
    MiB, LL128 from 4 to 16 MiB, Simple from 32 MiB; each at the node's own numbers."""
    bus = 235 * 8 / 14 * 1e3
    times = {}
    for size in (2**k for k in powers):
        ll = 6.6 + 14 * 0.6 + size / (87.7 * 8 / 14 * 1e3)
        predicted = {"LL": ll, "LL128": 14 + 14 * 1.9 + size / (0.92 * bus), "Simple": 8.4 + 14 * 3.4 + size / bus}
        measured = {"LL": ll, "LL128": 14 + 14 * 1.9 + size / (ll128_share * bus), "Simple": 8.4 + 14 * 12 + size / bus}
        times[size] = measured[min(predicted, key=predicted.get)]
    return times


def test_a_slow_ring_step_and_ll128_share_are_recovered_on_one_node(tmp_path):
    """The slow A100 node above with LL128 at 0.45 of the bus: NCCL runs LL to 2 MiB, LL128 from 4
    to 16 MiB (at 4 MiB 40.6 + S / (0.45 x 134.3 x 10^3) = 110.0 µs, where its tuner predicted
    74.6) and Simple from 32 MiB (176.4 + S / (134.3 x 10^3)); the fit recovers all three."""
    times = slow_a100_ring(0.45)
    assert times[4 * 2**20] == pytest.approx(110.0, abs=0.05)
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", times)
    run = flint("calibrate", "--network", "hgx-a100", measured, "-o", tmp_path / "f.toml", "--json")
    assert run.returncode == 0, run.stderr
    fit = json.loads(run.stdout)
    assert fit["fitted"]["node.bus_gbps"] == pytest.approx(235, rel=0.002)
    assert fit["fitted"]["node.ring_simple_hop_us"] == pytest.approx(12, abs=0.05)
    assert fit["fitted"]["node.ll128_bus_fraction"] == pytest.approx(0.45, abs=0.005)
    protocols = [row["protocol"] for row in fit["runs"][0]["rows"]]
    assert protocols == ["LL"] * 2 + ["LL128"] * 3 + ["Simple"] * 6
    written = load_network_file(tmp_path / "f.toml")
    assert written.node.ring_simple_hop_us == pytest.approx(12, abs=0.05)
    assert written.node.ll128_bus_fraction == pytest.approx(0.45, abs=0.005)


def test_an_ll128_share_no_size_runs_at_is_left_as_the_file_has_it(tmp_path):
    """The same node measured at 1 and 2 MiB (LL) and from 32 MiB (Simple) only: NCCL's tuner runs
    LL128 at none of them, whatever its share, so the sizes leave the share loose: a file without
    one keeps none (NCCL's 0.92), and the fit does not report it."""
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf",
                          slow_a100_ring(0.2, (20, 21, *range(25, 31))))
    shipped = (resources.files("flint.step") / "networks" / "hgx-a100.toml").read_text()
    base = tmp_path / "a100-nccl-ll128.toml"
    base.write_text("\n".join(line for line in shipped.splitlines() if not line.startswith("ll128_bus_fraction")))
    assert load_network_file(base).node.ll128_bus_fraction is None
    run = flint("calibrate", "--network", base, measured, "-o", tmp_path / "f.toml", "--json")
    assert run.returncode == 0, run.stderr
    fit = json.loads(run.stdout)
    rows = fit["runs"][0]["rows"]
    assert [row["protocol"] for row in rows] == ["LL"] * 2 + ["Simple"] * 6
    for row in rows:
        assert row["modelled_us"] == pytest.approx(row["measured_us"], rel=0.01)
    assert "node.ll128_bus_fraction" not in fit["fitted"]
    assert fit["fitted"]["node.ring_simple_hop_us"] == pytest.approx(12, abs=0.05)
    assert load_network_file(tmp_path / "f.toml").node.ll128_bus_fraction is None


def test_ranks_the_networks_nodes_cannot_hold_are_refused(tmp_path):
    """hgx's nodes hold 8 GPUs (its file's node.gpus). Before, 16 ranks of a two-node run with
    --nodes left at 1 were fitted as one node's NVLS, with exit 0, as were 9 ranks; and 8 ranks
    on 3 nodes were told to reach larger sizes. (400 GB/s, which hgx's 8 channels between
    nodes carry as NVLS-Tree, 8 x 57.7 = 461.6: the last run, on 2 nodes, is fitted.)"""
    times = nvls(60, 400)
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", times, header="")
    for flags, said in [(["--ranks", "16"], "16 ranks on 1 node (--ranks, and --nodes or its default 1), and "
                         "network hgx's nodes hold 8 GPUs: give the --nodes it ran on (2 or more)"),
                        (["--ranks", "9"], "9 ranks on 1 node"),
                        (["--ranks", "8", "--nodes", "3"], "8 ranks do not divide over 3 nodes")]:
        run = flint("calibrate", "--network", "hgx", measured, *flags, "-o", tmp_path / "f.toml")
        assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert said in run.stderr and not (tmp_path / "f.toml").exists()
    # 16 ranks that the file's Rank lines put on one host: the network is not the machine's.
    one_host = "".join(f"#  Rank {r:2} Group  0 Pid  {100 + r} on  node0 device  {r} [0x1b] NVIDIA H100\n"
                       for r in range(16))
    measured = nccl_tests(tmp_path / "big_all_reduce_perf.txt", "all_reduce_perf", times, header=one_host)
    run = flint("calibrate", "--network", "hgx", measured, "-o", tmp_path / "f.toml")
    assert run.returncode == 2 and "16 ranks on 1 node (its '#  Rank' lines)" in run.stderr
    assert "give the --network of the machine it ran on" in run.stderr and not (tmp_path / "f.toml").exists()
    # 16 ranks on 2 nodes is hgx's placement: no refusal of the placement itself.
    assert flint("calibrate", "--network", "hgx", tmp_path / "all_reduce_perf.txt", "--ranks", "16", "--nodes", "2",
                 "-o", tmp_path / "f.toml").returncode == 0


TWO_NODES = "".join(f"#  Rank {r:2} Group  0 Pid  {100 + r} on  node{r // 8} device  {r % 8} [0x1b] NVIDIA H100\n"
                    for r in range(16))


def nvls_tree_on_two_nodes(bus_gbps: float, sizes=SIZES) -> dict[int, float]:
    """NVLS-Tree's all-reduce over two hgx nodes of 8 at `bus_gbps` (x 16 / 30 its algorithm
    bandwidth), on `sizes` of 1 GiB or more, by NVLS's chunks (see test_nccl): rounds of 16 channels
    x 8 heads x 128 KiB (16 MiB), each 4.8 µs plus its bytes at the rate that makes them reach the
    bandwidth, 3 deep, after hgx's NVLS latency (21.0 µs) and two network steps of 20.9 (tuning.cc's
    NVLS-Tree hop)."""
    return {size: nvls_pipelined(size, 128 * 1024, 128, bus_gbps * 16 / 30, latency=21.0 + 2 * 20.9)
            for size in sizes if size >= 2**30}


def test_nvls_tree_held_by_nvls_fits_the_nodes_nvls_not_the_nics(tmp_path):
    """All-reduce across two hgx nodes of 8, 1 to 16 GiB: NCCL runs NVLS-Tree, whose bus bandwidth
    is the least of the node's NVLS (here 440 GB/s), twice the node's NICs on two nodes (2 x 8 x 47)
    and 16 channels of 57.7: 440 (`nvls_tree_on_two_nodes`). Before, the fit put the whole shortfall
    on the NICs: 27.5 GB/s each (440 / 16), where they carry 47. The run's sizes fit the network's
    latency (0), not the node's NVLS latency and step, which one node's run measures: before, a
    two-node run moved them and with them every one-node NVLS time."""
    times = nvls_tree_on_two_nodes(440)
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", times, header=TWO_NODES)
    run = flint("calibrate", "--network", "hgx", measured, "-o", tmp_path / "f.toml", "--json")
    assert run.returncode == 0, run.stderr
    fit = json.loads(run.stdout)
    assert fit["fitted"] == {"node.nvls_bus_gbps[7]": pytest.approx(440, rel=0.005),
                             "scale_out.latency_us": pytest.approx(0, abs=0.05)}
    assert {row["algorithm"] for row in fit["runs"][0]["rows"]} == {"NVLS-Tree"}
    network = load_network_file(tmp_path / "f.toml")
    assert (network.scale_out.nic_gbps, network.node.nvls_latency_us, network.node.nvls_step_us) == (47.0, 21.0, 4.8)


def test_a_run_faster_than_nccls_per_channel_cap_fits_the_channels_between_nodes(tmp_path):
    """The same two nodes at 470 GB/s: above NCCL's cap for hgx's 8 channels between nodes (8 x
    57.7 = 461.6, tuning.cc's NVLS-Tree per channel on 2 nodes), below NVLS (480) and the NICs (2 x
    8 x 47): no number of the machine reaches it, so the fit gives the channels 470 / 57.7 = 8.146
    (the machine's channels outrun NCCL's caps) and leaves NVLS and the NICs; the written file
    reads back with it."""
    times = nvls_tree_on_two_nodes(470)
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", times, header=TWO_NODES)
    run = flint("calibrate", "--network", "hgx", measured, "-o", tmp_path / "f.toml", "--json")
    assert run.returncode == 0, run.stderr
    fit = json.loads(run.stdout)
    assert fit["fitted"] == {"scale_out.channels": pytest.approx(470 / 57.7, rel=0.005),
                             "scale_out.latency_us": pytest.approx(0, abs=0.05)}
    network = load_network_file(tmp_path / "f.toml")
    assert network.scale_out.channels == pytest.approx(470 / 57.7, rel=0.005)
    assert (network.scale_out.nic_gbps, network.node.nvls_bus_gbps[7]) == (47.0, 480.0)


def ring_across_two_nodes(bus_gbps: float, network_us: float = 0.0) -> dict[int, float]:
    """A Simple ring over two hgx nodes of 8 at `bus_gbps`: NCCL's latency 8.4 + 28 x 3.4 (its steps
    within a node, NVLink's hop above 3 x the Intel host's 1 µs network overhead) + 2 x (14 + 2 x
    `network_us`) (its steps between nodes: NCCL's network hop, and the network's latency twice for
    Simple), 1.4 times over (a Simple ring across nodes with 64 B or more per channel and rank),
    then S / (bus x 16 / 30 x 10^3)."""
    latency = (8.4 + 28 * 3.4 + 2 * (14 + 2 * network_us)) * 1.4
    return {size: latency + size / (bus_gbps * 16 / 30 * 1e3) for size in SIZES}


def test_a_ring_forced_across_two_nodes_fits_the_nics_and_the_networks_latency(tmp_path):
    """NCCL_ALGO=Ring NCCL_PROTO=Simple across two nodes whose NICs carry 40 GB/s, 6 µs apart: the
    ring's bus bandwidth is the least of the node's (370.8) and its 8 GPUs' NICs (320). nccl-tests'
    output does not say the algorithm was forced; NCCL's own choice there, NVLS-Tree, would be
    timed instead."""
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", ring_across_two_nodes(320, 6.0),
                          header=TWO_NODES)
    run = flint("calibrate", "--network", "hgx", measured, "--algorithm", "ring", "--protocol", "simple",
                "-o", tmp_path / "f.toml", "--json")
    assert run.returncode == 0, run.stderr
    fit = json.loads(run.stdout)
    assert fit["fitted"] == {"scale_out.nic_gbps": pytest.approx(40, rel=0.001),
                             "scale_out.latency_us": pytest.approx(6.0, abs=0.05)}
    assert fit["runs"][0]["forced"] == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}
    for row in fit["runs"][0]["rows"]:
        assert (row["algorithm"], row["protocol"]) == ("Ring", "Simple")
        assert row["modelled_us"] == pytest.approx(row["measured_us"], rel=0.001)
    source = dict(load_network_file(tmp_path / "f.toml").sources)["scale_out.nic_gbps"]
    assert source.endswith("(in-place times, NCCL_ALGO=Ring, NCCL_PROTO=Simple)")


def test_a_ring_across_nodes_faster_than_the_nodes_ring_names_it(tmp_path):
    """The same ring at 400 GB/s: no NIC bandwidth gets it there, as hgx's node holds a ring to
    370.8 (its largest size then takes 184.2 + S / (370.8 x 16 / 30 x 10^3) µs)."""
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", ring_across_two_nodes(400),
                          header=TWO_NODES)
    run = flint("calibrate", "--network", "hgx", measured, "--algorithm", "Ring", "-o", tmp_path / "f.toml")
    node_bound = ring_across_two_nodes(370.8)[SIZES[-1]]
    assert_refused(run, tmp_path / "f.toml", f"NCCL's model takes {node_bound:,.1f} at any scale_out.nic_gbps, where "
                   "node.bus_gbps (370.8) bounds Ring Simple: the run is faster than hgx can be")


def ring_across_four_nodes() -> dict[int, float]:
    """A Simple ring over four hgx nodes of 8 whose NICs carry 46.1 GB/s, 1 to 16 GiB: its bus
    bandwidth the least of the node's (370.8) and its 8 GPUs' NICs (368.8), after (8.4 + 56 x 3.4 +
    6 x 14) x 1.4 µs (as above, with 6 steps between nodes)."""
    latency = (8.4 + 56 * 3.4 + 6 * 14) * 1.4
    return {size: latency + size / (8 * 46.1 * 32 / 62 * 1e3) for size in SIZES if size >= 2**30}


FOUR_NODES = "".join(f"#  Rank {r:2} Group  0 Pid  {100 + r} on  node{r // 8} device  {r % 8} [0x1b] NVIDIA H100\n"
                     for r in range(32))


def test_under_an_older_releases_tuner_the_nics_fit_below_its_switch(tmp_path):
    """The four-node ring (`ring_across_four_nodes`) under NCCL 2.26.2's tuner (the network file's
    nccl): 1 to 16 GiB run the ring. 2.26.2 predicts NVLS-Tree at 5/6 x min(480 / (2 x 0.85 x
    7/8), 8 x NIC / 2) GB/s, so from 57.3 GB/s NICs on it runs that, which Flint times at 8
    channels' cap (364): slower than the ring, 91,564 µs at 16 GiB against the measured 90,650.
    The time is then not falling everywhere as the NICs grow: the fit steps down from the file's 47
    to the crossing, where a bisection over the whole range ended at its top, above the switch, and
    refused."""
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", ring_across_four_nodes(),
                          header=FOUR_NODES)
    base = tmp_path / "hgx-2.26.toml"
    shipped = (resources.files("flint.step") / "networks" / "hgx.toml").read_text()
    base.write_text(shipped.replace('cpu = "intel"', 'cpu = "intel"\nnccl = "2.26.2"'))
    run = flint("calibrate", "--network", base, measured, "-o", tmp_path / "f.toml", "--json")
    assert run.returncode == 0, run.stderr
    fit = json.loads(run.stdout)
    assert fit["fitted"] == {"scale_out.nic_gbps": pytest.approx(46.1, rel=0.001),
                             "scale_out.latency_us": pytest.approx(0, abs=0.05)}
    assert {(row["algorithm"], row["protocol"]) for row in fit["runs"][0]["rows"]} == {("Ring", "Simple")}
    assert load_network_file(tmp_path / "f.toml").nccl == "2.26.2"


STATES_2_26_2 = "# nccl-tests version 2.17.9 nccl-headers=22602 nccl-library=22602\n"
"""nccl-tests' first line from 2.17: its NCCL headers' and library's NCCL_VERSION_CODE."""


def test_the_release_a_run_states_is_the_tuner_the_fit_takes_and_the_file_names(tmp_path):
    """The four-node ring above, its output stating NCCL 2.26.2 (nccl-library=22602) and the network
    hgx, which names no release: the fit takes 2.26.2's tuner, so finds the ring's 46.1 GB/s NICs
    with no latency, and writes nccl = "2.26.2" with its source. The same rows stating nothing are
    fitted under 2.30.7's tuner, which predicts NVLS-Tree faster at some sizes: a latency of tens of
    µs then makes up what the ring's lines do not."""
    written = tmp_path / "f.toml"
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", ring_across_four_nodes(),
                          header=STATES_2_26_2 + FOUR_NODES)
    run = flint("calibrate", "--network", "hgx", measured, "-o", written, "--json")
    assert run.returncode == 0, run.stderr
    fit = json.loads(run.stdout)
    assert (fit["nccl"], fit["nccl_from"]) == ("2.26.2", "stated by the runs' output")
    assert fit["fitted"] == {"scale_out.nic_gbps": pytest.approx(46.1, rel=0.001),
                             "scale_out.latency_us": pytest.approx(0, abs=0.05)}
    network = load_network_file(written)
    assert network.nccl == "2.26.2"
    assert dict(network.sources)["nccl"] == ("the NCCL release that ran all_reduce_perf.txt (stated by the runs' "
                                             "output)")
    silent = tmp_path / "silent" / "all_reduce_perf.txt"
    silent.parent.mkdir()
    nccl_tests(silent, "all_reduce_perf", ring_across_four_nodes(), header=FOUR_NODES)
    run = flint("calibrate", "--network", "hgx", silent, "-o", tmp_path / "g.toml", "--json")
    assert run.returncode == 0, run.stderr
    fit = json.loads(run.stdout)
    assert (fit["nccl"], fit["nccl_from"]) == ("2.30.7", "the newest Flint has; the runs state none")
    assert fit["fitted"]["scale_out.latency_us"] > 10
    assert load_network_file(tmp_path / "g.toml").nccl is None


@pytest.mark.parametrize("logged", ["node0:100:100 [0] NCCL INFO NCCL version 2.26.2+cuda12.8\n",
                                    "NCCL version 2.26.2+cuda12.8\n"], ids=["INFO", "VERSION"])
def test_nccls_own_log_line_states_the_release_and_nccl_gives_one_where_none_is_stated(tmp_path, logged):
    """NCCL prints "NCCL version 2.26.2+cuda12.8" with NCCL_DEBUG=VERSION or WARN, as a log line with
    INFO, which may fall among the rows (before, either was refused as not a row of the table);
    --nccl 2.26 (its newest, 2.26.6) gives the rows that state nothing a tuner that, as 2.26.2's,
    runs the ring at every size."""
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", ring_across_four_nodes(),
                          header=FOUR_NODES)
    lines = measured.read_text().splitlines(keepends=True)
    measured.write_text("".join(lines[:-3] + [logged] + lines[-3:]))  # between two rows
    run = flint("calibrate", "--network", "hgx", measured, "-o", tmp_path / "f.toml", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["nccl"] == "2.26.2"
    silent = tmp_path / "reduce" / "all_reduce_perf.txt"
    silent.parent.mkdir()
    nccl_tests(silent, "all_reduce_perf", ring_across_four_nodes(), header=FOUR_NODES)
    run = flint("calibrate", "--network", "hgx", silent, "--nccl", "2.26", "-o", tmp_path / "g.toml", "--json")
    assert run.returncode == 0, run.stderr
    fit = json.loads(run.stdout)
    assert (fit["nccl"], fit["nccl_from"]) == ("2.26.6", "given as --nccl")
    assert fit["fitted"]["scale_out.latency_us"] == pytest.approx(0, abs=0.05)
    assert {(row["algorithm"], row["protocol"]) for row in fit["runs"][0]["rows"]} == {("Ring", "Simple")}


@pytest.mark.parametrize("case", ["two in one file", "two runs", "--nccl against the run", "unknown", "unknown --nccl"])
def test_releases_that_disagree_or_that_flint_has_no_tuner_of_are_one_line(tmp_path, case):
    """Each refusal names what disagrees and what to do; NCCL_VERSION_CODE before 2.9 was major x 1000
    + minor x 100 + patch (2804: 2.8.4)."""
    times, written = ring_across_four_nodes(), tmp_path / "f.toml"
    first = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", times, header=STATES_2_26_2 + FOUR_NODES)
    if case == "two in one file":
        both = nccl_tests(tmp_path / "both_all_reduce_perf.txt", "all_reduce_perf", times,
                          header=STATES_2_26_2 + FOUR_NODES + "# NCCL INFO NCCL version 2.27.3+cuda12.9\n")
        run, words = flint("calibrate", "--network", "hgx", both, "-o", written), \
            "both_all_reduce_perf.txt: states NCCL releases 2.26.2, 2.27.3: one run ran one"
    elif case == "two runs":
        other = nccl_tests(tmp_path / "other_all_reduce_perf.txt", "all_reduce_perf", times,
                           header=STATES_2_26_2.replace("22602", "22703") + FOUR_NODES)
        run, words = flint("calibrate", "--network", "hgx", first, other, "-o", written), \
            ("the runs state different NCCL releases (all_reduce_perf.txt: 2.26.2, other_all_reduce_perf.txt: "
             "2.27.3): fit each release's runs on their own")
    elif case == "--nccl against the run":
        run, words = flint("calibrate", "--network", "hgx", first, "--nccl", "2.28.9", "-o", written), \
            "--nccl 2.28.9, and " + str(first) + " states NCCL 2.26.2: leave --nccl out"
    elif case == "unknown":
        old = nccl_tests(tmp_path / "old_all_reduce_perf.txt", "all_reduce_perf", times,
                         header=STATES_2_26_2.replace("22602", "2804") + FOUR_NODES)
        run, words = flint("calibrate", "--network", "hgx", old, "-o", written), \
            ("old_all_reduce_perf.txt states NCCL 2.8.4: Flint has no tuner of that release (it has NCCL 2.18.1 "
             "to 2.30.7): give --nccl with the release nearest it")
    else:
        run, words = flint("calibrate", "--network", "hgx", first, "--nccl", "2.31", "-o", written), \
            "--nccl 2.31: Flint has no tuner of that release (it has NCCL 2.18.1 to 2.30.7): give one of those"
    assert_refused(run, written, words)


@pytest.mark.parametrize("forced", [["--algorithm", "Tree"], ["--algorithm", "nvls", "--protocol", "LL"]])
def test_an_algorithm_nccl_does_not_have_there_is_refused_naming_the_run(tmp_path, forced):
    """NCCL runs no Tree within one node, and NVLS only with Simple (tuning.cc): a run said to be
    held to either was not; before, the refusal named no file and asked to choose another."""
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", nvls(60, 600))
    run = flint("calibrate", "--network", "hgx", measured, *forced, "-o", tmp_path / "f.toml")
    said = " ".join(forced[1::2]).replace("nvls", "NVLS")
    assert_refused(run, tmp_path / "f.toml", f"all_reduce_perf.txt: NCCL has no {said} for all_reduce on 8 ranks on "
                   "1 node of network hgx: give the --algorithm and --protocol the run was held to")


GOOD_ROW = "   8388608   2097152  float  sum  -1  151.6  55.35  103.78  0  150.5  55.74  104.51  0\n"


def calibrate_table(tmp_path: Path, text: str):
    """`flint calibrate --network hgx` of an all_reduce_perf file holding `text`, 8 ranks."""
    measured = tmp_path / "all_reduce_perf.txt"
    measured.write_text(text)
    return flint("calibrate", "--network", "hgx", measured, "--ranks", "8", "-o", tmp_path / "f.toml")


@pytest.mark.parametrize("last", ["  16777216   4194304  fl\n", GOOD_ROW.replace("150.5", "inf")],
                         ids=["cut off", "inf"])
def test_a_cut_off_row_and_an_infinite_time_are_one_line(tmp_path, last):
    """Before, a last row cut off within its first four fields was an IndexError, and a time of inf
    a math domain error (the log of an infinite ratio), both tracebacks with exit 1."""
    run = calibrate_table(tmp_path, "#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
                          f"{GOOD_ROW}{last}")
    assert_refused(run, tmp_path / "f.toml", "line 3: not a row of nccl-tests' table")



def test_a_row_with_wrong_results_is_refused(tmp_path):
    """nccl-tests counted 3 wrong results in place at 1 GiB (line 9: the file's four lines of header,
    then the rows from 64 MiB); before, its time was fitted as if the collective were correct. N/A
    (nccl-tests -c 0: not checked) is no count."""
    times = nvls(60, 600)
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", times, header="")
    lines = measured.read_text().splitlines()
    assert lines[8].split()[0] == str(2**30)
    lines[8] = lines[8][:-1] + "3"
    lines[9] = lines[9][:-1] + "N/A"
    measured.write_text("\n".join(lines) + "\n")
    run = flint("calibrate", "--network", "hgx", measured, "--ranks", "8", "-o", tmp_path / "f.toml")
    assert_refused(run, tmp_path / "f.toml", "line 9: nccl-tests found 3 wrong results at 1,073,741,824 bytes")
    lines[8] = lines[8][:-1] + "0"
    measured.write_text("\n".join(lines) + "\n")
    run = flint("calibrate", "--network", "hgx", measured, "--ranks", "8", "-o", tmp_path / "f.toml")
    assert run.returncode == 0, run.stderr


def test_a_file_of_two_programs_tables_is_refused(tmp_path):
    """An all_gather_perf run, then an all_reduce_perf run, in one file: before, all its rows were
    read as the all-gather's (the first name found)."""
    gather = {size: 8.4 + 7 * 3.4 + size / (300 * 8 / 7 * 1e3) for size in SIZES}
    reduce = nvls(60, 600)
    both = tmp_path / "both.txt"
    both.write_text(nccl_tests(tmp_path / "a", "all_gather_perf", gather).read_text()
                    + nccl_tests(tmp_path / "b", "all_reduce_perf", reduce).read_text())
    run = flint("calibrate", "--network", "hgx", both, "-o", tmp_path / "f.toml")
    assert_refused(run, tmp_path / "f.toml", "more than one nccl-tests program (all_gather_perf, all_reduce_perf)")


def test_names_and_sources_are_written_as_toml_strings(tmp_path):
    """A quotation mark, a backslash, a newline and DEL, in the name and in the measured file's
    name (each fitted number's source): before, name = "a"b" was written, and the file did not load."""
    name = 'a"b\\c\nd\x7f'
    times = nvls(60, 600)
    measured = nccl_tests(tmp_path / 'x"y\nz_all_reduce_perf.txt', "all_reduce_perf", times)
    run = flint("calibrate", "--network", "hgx", measured, "--name", name, "-o", tmp_path / "f.toml")
    assert run.returncode == 0, run.stderr
    written = load_network_file(tmp_path / "f.toml")
    assert written.name == name
    assert dict(written.sources)["node.nvls_latency_us"] == (
        'flint calibrate --network hgx on x"y\nz_all_reduce_perf.txt (in-place times)')
    # A byte that is not UTF-8 (Python's surrogate for it): before, a UnicodeEncodeError, and an empty file.
    run = flint("calibrate", "--network", "hgx", measured, "--name", "q\udcff", "-o", tmp_path / "g.toml")
    assert run.returncode == 2 and "holds bytes that are not UTF-8" in run.stderr and not (tmp_path / "g.toml").exists()


@pytest.mark.parametrize("option", [["--rank", "0"], ["--device", "h100"]])
def test_device_options_are_refused_with_network(tmp_path, option):
    """--rank and --device pick the profiled rank and the device of a device fit; before, --network
    took them and ignored them (even --rank 0, --rank's default, given on purpose)."""
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", nvls(60, 600))
    run = flint("calibrate", "--network", "hgx", measured, *option, "-o", tmp_path / "f.toml")
    assert_refused(run, tmp_path / "f.toml", f"{option[0]} is for fitting a device to profiles")


@pytest.mark.parametrize("columns", ["size count type redop root", "size count type"])
def test_a_table_of_out_of_place_columns_only_says_so(tmp_path, columns):
    """Rows of size, count, type (with or without redop and root) and one group of time, algbw,
    busbw and #wrong: before, each was "not a row of nccl-tests' table"."""
    lead = "float sum -1" if "redop" in columns else "float"
    run = calibrate_table(tmp_path, f"#  {columns} time algbw busbw #wrong\n"
                                    f"  8388608  2097152  {lead}  151.6  55.35  103.78  0\n")
    assert_refused(run, tmp_path / "f.toml", "line 2: has no in-place column")


def test_a_run_slower_than_the_network_can_be_names_the_network(tmp_path):
    """16 GiB all-reduced on 2 nodes of 8 GPUs by NVLS-Tree at 100 GB/s (`nvls_tree_on_two_nodes`),
    slower than hgx's ring across its nodes (370.8 GB/s, under its eight 47 GB/s NICs),
    to which NCCL's tuner turns at any NVLS bandwidth low enough to give such a time: (8.4 + 28 x
    3.4 + 2 x 14) x 1.4 (the ring's plateau) + S / (370.8 x 16 / 30 x 10^3) µs. No bandwidth and no
    larger size fits it; before, the hint was to give a run that reaches larger sizes."""
    size = 2**34
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf",
                          nvls_tree_on_two_nodes(100, [size]), header="")
    ring = (8.4 + 28 * 3.4 + 2 * 14) * 1.4 + size / (370.8 * 16 / 30 * 1e3)
    run = flint("calibrate", "--network", "hgx", measured, "--ranks", "16", "--nodes", "2", "-o", tmp_path / "f.toml")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert (f"NCCL's model takes at most {ring:,.1f} at any node.nvls_bus_gbps[7], running Ring Simple on network "
            "hgx's other numbers: the run is slower than hgx can be: give the --network of the machine") in run.stderr
    assert "(or, where NCCL_ALGO or NCCL_PROTO held it, --algorithm or --protocol)" in run.stderr
    assert not (tmp_path / "f.toml").exists()


def test_a_toml_string_reads_back_as_written():
    """What network and device files write their names and sources with: TOML's own reader gets the
    text back, quotes, backslashes and control characters included."""
    for text in ('a"b', "back\\slash", "tab\there\nnew line", "del\x7f", "bell\x07", "ünï ∑", ""):
        assert tomllib.loads(f"x = {toml_string(text)}")["x"] == text


@pytest.mark.parametrize("option", [["--ranks", "8"], ["--nodes", "2"], ["--algorithm", "Ring"],
                                    ["--protocol", "LL128"], ["--nccl", "2.26.2"]])
def test_network_options_are_refused_without_network(tmp_path, option):
    """--ranks, --nodes, --algorithm, --protocol and --nccl describe nccl-tests runs; a device fit
    from profiles ignored them."""
    run = flint("calibrate", tmp_path / "p.json.gz", tmp_path / "t", *option, "-o", tmp_path / "f.toml")
    assert_refused(run, tmp_path / "f.toml", f"{option[0]} describes nccl-tests runs, for fitting a network")


def test_a_ring_fitted_just_below_the_nvlink_topology_keeps_nvls(tmp_path):
    """An all-gather whose ring reaches 358 GB/s bus bandwidth (8.4 + 7 x 3.4 µs + S / (358 x 8 / 7
    x 10^3)), beside the NVLS all-reduce of the module docstring. NCCL's search fits NVLS's 8
    channels (one per GPU, the head's link crossed twice: 9 x s) in a GPU's NVLinks as its topology
    counts them, 18 x 20.6 = 370.8 GB/s (`nvlink_gbps`), at the fastest speed that fits: 40 GB/s.
    Before, the search took the ring's fitted bandwidth: 9 x 40 = 360 > 358 left it 30, NCCL's tuner
    predicted NVLS below the ring and ran the ring at every size, and the fit failed with an error
    about NVLS's step that the user had set nothing of."""
    gather = nccl_tests(tmp_path / "all_gather_perf.txt", "all_gather_perf",
                        {size: 8.4 + 7 * 3.4 + size / (358 * 8 / 7 * 1e3) for size in SIZES})
    reduce = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", nvls(60, 600, 10))
    written = tmp_path / "my hgx.toml"
    run = flint("calibrate", "--network", "hgx", reduce, gather, "-o", written, "--json")
    assert run.returncode == 0, run.stderr
    fitted = json.loads(run.stdout)["fitted"]
    assert fitted["node.bus_gbps"] == pytest.approx(358, rel=0.001)
    assert fitted["node.nvls_bus_gbps[7]"] == pytest.approx(600, rel=0.001)
    network = load_network_file(written)
    assert network.node.nvlink_gbps == 370.8
    model = NcclModel(network_for(str(written), [("tensor", 8)]))
    assert model.choose(pb.ALL_REDUCE, 2**34, Placement(8, 1)).algorithm == "NVLS"
    text = flint("calibrate", "--network", "hgx", reduce, gather, "-o", written)
    assert text.stdout.rstrip().endswith(f"use it as --network '{written}'")


def test_a_run_of_large_sizes_faster_than_the_model_is_not_told_to_reach_larger_ones(tmp_path):
    """The module docstring's NVLS run (16 GiB in about 50 ms) fitted as if NCCL_PROTO=LL had held it:
    Ring LL at 16 GiB is capped at Hopper's llMaxBw, 141 GB/s of bus bandwidth (below half the
    node's ring), so it takes at least 6.6 + 14 x 0.6 + 16 GiB / (141 x 8 / 14 x 10^3) µs at any
    bus bandwidth. Before, the advice was to reach larger sizes than 16 GiB."""
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", nvls(60, 600))
    floor = 6.6 + 14 * 0.6 + 2**34 / (141 * 8 / 14 * 1e3)
    run = flint("calibrate", "--network", "hgx", measured, "--protocol", "LL", "-o", tmp_path / "f.toml")
    assert_refused(run, tmp_path / "f.toml", f"NCCL's model takes {floor:,.1f} at any node.bus_gbps, running Ring LL "
                   "on network hgx's other numbers: the run is faster than hgx can be")
    assert "leave out --algorithm and --protocol" in run.stderr and "larger sizes" not in run.stderr


def test_ranks_and_nodes_are_refused_where_every_run_lists_its_own(tmp_path):
    """The runs' '#  Rank' lines say 8 ranks on one node; --ranks 16 --nodes 2 contradicted them and
    was ignored without a word."""
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", nvls(60, 600))
    run = flint("calibrate", "--network", "hgx", measured, "--ranks", "16", "--nodes", "2", "-o", tmp_path / "f.toml")
    assert_refused(run, tmp_path / "f.toml", "--ranks and --nodes: every run lists its ranks and their nodes")


def test_a_failed_write_keeps_the_earlier_file_whole(tmp_path):
    """With files limited to 2 KiB (ulimit -f 2) the fitted file cannot be written: the earlier one
    stays as it was and no fragment is left. Before, it was cut to 2,048 bytes of invalid TOML."""
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", nvls(60, 600))
    kept = tmp_path / "kept.toml"
    kept.write_text("# an earlier fit\n")

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    done = subprocess.run([sys.executable, "-m", "flint", "calibrate", "--network", "hgx", str(measured), "-o",
                           str(kept)], capture_output=True, text=True, preexec_fn=small_files, timeout=600)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"cannot write '{kept}': File too large" in done.stderr
    assert kept.read_text() == "# an earlier fit\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all_reduce_perf.txt", "kept.toml"]


def test_the_table_keeps_every_number_in_80_columns(tmp_path):
    """Piped (80 columns), two nodes' NVLS-Tree rows up to 16 GiB: the algorithm folds, the
    numbers stay whole. Before, 'after µs' read '68,668…' and the algorithm 'NVLS-Tree Simp…'."""
    run = flint("calibrate", "--network", "hgx", ROOT / "bench" / "measured" / "nccl" /
                "h100-2x8-nccl-tests-309-xe9680.all_reduce_perf.txt", "--ranks", "16", "--nodes", "2", "--nccl",
                "2.26.2", "-o", tmp_path / "f.toml", env={**os.environ, "COLUMNS": "80"})
    assert run.returncode == 0, run.stderr
    assert "…" not in run.stdout
    last = [line for line in run.stdout.splitlines() if line.startswith("│ 17,179,869,184")]
    assert [cell.strip() for cell in last[0].split("│")[1:-1]][:5] == [
        "17,179,869,184", "68,668.0", "69,968.6", "68,668.0", "1.00"]


def _run_text(program: str, rows: str, footer: str = "# Out of bounds values : 0 OK\n") -> str:
    """nccl-tests' output as it prints it: its header line naming the program, rank lines, the table."""
    return (f"# Collective test starting: {program}\n# nThread 1 nGpus 1 minBytes 8 maxBytes 8 step: 2(factor)\n"
            f"{HEADER}#\n#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n{rows}"
            f"{footer}# Avg bus bandwidth    : 0.1\n#\n")


ROW = ("     1048576        262144     float     sum      -1    27.37   38.31   67.04      0"
       "    26.91   38.96   68.18      0\n")


@pytest.mark.parametrize("name, text, words", [
    ("mislabeled_all_reduce_perf.txt", _run_text("all_gather_perf", ROW),
     "its name says all_reduce_perf and its output all_gather_perf"),
    ("reduce_perf.txt", _run_text("reduce_perf", ROW), "the output of reduce_perf, which Flint does not fit"),
    ("gather.txt", ROW, "neither its name nor its text names a program Flint fits"),
    ("all_reduce_perf.txt", _run_text("all_reduce_perf", ROW + ROW), "line 14: a second row of 1,048,576 bytes"),
    ("all_reduce_perf.txt", _run_text("all_reduce_perf", ROW, "") + _run_text("all_reduce_perf", ROW.replace(
        "1048576", "2097152"), ""), "lists a rank twice"),
    ("all_reduce_perf.txt", _run_text("all_reduce_perf", ROW, "# Out of bounds values : 0 OK\n" * 2),
     "holds 2 runs' footers"),
    ("all_reduce_perf.txt", _run_text("all_reduce_perf", ROW, "# Out of bounds values : 1 FAILED\n"),
     "nccl-tests found 1 value out of bounds: its times are not those of a correct all_reduce"),
], ids=["name and header", "unfitted program", "no program", "a size twice", "ranks twice", "two footers",
        "out of bounds"])
def test_files_that_are_not_one_run_of_a_fitted_program_are_one_line(tmp_path, name, text, words):
    """Before: the file's name won over its header (an all-gather fitted as an all-reduce, NVLS at
    722 GB/s), a reduce_perf output was told to take another name, and a run concatenated with
    another (or itself) was read as one, each size twice."""
    measured = tmp_path / name
    measured.write_text(text)
    run = flint("calibrate", "--network", "hgx", measured, "-o", tmp_path / "f.toml")
    assert_refused(run, tmp_path / "f.toml", words)


def test_an_older_nccl_tests_error_column_is_read(tmp_path):
    """Older nccl-tests print each group's largest error (2e-06, a float) where newer ones count
    wrong results; such a table was refused as not a row of nccl-tests' table. Its times are read,
    and its footer says whether the values were in bounds."""
    rows = "".join(f"{size:>12} {size // 4:>12} float sum {t:9.1f} 0.0 0.0 2e-06 {t:9.1f} 0.0 0.0 0e+00\n"
                   for size, t in nvls(60, 600).items())
    measured = tmp_path / "all_reduce_perf.txt"
    measured.write_text(_run_text("all_reduce_perf", rows))
    run = flint("calibrate", "--network", "hgx", measured, "-o", tmp_path / "f.toml", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["fitted"]["node.nvls_bus_gbps[7]"] == pytest.approx(600, rel=0.001)
    measured.write_text(_run_text("all_reduce_perf", rows.replace("2e-06", "nan", 1)))
    run = flint("calibrate", "--network", "hgx", measured, "-o", tmp_path / "g.toml")
    assert_refused(run, tmp_path / "g.toml", "not a row of nccl-tests' table")


@pytest.mark.parametrize("option, words", [
    (["-o", ""], "'-o' / '--output': is empty: give the file to write"),
    (["-o", "f.toml", "--name", " "], "--name is empty: give the fitted file's name"),
], ids=["output", "name"])
def test_an_empty_output_or_name_is_one_line(tmp_path, option, words):
    """Before: -o '' was refused as '.', which is not a .toml file, and --name '' took the default
    name without a word."""
    measured = nccl_tests(tmp_path / "all_reduce_perf.txt", "all_reduce_perf", nvls(60, 600))
    run = flint("calibrate", "--network", "hgx", measured, *option, cwd=tmp_path)
    assert_refused(run, tmp_path / "f.toml", words)

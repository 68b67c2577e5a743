"""Flint's collectives beside NCCL's measured ones: one line per size, modelled / measured.

    python bench/collectives.py [--calibration DIR] [FILE ... [--network NETWORK] [--ranks N] [--nodes M]]

(`--calibration`: ../shared/calibration/nccl beside the repository unless given; `--network`: hgx
unless given; `--help` says what each option means.)

1. The 8x H100 all_reduce_perf sample (`h100_8gpu_all_reduce_perf.txt`, in-place times) on the
   `hgx` network, with the targets: within 15% from 16 MB to 16 GB, within 35% from 8 B to 8 MB.
2. The published bus bandwidths of NCCL's maintainers and users (the calibration folder's
   README): all-gather and reduce-scatter of 1 GB on 8x H100 (about 370 GB/s, target 15%); Ring
   all-reduce (365-370 GB/s); NVLS all-reduce by GPU count; 46-48 GB/s per 400 Gb/s NIC between
   nodes. Flint's bus bandwidth is nccl-tests': the algorithm bandwidth (bytes / time) x 2(n-1)/n
   for an all-reduce, x (n-1)/n for an all-gather or reduce-scatter. The NVLS figures by GPU count
   and the NIC's are numbers the hgx network file takes from these statements: their lines check
   how the model turns them into times, not its accuracy; the all-gather, reduce-scatter and Ring
   lines come from NCCL's NVLink bandwidth per link (topo.h) and are a check, as is the held-out
   A100 cluster of nccl-tests issue 119 (3 nodes of 8 A100 SXM4 with 4 HDR NICs each, the
   `hgx-a100` network with 4 NICs a node: a peak bus bandwidth of about 96 GB/s at 128 MB), and
   the peak of one 8x H200 node (nccl-tests issue 272: 475 GB/s), whose NVLS figures the hgx-h200
   file takes from H100's; and one 8x B200 node's (the GKE a4 output of yangwhale/gpu-tpu-pedia's
   gpu/deepep/README.md: 845 GB/s at 16 GB, out of place), which the hgx-b200 and nvl72 files take
   as their 8-GPU NVLS bus bandwidth (their line checks the model's use of it).
3. The published nccl-tests output `hgx-a100`'s one-node ring numbers were fitted to
   (`bench/measured/nccl/fitted.toml`: one node of 8 A100), beside the fitted model.
4. Sixteen published nccl-tests outputs of other machines (`bench/measured/nccl/held_out.toml`:
   one to 128 nodes of 8 H100, two nodes of 8 A100 and of 8 B200, one, two and twenty GB200 NVL72
   racks) and four published tables of all-reduce bus bandwidth by size (`bus_bandwidths.toml`:
   Azure's 8x H100, 8x H200 and 8x A100 VMs and a 4x GB200 VM's ring, 1 KB to 8 GB), none of them
   fitted, each with the tuner of the NCCL release it ran choosing: the one it states (`nccl`, or
   its own output), else the newest NVIDIA had tagged before it was posted (`posted`;
   `releases.toml`), else the newest release's: one line per size, then each run's worst and
   median ratio by size band and its largest size's bus bandwidth; then, where two or more
   published runs share a placement (those of 1. and 3. among them), the range they span at each
   size and where Flint, under each run's release, falls in it.
5. Runs of one cluster at two sizes (`transfer.toml`): `flint calibrate --network` fitted to the
   smaller, the larger beside the network before and after the fit: how far a fit on a small
   allocation carries to more nodes (worst and median ratio by size band).
6. Any nccl-tests output given (`FILE ...`) on `--network`, its ranks and nodes from its `#  Rank`
   lines, else `--ranks` and `--nodes` (1 unless given), placed as `flint calibrate --network`
   places them, with its checks (flint.analysis.calibrate_network): ranks that do not divide over
   the nodes or outnumber the GPUs the network's nodes hold are refused, and so are `--ranks` and
   `--nodes` where every file lists its own ranks.

Every input (the files, the network, ranks and nodes, the calibration folder) is read and checked,
and the files' lines computed, before anything is printed: a bad one is one line on stderr
(`error: ...`, saying what is wrong and what to do) and exit status 2, as Flint's commands do.

Every figure is computed in this run by Flint's model of NCCL (flint.step.nccl), as `flint
simulate`, `flint timeline`, `flint inspect` and `flint sweep` time collectives.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

from flint.analysis.calibrate_network import (calibrate_network, check_given, check_placement, modelled, placement_of,
                                              tuner_release)
from flint.analysis.nccl_tests import COLLECTIVES, Measurement, NcclTestsRun, read_nccl_tests
from flint.errors import FlintError
from flint.schema import et_def_pb2 as pb
from flint.step.nccl import Placement, forced_name
from flint.step.network_files import BUILTIN_NETWORKS, NetworkFile, network_named

ROOT = Path(__file__).resolve().parent.parent
CALIBRATION = ROOT.parent / "shared" / "calibration" / "nccl"
SAMPLE = "h100_8gpu_all_reduce_perf.txt"
"""The 8x H100 all_reduce_perf sample of part 1, in the `--calibration` folder."""
GB = 10**9
BANDS = [(16 * 2**20, 16 * 2**30, 0.15), (8, 8 * 2**20, 0.35)]
"""(smallest, largest bytes, tolerance): the 8x H100 all-reduce targets."""
TAGGED = tomllib.loads((ROOT / "bench" / "measured" / "nccl" / "releases.toml").read_text())["tagged"]
"""The day each NCCL release was tagged, by release."""


def run_beside(run: NcclTestsRun, network, ranks: int | None = None, nodes: int | None = None,
               algorithm: str | None = None, protocol: str | None = None) -> list[float]:
    """One line per size of a measured run (of `algorithm` and `protocol` where the run forced
    them); the ratios."""
    lines, ratios = beside(run, network, placement_of(run, ranks, nodes), algorithm, protocol)
    print("\n".join(lines))
    return ratios


def beside(run: NcclTestsRun, network, placement: Placement, algorithm: str | None = None,
           protocol: str | None = None) -> tuple[list[str], list[float]]:
    """`run_beside`'s lines, computed without printing them, and the ratios."""
    forced = f", {forced_name(algorithm, protocol)} forced" if algorithm or protocol else ""
    lines = [f"\n{run.path.name}: {run.collective}, {placement.ranks} ranks on {placement.nodes} node(s), "
             f"network {network.name}, in place{forced}",
             f"{'bytes':>14} {'NCCL µs':>10} {'Flint µs':>10} {'ratio':>6}  NCCL runs (its tuner's pick)"]
    ratios = []
    for row in run.rows:
        choice = modelled(network, run.comm_type, row.size, placement, algorithm, protocol)
        ratios.append(choice.micros / row.micros)
        lines.append(f"{row.size:>14,} {row.micros:>10,.1f} {choice.micros:>10,.1f} {ratios[-1]:>6.2f}  "
                     f"{choice.algorithm} {choice.protocol}")
    return lines, ratios


def curve_run(entry: dict) -> NcclTestsRun:
    """A published table of bus bandwidths by size (`bus_bandwidths.toml`) as the run it measures."""
    factor = bus_factor(COLLECTIVES[entry["collective"]], entry["ranks"])
    rows = tuple(Measurement(entry["first_bytes"] << i, (entry["first_bytes"] << i) * factor / (busbw * 1e3))
                 for i, busbw in enumerate(entry["busbw"]))
    return NcclTestsRun(Path(entry["name"]), entry["collective"], entry["ranks"], entry["nodes"], rows)


def h100_all_reduce(run: NcclTestsRun) -> NcclTestsRun:
    ratios = run_beside(run, BUILTIN_NETWORKS["hgx"], ranks=8)
    for low, high, tolerance in BANDS:
        band = [r for row, r in zip(run.rows, ratios) if low <= row.size <= high]
        worst = max(band, key=lambda r: abs(r - 1))
        verdict = "met" if abs(worst - 1) <= tolerance else "NOT met"
        print(f"{low:>14,} .. {high:,} B: worst ratio {worst:.2f} (target within {tolerance:.0%}): {verdict}")
    return run


def worst_and_median(ratios: list[float]) -> str:
    """A band's ratios as the held-out and transfer tables print them: the one furthest from 1, and
    the median."""
    return f"{max(ratios, key=lambda r: abs(r - 1)):.2f}, {statistics.median(ratios):.2f}"


def bus_factor(comm_type: int, n: int) -> float:
    """nccl-tests' bus bandwidth over its algorithm bandwidth for a collective over `n` ranks."""
    if comm_type == pb.ALL_REDUCE:
        return 2 * (n - 1) / n
    return (n - 1) / n if comm_type in (pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_TO_ALL) else 1.0


def bus_bandwidth(comm_type: int, total: int, micros: float, n: int) -> float:
    """nccl-tests' bus bandwidth (GB/s) of `total` bytes in `micros` over `n` ranks."""
    return total / (micros * 1e-6) / GB * bus_factor(comm_type, n)


def published(network_name: str = "hgx") -> None:
    network = BUILTIN_NETWORKS[network_name]
    print(f"\nPublished bus bandwidths beside Flint's ({network_name})")
    print(f"{'what':<66} {'NCCL GB/s':>10} {'Flint GB/s':>10} {'ratio':>6}")

    def line(label: str, measured: float, flint: float, tolerance: float | None = None) -> None:
        verdict = "" if tolerance is None else (
            f"  (within {tolerance:.0%}: {'met' if abs(flint / measured - 1) <= tolerance else 'NOT met'})")
        print(f"{label:<66} {measured:>10.0f} {flint:>10.1f} {flint / measured:>6.2f}{verdict}")

    node = Placement(8, 1)
    for kind, name in ((pb.ALL_GATHER, "all-gather"), (pb.REDUCE_SCATTER, "reduce-scatter")):
        choice = modelled(network, kind, GB, node)
        line(f"8x H100 {name} 1 GB ({choice.algorithm} {choice.protocol}; nccl-tests #212)", 370,
             bus_bandwidth(kind, GB, choice.micros, 8), 0.15)
    size = 16 * 2**30
    ring = modelled(network, pb.ALL_REDUCE, size, node, "Ring", "Simple")
    line("8x H100 all-reduce 16 GB, Ring (NCCL #1455: 365-370)", 367.5,
         bus_bandwidth(pb.ALL_REDUCE, size, ring.micros, 8))
    for gpus, measured in ((4, 370), (5, 420), (6, 440), (7, 460), (8, 480)):
        choice = modelled(network, pb.ALL_REDUCE, size, Placement(gpus, 1))
        line(f"{gpus}x H100 all-reduce 16 GB, {choice.algorithm} (NCCL #1455)", measured,
             bus_bandwidth(pb.ALL_REDUCE, size, choice.micros, gpus))
    a100 = BUILTIN_NETWORKS["hgx-a100"]
    # #119's servers: two Intel Xeon Platinum 8358 each (hgx-a100 has a DGX A100's AMD hosts), 4 HDR NICs
    four_nics = replace(a100, name="hgx-a100, 4 NICs, Intel hosts", cpu="intel",
                        scale_out=replace(a100.scale_out, nics=4, channels=4))
    choice = modelled(four_nics, pb.ALL_REDUCE, 128 * 2**20, Placement(24, 3))
    line(f"3 nodes x 8 A100, 4 HDR NICs each, all-reduce 128 MB, {choice.algorithm} (#119)", 96,
         bus_bandwidth(pb.ALL_REDUCE, 128 * 2**20, choice.micros, 24), 0.15)
    for name, label, total, measured in (
        ("hgx-h200", "8x H200 all-reduce 4 GB, peak (nccl-tests #272, held out)", 4 * 2**30, 475),
        ("hgx-b200", "8x B200 all-reduce 16 GB, out of place (GKE a4: hgx-b200's)", 16 * 2**30, 845)):
        choice = modelled(BUILTIN_NETWORKS[name], pb.ALL_REDUCE, total, node)
        line(f"{label}, {choice.algorithm}", measured, bus_bandwidth(pb.ALL_REDUCE, total, choice.micros, 8))
    apart = Placement(2, 2)
    choice = modelled(network, pb.ALL_REDUCE, size, apart)
    line(f"2 nodes x 1 GPU all-reduce 16 GB, {choice.algorithm} (nccl-tests #290)", 47,
         bus_bandwidth(pb.ALL_REDUCE, size, choice.micros, 2))


def fitted_runs(folder: Path) -> list[tuple[dict, NcclTestsRun]]:
    """The published runs a built-in network file was fitted to (`fitted.toml` there), each beside
    the fitted model: a check of the fit."""
    runs = []
    for entry in tomllib.loads((folder / "fitted.toml").read_text())["run"]:
        run = read_nccl_tests(folder / entry["file"])
        print(f"\nFitted to it: {entry['network']}'s {entry['fitted']}")
        run_beside(run, BUILTIN_NETWORKS[entry["network"]], entry["ranks"], entry["nodes"])
        runs.append((entry, run))
    return runs


def held_network(entry: dict, run: NcclTestsRun | None = None) -> NetworkFile:
    """A held-out run's network: its built-in file, under the tuner of the NCCL release the run ran
    (`run_release`) and with the channels between nodes the run set (`channels`, where
    NCCL_MIN_NCHANNELS gave it more CTAs than NCCL's default)."""
    release, source = run_release(entry, run)
    network = with_release(BUILTIN_NETWORKS[entry["network"]], release, source)
    if "channels" not in entry:
        return network
    return replace(network, scale_out=replace(network.scale_out, channels=entry["channels"]))


def run_release(entry: dict, run: NcclTestsRun | None) -> tuple[str | None, str]:
    """The release a published run is timed under, and what says so: the one it states (`nccl`, else
    its output's), else the newest NCCL had tagged before the day it was posted (`posted`: it
    cannot have run a later one), else none (the network file's, the newest)."""
    source = entry.get("file", "bench/measured/nccl")
    stated = entry.get("nccl") or (run.nccl if run else None)
    if stated:
        return stated, f"{source} states NCCL {stated}"
    if "posted" not in entry:
        return None, f"{source} states no release"
    before = [release for release, day in TAGGED.items() if day < entry["posted"]]
    if not before:
        raise FlintError(f"{source} was posted on {entry['posted']}, before every release in releases.toml")
    newest = max(before, key=TAGGED.__getitem__)
    return newest, f"{source}, posted on {entry['posted']}, ran NCCL {newest} or older"


def with_release(network: NetworkFile, release: str | None, why: str) -> NetworkFile:
    """`network` under the tuner of NCCL `release` (`why`: what says the run ran it) where one is
    given; one line where Flint has no tuner of it."""
    if not release:
        return network
    return replace(network, nccl=tuner_release(release, why, "this bench times a run "
                                               "under the tuner of the release it states: give a copy of the file "
                                               "that states none, or the release nearest it"))


def held_out(folder: Path, fitted: list[tuple[dict, NcclTestsRun]]) -> None:
    """Published measurements of other machines (`held_out.toml`'s nccl-tests outputs, then
    `bus_bandwidths.toml`'s tables): each one's lines, then per run the worst and median ratio by
    size band and the largest size's bus bandwidth; then the ranges they span together with the
    `fitted` runs (a network file took a number from those)."""
    runs = [(entry, read_nccl_tests(folder / entry["file"]))
            for entry in tomllib.loads((folder / "held_out.toml").read_text())["run"]]
    curves = tomllib.loads((folder / "bus_bandwidths.toml").read_text())["curve"]
    runs += [(entry, curve_run(entry)) for entry in curves]
    summary = []
    for entry, run in runs:
        network = held_network(entry, run)
        ratios = run_beside(run, network, entry["ranks"], entry["nodes"], entry.get("algorithm"), entry.get("protocol"))
        rows = run.rows
        bands = [[r for row, r in zip(rows, ratios) if low <= row.size <= high] for low, high, _ in BANDS[::-1]]
        largest = rows[-1]
        flint_us = largest.micros * ratios[-1]
        measured, flint = (bus_bandwidth(run.comm_type, largest.size, us, entry["ranks"])
                           for us in (largest.micros, flint_us))
        summary.append((run.path.name, bands, largest.size, measured, flint))
    print("\nHeld-out measurements (bench/measured/nccl; none was fitted): Flint / NCCL time")
    print(f"{'run':<56} {'8 B-8 MB worst, median':>24} {'16 MB-16 GB worst, median':>27} "
          f"{'largest: NCCL, Flint bus GB/s':>31}")
    for name, bands, size, measured, flint in summary:
        cells = [worst_and_median(b) if b else "-" for b in bands]
        largest_bus = f"{measured:.0f}, {flint:.0f} at {size / 2**30:g} GiB"
        print(f"{name:<56} {cells[0]:>24} {cells[1]:>27} {largest_bus:>31}")
    published_ranges(runs + fitted)


def published_ranges(runs: list[tuple[dict, NcclTestsRun]]) -> None:
    """Machines of one kind measure differently (drivers, firmware, NCCL versions, VMs), so a
    model can only be asked to land among them: for every placement that two or more published runs
    share at NCCL's defaults, each size they both measure, their lowest and highest time beside
    Flint's under each run's release (`run_release`: the releases' tuners may pick differently),
    and where Flint is: inside that published range, or the ratio to the nearer end of the Flint
    time furthest from it."""
    groups: dict[tuple, list[tuple[dict, NcclTestsRun]]] = {}
    for entry, run in runs:
        if entry.get("algorithm") or entry.get("protocol"):
            continue
        groups.setdefault((entry["network"], entry["ranks"], entry["nodes"], run.comm_type), []).append((entry, run))
    print("\nPublished range: placements that several published runs share (NCCL's defaults; the 8x H100 "
          "sample above among them), per size measured by two or more; Flint under each run's release")
    print(f"{'placement':<28} {'bytes':>14} {'runs':>4} {'lowest µs':>10} {'highest µs':>10} {'Flint µs':>19}  "
          "Flint / nearer end")
    outside: list[float] = []
    for (network_name, ranks, nodes, comm_type), group in groups.items():
        if len(group) < 2:
            continue
        by_size: dict[int, list[tuple[float, NetworkFile]]] = {}
        for entry, run in group:
            network = held_network(entry, run)
            for row in run.rows:
                by_size.setdefault(row.size, []).append((row.micros, network))
        label = f"{ranks} ranks, {nodes} node(s), {network_name}"
        for size in sorted(s for s, measured in by_size.items() if len(measured) > 1):
            low, high = min(us for us, _ in by_size[size]), max(us for us, _ in by_size[size])
            flint = sorted({modelled(network, comm_type, size, Placement(ranks, nodes)).micros
                            for _, network in by_size[size]})
            ratio = max((t / low if t < low else t / high if t > high else 1.0 for t in flint),
                        key=lambda r: abs(r - 1))
            outside.append(ratio)
            where = "inside" if ratio == 1.0 else f"{ratio:.2f}"
            times = f"{flint[0]:,.1f}" + (f"-{flint[-1]:,.1f}" if len(flint) > 1 else "")
            print(f"{label:<28} {size:>14,} {len(by_size[size]):>4} {low:>10,.1f} {high:>10,.1f} "
                  f"{times:>19}  {where}")
    inside = sum(r == 1.0 for r in outside)
    near = sum(abs(r - 1) <= 0.15 for r in outside)
    print(f"{len(outside)} sizes: {inside} inside the published range, {near} within 15% of it, "
          f"furthest {min(outside, key=lambda r: -abs(r - 1)):.2f}")


def transfers(folder: Path) -> None:
    """A fit on one run of a cluster, checked on a larger run of it (`transfer.toml`): the larger
    run's worst and median ratio by size band, before and after the fit."""
    print("\nCalibrated on a smaller run of a cluster, checked on a larger one (bench/measured/nccl/transfer.toml):"
          " Flint / NCCL time")
    print(f"{'fitted to':<52} {'checked on':<52} {'band':>12} {'before':>11} {'after':>11}")
    for pair in tomllib.loads((folder / "transfer.toml").read_text())["pair"]:
        base = held_network(pair)
        small, large = ((read_nccl_tests(folder / part["file"]), part["ranks"], part["nodes"])
                        for part in (pair["fit"], pair["check"]))
        fit = calibrate_network([small[0]], base, f"{base.name}-calibrated", small[1], small[2])
        run, placement = large[0], placement_of(*large)
        for (low, high, _), label in zip(BANDS[::-1], ("8 B-8 MB", "16 MB-16 GB")):
            rows = [row for row in run.rows if low <= row.size <= high]
            if not rows:
                continue
            cells = [worst_and_median([modelled(network, run.comm_type, row.size, placement).micros / row.micros
                                       for row in rows]) for network in (base, fit.network)]
            print(f"{small[0].path.name:<52} {run.path.name:<52} {label:>12} {cells[0]:>11} {cells[1]:>11}")
        ends = {key: " (the end of the range tried)" for key in fit.at_limit}
        print(f"  fitted: {', '.join(f'{key} {value:g}{ends.get(key, str())}' for key, value in fit.fitted.items())}")


def read_sample(folder: Path) -> NcclTestsRun:
    """The `--calibration` folder's 8x H100 sample (part 1), or one line saying what is wrong."""
    if not (folder / SAMPLE).is_file():
        wrong = "no such folder" if not folder.is_dir() else f"no {SAMPLE} in it"
        raise FlintError(f"--calibration {str(folder)!r}: {wrong}: give the folder that holds {SAMPLE} "
                         "(shared/calibration/nccl beside the repository), or leave --calibration out for it")
    return read_nccl_tests(folder / SAMPLE)


def given_runs(paths: list[Path], network: NetworkFile, ranks: int | None, nodes: int | None) -> list[list[str]]:
    """Each FILE's lines (part 6), read, placed and checked as `flint calibrate --network` does, and
    computed before the report prints anything: a bad input stops the bench before its first line."""
    runs = [read_nccl_tests(path) for path in paths]
    check_given(runs, ranks, nodes)
    tables = []
    for run in runs:
        placement = placement_of(run, ranks, nodes)
        check_placement(run, placement, network)
        tables.append(beside(run, with_release(network, run.nccl, f"{run.path} states NCCL {run.nccl}"),
                             placement)[0])
    return tables


class Parser(argparse.ArgumentParser):
    """A mistyped command line is bad input like any other: one line, exit 2 (as `flint`'s)."""

    def error(self, message: str) -> None:
        fail(f"{message} (see {self.prog} --help)")


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def count(least: int, what: str):
    """An argparse type: a whole number of `least` or more, else one line saying so."""
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"{text!r}: give {what}, a whole number of {least} or more")
        return value
    return convert


def parser() -> Parser:
    built = Parser(
        prog="python bench/collectives.py",
        usage="%(prog)s [-h] [--calibration DIR] [FILE ... [--network NETWORK] [--ranks N] [--nodes M]]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"""{__doc__.splitlines()[0]}

Prints the built-in report (the 8x H100 sample, published bus bandwidths, the
fitted, held-out and transfer runs of bench/measured/nccl), then each FILE
given beside the model. Every input is read and checked first: a bad one is one
line on stderr ('error: ...') and exit status 2, with nothing else printed.""",
        epilog="""examples:
  python bench/collectives.py
  python bench/collectives.py all_reduce_perf.txt --ranks 16 --nodes 2
  python bench/collectives.py all_reduce_perf.txt --network my-hgx.toml""")
    built.add_argument("files", nargs="*", type=Path, metavar="FILE",
                       help="nccl-tests output (all_reduce_perf, all_gather_perf, reduce_scatter_perf, "
                            "alltoall_perf, broadcast_perf or sendrecv_perf; one run a file) to set beside "
                            "the model after the built-in report, one line per size [default: none]")
    built.add_argument("--calibration", type=Path, default=CALIBRATION, metavar="DIR",
                       help=f"folder that holds {SAMPLE}, the 8x H100 sample the report opens with "
                            "[default: ../shared/calibration/nccl beside the repository: %(default)s]")
    built.add_argument("--network", metavar="NETWORK",
                       help=f"network the FILEs ran on: a built-in one ({', '.join(BUILTIN_NETWORKS)}) "
                            "or a network file (.toml) [default: hgx]")
    built.add_argument("--ranks", type=count(2, "the GPUs the FILEs ran on"), metavar="N",
                       help="GPUs the FILEs ran on, for FILEs whose output lists no ranks (2 or more; "
                            "refused where every FILE lists its own) [default: none: such a FILE is "
                            "refused]")
    built.add_argument("--nodes", type=count(1, "the nodes the FILEs ran on"), metavar="M",
                       help="nodes those GPUs were on, for FILEs whose output lists no ranks (refused "
                            "where every FILE lists its own); the ranks must divide over them and fit the "
                            "network's GPUs a node [default: 1]")
    return built


def main() -> None:
    args = parser().parse_args()
    try:
        report(args)
    except FlintError as exc:
        fail(str(exc))


def report(args: argparse.Namespace) -> None:
    """The report, once every input has been read and checked and the FILEs' lines computed."""
    if not args.files:
        for option in ("--network", "--ranks", "--nodes"):
            if getattr(args, option[2:]) is not None:
                raise FlintError(f"{option} describes the FILEs (nccl-tests output) and none is given: give "
                                 f"them, or leave {option} out")
    network = network_named(args.network or "hgx")
    sample = read_sample(args.calibration)
    tables = given_runs(args.files, network, args.ranks, args.nodes)
    h100_all_reduce(sample)
    published()
    folder = ROOT / "bench" / "measured" / "nccl"
    fitted = fitted_runs(folder)
    held_out(folder, [({"network": "hgx", "ranks": 8, "nodes": 1}, sample), *fitted])
    transfers(folder)
    for lines in tables:
        print("\n".join(lines))


if __name__ == "__main__":
    main()

"""`flint calibrate --network`: fit a network file to measured collectives (nccl-tests output).

Each run's largest size says which of the network's numbers it measures: the bandwidth that bounds
what NCCL's model runs there (`flint.step.nccl`), the one whose 1% either way moves its time. Across
nodes that is the NICs', unless NVLS holds NVLS-Tree inside each node (NCCL's default across two
H100 nodes, whose NICs count twice there): fitting the NICs to such a run would give them whatever
slows NVLS, far below what they carry. Where NCCL's per-channel cap holds it (NVLS-Tree on two 8x
H100 nodes: 8 channels of 57.7 GB/s), a run faster than that fits the channels between nodes
(`scale_out.channels`, a fraction: the machine's channels outrun NCCL's caps), a slower one what
bounds it past the caps. A ring across nodes measures the NICs even where the node's ring bandwidth
is as low (as on hgx): a slower run is put down to them. In a node it is NVLS's bus bandwidth for
that many GPUs, or the ring's. That number is set so that the largest size takes its measured time
(the value nearest the file's own, where NCCL's tuner runs a slower algorithm past some value; runs
that measure one number share it: their mean). The node's numbers are fitted before the NICs',
so that a one-node run given beside runs across nodes sets the node the NICs are fitted on. Runs
made with NCCL_ALGO or NCCL_PROTO set hold the model to that algorithm or protocol (`algorithm`,
`protocol`): nccl-tests' output does not record them, and NCCL's choice would time another algorithm
than ran.

Then the numbers that shape the smaller sizes, each the value that minimises the sum of squared
log ratios of modelled to measured time over its runs' sizes (a coarse grid, then a fine one
around its best), in turns with the bandwidths until they hold:

- to one-node runs whose bandwidth is NVLS's, NVLS's latency (0 to 2,000 µs, to 0.5 µs) and the
  step a round of its chunks costs (0 to 50 µs, to 0.05 µs), the step only where a size runs
  chunks smaller than NCCL's largest: rounds of the largest reach the bandwidth whatever the step,
  so sizes that all run them fix the latency less the steps alone;
- to one-node runs whose bandwidth is the ring's, one step of a Simple ring (0 to 100 µs, to
  0.05 µs; NCCL's tuner takes 3.4 on NVLink) and the share of the ring's bandwidth LL128 reaches
  (0.05 to 1, to 0.01; NCCL's 0.92);
- to every run across nodes together, the network's latency (`scale_out.latency_us`, 0 to 100 µs,
  to 0.05 µs; NCCL's own for InfiniBand is 0), which each step between nodes adds (twice for
  Simple). A run across nodes leaves the node's latencies as they are: one node's run measures
  them, and a latency fitted to steps between nodes would move every one-node time.

A number the sizes leave loose (a step either way, the bandwidths refitted, fits them as well:
LL128's share where NCCL's tuner runs LL128 at no size; a latency where a run has one size) keeps the
file's own value where that fits as well, and is not reported as fitted. A run whose largest size does not
depend on its bandwidth (an LL ring at its cap) cannot fit it, and is refused, as is one whose
largest size took less than the model's latency, or longer than the model takes at any bandwidth
(another algorithm, on the network's other numbers, outruns it: not the machine's network) or less
than another of its bandwidths allows (a ring across nodes faster than the node's ring), and one on
more ranks than the network's nodes hold or on ranks that do not divide over its nodes.

NCCL's tuner picks what each size runs, so the fit takes the tuner of the release the runs ran
(`--nccl`, else the one their output states; else the network file's `nccl`, else the newest
release Flint has), and the fitted file names it: one release's tuner leaves the tree for
NVLS-Tree at another size than another's, and numbers fitted under the wrong one would fit the
switch, not the machine. Runs that state different releases are refused, as is a release Flint has
no tuner of unless `--nccl` names one to take instead.

A latency at the end of its range is reported: there the times do not follow a latency plus bytes
over a bandwidth, and the file fits them only as far as its numbers can. NCCL's other constants
(latencies per algorithm and protocol, the other protocols' efficiencies) stay as tuning.cc has
them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from flint.analysis.nccl_tests import NcclTestsRun
from flint.errors import FlintError
from flint.schema import et_def_pb2 as pb
from flint.step.nccl import Choice, NcclModel, Placement, forced_name
from flint.step.network import Dimension, Network
from flint.step.network_files import NetworkFile, nccl_release, nccl_releases


@dataclass(frozen=True)
class Shape:
    """A number fitted besides a bandwidth: tried from `low` to `high` every `coarse`, then every
    `fine` around the best; `bounded`: a best at `high` is reported (a latency, not a share)."""

    key: str
    low: float
    high: float
    coarse: float
    fine: float
    bounded: bool = True


NVLS_LATENCY = Shape("node.nvls_latency_us", 0.0, 2000.0, 5.0, 0.5)
NVLS_STEP = Shape("node.nvls_step_us", 0.0, 50.0, 0.5, 0.05)
RING_SIMPLE_HOP = Shape("node.ring_simple_hop_us", 0.0, 100.0, 0.5, 0.05)
LL128_FRACTION = Shape("node.ll128_bus_fraction", 0.05, 1.0, 0.05, 0.01, bounded=False)
NETWORK_LATENCY = Shape("scale_out.latency_us", 0.0, 100.0, 0.5, 0.05)
SHAPES = {"node.bus_gbps": (RING_SIMPLE_HOP, LL128_FRACTION)}
"""What else each bandwidth's one-node runs fit (NVLS's bandwidths: NVLS_LATENCY and NVLS_STEP).
Runs across nodes fit the network's latency (NETWORK_LATENCY), all of them together."""
CHANNELS = "scale_out.channels"
"""NCCL's channels between nodes: a number of the file that NCCL's per-channel caps multiply, fitted
only to a run faster than they allow."""
UNCAPPED = 1e6
"""Channels enough that no per-channel cap binds."""
BANDWIDTH_RANGE = (1e-3, 1e5)
"""What a fitted bandwidth (GB/s) or count of channels may take."""
BANDWIDTH_STEP = 1.05
"""The factor a bandwidth's fit moves from the file's value by until the time crosses the measured."""
ROUNDS = 20
"""At most this many turns of fitting those numbers and then the bandwidths."""
SAME_MISFIT = 1e-12
"""Misfits (sums of squared log ratios) closer than this fit alike: the bandwidth's bisection
leaves rounding of this order."""


@dataclass(frozen=True)
class Row:
    """One size: measured and modelled (before and after the fit) µs, and what NCCL's model runs."""

    size: int
    measured: float
    before: float
    after: Choice


@dataclass(frozen=True)
class PlacedRun:
    """A run as NCCL's model times it: on which ranks and nodes, of the algorithm and protocol it
    forced (NCCL_ALGO, NCCL_PROTO; None: NCCL's choice)."""

    run: NcclTestsRun
    placement: Placement
    algorithm: str | None = None
    protocol: str | None = None

    def choice(self, network: NetworkFile, size: int) -> Choice:
        return modelled(network, self.run.comm_type, size, self.placement, self.algorithm, self.protocol)

    def forced(self) -> dict[str, str]:
        return {variable: value for variable, value in (("NCCL_ALGO", self.algorithm), ("NCCL_PROTO", self.protocol))
                if value}


@dataclass(frozen=True)
class RunFit:
    run: NcclTestsRun
    placement: Placement
    rows: tuple[Row, ...]
    forced: dict[str, str] = field(default_factory=dict)
    """What the run held NCCL to: NCCL_ALGO, NCCL_PROTO -> value."""

    @property
    def held_to(self) -> str:
        """`forced` as the fit's table title and the fitted numbers' source say it: ', NCCL_ALGO=Ring'."""
        return "".join(f", {variable}={value}" for variable, value in self.forced.items())


@dataclass(frozen=True)
class NetworkFit:
    """The fitted network, each run beside it, and what was fitted (name -> value)."""

    network: NetworkFile
    runs: tuple[RunFit, ...]
    fitted: dict[str, float]
    at_limit: tuple[str, ...] = ()
    """Fitted numbers that ended at the end of the range the fit tries."""
    release_from: str = ""
    """Whence the release whose tuner picked (`network.release`): the runs, --nccl, the file."""

    def as_json(self) -> dict:
        return {
            "network": self.network.name,
            "nccl": self.network.release,
            "nccl_from": self.release_from,
            "fitted": self.fitted,
            "at_limit": list(self.at_limit),
            "runs": [{
                "file": str(fit.run.path), "collective": fit.run.collective, "ranks": fit.placement.ranks,
                "nodes": fit.placement.nodes, "forced": fit.forced,
                "rows": [{"bytes": r.size, "measured_us": r.measured, "before_us": r.before,
                          "modelled_us": r.after.micros, "algorithm": r.after.algorithm,
                          "protocol": r.after.protocol} for r in fit.rows],
            } for fit in self.runs],
        }


def modelled(network: NetworkFile, comm_type: int, size: int, placement: Placement, algorithm: str | None = None,
             protocol: str | None = None) -> Choice:
    """NCCL's model of one nccl-tests row: `size` bytes as nccl-tests counts them (of `algorithm`
    and `protocol` where the run forced them)."""
    per_rank = size // placement.ranks if comm_type == pb.ALL_GATHER else size
    return _model(network, placement).choose(comm_type, max(per_rank, 1), placement, algorithm, protocol)


def _model(network: NetworkFile, placement: Placement) -> NcclModel:
    return NcclModel(Network((Dimension("Switch", placement.ranks, 1.0, 0.0),), network.name, network))


def _shows_nvls_step(network: NetworkFile, one: PlacedRun) -> bool:
    """Whether a run has a size NVLS runs in one node in chunks smaller than NCCL's largest: only
    there does a round's step show, since rounds of the largest reach NVLS's bandwidth whatever it
    is (`flint.step.nccl`), and a run without such sizes fixes the latency less the steps alone."""
    model, placement = _model(network, one.placement), one.placement
    return placement.nodes == 1 and any(
        one.choice(network, row.size).algorithm == "NVLS"
        and model.nvls_chunk(row.size, placement) < model.largest_nvls_chunk(placement)
        for row in one.run.rows)


def placement_of(run: NcclTestsRun, ranks: int | None, nodes: int | None) -> Placement:
    """The run's ranks and nodes: the file's, else those given, else one node of ranks."""
    count = run.ranks or ranks
    if count is None:
        raise FlintError(f"{run.path} does not record its ranks (no '#  Rank' lines): give --ranks")
    if count < 2:
        raise FlintError(f"{run.path}: {count} rank: a collective needs 2 or more")
    return Placement(count, run.nodes or nodes or 1)


def check_given(runs: Sequence[NcclTestsRun], ranks: int | None, nodes: int | None) -> None:
    """Refuse --ranks or --nodes where every run lists its ranks and nodes: each run's own are
    taken (`placement_of`), and the given ones would be ignored without a word."""
    given = " and ".join(option for option, value in (("--ranks", ranks), ("--nodes", nodes)) if value is not None)
    if given and all(run.ranks for run in runs):
        raise FlintError(f"{given}: every run lists its ranks and their nodes ('#  Rank' lines), which Flint "
                         f"takes: leave {given} out")


def check_placement(run: NcclTestsRun, placement: Placement, network: NetworkFile) -> None:
    """Refuse ranks that do not divide over the nodes, or more than the network's nodes hold: NCCL's
    model would time another machine (16 ranks on one 8-GPU node, a run across two nodes whose
    --nodes was left out, fit a bogus NVLS), and the fit would write its numbers with exit 0."""
    ranks, nodes, gpus = placement.ranks, placement.nodes, network.node.gpus
    given = "its '#  Rank' lines" if run.ranks else "--ranks, and --nodes or its default 1"
    if ranks % nodes:
        raise FlintError(f"{run.path}: {ranks} ranks do not divide over {nodes} nodes ({given}): "
                         "give the ranks and nodes the run used")
    if gpus is not None and ranks > gpus * nodes:
        todo = ("give the --network of the machine it ran on" if run.ranks else
                f"give the --nodes it ran on ({-(-ranks // gpus)} or more), or the --network of its machine")
        raise FlintError(f"{run.path}: {ranks} ranks on {nodes} node{'s' * (nodes > 1)} ({given}), and network "
                         f"{network.name}'s nodes hold {gpus} GPUs: {todo}")


def _check_forced(one: PlacedRun, network: NetworkFile) -> None:
    """Refuse an algorithm or protocol NCCL does not have for the run on this network (NVLS on
    A100s, a Tree in one node), naming the run."""
    if not one.forced():
        return
    try:
        one.choice(network, one.run.largest.size)
    except FlintError:
        nodes, forced = one.placement.nodes, forced_name(one.algorithm, one.protocol)
        raise FlintError(f"{one.run.path}: NCCL has no {forced} for {one.run.collective} on {one.placement.ranks} "
                         f"ranks on {nodes} node{'s' * (nodes > 1)} of network {network.name}: give the --algorithm "
                         "and --protocol the run was held to (NCCL_ALGO, NCCL_PROTO)") from None


def calibrate_network(runs: Sequence[NcclTestsRun], base: NetworkFile, name: str, ranks: int | None = None,
                      nodes: int | None = None, algorithm: str | None = None,
                      protocol: str | None = None, nccl: str | None = None) -> NetworkFit:
    """Fit `base`'s numbers to `runs`, made with NCCL_ALGO `algorithm` and NCCL_PROTO `protocol`
    where given, under the tuner of NCCL `nccl` where given (see the module docstring)."""
    check_given(runs, ranks, nodes)
    release, release_from = _measured_release(runs, nccl)
    if release is None:
        release_from = (f"network {base.name}'s; the runs state none" if base.nccl else
                        "the newest Flint has; the runs state none")
    else:
        base = replace(base, nccl=release)
    placed = [PlacedRun(run, placement_of(run, ranks, nodes), algorithm, protocol) for run in runs]
    for one in placed:
        check_placement(one.run, one.placement, base)
        _check_forced(one, base)
    by_parameter: dict[str, list[PlacedRun]] = defaultdict(list)
    for one in placed:
        by_parameter[_parameter(base, one)].append(one)
    groups = sorted(by_parameter.items(), key=lambda item: item[0].startswith("scale_out"))

    def refit(network: NetworkFile) -> NetworkFile:
        for parameter, measured in groups:
            network = _fit_bandwidth(network, parameter, measured)
        return network

    # (shape, the runs it is fitted to, what refits the bandwidths it moves)
    fits: list[tuple[Shape, list[PlacedRun], Callable[[NetworkFile], NetworkFile]]] = []
    for parameter, measured in groups:
        one_node = [one for one in measured if one.placement.nodes == 1]
        if not one_node:
            continue
        if parameter.startswith("node.nvls_bus_gbps"):
            steps = any(_shows_nvls_step(base, one) for one in one_node)
            shapes = (NVLS_LATENCY, NVLS_STEP) if steps else (NVLS_LATENCY,)
        else:
            shapes = SHAPES.get(parameter, ())
        fits += [(shape, one_node, lambda n, p=parameter, m=measured: _fit_bandwidth(n, p, m)) for shape in shapes]
    across = [one for one in placed if one.placement.nodes > 1]
    if across:
        fits.append((NETWORK_LATENCY, across, refit))
    network, values = refit(base), {}
    for parameter, measured in groups:  # on the file's own latencies first: what no bandwidth reaches
        _check_measured(network, parameter, measured)
    for _ in range(ROUNDS):  # each fit moves the others: take turns until they hold
        previous = dict(values)
        for shape, measured, moved in fits:
            values[shape.key] = _fit_shape(network, shape, measured)
            network = moved(_set(network, shape.key, values[shape.key]))
        if values == previous:
            break
    for parameter, measured in groups:
        _check_measured(network, parameter, measured)
    for shape, measured, moved in fits:
        if _unsettled(network, moved, shape, measured):
            kept = moved(_set(network, shape.key, _get(base, shape.key)))
            if _misfit(kept, measured) <= _misfit(network, measured) + SAME_MISFIT:
                network = refit(kept)
                del values[shape.key]
    at_limit = tuple(shape.key for shape, _, _ in fits
                     if shape.key in values and shape.bounded and values[shape.key] == shape.high)
    fitted = {**values, **{parameter: _get(network, parameter) for parameter, _ in groups}}
    network = replace(network, name=name)
    runs_fit = tuple(RunFit(one.run, one.placement, tuple(
        Row(row.size, row.micros, one.choice(base, row.size).micros, one.choice(network, row.size))
        for row in one.run.rows), one.forced()) for one in placed)
    return NetworkFit(network, runs_fit, fitted, at_limit, release_from)


def _measured_release(runs: Sequence[NcclTestsRun], nccl: str | None) -> tuple[str | None, str]:
    """The NCCL release the runs ran, and whence: `nccl` (--nccl) where given, else the one their
    output states; None where neither says. Two releases stated, or one stated and another given,
    are refused; so is a stated release Flint has no tuner of, unless `nccl` names one to take."""
    stated = {run.nccl: run for run in runs if run.nccl}
    if len(stated) > 1:
        said = ", ".join(f"{run.path.name}: {release}" for release, run in sorted(stated.items()))
        raise FlintError(f"the runs state different NCCL releases ({said}): fit each release's runs on their own")
    if nccl is not None:
        release = tuner_release(nccl, f"--nccl {nccl}", "give one of those")
        for said, run in stated.items():
            if said != release and said in nccl_releases():
                raise FlintError(f"--nccl {nccl}, and {run.path} states NCCL {said}: leave --nccl out, or give the "
                                 "release the run states")
        return release, "given as --nccl"
    if not stated:
        return None, ""
    [(said, run)] = stated.items()
    return tuner_release(said, f"{run.path} states NCCL {said}", "give --nccl with the release nearest it"), \
        "stated by the runs' output"


def tuner_release(version: str, said: str, todo: str) -> str:
    """The release of `version` whose tuner Flint has (a minor version: its newest); else one line."""
    try:
        return nccl_release(version)
    except ValueError:
        releases = nccl_releases()
        raise FlintError(f"{said}: Flint has no tuner of that release (it has NCCL {releases[0]} to {releases[-1]}): "
                         f"{todo}") from None


def _fit_shape(network: NetworkFile, shape: Shape, runs: Sequence[PlacedRun]) -> float:
    """`shape`'s value of least misfit: every `coarse` from `low` to `high`, then every `fine`
    around the best (rounded to the fine step)."""
    def misfit(value: float) -> float:
        return _misfit(_set(network, shape.key, value), runs)

    steps = round((shape.high - shape.low) / shape.coarse)
    best = min((shape.low + i * shape.coarse for i in range(steps + 1)), key=misfit)
    around = round(shape.coarse / shape.fine)
    candidates = (round(best + i * shape.fine, 6) for i in range(-around, around + 1))
    return min((v for v in candidates if shape.low <= v <= shape.high), key=misfit)


def _unsettled(network: NetworkFile, moved: Callable[[NetworkFile], NetworkFile], shape: Shape,
               runs: Sequence[PlacedRun]) -> bool:
    """Whether the sizes leave `network`'s value of `shape` loose: a fine step to either side
    (within the range), the bandwidths it moves refitted (`moved`), fits them as well. So they
    bound the number at most, as LL128's share where NCCL runs LL128 at no size, or a latency
    measured at one size, where any latency fits with its own bandwidth."""
    value, misfit = _get(network, shape.key), _misfit(network, runs)
    steps = (round(value + step, 6) for step in (-shape.fine, shape.fine))
    return any(abs(_misfit(moved(_set(network, shape.key, v)), runs) - misfit) <= SAME_MISFIT
               for v in steps if shape.low <= v <= shape.high)


def _check_measured(network: NetworkFile, parameter: str, runs: Sequence[PlacedRun]) -> None:
    """Each run's largest size must take longer with less of `parameter` and less with more: else
    it does not measure the number (an LL ring at its cap, below the bus bandwidth), and any
    value past a bound would fit it. And some value must give it its measured time: a time below
    the model's latency is reached by none (the bisection ends at its bound), nor one below what
    another of the network's bandwidths allows (a ring across nodes faster than the node's ring);
    nor is a time above what the model takes at the least value, where another algorithm or
    protocol, which does not depend on `parameter`, runs faster on the network's other numbers: the
    network is not the machine's (an A100 node measured on hgx, whose ring outruns it), and a larger
    size would not help."""
    for one in runs:
        largest = one.run.largest
        fitted = _fit_bandwidth(network, parameter, [one])
        closest = one.choice(fitted, largest.size)
        if not math.isclose(closest.micros, largest.micros, rel_tol=0.01):
            slower = closest.micros < largest.micros
            said = (f"{one.run.path}: its largest size ({largest.size:,} bytes) took {largest.micros:,.1f} µs, and "
                    f"NCCL's model takes {'at most ' * slower}{closest.micros:,.1f} at any {parameter}")
            if slower:
                raise FlintError(f"{said}, running {closest.algorithm} {closest.protocol} on network {network.name}'s "
                                 f"other numbers: the run is slower than {network.name} can be: give the --network "
                                 f"of the machine it ran on{_held(one)}")
            other = _binding(fitted, one, [p for p in _bandwidths(fitted, one) if p != parameter])
            if other is not None:
                raise FlintError(f"{said}, where {other} ({_get(fitted, other):g}) bounds {closest.algorithm} "
                                 f"{closest.protocol}: the run is faster than {network.name} can be: give the "
                                 "--network of the machine it ran on, or fit that number first")
            if _latency_bound(fitted, one, closest):
                raise FlintError(f"{said}: give a run that reaches larger sizes (nccl-tests -e 8G)")
            raise FlintError(f"{said}, running {closest.algorithm} {closest.protocol} on network {network.name}'s "
                             f"other numbers: the run is faster than {network.name} can be: give the --network of "
                             f"the machine it ran on{_held(one)}")
        if _binding(network, one, [parameter]) is None:
            choice = one.choice(network, largest.size)
            raise FlintError(f"{one.run.path}: at its largest size ({largest.size:,} bytes) NCCL's model runs "
                             f"{choice.algorithm} {choice.protocol}, whose time does not depend on {parameter}: "
                             "give a run that reaches larger sizes (nccl-tests -e 8G)")


def _held(one: PlacedRun) -> str:
    """The other way a run may differ from what the model runs: held to an algorithm or protocol
    that the fit was not told of, or not held to the one it was."""
    if one.forced():
        return " (or, where NCCL_ALGO and NCCL_PROTO did not hold it, leave out --algorithm and --protocol)"
    return " (or, where NCCL_ALGO or NCCL_PROTO held it, --algorithm or --protocol)"


def _latency_bound(network: NetworkFile, one: PlacedRun, choice: Choice) -> bool:
    """Whether most of the model's time at a run's largest size is the latency of what runs there
    (its time for one byte): then a larger size, whose bytes outweigh it, measures the bandwidth;
    otherwise the run's sizes are large enough, and the network's other numbers hold it back."""
    latency = modelled(network, one.run.comm_type, 1, one.placement, choice.algorithm, choice.protocol).micros
    return latency >= choice.micros / 2


def _bandwidths(network: NetworkFile, one: PlacedRun) -> list[str]:
    """The bandwidths that may bound a run: the NICs' across nodes, NVLS's for its GPUs in a node
    (where the node has NVLS), NCCL's channels between nodes (its per-channel caps multiply them),
    the ring's."""
    across = one.placement.nodes > 1
    found = ["scale_out.nic_gbps"] if across else []
    if network.node.nvls:
        gpus = min(math.ceil(one.placement.ppn), len(network.node.nvls_bus_gbps))
        found.append(f"node.nvls_bus_gbps[{gpus - 1}]")
    return found + [CHANNELS] * across + ["node.bus_gbps"]


def _candidates(network: NetworkFile, one: PlacedRun) -> list[str]:
    """The bandwidths of the machine a run's largest size may measure, the one it measures where
    none bounds it first: across nodes the NICs', or NVLS's where it holds NVLS-Tree (not the
    ring's: a ring across nodes measures the NICs, which a slower run must be put down to); in a
    node the ring's, or NVLS's."""
    found = [p for p in _bandwidths(network, one) if p != CHANNELS]
    return found[:-1] if one.placement.nodes > 1 else [found[-1], *found[:-1]]


def _binding(network: NetworkFile, one: PlacedRun, parameters: Sequence[str]) -> str | None:
    """The first of `parameters` whose 1% either way moves the run's largest size's time."""
    size = one.run.largest.size
    for parameter in parameters:
        time, value = _timer(network, parameter, one, size), _get(network, parameter)
        if time(value * 0.99) > time(value) > time(value * 1.01):
            return parameter
    return None


def _parameter(network: NetworkFile, one: PlacedRun) -> str:
    """Which number a run's largest size measures: the bandwidth that bounds it."""
    if one.placement.nodes > 1 and network.scale_out is None:
        raise FlintError(f"{one.run.path} ran on {one.placement.nodes} nodes and network {network.name} has one: "
                         "start from a network with a [scale_out]")
    candidates = _candidates(network, one)
    if one.placement.nodes == 1:
        return _binding(network, one, candidates) or candidates[0]
    if (_binding(network, one, [CHANNELS]) is not None
            and one.choice(network, one.run.largest.size).micros > one.run.largest.micros):
        return CHANNELS  # faster than NCCL's per-channel caps allow: the machine's channels outrun them
    uncapped = _set(network, CHANNELS, UNCAPPED)  # slower: put down to what bounds it past the caps
    return _binding(uncapped, one, candidates) or candidates[0]


def _fit_bandwidth(network: NetworkFile, parameter: str, runs: Sequence[PlacedRun]) -> NetworkFile:
    """`parameter` set to the mean over `runs` of the value at which each largest size takes its
    measured time, the one nearest the network's own: from it, in steps of 5% down or up until the
    time crosses the measured one (at most to 10^-3 and 10^5), then bisected. The time falls as the
    bandwidth grows, except where an NCCL release's tuner then moves to a slower algorithm (2.26's
    to NVLS-Tree across 4 nodes once the NICs carry 57 GB/s, a quarter more than the node's ring
    needs): a bisection over the whole range, or steps that double, would end past that switch,
    where no value gives the measured time."""
    values = []
    for one in runs:
        largest = one.run.largest
        time = _timer(network, parameter, one, largest.size)
        own = min(max(_get(network, parameter), BANDWIDTH_RANGE[0]), BANDWIDTH_RANGE[1])
        if time(own) > largest.micros:  # too slow: more of it
            low, high = own, min(own * BANDWIDTH_STEP, BANDWIDTH_RANGE[1])
            while time(high) > largest.micros and high < BANDWIDTH_RANGE[1]:
                low, high = high, min(high * BANDWIDTH_STEP, BANDWIDTH_RANGE[1])
        else:
            low, high = max(own / BANDWIDTH_STEP, BANDWIDTH_RANGE[0]), own
            while time(low) <= largest.micros and low > BANDWIDTH_RANGE[0]:
                low, high = max(low / BANDWIDTH_STEP, BANDWIDTH_RANGE[0]), low
        for _ in range(100):
            middle = math.sqrt(low * high)
            low, high = (middle, high) if time(middle) > largest.micros else (low, middle)
        values.append(math.sqrt(low * high))
    return _set(network, parameter, sum(values) / len(values))


def _timer(network: NetworkFile, parameter: str, one: PlacedRun, size: int) -> Callable[[float], float]:
    return lambda value: one.choice(_set(network, parameter, value), size).micros


def _misfit(network: NetworkFile, runs: Sequence[PlacedRun]) -> float:
    """The sum of squared log ratios of modelled to measured time; a network NCCL's model refuses
    (an NVLS step longer than a round of its largest chunks takes) fits worst."""
    try:
        return sum(math.log(one.choice(network, row.size).micros / row.micros) ** 2
                   for one in runs for row in one.run.rows)
    except FlintError:
        return math.inf


def _get(network: NetworkFile, parameter: str) -> float:
    tier, _, key = parameter.partition(".")
    if "[" in key:
        key, index = key.rstrip("]").split("[")
        return getattr(getattr(network, tier), key)[int(index)]
    return getattr(getattr(network, tier), key)


def _set(network: NetworkFile, parameter: str, value: float) -> NetworkFile:
    tier, _, key = parameter.partition(".")
    part = getattr(network, tier)
    if "[" in key:
        key, index = key.rstrip("]").split("[")
        table = list(getattr(part, key))
        table[int(index)] = value
        value = tuple(table)
    return replace(network, **{tier: replace(part, **{key: value})})

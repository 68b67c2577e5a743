"""`flint simulate`: from a trace directory to the step time of one step on a machine.

The machine is read from the trace's manifest (its mesh axes lay the network's dimensions out, its
device sets the roofline) and the request (network preset or file, replay or roofline). Two engines
give the step: Flint's estimator (`flint`, the default): `flint timeline`'s schedule with
communication timed as NCCL runs it on the network (`flint.step.nccl`; or, with `collectives`
astra-sim, as ASTRA-sim times it on the same network and system keys, `flint.step.astra_sim`),
and ASTRA-sim itself (`astra-sim`), handed the closest network its analytical backend models (one
switch per tier of the network file). The estimator is the default because it is the more
faithful: ASTRA-sim's rings per dimension are far from what NCCL does (see docs/simulate.md).
`auto` runs ASTRA-sim where it is found and the trace has at most `ASTRA_SIM_MAX_RANKS` ranks and
every rank's file (not one per rank class, `flint extract --rank-files classes`), the estimator
otherwise; the result says which ran. Beside ASTRA-sim's result stands the estimator's,
so a user sees how far apart they are.

The output directory appears whole or not at all: everything is written into a staging directory
beside it (`flint.emit.writer`'s, as a trace is), which replaces it when the simulation succeeded
and is removed otherwise, leaving an earlier simulation's output as it was.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from flint.devices import load_device
from flint.emit.writer import OutputDir, disk_errors, make_directories, prepare_output, remove_empty
from flint.errors import FlintError
from flint.simulation.inputs import SimulationInputs, read_system_overrides
from flint.simulation.run import RankResult, find_simulator, run_simulator
from flint.step.astra_sim import CollectiveModel
from flint.step.models import collective_model
from flint.step.nccl import NcclModel
from flint.step.network import mesh_axes, network_for
from flint.step.schedule import AS_ASTRA_SIM, schedule_trace_set
from flint.trace.contract import PER_CLASS_SET
from flint.trace.errors import TraceFormatError, TraceLookupError
from flint.trace.reader import TraceFiles, comm_groups_path, locate_traces
from flint.trace.timing import Compute, Link, NodeTimer, recorded_device

RESULT = "result.json"
"""The report's file in the simulation's directory."""
WRITTEN = frozenset({"system.json", "network.yml", "memory.json", "logging.toml", RESULT, "stdout.txt", "stderr.txt",
                     "log"})
"""What a simulation's directory holds (ASTRA-sim's inputs, its output and logs, the report): one
holding anything else is not replaced."""
ENGINES = ("flint", "astra-sim", "auto")
"""`flint simulate --engine`: the estimator, ASTRA-sim, or ASTRA-sim where it is found and within
reach, else the estimator."""
ASTRA_SIM_MAX_RANKS = 2048
"""The most ranks `--engine auto` gives ASTRA-sim: its time and memory grow with the ranks (1,024
took minutes), while the estimator answers in seconds at any scale."""


@dataclass(frozen=True)
class SimulateRequest:
    """What to simulate and on what: `network` is a preset name or an ASTRA-sim YAML file;
    `device` (a name or a JSON spec) overrides the manifest's; `output` holds ASTRA-sim's inputs
    and logs (default: DIR/astra-sim); `system` is a JSON file of ASTRA-sim system keys that
    replace Flint's; `groups` is a communicator-group file other than PREFIX.comm_groups.json;
    `collectives` is the estimator's communication model (nccl or astra-sim)."""

    directory: Path
    network: str = "hgx"
    roofline: bool = False
    device: str | None = None
    system: Path | None = None
    simulator: str | None = None
    output: Path | None = None
    prefix: str | None = None
    estimate: bool = True
    timeout: float | None = None
    groups: Path | None = None
    engine: str = "flint"
    collectives: str = "nccl"


@dataclass(frozen=True)
class Simulation:
    """The outcome: the inputs written, and the per-rank times of the engine that ran (`astra-sim`
    or `flint`; none ran when ASTRA-sim was asked for and not found). `runnable`: whether ASTRA-sim
    can run the inputs (not on a set of one file per rank class, which a note says)."""

    inputs: SimulationInputs
    simulator: Path | None
    ranks: Sequence[RankResult]
    estimate_us: float | None
    known_issue: str | None
    engine: str | None = None
    seconds: float | None = None
    notes: Sequence[str] = ()
    collectives: str = "nccl"
    runnable: bool = True

    @property
    def ran(self) -> bool:
        return bool(self.ranks)

    @property
    def slowest(self) -> RankResult | None:
        return max(self.ranks, key=lambda r: (r.wall, -r.rank), default=None)

    def as_json(self) -> dict:
        slowest = self.slowest
        return {
            "trace": str(self.inputs.workload.parent),
            "ranks": self.inputs.network.npus,
            "network": self.inputs.network.as_json(),
            "engine": self.engine,
            "collectives": self.collectives,
            "seconds": self.seconds,
            "device": self.inputs.device.name,
            "mode": "roofline" if self.inputs.roofline else "replay",
            "simulator": str(self.simulator) if self.simulator else None,
            "command": self.inputs.shell_command(self.simulator or "astra-sim") if self.runnable else None,
            "files": {key: str(path) for key, path in self.inputs.files.items()},
            "step_us": slowest.wall / 1e3 if slowest else None,
            "slowest_rank": slowest.rank if slowest else None,
            "timeline_estimate_us": self.estimate_us,
            "known_issue": self.known_issue,
            "notes": list(self.notes),
            "per_rank": [r.as_json(slowest.wall) for r in self.ranks],
        }


def simulate(request: SimulateRequest, on_progress: Callable[[int, int], None] = lambda done, total: None
             ) -> Simulation:
    """Write ASTRA-sim's inputs for the trace, run it if there is one, and read the results."""
    try:
        files = locate_traces(request.directory, request.prefix, groups_file=request.groups)
    except FileNotFoundError as exc:
        raise FlintError(f"{exc}: give a directory written by `flint extract`") from None
    except (TraceFormatError, TraceLookupError) as exc:  # each says what to do
        raise FlintError(str(exc)) from None
    prefix = files.prefix
    manifest = _manifest(files)
    axes = mesh_axes(manifest, files.num_ranks)
    if request.device and not request.roofline:
        raise FlintError("--device times compute in ASTRA-sim's roofline mode: add --roofline (replay "
                         "mode replays the trace's own durations; extract again with --device to change them)")
    if request.system and request.engine == "flint" and request.collectives == "nccl":
        # ASTRA-sim's keys reach only its model of collectives and ASTRA-sim itself, neither of which runs
        raise FlintError("--system sets ASTRA-sim's system keys, which NCCL's model does not use: add --collectives "
                         "astra-sim, or --engine astra-sim to run ASTRA-sim, or leave --system out")
    # The device of ASTRA-sim's system file; another producer's trace names none: an H100's.
    device = load_device(request.device) if request.device else recorded_device(manifest)
    compute = Compute(device, "roofline") if request.roofline else Compute()
    network = network_for(request.network, axes)
    groups_file = request.groups or comm_groups_path(request.directory, prefix)
    inputs = SimulationInputs(  # absolute: ASTRA-sim runs in the inputs' directory
        directory=(request.output or request.directory / "astra-sim").resolve(),
        workload=request.directory.resolve() / prefix,
        groups=groups_file.resolve() if groups_file.exists() else None,
        network=network,
        device=device,
        roofline=request.roofline,
        system_overrides=read_system_overrides(request.system) if request.system else {},
    )
    if request.engine not in ENGINES:
        raise FlintError(f"unknown --engine {request.engine!r}: use one of {', '.join(ENGINES)}")
    model = collective_model(request.collectives, network, device, inputs.system_overrides)
    notes = [f"the estimator times ring collectives; the system file asks ASTRA-sim for {', '.join(found)}"
             for found in [model.unmodelled()] if found]
    if files.one_per_class and request.engine == "astra-sim":
        raise FlintError(f"{request.directory}: {PER_CLASS_SET}")
    if files.one_per_class:  # ASTRA-sim's inputs are written all the same, but it cannot run them
        notes.append(PER_CLASS_SET)
    _check_output(inputs.directory)  # before the slow work
    simulator = find_simulator(request.simulator) if request.engine != "flint" and not files.one_per_class else None
    use_flint = request.engine == "flint" or (
        request.engine == "auto" and (simulator is None or files.num_ranks > ASTRA_SIM_MAX_RANKS))
    if use_flint:
        began = time.perf_counter()
        step, ranks = estimate(files, compute, model)
        seconds = time.perf_counter() - began
        simulation = Simulation(inputs, simulator, ranks, step, None, "flint", seconds, notes, request.collectives,
                                runnable=not files.one_per_class)
        with _staged(inputs) as staged:  # once the trace is known to be sound: a refused one is left as it was
            staged.write()
            _write_result(staged, simulation)
        return simulation
    estimated = estimate(files, compute, model)[0] if request.estimate else None
    with _staged(inputs) as staged:
        staged.write()
        if simulator is None:
            return Simulation(inputs, None, [], estimated, None, notes=notes, collectives=request.collectives)
        multi_group = max(Counter(r for ranks in files.groups.values() for r in ranks).values(), default=0) >= 2
        began = time.perf_counter()
        # in the staging directory, by its paths; the result names the inputs where they will be
        run = run_simulator(staged.command(simulator), staged.directory, files.num_ranks, multi_group,
                            lambda done: on_progress(done, files.num_ranks), request.timeout)
        known = None
        if run.returncode != 0:
            known = (f"ASTRA-sim crashed at teardown (exit {run.returncode}) after every rank finished: a known "
                     "upstream issue with ranks in two or more communicator groups; the results are complete")
        simulation = Simulation(inputs, simulator, [run.ranks[r] for r in range(files.num_ranks)], estimated, known,
                                "astra-sim", time.perf_counter() - began, notes if estimated is not None else [],
                                request.collectives)
        _write_result(staged, simulation)
    return simulation


def _write_result(staged: SimulationInputs, simulation: Simulation) -> None:
    (staged.directory / RESULT).write_text(json.dumps(simulation.as_json(), indent=2) + "\n")


def _check_output(target: Path) -> None:
    """Refuse an output directory that a simulation cannot replace whole: one holding anything but
    an earlier simulation's files, or the current directory, or where no directory can be made."""
    try:
        foreign = sorted(e.name for e in target.iterdir() if e.name not in WRITTEN) if target.is_dir() else []
    except OSError as exc:
        raise FlintError(f"cannot read output directory {str(target)!r}: {exc.strerror}: choose another -o") from None
    if foreign:
        raise FlintError(f"output directory {str(target)!r} holds {foreign[0]!r}, which flint simulate does not "
                         "write, and a simulation replaces the directory whole: choose another -o (a new or empty "
                         "directory, or an earlier simulation's)")
    if target.parent.is_dir():  # else its missing parents are made when the simulation is written
        prepare_output(target, force=True)


@contextmanager
def _staged(inputs: SimulationInputs) -> Iterator[SimulationInputs]:
    """`inputs` in a staging directory beside their own (and its missing parents, made here), which
    replaces it when the block ends and is removed if it raises (or is interrupted), with the
    parents made, leaving an earlier output as it was."""
    target = inputs.directory
    try:
        made = make_directories(target.parent)
    except OSError as exc:
        raise FlintError(f"cannot create {str(target)!r}: {exc.strerror}: choose another -o") from None
    try:
        with disk_errors(target), OutputDir(target) as output:
            yield replace(inputs, directory=output.staging)
    except BaseException:
        remove_empty(made)
        raise


def _manifest(files: TraceFiles) -> dict:
    """Flint's manifest of this trace set, or {} for another producer's trace."""
    try:
        return files.recorded() or {}
    except TraceFormatError as exc:
        raise FlintError(f"{exc}: extract the trace again") from None


def estimate(files: TraceFiles, compute: Compute, model: CollectiveModel | NcclModel
             ) -> tuple[float, list[RankResult]]:
    """The estimator's step (µs) and each rank's times (as ASTRA-sim reports them, in ns): `flint
    timeline`'s schedule of the opened set with communication timed by `model`, compute as
    ASTRA-sim times it (the trace's durations, or the roofline in roofline mode)."""
    timeline = schedule_trace_set(
        files, lambda groups, num_ranks: NodeTimer(compute, Link(), groups, num_ranks, model), issue=AS_ASTRA_SIM,
        detail=False,
    )
    ranks = [RankResult(r.rank, wall=r.step * 1e3, compute=r.compute * 1e3, communication=r.communication * 1e3,
                        overlap=(r.communication - r.exposed) * 1e3, finished=True) for r in timeline.every_rank()]
    return timeline.step, ranks

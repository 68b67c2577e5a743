"""The terminal view of a simulation: the step, where each rank's time went, and how to rerun it."""

from __future__ import annotations

from statistics import fmean

from rich.console import Group
from rich.table import Table
from rich.text import Text

from flint.simulation.driver import Simulation


def _fabric(simulation: Simulation) -> str:
    """The network as the engine that gave the step sees it: ASTRA-sim's dimensions, or the
    network file's node and NICs that NCCL's model times on (and the NCCL release it names)."""
    network = simulation.inputs.network
    cluster = network.cluster
    if simulation.engine == "astra-sim" or simulation.collectives != "nccl" or cluster is None:
        return ", ".join(f"{'+'.join(d.axes) or 'ranks'} {d.npus} at {d.bandwidth_gbps:g} GB/s"
                         for d in network.dimensions)
    node = cluster.node
    text = f"{node.gpus or 'all'} GPUs a node at {node.bus_gbps:g} GB/s{', NVLS' if node.nvls else ''}"
    if cluster.scale_out is not None:
        out = cluster.scale_out
        text += f"; {out.nics} NICs a node at {out.nic_gbps:g} GB/s{', SHARP' if out.sharp else ''}"
    text += f"; NCCL {cluster.release}'s tuner picks"
    return text


def simulation_view(simulation: Simulation) -> Group:
    inputs = simulation.inputs
    network = _fabric(simulation)
    mode = "roofline" if inputs.roofline else "replay"
    lines: list = [Text(f"{inputs.workload.name}: {inputs.network.npus} ranks on {inputs.network.name} "
                        f"({network}), {mode}, {inputs.device.name}")]
    estimate = simulation.estimate_us
    if not simulation.ran:
        lines.append(Text("ASTRA-sim not found (give --astra-sim PATH or set ASTRA_SIM): its inputs are in "
                          f"{inputs.directory}; run"))
        lines.append(Text("  " + inputs.shell_command("astra-sim")))
        if estimate is not None:
            lines.append(Text(f"Flint's estimator gives the step: {estimate:,.1f} µs"))
        for note in simulation.notes:
            lines.append(Text(f"note: {note}", style="yellow"))
        return Group(*lines)
    slowest = simulation.slowest
    model = "as NCCL runs them" if simulation.collectives == "nccl" else "as ASTRA-sim times them"
    beside = ""
    if simulation.engine != "flint" and estimate is not None:
        beside = f"   (Flint's estimator, collectives {model}: {estimate:,.1f} µs)"
    took = "" if simulation.seconds is None else (
        f" in {simulation.seconds:,.1f} s" if simulation.seconds >= 0.05 else " in under 0.1 s")
    engine = f"Flint's estimator (collectives {model})" if simulation.engine == "flint" else "ASTRA-sim"
    lines.append(Text(f"engine: {engine}{took}"))
    lines.append(Text(f"step {slowest.wall / 1e3:,.1f} µs (slowest rank {slowest.rank}){beside}"))
    table = Table(box=None, padding=(0, 2))
    table.add_column("per rank, µs")
    for column in ("min", "mean", "max"):
        table.add_column(column, justify="right")
    for label, value in (("step", lambda r: r.wall), ("compute", lambda r: r.compute),
                         ("exposed communication", lambda r: r.exposed), ("idle", lambda r: r.idle(slowest.wall))):
        values = [value(r) / 1e3 for r in simulation.ranks]
        table.add_row(label, *(f"{v:,.1f}" for v in (min(values), fmean(values), max(values))))
    lines.append(table)
    if simulation.known_issue:
        lines.append(Text(f"note: {simulation.known_issue}", style="yellow"))
    for note in simulation.notes:
        lines.append(Text(f"note: {note}", style="yellow"))
    if simulation.engine == "flint" and not simulation.runnable:  # a note above says why
        lines.append(Text(f"ASTRA-sim's inputs and result.json are in {inputs.directory}"))
    elif simulation.engine == "flint":
        lines.append(Text(f"ASTRA-sim's inputs and result.json are in {inputs.directory}; run"))
        lines.append(Text("  " + inputs.shell_command(simulation.simulator or "astra-sim")))
    else:
        lines.append(Text(f"ASTRA-sim's inputs, output and result.json are in {inputs.directory}"))
    return Group(*lines)

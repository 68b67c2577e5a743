"""Compare an extracted trace with the step's real execution: do they describe the same work?

The executable that runs is the compiler's fully optimised module, so the trace compared with it is
an `--stage optimized` extraction (the partitioned stage is earlier: the CPU compiler later combines
all-reduces and widens bf16 ones to f32). Per rank:

- communication must agree exactly: every executed collective matches one trace node of the same
  kind, the same group (as measured at the rendezvous) and the same bytes in Chakra's convention;
  each executed `collective-permute` is a SEND to each target and a RECV from each source the rank
  has in its pairs. Anything left over on either side is a disagreement.
- compute ops are matched by count: every executed instruction that is not communication, control
  flow (`while`, `conditional`, `call`: their bodies' instructions run and count themselves), part
  of a loop's condition (the trace unrolls loops) or free in Flint's cost rules (`partition-id`,
  `bitcast`, tuples, ...) must be one COMP or MEM node. A
  fusion is one kernel in both views, so counts agree exactly when the trace is the optimised module.
- a table per op kind puts the measured time beside the time the trace predicts (roofline and
  alpha-beta from `flint.trace.timing`); on virtual CPU devices the measured column says where the
  host spent its time, not what an accelerator would.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flint.analysis.execution import ExecutedOp, Execution, Instruction
from flint.devices import Device
from flint.errors import FlintError
from flint.ir.costs import NO_COST
from flint.layout import LayoutRequest
from flint.layout import recorded as recorded_layout
from flint.mesh import MeshSpec
from flint.schema import et_def_pb2 as pb
from flint.trace.node_rules import ALL_RANKS
from flint.trace.reader import RankTrace, attr_value, find_traces, read_trace_set
from flint.trace.timing import COMPUTE_TYPES, Compute, Link, NodeTimer, group_id

COLLECTIVE_KIND = {
    "all-reduce": "ALL_REDUCE",
    "all-gather": "ALL_GATHER",
    "reduce-scatter": "REDUCE_SCATTER",
    "all-to-all": "ALL_TO_ALL",
    "collective-broadcast": "BROADCAST",
}
PERMUTE = "collective-permute"
CONTROL_FLOW = frozenset({"while", "conditional", "call"})
_SAME_KIND = {"dot_general": "dot", "broadcast_in_dim": "broadcast"}
"""StableHLO names of ops whose HLO opcode is spelled differently."""


@dataclass(frozen=True)
class Communication:
    """One transfer as both views can state it: kind, ranks (group, or source and target), bytes."""

    kind: str
    ranks: tuple[int, ...]
    bytes: int

    def __str__(self) -> str:
        if self.kind in ("SEND", "RECV"):
            return f"{self.kind} {self.ranks[0]}->{self.ranks[1]} of {self.bytes:,} bytes"
        return f"{self.kind} of {self.bytes:,} bytes over ranks {list(self.ranks)}"


@dataclass(frozen=True)
class KindRow:
    """One op kind: count and time per rank (mean over ranks), executed and in the trace."""

    kind: str
    executed: float
    traced: float
    measured_us: float
    predicted_us: float

    def as_json(self) -> dict:
        return {
            "kind": self.kind,
            "executed_per_rank": self.executed,
            "traced_per_rank": self.traced,
            "measured_us_per_rank": round(self.measured_us, 3),
            "predicted_us_per_rank": round(self.predicted_us, 3),
        }


@dataclass(frozen=True)
class Validation:
    """The verdict: disagreements on communication fail it; compute counts and times inform."""

    num_ranks: int
    matched: int
    disagreements: list[str] = field(default_factory=list)
    compute_executed: dict[int, int] = field(default_factory=dict)
    compute_traced: dict[int, int] = field(default_factory=dict)
    rows: list[KindRow] = field(default_factory=list)
    executed: dict[int, list[tuple[str, Communication]]] = field(default_factory=dict)
    """Per rank, each executed transfer with the instruction that made it."""
    costliest_branches: int = 0
    """Conditionals the trace takes as their costliest branch (their selector depends on data or
    on the rank)."""

    @property
    def ok(self) -> bool:
        return not self.disagreements

    @property
    def compute_counts_agree(self) -> bool:
        return self.compute_executed == self.compute_traced

    def as_json(self) -> dict:
        return {
            "ok": self.ok,
            "ranks": self.num_ranks,
            "communication_matched": self.matched,
            "costliest_branches": self.costliest_branches,
            "disagreements": self.disagreements,
            "compute_ops": {
                "agree": self.compute_counts_agree,
                "executed": [self.compute_executed.get(r, 0) for r in range(self.num_ranks)],
                "traced": [self.compute_traced.get(r, 0) for r in range(self.num_ranks)],
            },
            "kinds": [row.as_json() for row in self.rows],
            "executed_communication": [
                {"rank": rank, "instruction": name, "kind": c.kind, "ranks": list(c.ranks), "bytes": c.bytes}
                for rank, transfers in sorted(self.executed.items())
                for name, c in transfers
            ],
        }


@dataclass(frozen=True)
class ValidateRequest:
    """What to validate: a model on a mesh (built with `model_args`), against a fresh extraction or
    the trace in `traces`."""

    model: Path
    mesh: MeshSpec
    device: Device
    link: Link
    traces: Path | None = None
    command: str = ""
    model_args: tuple[tuple[str, Any], ...] = ()
    compute: Compute | None = None
    """How the trace's compute is timed; None: its own durations."""


def validate(request: ValidateRequest) -> tuple[Validation, Execution]:
    """Extract the step (`--stage optimized`), run it under the profiler, and compare the two.

    The extraction always runs, even with `traces` given: its workload is what gets executed, so
    the step runs exactly as Flint loaded and laid it out.
    """
    from flint.analysis.execution import run_profiled
    from flint.compile.backend import make_virtual_mesh
    from flint.pipeline import ExtractRequest, extract

    layout, model_args, donate = LayoutRequest(), request.model_args, True
    if request.traces is not None:
        layout, model_args, donate = _as_traced(request.traces, request.mesh, model_args)
    with tempfile.TemporaryDirectory(prefix="flint-validate-") as tmp:
        extraction = extract(
            ExtractRequest(
                model=request.model,
                mesh=request.mesh,
                output=Path(tmp) / "traces",
                device=request.device,
                stage="optimized",
                layout=layout,
                model_args=model_args,
                donate=donate,
                command=request.command,
            )
        )
        traces, groups = read_trace_set(request.traces or Path(tmp) / "traces")
    if len(traces) != request.mesh.size:
        raise FlintError(
            f"the trace has {len(traces)} ranks but mesh {request.mesh} has {request.mesh.size}: "
            "validate with the mesh the trace was extracted for"
        )
    execution = run_profiled(extraction.workload, make_virtual_mesh(request.mesh), extraction.module.donated)
    timer = NodeTimer(request.compute or Compute(), request.link, groups, len(traces))
    verdict = compare(execution, traces, groups, timer)
    return replace(verdict, costliest_branches=extraction.graph.costliest_branches), execution


def _as_traced(
    directory: Path, mesh: MeshSpec, model_args: tuple[tuple[str, Any], ...]
) -> tuple[LayoutRequest, tuple[tuple[str, Any], ...], bool]:
    """The layout, model arguments and donation `directory` was extracted with, so the step runs
    (and is compiled) as it was traced; refuses, before any slow work, what is not a trace, a Flint
    trace of another backend, stage or mesh (its collectives are not those that run), and model
    arguments other than its own."""
    try:
        find_traces(directory)
    except (FileNotFoundError, ValueError) as exc:
        raise FlintError(f"{exc}: --traces needs a directory of <prefix>.<rank>.et files") from None
    manifest = directory / "manifest.json"
    if not manifest.exists():
        return LayoutRequest(), model_args, True  # not Flint's: compare it with the model's own layout
    recorded = json.loads(manifest.read_text())
    backend = recorded.get("backend", "cpu")
    if backend != "cpu":
        raise FlintError(
            f"{directory} was extracted on --backend {backend}, but the step runs on the CPU here: "
            "extract it with --backend cpu --stage optimized to validate it"
        )
    stage = recorded.get("stage")
    if stage != "optimized":
        raise FlintError(
            f"{directory} was extracted at stage {stage!r}, but the executable runs the optimised "
            "module: extract it with --stage optimized to validate it"
        )
    traced_mesh = recorded.get("mesh") or {}
    traced = MeshSpec(tuple(traced_mesh.get("shape", mesh.shape)),
                      tuple(traced_mesh.get("axis_names", mesh.axis_names)))
    if traced != mesh:
        raise FlintError(f"{directory} was extracted for mesh {traced}, not {mesh}: give --mesh {traced}")
    traced_args = tuple((recorded.get("model_args") or {}).items())
    if model_args and dict(model_args) != dict(traced_args):
        raise FlintError(
            f"--model-arg {', '.join(f'{k}={v!r}' for k, v in model_args)} differs from the model "
            f"arguments {directory} was extracted with ({dict(traced_args) or 'none'}): drop --model-arg, "
            "--traces runs the step as it was traced"
        )
    # A --no-donate trace donated nothing; one that donated records what (older traces: unknown).
    donate = bool(recorded.get("donated_arguments", True))
    return recorded_layout(recorded.get("layout", {}), f"{manifest}"), traced_args, donate


def compare(
    execution: Execution,
    traces: list[RankTrace],
    groups: dict[int, tuple[int, ...]],
    timer: NodeTimer,
) -> Validation:
    """Judge `traces` (one per rank that ran) against `execution` (see the module docstring)."""
    executed_by_rank: dict[int, list[ExecutedOp]] = defaultdict(list)
    for op in execution.ops:
        executed_by_rank[op.rank].append(op)
    disagreements: list[str] = []
    matched = 0
    compute_executed, compute_traced, transfers = {}, {}, {}
    for trace in traces:
        executed = executed_by_rank[trace.rank]
        ran = [(op.instruction.name, c) for op in executed for c in executed_communication(op)]
        traced = [
            (f"node {node.id}", c)
            for node in trace.nodes
            if (c := traced_communication(node, groups, len(traces))) is not None
        ]
        transfers[trace.rank] = ran
        rank_matched, rank_disagreements = _match(trace.rank, ran, traced)
        matched += rank_matched
        disagreements += rank_disagreements
        compute_executed[trace.rank] = sum(1 for op in executed if is_compute(op.instruction))
        compute_traced[trace.rank] = sum(1 for node in trace.nodes if node.type in COMPUTE_TYPES)
    return Validation(
        num_ranks=len(traces),
        matched=matched,
        disagreements=disagreements,
        compute_executed=compute_executed,
        compute_traced=compute_traced,
        rows=_rows(execution, traces, timer),
        executed=transfers,
    )


def _match(
    rank: int, ran: list[tuple[str, Communication]], traced: list[tuple[str, Communication]]
) -> tuple[int, list[str]]:
    """How many transfers match one for one, and a line for each one that does not."""
    ran_count = Counter(c for _, c in ran)
    traced_count = Counter(c for _, c in traced)
    only_ran, only_traced = ran_count - traced_count, traced_count - ran_count
    messages = []
    for where, c in ran:
        if only_ran[c]:
            only_ran[c] -= 1
            messages.append(f"rank {rank}: executed {c} ({where}) has no match in the trace")
    for where, c in traced:
        if only_traced[c]:
            only_traced[c] -= 1
            messages.append(f"rank {rank}: trace {where}, {c}, was not executed")
    return sum((ran_count & traced_count).values()), messages


def executed_communication(op: ExecutedOp) -> list[Communication]:
    """What an executed instruction transfers, in the trace's terms (nothing for compute)."""
    instruction = op.instruction
    if instruction.opcode == PERMUTE:  # a rank's pair with itself moves nothing, as in the trace
        pairs = [(s, t) for s, t in instruction.pairs if s != t]
        return [Communication("SEND", (s, t), instruction.result_bytes) for s, t in pairs if s == op.rank] + [
            Communication("RECV", (s, t), instruction.result_bytes) for s, t in pairs if t == op.rank
        ]
    kind = COLLECTIVE_KIND.get(instruction.opcode)
    if kind is None:
        return []
    group = op.group or ()
    n = max(1, len(group))
    size = {
        "ALL_GATHER": instruction.result_bytes // n,  # Chakra: the per-rank input
        "REDUCE_SCATTER": instruction.result_bytes * n,  # Chakra: the full input
    }.get(kind, instruction.result_bytes)
    return [Communication(kind, group, size)]


def traced_communication(
    node: pb.Node, groups: dict[int, tuple[int, ...]], num_ranks: int
) -> Communication | None:
    """A trace node's transfer in the same terms, or None for compute."""
    size = attr_value(node, "comm_size")
    if node.type == pb.COMM_COLL_NODE:
        kind = pb.CollectiveCommType.Name(attr_value(node, "comm_type"))
        group = group_id(node)
        ranks = tuple(range(num_ranks)) if group == ALL_RANKS else tuple(sorted(groups[group]))
        return Communication(kind, ranks, size)
    if node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
        kind = "SEND" if node.type == pb.COMM_SEND_NODE else "RECV"
        return Communication(kind, (attr_value(node, "comm_src"), attr_value(node, "comm_dst")), size)
    return None


def is_compute(instruction: Instruction) -> bool:
    """Whether an executed instruction should be one COMP or MEM node of the trace."""
    opcode = instruction.opcode
    return not (opcode in COLLECTIVE_KIND or opcode == PERMUTE or _bookkeeping(instruction))


def _bookkeeping(instruction: Instruction) -> bool:
    """Control flow, free ops and loop conditions: no node of the trace stands for them (the trace
    unrolls loops, inlines calls and drops what costs nothing)."""
    opcode = instruction.opcode
    return opcode in CONTROL_FLOW or _kind(opcode) in NO_COST or instruction.in_loop_condition


def _kind(name: str) -> str:
    """One spelling for an op kind, whether it comes from HLO (`all-reduce`) or StableHLO."""
    name = name.replace("-", "_")
    return _SAME_KIND.get(name, name)


def _node_kind(node: pb.Node) -> str:
    op = attr_value(node, "op")
    if isinstance(op, str) and op:
        return _kind(op)
    if node.type == pb.COMM_COLL_NODE:
        return pb.CollectiveCommType.Name(attr_value(node, "comm_type")).lower()
    return pb.NodeType.Name(node.type).lower()


def _rows(execution: Execution, traces: list[RankTrace], timer: NodeTimer) -> list[KindRow]:
    executed: Counter[str] = Counter()
    measured: Counter[str] = Counter()
    for op in execution.ops:
        if _bookkeeping(op.instruction):
            continue
        executed[_kind(op.instruction.opcode)] += 1
        measured[_kind(op.instruction.opcode)] += op.duration_ns / 1e3
    traced: Counter[str] = Counter()
    predicted: Counter[str] = Counter()
    for trace in traces:
        permutes = set()
        for node in trace.nodes:
            kind = _node_kind(node)
            predicted[kind] += timer.micros(node)
            if node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                permutes.add(attr_value(node, "comm_tag"))  # both halves of one permute count once
            else:
                traced[kind] += 1
        traced[_kind(PERMUTE)] += len(permutes)
    n = len(traces)
    kinds = sorted({*executed, *(k for k, v in traced.items() if v)}, key=lambda k: (-measured[k], k))
    return [KindRow(k, executed[k] / n, traced[k] / n, measured[k] / n, predicted[k] / n) for k in kinds]

"""`flint validate`: the extracted graph against the step's real execution under JAX's profiler.

On the 2x4 mesh rank r sits in row r // 4 (its tensor group, 4 ranks) and column r % 4 (its data
group, ranks r % 4 and r % 4 + 4). The CPU compiler, whose optimised module is what runs, widens
bf16 all-reduces to f32 and combines the gradient all-reduces of one step into one.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from conftest import EXAMPLES, MODELS, extract, flint, load_example
from models import cpu_quirks
from test_trace_contract import set_attr

from flint.analysis.execution import describe
from flint.schema import et_def_pb2 as pb
from flint.schema.hlo_envelope_pb2 import HloModule
from flint.trace import attr_value, encode_delimited, read_trace

F32 = 4


def tensor_group(rank: int) -> list[int]:
    return [4 * (rank // 4) + i for i in range(4)]


def data_group(rank: int) -> list[int]:
    return [rank % 4, rank % 4 + 4]


def transfers(report: dict, rank: int) -> list[tuple[str, list[int], int]]:
    return sorted(
        (c["kind"], c["ranks"], c["bytes"]) for c in report["executed_communication"] if c["rank"] == rank
    )


@pytest.fixture(scope="module")
def mlp_optimized(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mlp-optimized") / "traces"
    extract(EXAMPLES / "mlp.py", "2x4", out, "--stage", "optimized")
    return out


def test_gpt_execution_matches_its_graph() -> None:
    run = flint("validate", EXAMPLES / "gpt.py", "--mesh", "2x4", "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] and report["disagreements"] == []
    assert report["compute_ops"]["agree"] and min(report["compute_ops"]["executed"]) > 100
    kinds = {row["kind"]: row for row in report["kinds"]}
    assert kinds["all_reduce"]["executed_per_rank"] == kinds["all_reduce"]["traced_per_rank"] > 0
    # examples/gpt.py: every collective is an all-reduce over the rank's mesh row or column
    for rank in range(8):
        ran = transfers(report, rank)
        assert ran and {kind for kind, _, _ in ran} == {"ALL_REDUCE"}
        assert {tuple(group) for _, group, _ in ran} == {tuple(tensor_group(rank)), tuple(data_group(rank))}
    assert report["communication_matched"] == len(report["executed_communication"])


def test_mlp_executes_the_hand_derived_collectives(mlp_optimized: Path) -> None:
    run = flint("validate", EXAMPLES / "mlp.py", "--mesh", "2x4", "--traces", mlp_optimized, "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] and report["compute_ops"]["agree"]
    batch, d_model, hidden = 256 // 2, 1024, 4096 // 4
    for rank in range(8):
        assert transfers(report, rank) == sorted([
            ("ALL_REDUCE", tensor_group(rank), batch * d_model * F32),  # forward output, f32
            # both weight gradients and the loss, combined into one all-reduce
            ("ALL_REDUCE", data_group(rank), 2 * d_model * hidden * F32 + F32),
        ])


def test_pipeline_permutes_execute_as_sends_and_receives() -> None:
    """examples/pipeline_manual.py on `--mesh pp=4` (see test_pipeline_manual): M + S - 2 permutes
    each way, every one a SEND to a neighbour stage and a RECV from the other neighbour, as the pairs
    the executable ran with say. The CPU compiler widens the bf16 activation to f32 (2x its bytes)."""
    from test_pipeline_manual import PERMUTES, S, example, gpt

    run = flint("validate", EXAMPLES / "pipeline_manual.py", "--mesh", f"pp={S}", "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] and report["compute_ops"]["agree"]
    activation = gpt.BATCH // example.MICROBATCHES * gpt.SEQ * gpt.D_MODEL * F32
    for rank in range(S):
        expected = Counter()
        if rank < S - 1:  # activations forward to the next stage, their gradients back from it
            expected["SEND", (rank, rank + 1), activation] += PERMUTES
            expected["RECV", (rank + 1, rank), activation] += PERMUTES
        if rank > 0:
            expected["RECV", (rank - 1, rank), activation] += PERMUTES
            expected["SEND", (rank, rank - 1), activation] += PERMUTES
        point_to_point = Counter(
            (kind, tuple(ranks), size)
            for kind, ranks, size in transfers(report, rank)
            if kind in ("SEND", "RECV")
        )
        assert point_to_point == expected, rank


def test_moe_all_to_alls_run_as_extracted() -> None:
    """examples/moe_gshard.py on 2x4 under its own rules (experts over the first axis, token groups
    over all 8 ranks). The CPU compiler gives each all-to-all several operands, a form that extracts
    at `--stage optimized` and runs as 3 all-to-alls per rank over its column: each of the rank's
    dispatched tokens [EXPERTS, GROUPS / 8, CAPACITY, D_MODEL], f32 as the CPU compiler widens bf16."""
    moe = load_example("moe_gshard")
    run = flint("validate", EXAMPLES / "moe_gshard.py", "--mesh", "2x4", "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] and report["compute_ops"]["agree"]
    tokens = moe.EXPERTS * moe.GROUPS // 8 * moe.CAPACITY * moe.D_MODEL * F32
    for rank in range(8):
        all_to_all = [t for t in transfers(report, rank) if t[0] == "ALL_TO_ALL"]
        assert all_to_all == [("ALL_TO_ALL", data_group(rank), tokens)] * 3, rank


def test_what_the_cpu_runs_otherwise_is_counted_as_the_trace_counts_it() -> None:
    """tests/models/cpu_quirks.py on `--mesh 4`: compute counts agree on every rank (small loops are
    run instruction by instruction, a sort is one op however many thunks run it), one sort per rank,
    and the permute moves only what crosses ranks: ranks 1 and 2 swap ROWS x COLS f32; 0 and 3,
    paired with themselves, send nothing."""
    run = flint("validate", MODELS / "cpu_quirks.py", "--mesh", "4", "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] and report["compute_ops"]["agree"]
    sort = next(row for row in report["kinds"] if row["kind"] == "sort")
    assert sort["executed_per_rank"] == sort["traced_per_rank"] == 1
    block = cpu_quirks.ROWS * cpu_quirks.COLS * F32
    assert transfers(report, 0) == transfers(report, 3) == []
    assert transfers(report, 1) == [("RECV", [2, 1], block), ("SEND", [1, 2], block)]
    assert transfers(report, 2) == [("RECV", [1, 2], block), ("SEND", [2, 1], block)]


def test_branches_picked_by_the_loop_counter_are_the_ones_that_run() -> None:
    """tests/models/interleaved.py on 2x4: the heavy branch runs on 6 of the 15 loop steps (see
    test_control_flow), and that is what executes: one all-gather over the rank's row each time."""
    assert_gathers_over_tensor_groups(MODELS / "interleaved.py", 6)


def test_an_inner_loop_bounded_by_the_outer_counter_runs_as_unrolled() -> None:
    """tests/models/triangular.py on 2x4: 6 inner steps (see test_control_flow), and the inner
    loop's condition, which the CPU evaluates every step, is not counted as compute."""
    assert_gathers_over_tensor_groups(MODELS / "triangular.py", 6)


def assert_gathers_over_tensor_groups(model: Path, count: int) -> None:
    run = flint("validate", model, "--mesh", "2x4", "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] and report["compute_ops"]["agree"]
    for rank in range(8):
        gathers = [t for t in transfers(report, rank) if t[0] == "ALL_GATHER"]
        assert [group for _, group, _ in gathers] == [tensor_group(rank)] * count


def test_executable_module_is_described_from_its_proto() -> None:
    """Result bytes by XLA's storage rule (pred a byte, s4 packed two to a byte, tuples summed,
    tokens nothing) and permute pairs, from a hand-built `HloModuleProto`."""
    from jaxlib.xla_client import PrimitiveType

    module = HloModule()
    instructions = module.computations.add().instructions
    for name, opcode, shapes in [
        ("mask", "compare", [(PrimitiveType.PRED, [3, 5])]),
        ("packed", "convert", [(PrimitiveType.S4, [3])]),
        ("pair", "tuple", [(PrimitiveType.F32, [2]), (PrimitiveType.BF16, [4, 2])]),
        ("after", "after-all", [(PrimitiveType.TOKEN, [])]),
        ("shift", "collective-permute", [(PrimitiveType.F32, [8, 3])]),
    ]:
        instruction = instructions.add(name=name, opcode=opcode)
        shape = instruction.shape
        arrays = [shape.tuple_shapes.add() for _ in shapes] if len(shapes) > 1 else [shape]
        for array, (element_type, dims) in zip(arrays, shapes):
            array.element_type = element_type.value
            array.dimensions.extend(dims)
    instructions[-1].source_target_pairs.add(source=0, target=1)
    instructions[-1].source_target_pairs.add(source=1, target=0)
    described = describe(module.SerializeToString())
    assert {name: i.result_bytes for name, i in described.items()} == {
        "mask": 15, "packed": 2, "pair": 2 * 4 + 8 * 2, "after": 0, "shift": 8 * 3 * 4,
    }
    assert described["shift"].pairs == ((0, 1), (1, 0)) and described["mask"].pairs == ()
    assert described["shift"].opcode == "collective-permute"


def rewrite_rank(directory: Path, rank: int, edit) -> None:
    path = directory / f"mlp.{rank}.et"
    trace = read_trace(path)
    nodes = edit(list(trace.nodes))
    path.write_bytes(b"".join(encode_delimited(m.SerializeToString()) for m in [trace.metadata, *nodes]))


def gradient_all_reduce(nodes: list[pb.Node]) -> pb.Node:
    size = 2 * 1024 * 1024 * F32 + F32
    return next(n for n in nodes if n.type == pb.COMM_COLL_NODE and attr_value(n, "comm_size") == size)


def resize(nodes: list[pb.Node]) -> list[pb.Node]:
    set_attr(gradient_all_reduce(nodes), "comm_size", "int64_val", 2 * 1024 * 1024 * F32 + 2 * F32)
    return nodes


def drop(nodes: list[pb.Node]) -> list[pb.Node]:
    gone = gradient_all_reduce(nodes)
    return [n for n in nodes if n is not gone]


@pytest.mark.parametrize("edit", [resize, drop])
def test_an_altered_graph_fails(mlp_optimized: Path, tmp_path: Path, edit) -> None:
    altered = tmp_path / "altered"
    shutil.copytree(mlp_optimized, altered)
    rewrite_rank(altered, 3, edit)
    run = flint("validate", EXAMPLES / "mlp.py", "--mesh", "2x4", "--traces", altered)
    assert run.returncode == 1, run.stdout + run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith("rank ")]
    data_group = r"over ranks \[3, 7\]"
    executed = rf"rank 3: executed ALL_REDUCE of 8,388,612 bytes {data_group} \(all-reduce[.\d]*\)"
    assert re.fullmatch(executed + " has no match in the trace", lines[0]), lines
    if edit is resize:
        traced = rf"rank 3: trace node \d+, ALL_REDUCE of 8,388,616 bytes {data_group}, was not executed"
        assert re.fullmatch(traced, lines[1]), lines
    assert len(lines) == (2 if edit is resize else 1)
    assert "disagree on" in run.stderr


def test_a_partitioned_stage_trace_is_refused(mlp_traces) -> None:
    run = flint("validate", EXAMPLES / "mlp.py", "--mesh", "2x4", "--traces", mlp_traces("2x4"))
    assert run.returncode == 2 and "--stage optimized" in run.stderr


def test_model_arguments_are_validated_as_extracted(tmp_path: Path) -> None:
    """mlp.py with width 256 and hidden 512, not its defaults: given with --model-arg, or read from
    the manifest of a trace extracted with them. Per rank, as the CPU compiler runs it (bf16
    widened to f32): the tensor group's all-reduce of the [128 rows, 256] activation (131,072 B)
    and the data group's of the weight-gradient shards 2 x [256, 128] plus the loss (262,148 B).
    A --model-arg or mesh other than the trace's is refused in one line. Both runs time the same module's
    compute with the calibrated model on an H100 (--durations), so they predict the same times."""
    args = ("--model-arg", "width=256", "--model-arg", "hidden=512")
    out = tmp_path / "traces"
    extract(EXAMPLES / "mlp.py", "2x4", out, "--stage", "optimized", *args)
    predicted = []
    for run in (flint("validate", EXAMPLES / "mlp.py", "--mesh", "2x4", "--traces", out, "--json",
                      "--durations", "calibrated"),
                flint("validate", EXAMPLES / "mlp.py", "--mesh", "2x4", *args, "--json", "--durations", "calibrated")):
        assert run.returncode == 0, run.stdout + run.stderr
        report = json.loads(run.stdout)
        assert report["ok"]
        predicted.append({row["kind"]: row["predicted_us_per_rank"] for row in report["kinds"]})
        for rank in range(8):
            tensor = [rank // 4 * 4 + t for t in range(4)]
            data = [rank % 4, rank % 4 + 4]
            assert transfers(report, rank) == sorted(
                [("ALL_REDUCE", tensor, 128 * 256 * 4), ("ALL_REDUCE", data, 2 * 256 * 128 * 4 + 4)]
            )
    assert predicted[0] == predicted[1] and predicted[0]["dot"] > 0
    run = flint("validate", EXAMPLES / "mlp.py", "--mesh", "2x4", "--traces", out, "--model-arg", "width=512")
    assert run.returncode == 2 and "--model-arg" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    run = flint("validate", EXAMPLES / "mlp.py", "--mesh", "2x4", "--durations", "trace", "--device", "b200")
    assert run.returncode == 2 and "--device times compute again" in run.stderr
    run = flint("validate", EXAMPLES / "mlp.py", "--mesh", "4x2", "--traces", out, *args)
    assert run.returncode == 2 and "was extracted for mesh data=2,tensor=4, not data=4,tensor=2" in run.stderr


def test_traces_are_validated_with_the_layout_they_were_extracted_with(tmp_path: Path) -> None:
    """mlp.py under `--strategy dp` is pure data parallelism: the step must run that way too, so
    every rank's transfers are the gradient all-reduces over all 8 ranks (the CPU compiler combines
    them into one, f32-widened: w1 [1024, 4096], w2 [4096, 1024] and the loss) and nothing else."""
    out = tmp_path / "traces"
    extract(EXAMPLES / "mlp.py", "2x4", out, "--stage", "optimized", "--strategy", "dp")
    run = flint("validate", EXAMPLES / "mlp.py", "--mesh", "2x4", "--traces", out, "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] and report["disagreements"] == []
    everyone = list(range(8))
    for rank in range(8):
        ran = transfers(report, rank)
        assert {tuple(group) for _, group, _ in ran} == {tuple(everyone)}
        assert sum(size for _, _, size in ran) == 2 * 1024 * 4096 * F32 + F32  # and the loss


@pytest.mark.parametrize("donate", [True, False])
def test_traces_are_run_with_the_donation_they_were_extracted_with(tmp_path: Path, monkeypatch, donate) -> None:
    """mlp.py's step replaces its parameters (argument 0), which an extraction donates unless
    `--no-donate`: validating the trace compiles the step it runs the same way."""
    import flint.analysis.execution as execution
    from flint.analysis.validate import ValidateRequest, validate
    from flint.devices import load_device
    from flint.mesh import parse_mesh
    from flint.trace.timing import Link

    out = tmp_path / "traces"
    extract(EXAMPLES / "mlp.py", "2x4", out, "--stage", "optimized", *([] if donate else ["--no-donate"]))
    ran_with = []

    def stop_at_run(workload, mesh, donated=()):
        ran_with.append(donated)
        raise RuntimeError("stop before running")

    monkeypatch.setattr(execution, "run_profiled", stop_at_run)
    with pytest.raises(RuntimeError, match="stop before running"):
        validate(ValidateRequest(EXAMPLES / "mlp.py", parse_mesh("2x4"), load_device("h100"), Link(), traces=out))
    assert ran_with == [(0,) if donate else ()]

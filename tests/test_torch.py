"""PyTorch model files against the JAX examples and against numbers derived by hand.

`examples/torch_mlp.py` is `examples/mlp.py` in torch (same dims, dtype and layout), so every rank
must have test_mlp's hand-derived matmul FLOPs and collectives, and the JAX trace's.

`examples/torch_gpt.py` has gpt.py's dimensions and Megatron layout (its `tp_plan`), with the blocks
of `torch.nn` unrolled instead of scanned. Notation as in test_gpt (b, h, f, v per rank; T the
tensor group, G the data group; H = HEADS, k = D_HEAD, L = LAYERS). Differences from gpt.py, each
following from how torch writes the step:

- attention core: torch computes `q @ k^T` and `probs @ v` on 4-D tensors as a `bmm` over the
  merged [batch, heads] dimension. With the batch split over the data axes and the heads over the
  tensor axis, no tiling of the merged dimension gives each rank a contiguous block, so the
  partitioner keeps the batch split and gathers the heads: q, k and v are all-gathered over T in
  forward (3 per layer, per-rank input [b, h, S, k] bf16), the gradient of the attention output
  (which arrives split by heads from o's input gradient) once in backward, and QK^T and PV with
  their two backward matmuls each run on all H heads, not h;
- the embedding gradient: torch's `embedding_dense_backward` accumulates the scatter-add of a bf16
  table in f32, so it is reduced over G at v·D·4 bytes (gpt.py: bf16);
- everything else is gpt.py's: the lookup, 2 forward and 4 backward activation all-reduces per
  layer and the head's input gradient over T ([b, S, D] bf16); the loss's max, sum of exponentials
  and target logit over T ([b, S] f32); per layer the 10 parameter gradients over G (q, k, v, o
  [D, h·k] and fc1, fc2 [D, f] in bf16, the four layernorm vectors [D] in f32); the head [D, v]
  bf16, the final layernorm's two [D] f32 and the f32 scalar loss over G.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import replace

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch_mlir")

from conftest import EXAMPLES, MODELS, extract, flint, matmuls_and_collectives  # noqa: E402
from test_gpt import AG, AR, BF16, F32, Dims, collectives, gpt, matmul_flops, read_rank  # noqa: E402
from test_layout import same_traces  # noqa: E402
from test_mlp import expected as mlp_expected  # noqa: E402

from flint.trace.contract import check_traces  # noqa: E402
from flint.trace.reader import attr_value  # noqa: E402

_spec = importlib.util.spec_from_file_location("torch_gpt_example", EXAMPLES / "torch_gpt.py")
torch_gpt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_gpt)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """Each (model, mesh, flags) extracted once for this module: (directory, --json summary)."""
    cache: dict = {}

    def get(model: str, mesh: str, *flags: str):
        if (model, mesh, flags) not in cache:
            out = tmp_path_factory.mktemp(model) / "traces"
            cache[model, mesh, flags] = (out, extract(EXAMPLES / f"{model}.py", mesh, out, *flags))
        return cache[model, mesh, flags]

    return get


# ------------------------------------------------------------------------------------- MLP


def test_torch_mlp_equals_the_jax_mlp_and_the_hand_derivation(traces, mlp_traces):
    directory, _ = traces("torch_mlp", "2x4")
    for rank in range(8):
        found = matmuls_and_collectives(directory, rank)
        assert found == mlp_expected((2,), 4, rank), f"rank {rank}"
        assert found == matmuls_and_collectives(mlp_traces("2x4"), rank), f"rank {rank}"
    assert check_traces(directory) == []


def test_module_path_shard_rules_give_the_same_layout(traces):
    """The plan's layout written as --shard rules over module paths, on top of plain DP over all
    axes (which they replace), gives byte-identical traces."""
    planned, _ = traces("torch_mlp", "2x4")
    ruled, _ = traces(
        "torch_mlp", "2x4", "--strategy", "dp",
        "--shard", r"params/fc1\.weight=tensor,None",
        "--shard", r"params/fc2\.weight=None,tensor",
        "--shard", "batch/.*=data",
    )
    assert same_traces(planned, ruled)


def test_preset_follows_the_plan(traces):
    assert same_traces(traces("torch_mlp", "2x4")[0], traces("torch_mlp", "2x4", "--strategy", "dp+tp")[0])


def test_preset_reads_linear_weights_out_by_in():
    """Without the plan, the shape rule splits nn.Linear's [out, in] weights the Megatron way:
    fc1 [F, D] by its output features (column-parallel), fc2 [D, F] by its input features."""
    from flint.compile.backend import make_virtual_mesh
    from flint.frontend import load_workload
    from flint.layout import LayoutRequest, apply_layout
    from flint.mesh import parse_mesh

    mesh = make_virtual_mesh(parse_mesh("2x4"))
    workload = replace(load_workload(EXAMPLES / "torch_mlp.py", mesh), tensor_parallel=None)
    _, layout = apply_layout(workload, mesh, LayoutRequest(strategy="dp+tp"))
    assert {i.path: i.spec for i in layout.inputs} == {
        "params/fc1.weight": (("tensor",), ()),
        "params/fc2.weight": ((), ("tensor",)),
        "batch/x": (("data",), ()),
        "batch/y": (("data",), ()),
    }


# ------------------------------------------------------------------------------------- GPT


def torch_gpt_collectives(m: Dims, rank: int) -> list[tuple[int, int, tuple[int, ...]]]:
    """(comm_type, comm_size, group) of every collective of `rank`, by hand (module docstring)."""
    S, D, k, L = gpt.SEQ, gpt.D_MODEL, gpt.D_HEAD, gpt.LAYERS
    T, G = m.tensor_group(rank), m.data_group(rank)
    colls = [(AR, m.b * S * D * BF16, T)] * (1 + 2 * L + 1 + 4 * L)  # lookup, fwd, head, bwd
    colls += [(AR, m.b * S * F32, T)] * 3  # loss: max, sum of exp, target logit
    colls += [(AG, m.b * m.h * S * k * BF16, T)] * (4 * L)  # heads: q, k, v; attention output grad
    per_layer = [D * m.h * k * BF16] * 4 + [D * m.f * BF16] * 2 + [D * F32] * 4
    colls += [(AR, size, G) for size in per_layer] * L
    colls += [(AR, D * m.v * BF16, G), (AR, D * F32, G), (AR, D * F32, G)]  # head, final layernorm
    colls += [(AR, m.v * D * F32, G), (AR, F32, G)]  # embedding (f32 scatter-add), loss
    return colls


def torch_gpt_matmul_flops(m: Dims) -> int:
    """gpt.py's matmuls, but QK^T and PV (and their 2 backward matmuls each) on all H heads."""
    S, k, L = gpt.SEQ, gpt.D_HEAD, gpt.LAYERS
    extra_heads = gpt.HEADS - m.h
    return matmul_flops(m) + 3 * L * 2 * (2 * m.b * extra_heads * S * S * k)


def test_torch_gpt_has_gpt_dimensions():
    c = torch_gpt.CONFIG
    assert (c.vocab, c.d_model, c.heads, c.d_ff, c.layers, c.seq, c.batch) == (
        gpt.VOCAB, gpt.D_MODEL, gpt.HEADS, gpt.D_FF, gpt.LAYERS, gpt.SEQ, gpt.BATCH,
    )


def test_torch_gpt_dp_tp_every_rank(traces):
    directory, summary = traces("torch_gpt", "2x4", "--strategy", "dp+tp")
    m = Dims(2, 4)
    for rank in range(8):
        nodes, groups = read_rank(directory, rank)
        found = sorted((kind, size, group) for kind, size, group, _ in collectives(nodes, groups))
        assert found == sorted(torch_gpt_collectives(m, rank)), f"rank {rank}"
        dots = [n for n in nodes if attr_value(n, "op") in ("dot", "dot_general")]
        assert sum(attr_value(n, "num_ops") for n in dots) == torch_gpt_matmul_flops(m), f"rank {rank}"
    assert summary["ranks_alike"] is True
    assert check_traces(directory) == []


def test_square_weights_follow_the_plan(tmp_path):
    """q and o are both [D, D]: the plan makes q column-parallel and o row-parallel."""
    run = flint(
        "extract", EXAMPLES / "torch_gpt.py", "--mesh", "2x4", "-o", tmp_path / "t",
        "--strategy", "dp+tp", "--explain",
    )
    assert run.returncode == 0, run.stderr
    rows = {line.split()[0]: line.split()[4:6] for line in run.stderr.splitlines() if "/" in line.split()[0]}
    assert rows["params/layers.0.attn.q.weight"] == ["(tensor,", "None)"]
    assert rows["params/layers.0.attn.o.weight"] == ["(None,", "tensor)"]
    assert rows["opt/m/layers.2.mlp.fc1.weight"] == ["(tensor,", "None)"]
    assert rows["params/embed.weight"] == ["(tensor,", "None)"]


# ------------------------------------------------------------------------------ other steps


def test_inference_step_with_biases_and_a_buffer(tmp_path):
    """tests/models/torch_infer.py (no loss_fn): x [32, 64] @ up [64 -> 256], gelu, @ down [256 ->
    64], times a buffer. On 2x4, b = 32/2 rows and 256/4 hidden columns per rank: two matmuls of
    2·16·64·64 FLOPs; the row-parallel `down` is summed over the tensor group ([16, 64] f32); its
    bias and the buffer are added whole after that sum, `up`'s bias is split with its columns."""
    out = tmp_path / "t"
    extract(MODELS / "torch_infer.py", "2x4", out)
    b, d, h = 32 // 2, 64, 256 // 4
    for rank in range(8):
        row = rank // 4
        tensor_group = tuple(range(4 * row, 4 * row + 4))
        assert matmuls_and_collectives(out, rank) == (
            2 * (2 * b * d * h),
            [(AR, b * d * F32, tensor_group)],
        ), f"rank {rank}"


def test_weights_are_never_allocated(tmp_path):
    """tests/models/torch_huge.py holds 17 GB of f32 weights; its extraction stays far below.

    The extraction runs in a child process (`flint.isolation`), reaped before `main()` returns."""
    code = (
        "import resource, sys\nfrom flint.cli import main\ntry:\n    main()\nfinally:\n"
        "    print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "extract", str(MODELS / "torch_huge.py"), "--mesh", "2",
         "-o", str(tmp_path / "t")],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    peak_kib = int(done.stderr.strip().splitlines()[-1])
    assert peak_kib < 4 * 2**20, f"peak RSS {peak_kib} KiB"


# ------------------------------------------------------------------------------------ errors


def test_data_dependent_control_flow_is_one_line_naming_the_line(tmp_path):
    run = flint("extract", MODELS / "torch_branch.py", "--mesh", "2", "-o", tmp_path / "t")
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert "data-dependent control flow at torch_branch.py:14" in lines[0]
    assert "if y.sum() > 0:" in lines[0]
    assert not (tmp_path / "t").exists()

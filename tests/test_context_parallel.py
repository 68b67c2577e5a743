"""Context parallelism (`--strategy dp+cp+tp`): the sequence split over the mesh axis `context`,
keys and values gathered over it in every attention, their gradients reduce-scattered back.

Model: `examples/llama.py` as bundled, L = 4 layers, width D = 256, H = 8 query heads and KV = 4
key-value heads of hd = 32, SwiGLU hidden F = 704, vocabulary V = 2048, B = 8 sequences of S = 256
tokens, bf16. On `data=2,context=2,tensor=2` rank r = 4d + 2c + t: its context group is
{r - 2c, r - 2c + 2}, its tensor group {r - t, r - t + 1}, and the weights, whole on every data and
context rank, are reduced over the four ranks with its tensor position {t, t + 2, t + 4, t + 6}.
A rank holds b = B / 2 = 4 sequences of S / 2 = 128 positions, and KV / 2 = 2 key-value heads.
"""

from __future__ import annotations

from collections import Counter

from conftest import EXAMPLES, extract, extract_warnings, flint, load_example, transfers

from flint.schema import et_def_pb2 as pb
from flint.trace.reader import attr_value, find_traces, read_comm_groups, read_trace

llama = load_example("llama")
L, D, H, KV, F, V = llama.LAYERS, llama.WIDTH, llama.HEADS, llama.KV_HEADS, llama.FFN, llama.VOCAB
B, S, HD = llama.BATCH, llama.SEQ, llama.WIDTH // llama.HEADS
DP = CP = TP = 2
BF16, F32 = 2, 4
AR, AG, RS = pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER
MODEL = EXAMPLES / "llama.py"


def collectives(directory, rank: int) -> Counter:
    """(type, comm_size, group ranks) of every collective of one rank's trace."""
    prefix, _ = find_traces(directory)
    groups = read_comm_groups(directory / f"{prefix}.comm_groups.json")
    trace = read_trace(directory / f"{prefix}.{rank}.et")
    return Counter(
        (attr_value(n, "comm_type"), attr_value(n, "comm_size"), tuple(groups[int(attr_value(n, "pg_name"))]))
        for n in trace.nodes
        if n.type == pb.COMM_COLL_NODE
    )


def test_attention_gathers_keys_and_values_over_the_context_axis(tmp_path):
    """The GPU compiler's module (`gpu:h100`), per rank:

    - context group: per layer one all-gather of k and v together (the compiler combines them), each
      [b, S/cp, KV/tp, hd] bf16 on the rank (comm_size: the per-rank input), and in backward one
      reduce-scatter of their gradients, [b, S, KV/tp, hd] bf16 each (comm_size: the full input);
    - tensor group: Megatron's all-reduces of [b, S/cp, D] bf16: the lookup, 2 per layer in forward
      and 2 in backward (the combiner sums q's, k's and v's input gradients, and w_gate's and
      w_up's), the head's input gradient; and 3 of [b, S/cp] f32 in the cross-entropy;
    - data x context group: per layer the TP-local matrix gradients (wq, wo D·H·hd/tp; wk, wv
      D·KV·hd/tp; w_gate, w_up, w_down D·F/tp) bf16 in one; the embedding and the head (V/tp·D
      each, bf16) in one; the RMSNorm scales' gradients (applied in f32: 2 per layer and the final
      one, D each) with the f32 loss in one.
    """
    out = tmp_path / "out"
    extract(MODEL, "data=2,context=2,tensor=2", out, "--strategy", "dp+cp+tp", "--backend", "gpu:h100")
    b, s = B // DP, S // CP
    kv = b * s * (KV // TP) * HD * BF16
    layer = (2 * D * H * HD // TP + 2 * D * KV * HD // TP + 3 * D * F // TP) * BF16
    for rank in range(8):
        c, t = rank // 2 % 2, rank % 2
        context, tensor = (rank - 2 * c, rank - 2 * c + 2), (rank - t, rank - t + 1)
        weights = (t, t + 2, t + 4, t + 6)
        expected = Counter({
            (AG, 2 * kv, context): L,
            (RS, 2 * kv * CP, context): L,
            (AR, b * s * D * BF16, tensor): 2 + 4 * L,
            (AR, b * s * F32, tensor): 3,
            (AR, layer, weights): L,
            (AR, 2 * V // TP * D * BF16, weights): 1,
            (AR, (2 * L + 1) * D * F32 + F32, weights): 1,
        })
        assert collectives(out, rank) == expected, rank


def test_context_parallelism_pipelines(tmp_path):
    """`pp=2,data=2,context=2,tensor=2`, 2 microbatches (the CPU compiler's partitioned module,
    where k and v are gathered one by one): rank r = 8p + 4d + 2c + t. A microbatch is B / 2 = 4
    sequences, 2 per data rank, of S / cp = 128 positions per context rank: the activation crossing
    stages is bf16 [2, 128, D] = 131,072 bytes, to the rank at the same position on the other
    stage (r +- 8). Each forward unit gathers k and v of each of its L / 2 layers over the context
    group, [2, 128, KV/tp, hd] bf16 each."""
    out = tmp_path / "out"
    summary = extract(MODEL, "pp=2,data=2,context=2,tensor=2", out, "--strategy", "dp+cp+tp",
                      "--pipeline-stages", "2", "--microbatches", "2")
    b, s = B // 2 // DP, S // CP
    assert summary["pipeline"]["activation_bytes"] == b * s * D * BF16
    for rank, moves in transfers(out).items():
        peer = rank + 8 if rank < 8 else rank - 8
        assert {(t.src, t.dst) for t in moves} <= {(rank, peer), (peer, rank)} and moves, rank
        assert {t.size for t in moves} == {b * s * D * BF16}
    prefix, _ = find_traces(out)
    groups = read_comm_groups(out / f"{prefix}.comm_groups.json")
    for rank in (0, 13):
        c = rank // 2 % 2
        context = (rank - 2 * c, rank - 2 * c + 2)
        gathers = Counter(
            (n.name.split()[0], attr_value(n, "comm_size"), tuple(groups[int(attr_value(n, "pg_name"))]))
            for n in read_trace(out / f"{prefix}.{rank}.et").nodes
            if n.type == pb.COMM_COLL_NODE and attr_value(n, "comm_type") == AG
        )
        unit = b * s * (KV // TP) * HD * BF16
        assert gathers == {(f"F{m}.0", unit, context): 2 * L // 2 for m in range(2)}, rank


def test_a_mesh_without_a_context_axis_is_one_line(tmp_path):
    run = flint("extract", MODEL, "--mesh", "data=4,tensor=2", "--strategy", "dp+cp+tp",
                "--backend", "cpu", "-o", tmp_path / "out")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "a mesh axis named context or cp" in run.stderr and "--mesh data=2,context=2,tensor=2" in run.stderr


def test_context_parallelism_pipelines_on_the_gpu_compiler(tmp_path):
    """The same on `gpu:h100`, whose module updates the layers' stashed activations and stacked
    gradients in place asynchronously: the activation crossing stages is still bf16 [2, 128, D]
    (131,072 bytes). Each forward unit gathers k and v of each of its L / 2 layers in one
    all-gather of 2 x [2, 128, KV/tp, hd] bf16, each backward reduce-scatters their gradients
    (2 x [2, S, KV/tp, hd] bf16); a layer's matrix gradients are all-reduced over the data and
    context ranks once per step, by the update (U.0), never in a backward."""
    out = tmp_path / "out"
    summary = extract(MODEL, "pp=2,data=2,context=2,tensor=2", out, "--strategy", "dp+cp+tp",
                      "--pipeline-stages", "2", "--microbatches", "2", "--backend", "gpu:h100")
    b, s = B // 2 // DP, S // CP
    assert summary["pipeline"]["activation_bytes"] == summary["pipeline"]["gradient_bytes"] == b * s * D * BF16
    kv = b * s * (KV // TP) * HD * BF16
    layer = (2 * D * H * HD // TP + 2 * D * KV * HD // TP + 3 * D * F // TP) * BF16
    prefix, _ = find_traces(out)
    groups = read_comm_groups(out / f"{prefix}.comm_groups.json")
    for rank in (0, 13):
        c, t, stage = rank // 2 % 2, rank % 2, rank // 8
        context = (rank - 2 * c, rank - 2 * c + 2)
        weights = tuple(8 * stage + t + 2 * k for k in range(4))
        found = Counter(
            (n.name.split()[0], attr_value(n, "comm_type"), attr_value(n, "comm_size"),
             tuple(groups[int(attr_value(n, "pg_name"))]))
            for n in read_trace(out / f"{prefix}.{rank}.et").nodes
            if n.type == pb.COMM_COLL_NODE
        )
        for m in range(2):
            assert found[f"F{m}.0", AG, 2 * kv, context] == L // 2, rank
            assert found[f"B{m}.0", RS, 2 * kv * CP, context] == L // 2, rank
        assert found["B0.0", AR, layer, weights] == found["B1.0", AR, layer, weights] == 0, rank
        assert found["U.0", AR, layer, weights] == L // 2, rank


def test_a_sequence_that_does_not_divide_over_the_context_axis_is_a_warning(tmp_path):
    warnings = extract_warnings(MODEL, "data=2,context=2,tensor=2", tmp_path / "out", "--strategy", "dp+cp+tp",
                                "--model-arg", "seq=255")
    assert any(
        "tokens (255 positions), targets (255 positions) do not divide over context (2 ways): every rank "
        "holds the whole sequence; use a sequence divisible by 2" in w for w in warnings
    ), warnings

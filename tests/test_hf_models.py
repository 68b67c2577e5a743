"""Hugging Face `transformers` models as people build them: from a config, default settings.

`examples/hf_llama.py` is a LlamaForCausalLM (V = 256, D = 64, MLP I = 128, L = 2 layers, H = 4
query heads sharing KV = 2 key/value heads of k = 16, batch B = 4 of S = 16 tokens) whose own
loss is the step's (its output object's `loss`). Per rank b = B / data ways. Matmuls, by hand:

- per layer, the projections: q [D -> H·k], k and v [D -> KV·k], o [H·k -> D], gate and up
  [D -> I], down [I -> D]; the attention core: QK^T and PV, 2·b·H·S·S·k each (k and v are
  repeated to H heads first); then the LM head [D -> V];
- backward, two matmuls per forward matmul (the input gradient flows down to the embedding).

Collectives under data parallelism (group G) are the gradients' all-reduces, f32 (one per
parameter: per layer q, o [64·64], k, v [32·64], gate, up, down [128·64] and the two RMSNorm
vectors [D]; the final norm, the embedding and the LM head [V·D]), the loss (f32) and the count of
labels it averages over (int64), plus what torch's cross-entropy writes: it picks each token's
target logit with a gather (and scatters its gradient back) by explicit (row, label) index pairs,
which the partitioner gathers across the batch (b·S pairs of int64 per rank, twice), and the
per-token gradient of that pick comes back as a reduce-scatter of [B·S] f32.

With the model's own plan over a tensor group T (2x2 mesh: T = 2, G = 2), the weights of the plan
are split in two and, as in examples/torch_gpt.py (tests/test_torch.py), torch's attention core
(a batched matmul over the merged batch and head dimensions) runs on all H heads: q, k and v are
all-gathered over T in forward, the attention output's gradient in backward. The activations
[b·S, D] f32 are all-reduced over T wherever a split contraction leaves partial sums: in forward
after the row-wise embedding and each layer's o and down projections (1 + 2·L), in backward the
input gradient of the column-wise LM head and of each layer's q, k, v, gate and up projections,
each on its own (1 + 5·L). The vocabulary split adds the loss's three reductions over it
(b·S f32 each) and the target pick's gradient over the gathered index pairs ([B·S] f32).

On 2x4 (rank r: T its row of 4, G = (r % 4, r % 4 + 4)), `--strategy dp` with a batch of 8 (the
default 4 does not divide by 8 ranks) is the data-parallel derivation with b = 1 and G all 8 ranks.
Without a strategy the model's plan splits over T = 4 and the batch over G (b = 2); `--strategy
dp+tp` lays it out the same way (the declared plan names every matrix; the norms stay whole), so
both have one derivation. H = 4 splits four ways but KV = 2 does not: k_proj's and v_proj's KV·k =
32 output rows split into 8, so tensor rank t holds q head t but only half w = t % 2 of kv head
u = t // 2. The partitioner then splits the head dimension k of k, v and the attention core in two
over the pair P = (t, t ^ 1) that shares a kv head, and gathers over Q = (t, t ^ 2), the ranks
holding the same half of the other kv head. Every rank runs the attention core for all b·H
(batch, head) pairs (torch's merged batched matmul, as on 2x2) on k/2 of the head dimension: the
matmul FLOPs of H/2 whole heads. Its collectives besides G's (the same as on 2x2, weights split 4
ways), all f32 but the index constants:

- T, as on 2x2: activations [b·S, D] after the embedding and each o and down projection (1 + 2·L)
  and for the input gradients of the LM head and each q, k, v, gate and up (1 + 5·L); the loss's
  three reductions ([b·S]) and the target pick's gradient ([B·S]); q ([b, S, k], one head per
  rank) gathered to all heads in forward, the attention output's gradient in backward (2·L).
- P, once: the rotary angles (positions x inverse frequencies, [S, k/2]) are built on half the
  frequencies each, re-split by position (all-to-all of [S, k/4]), doubled to [S, k] and re-split
  by the head dimension (all-to-all of [S/2, k]); cos and sin are then gathered whole for q
  (2 all-gathers of [S, k/2]).
- P, per layer: rotating k's half head (rotate_half pairs feature i with i ± k/2, held by the
  partner) sends and receives a quarter [b, S, k/4] (one SEND and one RECV), rebuilds the rotated
  head per sequence (2 all-to-alls of [b, S, k/4]) and splits it back by half (all-to-all of
  [b, S, k/2]); the scores QK^T, contracted over half of k, are all-reduced ([b, H, S, S]), and
  so is the probabilities' gradient dO·V^T in backward; PV gives every head's half, and an
  all-to-all of [b, H/KV, S, k/2] swaps heads for halves so each rank holds its own q head whole
  for o_proj, and likewise q's gradient dS·K in backward. Backward, rotate_half's gradient
  gathers its two scattered quarters (2 all-gathers of [b, S, k/4]) and its first layer gathers
  the scatter's index constants (2 all-gathers of k/4 int64, which the second layer reuses).
- Q, per layer in forward: k and v, each repeated to its H/KV query heads, gathered across the kv
  heads ([b, H/KV, S, k/2] each). Their gradients need nothing: every rank computes dK and dV for
  all b·H pairs on its half and keeps its own kv head's.

`flint validate examples/hf_llama.py --mesh 2x4` runs that step (the plan) on 8 CPU devices: the
CPU compiler's optimised module combines all-reduces and reduces the target pick's [B·S] gradient
whole instead of scattering it, so what each group all-reduces adds up to the derivation's bytes,
and every other transfer is one of the derivation's.

`examples/hf_causal_lm.py` builds Mistral (sliding window 8 < S: a different mask, the same
matmuls) and Qwen2 (biases on q, k and v: no matmul, three more gradients per layer) in these
sizes, so they have Llama's derivation.

`examples/hf_llama_decode.py` is a Llama serving step (V = 256, D = 128, I = 256, L = 2, H = 8
query heads sharing KV = 4 of k = 16): one decode token per sequence against a cache of S = 32
positions given as inputs, or the prefill of S tokens (`--model-arg phase=prefill`); both keep
only the last position's logits. Under the model's plan on 2x4 (T = 4, one sequence per data
rank) the projections, the attention heads (QK^T and PV over S + 1 positions, or S x S in
prefill) and the LM head split four ways; the activations are all-reduced after the embedding
and each layer's o and down projections.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch_mlir")
pytest.importorskip("transformers")

from conftest import (  # noqa: E402
    ADDRESS_SPACE_LIMIT,
    EXAMPLES,
    MODELS,
    assert_sends_match_receives,
    flint,
    load_example,
    matmuls_and_collectives,
    transfers,
)

from flint.schema import et_def_pb2 as pb  # noqa: E402
from flint.trace.contract import check_traces  # noqa: E402

AR, AG, RS, A2A = pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER, pb.ALL_TO_ALL
F32, I64 = 4, 8
LLAMA = EXAMPLES / "hf_llama.py"
V, D, I, L, H, KV, K = 256, 64, 128, 2, 4, 2, 16
B, S = 4, 16


def limited(*args: str, patch: str = "") -> subprocess.CompletedProcess:
    """`flint ARGS` in a process whose address space is capped at ADDRESS_SPACE_LIMIT (inherited by
    the extraction's forked child); `patch` runs first."""
    code = (
        "import resource\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE_LIMIT}, {ADDRESS_SPACE_LIMIT}))\n"
        f"{patch}\nfrom flint.cli import main\nmain()"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """examples/hf_llama.py extracted once per mesh and options, under the memory limit."""
    cache: dict[tuple[str, ...], Path] = {}

    def get(mesh: str, *options: str) -> Path:
        key = (mesh, *options)
        if key not in cache:
            out = tmp_path_factory.mktemp("hf_llama") / "traces"
            done = limited("extract", LLAMA, "--mesh", mesh, "--backend", "cpu", *options, "-o", out, "--json")
            assert done.returncode == 0, done.stderr
            json.loads(done.stdout)
            cache[key] = out
        return cache[key]

    return get


def llama_matmul_flops(b: int, heads: int, tensor: int) -> int:
    """Per-rank matmul FLOPs of the training step: projections and head split `tensor` ways, the
    attention core on `heads` heads."""
    projections = D * H * K + 2 * D * KV * K + H * K * D + 3 * D * I
    forward = L * (2 * b * S * projections // tensor + 2 * (2 * b * heads * S * S * K)) + 2 * b * S * D * V // tensor
    return 3 * forward


def llama_gradients(tensor: int) -> list[int]:
    """Bytes of every parameter gradient's all-reduce (f32), each planned weight split `tensor` ways."""
    layer = [D * H * K, D * KV * K, D * KV * K, H * K * D, D * I, D * I, I * D]
    sizes = [n * F32 // tensor for n in layer] * L + [D * F32] * (2 * L + 1)
    return sizes + [V * D * F32 // tensor] * 2  # embedding, LM head


def data_collectives(batch: int, ways: int, tensor: int, group: tuple[int, ...]) -> list:
    """What the data group reduces and gathers with a global batch of `batch` split `ways` ways:
    every gradient, the loss, its label count, the target pick's index pairs (b·S of them, in
    forward and backward) and its gradient's reduce-scatter ([batch·S])."""
    b = batch // ways
    return (
        [(AR, size, group) for size in llama_gradients(tensor)] + [(AR, F32, group), (AR, I64, group)]
        + [(AG, b * S * 2 * I64, group)] * 2 + [(RS, batch * S * F32, group)]
    )


def tensor_group(rank: int, size: int) -> tuple[int, ...]:
    return tuple(range(rank // size * size, rank // size * size + size))


def test_config_matches_the_derivation():
    c = load_example("hf_llama").CONFIG
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (V, D, I, L)
    assert (c.num_attention_heads, c.num_key_value_heads, c.hidden_size // c.num_attention_heads) == (H, KV, K)


def test_llama_training_data_parallel_every_rank(llama):
    """Default sdpa attention, SiLU (`silu_backward`) and the rotary embedding's backward, under a
    4 GiB address-space limit; every rank's matmuls and collectives by hand."""
    directory = llama("2")
    expected = sorted(data_collectives(B, 2, 1, (0, 1)))
    for rank in range(2):
        assert matmuls_and_collectives(directory, rank) == (
            llama_matmul_flops(B // 2, H, 1), expected
        ), f"rank {rank}"
    assert check_traces(directory) == []


def test_llama_own_tensor_parallel_plan(llama):
    """2x2 without --strategy: the model's `tp_plan` (HF styles embedding_rowwise,
    colwise_gather_output) splits the weights over T; the data group G reduces the gradients."""
    directory = llama("2x2")
    b, h = B // 2, H // 2
    for rank in range(4):
        T = (rank // 2 * 2, rank // 2 * 2 + 1)
        G = (rank % 2, rank % 2 + 2)
        flops, found = matmuls_and_collectives(directory, rank)
        assert flops == llama_matmul_flops(b, H, 2), f"rank {rank}"
        over_g = sorted(c for c in found if c[2] == G)
        assert over_g == sorted(data_collectives(B, 2, 2, G)), f"rank {rank}"
        over_t = sorted(c for c in found if c[2] == T)
        assert over_t == sorted(
            [(AR, b * S * D * F32, T)] * (1 + 2 * L)  # forward: embedding, per layer o and down
            + [(AR, b * S * D * F32, T)] * (1 + 5 * L)  # backward: LM head, per layer q, k, v, gate, up
            + [(AR, b * S * F32, T)] * 3  # the loss's max, sum of exponentials and target logit
            + [(AR, B * S * F32, T)]  # the target pick's gradient, over the gathered index pairs
            + [(AG, b * h * S * K * F32, T)] * (4 * L)  # q, k, v and the attention output's gradient
        ), f"rank {rank}"
        assert len(found) == len(over_g) + len(over_t), f"rank {rank}"
    assert check_traces(directory) == []


def test_llama_data_parallel_over_2x4_every_rank(llama):
    """--strategy dp on 2x4 splits the batch over all 8 ranks (batch 8: one sequence each); every
    gradient is all-reduced over all of them."""
    directory = llama("2x4", "--strategy", "dp", "--model-arg", "batch=8")
    expected = sorted(data_collectives(8, 8, 1, tuple(range(8))))
    for rank in range(8):
        assert matmuls_and_collectives(directory, rank) == (llama_matmul_flops(1, H, 1), expected), f"rank {rank}"
    assert check_traces(directory) == []


def plan_2x4_collectives(rank: int) -> list:
    """Every collective of `rank` under the model's plan on 2x4 (T = 4, b = 2; the module
    docstring derives them), sorted."""
    b, half, quarter, repeated = B // 2, K // 2, K // 4, H // KV
    base, t = rank // 4 * 4, rank % 4
    T, G = tensor_group(rank, 4), (t, t + 4)
    P, Q = (base + t // 2 * 2, base + t // 2 * 2 + 1), (base + t % 2, base + t % 2 + 2)
    over_t = (
        [(AR, b * S * D * F32, T)] * (1 + 2 * L)  # forward: embedding, per layer o and down
        + [(AR, b * S * D * F32, T)] * (1 + 5 * L)  # backward: LM head, per layer q, k, v, gate, up
        + [(AR, b * S * F32, T)] * 3 + [(AR, B * S * F32, T)]  # the loss over the vocabulary split
        + [(AG, b * H // 4 * S * K * F32, T)] * (2 * L)  # q; the attention output's gradient
    )
    rotary = [(A2A, S * quarter * F32, P), (A2A, S // 2 * K * F32, P)] + [(AG, S * half * F32, P)] * 2
    per_layer = (
        [(A2A, b * S * quarter * F32, P)] * 2 + [(A2A, b * S * half * F32, P)]  # k's rotate_half
        + [(AR, b * H * S * S * F32, P)] * 2  # the scores; the probabilities' gradient
        + [(A2A, b * repeated * S * half * F32, P)] * 2  # heads for halves: PV; q's gradient
        + [(AG, b * S * quarter * F32, P)] * 2  # rotate_half's gradient
    )
    over_p = rotary + per_layer * L + [(AG, quarter * I64, P)] * 2  # and the scatter's indices
    over_q = [(AG, b * repeated * S * half * F32, Q)] * (2 * L)  # k and v
    return sorted(data_collectives(B, 2, 4, G) + over_t + over_p + over_q)


def plan_2x4_transfers(rank: int) -> list[tuple[bool, int, int, int]]:
    """(send, source, target, bytes) of `rank`'s point-to-point transfers under the plan on 2x4:
    k's rotate_half quarter to and from its partner in P, per layer, forward and backward."""
    partner, size = rank ^ 1, B // 2 * S * K // 4 * F32
    return sorted([(True, rank, partner, size), (False, partner, rank, size)] * (2 * L))


@pytest.mark.parametrize("strategy", [(), ("--strategy", "dp+tp")], ids=["own-plan", "dp+tp"])
def test_llama_plan_over_2x4_every_rank(llama, strategy):
    """2x4: the model's plan over T = 4 and the batch over G, as the model lays it out or as the
    dp+tp preset does (the plan decides what it names): the attention core on every (batch, head)
    pair over half of the head dimension (H/2 heads' FLOPs), and the collectives of the module
    docstring, kv heads split in halves included."""
    directory = llama("2x4", *strategy)
    found = transfers(directory)
    for rank in range(8):
        assert matmuls_and_collectives(directory, rank) == (
            llama_matmul_flops(B // 2, H // 2, 4), plan_2x4_collectives(rank)
        ), f"rank {rank}"
        assert sorted((t.send, t.src, t.dst, t.size) for t in found[rank]) == plan_2x4_transfers(rank)
    assert_sends_match_receives(found)
    assert check_traces(directory) == []


def test_validate_runs_the_plan_over_2x4():
    """`flint validate` runs the step under the plan on 8 CPU devices and finds the trace's
    transfers executed: what each group all-reduces adds up to the derivation's bytes (the
    optimised module combines all-reduces and reduces the target pick's gradient whole), and every
    other collective and transfer is the derivation's, one for one."""
    run = flint("validate", LLAMA, "--mesh", "2x4", "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] and report["disagreements"] == [] and report["compute_ops"]["agree"]
    kinds = {AR: "ALL_REDUCE", AG: "ALL_GATHER", A2A: "ALL_TO_ALL"}
    for rank in range(8):
        ran = [(c["kind"], tuple(c["ranks"]), c["bytes"])
               for c in report["executed_communication"] if c["rank"] == rank]
        derived = plan_2x4_collectives(rank)
        reduced, expected = Counter(), Counter()
        for kind, group, size in ran:
            if kind == "ALL_REDUCE":
                reduced[group] += size
        for kind, size, group in derived:
            if kind in (AR, RS):
                expected[group] += size
        assert reduced == expected, f"rank {rank}"
        assert sorted(c for c in ran if c[0] != "ALL_REDUCE") == sorted(
            [(kinds[kind], group, size) for kind, size, group in derived if kind in (AG, A2A)]
            + [("SEND" if send else "RECV", (src, dst), size)
               for send, src, dst, size in plan_2x4_transfers(rank)]
        ), f"rank {rank}"


@pytest.mark.parametrize("family, biases", [("mistral", []), ("qwen2", [H * K, KV * K, KV * K])])
def test_other_families_training_data_parallel(tmp_path, family, biases):
    """examples/hf_causal_lm.py: Mistral and Qwen2 in Llama's sizes have Llama's matmuls (Mistral's
    sliding window only masks; Qwen2's q, k and v biases add no matmul) and its collectives, plus
    an all-reduce per bias gradient for Qwen2."""
    out = tmp_path / "t"
    run = flint("extract", EXAMPLES / "hf_causal_lm.py", "--mesh", "2", "--backend", "cpu",
                "--model-arg", f"family={family}", "-o", out)
    assert run.returncode == 0, run.stderr
    group = (0, 1)
    expected = sorted(data_collectives(B, 2, 1, group) + [(AR, n * F32, group) for n in biases] * L)
    for rank in range(2):
        assert matmuls_and_collectives(out, rank) == (llama_matmul_flops(B // 2, H, 1), expected), f"rank {rank}"


def test_other_families_configs_match_the_derivation():
    families = load_example("hf_causal_lm").FAMILIES
    for cls, c in families.values():
        assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (V, D, I, L)
        assert (c.num_attention_heads, c.num_key_value_heads, c.hidden_size // c.num_attention_heads) == (H, KV, K)
    assert families["mistral"][1].sliding_window < S  # the window masks, and still no matmul changes


# ------------------------------------------------------------------------------ serving

DECODE = EXAMPLES / "hf_llama_decode.py"
DV, DD, DI, DH, DKV, DK, PAST = 256, 128, 256, 8, 4, 16, 32


def serving_matmul_flops(b: int, tokens: int, keys: int, tensor: int) -> int:
    """Per-rank matmul FLOPs of `tokens` new tokens per sequence attending over `keys` positions,
    every weight of the plan and the heads split `tensor` ways, the LM head on one position."""
    projections = DD * DH * DK + 2 * DD * DKV * DK + DH * DK * DD + 3 * DD * DI
    core = 2 * (2 * b * DH * tokens * keys * DK)  # QK^T and PV, k and v repeated to every query head
    return (L * (2 * b * tokens * projections + core) + 2 * b * DD * DV) // tensor


def test_serving_config_matches_the_derivation():
    c = load_example("hf_llama_decode").CONFIG
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (DV, DD, DI, L)
    assert (c.num_attention_heads, c.num_key_value_heads, c.hidden_size // c.num_attention_heads) == (DH, DKV, DK)


@pytest.mark.parametrize("phase, tokens, keys", [("decode", 1, PAST + 1), ("prefill", PAST, PAST)])
def test_serving_under_the_models_plan_every_rank(tmp_path, phase, tokens, keys):
    """2x4, batch 2 (b = 1 per data rank), the model's plan over T = 4: the decode step attends over
    the S cached positions given as inputs plus its own; in each, the row-wise embedding and each
    layer's o and down projections leave [b, tokens, D] f32 partial sums, all-reduced over T."""
    out = tmp_path / "t"
    run = flint("extract", DECODE, "--mesh", "2x4", "--backend", "cpu", "--model-arg", f"phase={phase}",
                "-o", out, "--explain")
    assert run.returncode == 0, run.stderr
    if phase == "decode":  # the cache is an input of the step, one key and one value tensor per layer
        explained = {line.split()[0]: line for line in run.stderr.splitlines() if line.startswith("batch/")}
        for name in [f"batch/past_{kind}.{i}" for kind in ("keys", "values") for i in range(L)]:
            assert f"[2, {DKV}, {PAST}, {DK}]" in explained[name]
    for rank in range(8):
        T = tensor_group(rank, 4)
        assert matmuls_and_collectives(out, rank) == (
            serving_matmul_flops(1, tokens, keys, 4), [(AR, tokens * DD * F32, T)] * (1 + 2 * L)
        ), f"rank {rank}"
    assert check_traces(out) == []


def test_decode_data_parallel_has_no_collectives(tmp_path):
    """--strategy dp with a batch of 8 on 2x4: a sequence and its cache per rank, the whole model
    on each: every matmul of the step and nothing to communicate."""
    out = tmp_path / "t"
    run = flint("extract", DECODE, "--mesh", "2x4", "--backend", "cpu", "--strategy", "dp",
                "--model-arg", "batch=8", "-o", out)
    assert run.returncode == 0, run.stderr
    for rank in range(8):
        assert matmuls_and_collectives(out, rank) == (serving_matmul_flops(1, 1, PAST + 1, 1), []), f"rank {rank}"


def test_model_argument_nothing_takes_is_refused(tmp_path):
    run = flint("extract", DECODE, "--mesh", "2", "--backend", "cpu", "--model-arg", "layers=3", "-o", tmp_path / "t")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "error: hf_llama_decode.py: neither model() nor example_inputs() has a model argument 'layers': "
        "they take batch, past, phase"
    ]
    assert not (tmp_path / "t").exists()


def test_hugging_face_plan_read_as_layout():
    """A config's base_model_tp_plan (no `model.` prefix) and HF-only styles, read directly."""
    import torch
    from transformers import LlamaForCausalLM

    from flint.frontend.torch_workload import plan_dims

    config = load_example("hf_llama").CONFIG
    with torch.device("meta"):
        net = LlamaForCausalLM(config)
    dims = plan_dims(net, config.base_model_tp_plan, LLAMA)
    assert dims["model.layers.1.self_attn.k_proj.weight"] == 0
    assert dims["model.layers.0.self_attn.o_proj.weight"] == 1
    assert dims["model.layers.0.mlp.down_proj.weight"] == 1
    assert len(dims) == 7 * L
    own = plan_dims(net, net.tp_plan, LLAMA)
    assert (own["lm_head.weight"], own["model.embed_tokens.weight"]) == (0, 0)
    styles = {
        "layers.*.post_attention_layernorm": "replicated_with_grad_allreduce",
        "layers.0.mlp.up_proj.weight": "packed_colwise",
    }
    assert plan_dims(net, styles, LLAMA) == {
        "model.layers.0.post_attention_layernorm.weight": None,
        "model.layers.1.post_attention_layernorm.weight": None,
        "model.layers.0.mlp.up_proj.weight": 0,
    }


def test_gpt2_inference_returns_its_output_object(tmp_path):
    """GPT-2 with sdpa attention returns a ModelOutput: logits and the key/value cache leave the
    step. Per rank (b = 2): per layer c_attn [D -> 3D], c_proj [D -> D], the MLP [D -> 4D -> D], QK^T
    and PV (2·b·S·S·D each over the heads), and the tied head [D -> V]; no collectives."""
    out = tmp_path / "t"
    run = flint("extract", MODELS / "hf_gpt2.py", "--mesh", "2", "--backend", "cpu", "-o", out, "--json")
    assert run.returncode == 0, run.stderr
    b = B // 2
    per_layer = 2 * b * S * (3 * D * D + D * D + 8 * D * D) + 2 * (2 * b * S * S * D)
    for rank in range(2):
        assert matmuls_and_collectives(out, rank) == (L * per_layer + 2 * b * S * D * V, [])


def test_unlowerable_op_is_named_with_its_line(tmp_path):
    run = flint("extract", MODELS / "torch_fft.py", "--mesh", "2", "--backend", "cpu", "-o", tmp_path / "t")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "error: torch_fft.py: torch-mlir cannot lower aten._fft_r2c (at torch_fft.py:13 "
        "'return self.fc(x) * torch.fft.rfft(x).abs()') to StableHLO: write that part of the model "
        "with other torch ops"
    ]


def test_out_of_memory_in_lowering_keeps_its_diagnostic(tmp_path):
    """Without the bound on rotary slices' backward, torch-mlir allocates until the limit: the
    one-line error keeps `std::bad_alloc`."""
    patch = "import flint.frontend.torch_bridge as bridge\nbridge._clamp_slice_ends = lambda graph: None"
    done = limited("extract", LLAMA, "--mesh", "2", "--backend", "cpu", "-o", tmp_path / "t", patch=patch)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: hf_llama.py: torch-mlir cannot lower the step to StableHLO: std::bad_alloc"
    ]


def test_plan_on_a_norm_is_refused_before_tracing(tmp_path):
    run = flint("extract", MODELS / "hf_bad_plan.py", "--mesh", "2x2", "--backend", "cpu", "-o", tmp_path / "t")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "error: hf_bad_plan.py: tp_plan entry 'layers.*.input_layernorm' matches "
        "model.layers.0.input_layernorm, a LlamaRMSNorm: only nn.Linear and nn.Embedding modules "
        "can be split (or name its parameters)"
    ]

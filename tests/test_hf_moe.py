"""Hugging Face mixture-of-experts models: `examples/hf_moe.py` (Mixtral, Qwen3-MoE), by hand.

The example has Llama's sizes (tests/test_hf_models.py: V = 256, D = 64, L = 2, H = 4 query heads
sharing KV = 2 of k = 16, B = 4 sequences of S = 16) with every layer's MLP a sparse block: a
router [D -> E] over E = 8 experts, k = 2 picked per token, each expert a SwiGLU of I_e = 32
(`gate_up_proj` [E, 2·I_e, D], `down_proj` [E, D, I_e]). Flint runs each block densely
(flint.frontend.torch_experts): every expert over every token of the rank, three matmuls batched
over the experts (gate, up: [E, t, D] x [E, D, I_e]; down: [E, t, I_e] x [E, I_e, D]), 2·E·t·I_e·D
FLOPs each for t tokens, the routing weight (zero for an expert not picked) applied before the
down projection, then a sum over experts. Backward doubles every matmul; the router adds
3 x 2·t·D·E per layer. So a step's matmul FLOPs are Llama's with the dense MLP's
3 x 2·t·3·D·I / T replaced by 3 x (2·t·D·E + 3 · 2·E·t·I_e·D / T).

Under the model's own plan on 2x4 (T = 4 the tensor group, G the data pair, b = 2, t = b·S),
`gate_up_proj` is split per packed part (each rank the same quarter of gate and of up) and
`down_proj` by its input features: every rank runs every expert on a quarter of I_e. The block's
collectives over T, per layer: forward, the experts' partial outputs [E, t, D] f32 all-reduced (the
split contraction over I_e leaves them partial; the sum over experts comes after); backward, the
input gradients of gate and of up ([E, t, D] each) and the routing weights' gradient [t, E]. Over
G, the gradients: gate and up apart (E·I_e·D / T each: the packed weight is two step inputs'
halves), down (E·D·I_e / T) and the router whole (E·D). The attention is Llama's and collects as
on 2x4 in tests/test_hf_models.py. Besides, per layer over Q (the ranks holding the same half of
a kv head, as for Llama's k and v), two all-gathers of the routing's sizes, [t, E] and [t, k] f32:
the partitioner computes part of the routing on split halves and gathers it.

Expert parallelism, X the expert group of size ep (each rank E/ep experts) and R the ranks holding
the same experts (the other axis), one sequence per rank (batch 8, t = S): the partitioner
dispatches by all-gather and combines by reduce-scatter. Per layer over X: the tokens [t, D] are
gathered (forward; and in backward, once more for the weight gradients, and the output gradient),
the routing indices [t, k] (int64) and weights [t, k] (f32) gathered; each rank runs its E/ep experts
over the ep·t tokens of its group (the same FLOPs as all experts over t) and the outputs
[ep·t, D] are reduce-scattered back to their ranks (forward; the input gradient in backward),
as is the routing weights' gradient [ep·t, k]. Over R, the expert gradients (E/ep·I_e·D each, three
per layer). `--strategy ep` on 2x4 splits the experts over the first axis (ep = 2); the model's own
`ep_plan` on a mesh `dp=2,ep=4` over `ep` (ep = 4).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch_mlir")
pytest.importorskip("transformers")

from conftest import EXAMPLES, extract, load_example, matmuls_and_collectives  # noqa: E402
from test_hf_models import (  # noqa: E402
    AG, AR, B, D, F32, H, I, I64, K, KV, L, RS, S, V,
    data_collectives, llama_matmul_flops, plan_2x4_collectives, tensor_group,
)

from flint.trace.contract import check_traces  # noqa: E402

MOE = EXAMPLES / "hf_moe.py"
E, IE, TOP = 8, 32, 2
FAMILIES = ("mixtral", "qwen3_moe")


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """examples/hf_moe.py extracted once per family, mesh and options (CPU backend)."""
    cache: dict[tuple[str, ...], Path] = {}

    def get(family: str, mesh: str, *options: str) -> Path:
        key = (family, mesh, *options)
        if key not in cache:
            out = tmp_path_factory.mktemp("hf_moe") / "traces"
            extract(MOE, mesh, out, "--model-arg", f"family={family}", *options)
            cache[key] = out
        return cache[key]

    return get


def moe_matmul_flops(b: int, heads: int, tensor: int) -> int:
    """Per-rank matmul FLOPs: Llama's (tests/test_hf_models.py) with the dense MLP replaced by the
    router and every expert over every token, experts' features split `tensor` ways."""
    t = b * S
    dense_mlp = 2 * t * 3 * D * I // tensor
    block = 2 * t * D * E + 3 * (2 * E * t * IE * D) // tensor
    return llama_matmul_flops(b, heads, tensor) - 3 * L * dense_mlp + 3 * L * block


def test_config_matches_the_derivation():
    for family in FAMILIES:
        c = load_example("hf_moe").model.__globals__["FAMILIES"][family][1]()
        assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.head_dim) == (V, D, L, K)
        assert (c.num_attention_heads, c.num_key_value_heads, c.num_experts_per_tok) == (H, KV, TOP)
        experts = c.num_local_experts if family == "mixtral" else c.num_experts
        size = c.intermediate_size if family == "mixtral" else c.moe_intermediate_size
        assert (experts, size) == (E, IE)


def test_own_plans_are_read():
    """The MoE styles split what Hugging Face's split: gate_up_proj per packed part (dimension 1),
    down_proj by input features (2); `moe_tp_experts` splits nothing itself; the EP plan's
    `grouped_gemm` splits experts (0). Qwen3-MoE's plan names a dense MLP its MoE layers lack."""
    import torch

    from flint.frontend.torch_experts import router_parameters
    from flint.frontend.torch_workload import expert_dims, packed_dims, plan_dims

    example = load_example("hf_moe")
    for family in FAMILIES:
        with torch.device("meta"):
            net = example.model(family)
        dims = plan_dims(net, net.tp_plan, MOE, own=True)
        assert dims["model.layers.1.mlp.experts.gate_up_proj"] == 1
        assert dims["model.layers.1.mlp.experts.down_proj"] == 2
        assert "model.layers.0.mlp.gate.weight" not in dims
        assert packed_dims(net, net.tp_plan, MOE, own=True) == {
            f"model.layers.{n}.mlp.experts.gate_up_proj": 1 for n in range(L)
        }
        assert router_parameters(net) == [f"model.layers.{n}.mlp.gate.weight" for n in range(L)]
        assert expert_dims(net, net.ep_plan, MOE, own=True) == {
            f"model.layers.{n}.mlp.experts.{w}": 0 for n in range(L) for w in ("gate_up_proj", "down_proj")
        }


def moe_gradients(tensor: int, experts: int = 1) -> list[int]:
    """Bytes of every gradient all-reduce over the data group: the attention's (split `tensor`
    ways), the router's (whole), gate's, up's and down's (split `tensor` ways, or by expert over
    `experts`: those are reduced over R instead, see `expert_parallel_collectives`), the norms'."""
    attention = [D * H * K, D * KV * K, D * KV * K, H * K * D]
    sizes = [n * F32 // tensor for n in attention] * L + [E * D * F32] * L
    if experts == 1:
        sizes += [E * IE * D * F32 // tensor] * (3 * L)
    return sizes + [D * F32] * (2 * L + 1) + [V * D * F32 // tensor] * 2


def own_plan_collectives(rank: int) -> list:
    """Every collective of `rank` for Mixtral under its own plan on 2x4: Llama's (attention, loss)
    with the dense MLP's replaced by the expert block's (module docstring), sorted."""
    b, t = B // 2, B // 2 * S
    T, G = tensor_group(rank, 4), (rank % 4, rank % 4 + 4)
    base, q = rank // 4 * 4, rank % 2
    Q = (base + q, base + q + 2)
    found = Counter(plan_2x4_collectives(rank))
    found -= Counter(data_collectives(B, 2, 4, G))
    found -= Counter([(AR, t * D * F32, T)] * (3 * L))  # the dense MLP's: down forward, gate and up backward
    b_ = B // 2
    data = (
        [(AR, size, G) for size in moe_gradients(4)] + [(AR, F32, G), (AR, I64, G)]
        + [(AG, b_ * S * 2 * I64, G)] * 2 + [(RS, B * S * F32, G)]
    )
    block = (
        [(AR, E * t * D * F32, T)] * 3  # forward: partial expert outputs; backward: gate's and up's input gradients
        + [(AR, t * E * F32, T)]  # backward: the routing weights' gradient
        + [(AG, t * E * F32, Q), (AG, t * TOP * F32, Q)]  # the router's top-k, from halves
    )
    return sorted((found + Counter(data + block * L)).elements())


@pytest.mark.parametrize(
    "family, strategy",
    [("mixtral", ()), ("qwen3_moe", ()), ("mixtral", ("--strategy", "dp+tp"))],
    ids=["mixtral", "qwen3_moe", "mixtral-dp+tp"],
)
def test_own_tensor_parallel_plan_over_2x4(moe, family, strategy):
    """Without --strategy: the model's tp_plan, `moe_tp_experts` and packed gate_up included, over
    T = 4; every rank's matmul FLOPs by hand, and for Mixtral every collective (Qwen3-MoE's
    per-head q and k norms add attention collectives: its expert block's are checked). `--strategy
    dp+tp` lays Mixtral out the same way: the plan decides what it names, and the routers, which
    it does not name, stay whole as the plan leaves them (split by shape, [E, D] would be split by
    expert, and the CPU compiler aborts on the top-k over a split dimension)."""
    directory = moe(family, "2x4", *strategy)
    t = B // 2 * S
    for rank in range(8):
        flops, found = matmuls_and_collectives(directory, rank)
        assert flops == moe_matmul_flops(B // 2, H // 2, 4), f"rank {rank}"
        if family == "mixtral":
            assert found == own_plan_collectives(rank), f"rank {rank}"
        T, G = tensor_group(rank, 4), (rank % 4, rank % 4 + 4)
        count = Counter(found)
        assert count[(AR, E * t * D * F32, T)] == 3 * L
        assert count[(AR, t * E * F32, T)] == L
        assert count[(AR, E * IE * D * F32 // 4, G)] == 3 * L + 2  # the embedding's and LM head's are as large
        assert count[(AR, E * D * F32, G)] == 3 * L  # the router's, and k's and v's as large
        assert not any(size >= E * IE * D * F32 // 4 and kind == AG for kind, size, _ in found)  # no weight gathered
    assert check_traces(directory) == []


def expert_parallel_collectives(rank: int, ep: int, expert_axis_first: bool) -> list:
    """`rank`'s collectives over its expert group X and over R (module docstring), sorted."""
    t = S
    if expert_axis_first:  # 2x4, experts over the first axis
        X, R = (rank % 4, rank % 4 + 4), tensor_group(rank, 4)
    else:  # dp=2,ep=4
        X, R = tensor_group(rank, 4), (rank % 4, rank % 4 + 4)
    per_layer = (
        [(AG, t * D * F32, X)] * 3  # tokens (forward, and again in backward), the output gradient
        + [(AG, t * TOP * I64, X), (AG, t * TOP * F32, X)]  # routing indices and weights
        + [(RS, ep * t * D * F32, X)] * 2  # outputs; the tokens' gradient
        + [(RS, ep * t * TOP * F32, X)]  # the routing weights' gradient
        + [(AR, E // ep * IE * D * F32, R)] * 3  # gate, up and down gradients
    )
    return sorted(per_layer * L)


@pytest.mark.parametrize(
    "family, mesh, options, ep, first",
    [
        ("mixtral", "2x4", ("--strategy", "ep"), 2, True),
        ("qwen3_moe", "2x4", ("--strategy", "ep"), 2, True),
        ("mixtral", "dp=2,ep=4", (), 4, False),
    ],
    ids=["mixtral-strategy-ep", "qwen3_moe-strategy-ep", "mixtral-own-ep-plan"],
)
def test_expert_parallel(moe, family, mesh, options, ep, first):
    """Experts split by expert over X (ep ways), one sequence per rank: every rank's matmul FLOPs
    (all experts over its t tokens, as ep·t tokens over E/ep experts) and every collective over X
    and R by hand; every other gradient is all-reduced over all 8 ranks."""
    directory = moe(family, mesh, "--model-arg", "batch=8", *options)
    for rank in range(8):
        flops, found = matmuls_and_collectives(directory, rank)
        assert flops == moe_matmul_flops(1, H, 1), f"rank {rank}"
        expected = expert_parallel_collectives(rank, ep, first)
        groups = {group for _, _, group in expected}
        assert sorted(c for c in found if c[2] in groups) == expected, f"rank {rank}"
        everyone = Counter(size for kind, size, group in found if kind == AR and len(group) == 8)
        assert not Counter(moe_gradients(1, ep)) - everyone, f"rank {rank}"
    assert check_traces(directory) == []


@pytest.mark.parametrize(
    "style, message",
    [
        ("grouped_gemm", "ep_plan entry 'layers.*.mlp.experts' = 'grouped_gemm' matches "
         "model.layers.0.mlp.experts, a module: name its stacked expert weights"),
        ("sharded", "ep_plan['layers.*.mlp.experts'] = 'sharded': use one of grouped_gemm, "
         "moe_tp_experts, ep_dispatch_experts, moe_identity_expert"),
    ],
)
def test_a_files_ep_plan_is_checked_before_tracing(tmp_path, style, message):
    """A model file's own `ep_plan` replaces the model's; `grouped_gemm` names weights, not modules."""
    from conftest import flint

    model = tmp_path / "moe_plan.py"
    model.write_text(
        f"import sys\nsys.path.insert(0, {str(EXAMPLES)!r})\n"
        "from hf_moe import example_inputs, loss_fn, model  # noqa: F401\n"
        f"ep_plan = {{'layers.*.mlp.experts': {style!r}}}\n"
    )
    run = flint("extract", model, "--mesh", "dp=2,ep=4", "--backend", "cpu", "-o", tmp_path / "t")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [f"error: moe_plan.py: {message}"]

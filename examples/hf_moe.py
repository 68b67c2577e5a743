"""Hugging Face `transformers` mixture-of-experts decoders, built from small configs, as a training step.

`--model-arg family=mixtral` (the default) is a `MixtralForCausalLM`, `family=qwen3_moe` a
`Qwen3MoeForCausalLM`: each exactly as `transformers` defines it, with its defaults, in a small
size: 2 layers of width 64, 4 query heads sharing 2 key/value heads, and in every layer a sparse
MLP of E = 8 experts (SwiGLU, intermediate size 32 each, their weights stacked as `gate_up_proj`
[E, 2·32, 64] and `down_proj` [E, 64, 32]) of which a router picks 2 per token. The batch (4
sequences of 16 tokens) carries `labels`, so each computes its own loss; the optimizer is AdamW.

Layout: without `--strategy`, the model's own tensor-parallel plan (`base_model_tp_plan`: the
attention as Llama's, every expert's `gate_up_proj` column-wise and `down_proj` row-wise over the
tensor axis) and the batch over the other axes. Expert parallelism splits the experts instead:
`--strategy ep` (the experts over the first axis, the batch over all), or a mesh with an axis
named `ep` or `expert`, over which the model's own expert-parallel plan (`base_model_ep_plan`)
splits them.

    flint extract examples/hf_moe.py --mesh 2x4 -o traces/hf_mixtral
    flint extract examples/hf_moe.py --mesh 2x4 --model-arg family=qwen3_moe -o traces/hf_qwen3_moe
    flint extract examples/hf_moe.py --mesh 2x4 --strategy ep -o traces/hf_mixtral_ep
    flint extract examples/hf_moe.py --mesh dp=2,ep=4 -o traces/hf_mixtral_own_ep

Flint runs every expert over every token of a rank's batch, each weighted by its routing weight
(zero for the experts a token did not pick): see README.md, "PyTorch models".
"""

import torch
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

BATCH, SEQ = 4, 16
SIZES = dict(
    vocab_size=256,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=SEQ,
    num_experts_per_tok=2,
)
EXPERTS, EXPERT_SIZE = 8, 32
FAMILIES = {
    "mixtral": (
        MixtralForCausalLM,
        lambda: MixtralConfig(**SIZES, intermediate_size=EXPERT_SIZE, num_local_experts=EXPERTS),
    ),
    "qwen3_moe": (
        Qwen3MoeForCausalLM,
        lambda: Qwen3MoeConfig(
            **SIZES, moe_intermediate_size=EXPERT_SIZE, intermediate_size=128, num_experts=EXPERTS
        ),
    ),
}


def model(family="mixtral"):
    if family not in FAMILIES:
        raise ValueError(f"family={family!r}: use one of {', '.join(FAMILIES)}")
    cls, config = FAMILIES[family]
    return cls(config())


def example_inputs(batch=BATCH):
    tokens = torch.zeros(batch, SEQ, dtype=torch.int64)
    return {"input_ids": tokens, "labels": tokens}


def loss_fn(model, batch):
    return model(**batch)  # a MoeCausalLMOutputWithPast: Flint takes its `loss`

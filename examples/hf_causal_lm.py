"""Hugging Face `transformers` decoder families beside Llama, built from small configs, as a training step.

`--model-arg family=mistral` (the default) is a `MistralForCausalLM`, `family=qwen2` a
`Qwen2ForCausalLM`: each exactly as `transformers` defines it, with its defaults (sdpa attention,
SwiGLU MLP, RMSNorm, rotary embeddings), in the size of examples/hf_llama.py (4 query heads share
2 key/value heads, 2 layers, a batch of 4 sequences of 16 tokens). What sets them apart from Llama
is kept: Mistral's sliding-window attention (a window of 8 here, shorter than the sequence, so its
mask differs from the causal one; the matmuls stay the same) and Qwen2's biases on the q, k and v
projections. The batch carries `labels`, so each computes its own loss; the optimizer is AdamW.

    flint extract examples/hf_causal_lm.py --mesh 2 -o traces/hf_mistral
    flint extract examples/hf_causal_lm.py --mesh 2x2 --model-arg family=qwen2 -o traces/hf_qwen2
"""

import torch
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

BATCH, SEQ = 4, 16
SIZES = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=SEQ,
)
FAMILIES = {
    "mistral": (MistralForCausalLM, MistralConfig(**SIZES, sliding_window=8)),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config(**SIZES)),
}


def model(family="mistral"):
    if family not in FAMILIES:
        raise ValueError(f"family={family!r}: use one of {', '.join(FAMILIES)}")
    cls, config = FAMILIES[family]
    return cls(config)


def example_inputs():
    tokens = torch.zeros(BATCH, SEQ, dtype=torch.int64)
    return {"input_ids": tokens, "labels": tokens}


def loss_fn(model, batch):
    return model(**batch)  # a CausalLMOutputWithPast: Flint takes its `loss`

"""A Hugging Face `transformers` Llama, built from its config, as a training step.

`LlamaForCausalLM` exactly as `transformers` defines it, with its defaults (the `sdpa` attention,
SwiGLU MLP, RMSNorm, rotary embeddings), in a small configuration with grouped-query attention
(4 query heads share 2 key/value heads). No weights are loaded: Flint builds the model on the meta
device. The batch carries `labels`, so the model computes its own cross-entropy loss and returns it
in its output object, which `loss_fn` passes on; the optimizer is Flint's AdamW.

Layout: without `--strategy`, the model's own tensor-parallel plan (`model.tp_plan`, from the
config's `base_model_tp_plan`: q, k, v, gate and up column-wise, o and down row-wise, the embedding
row-wise and the LM head column-wise) over the tensor axis, the batch over the others.

    flint extract examples/hf_llama.py --mesh 2 -o traces/hf_llama          # data-parallel
    flint extract examples/hf_llama.py --mesh 2x2 -o traces/hf_llama_tp     # and the model's plan

Without `loss_fn` (and `labels`), the step is inference: `model(**batch)` returns the logits and the
prefill's key/value cache, which leave the step as `keys` and `values` per layer.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BATCH, SEQ = 4, 16
CONFIG = LlamaConfig(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=SEQ,
)


def model():
    return LlamaForCausalLM(CONFIG)


def example_inputs():
    tokens = torch.zeros(BATCH, SEQ, dtype=torch.int64)
    return {"input_ids": tokens, "labels": tokens}


def loss_fn(model, batch):
    return model(**batch)  # a CausalLMOutputWithPast: Flint takes its `loss`

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

`--model-arg size=7b` builds Llama 2 7B's configuration instead (hidden 4096, 32 layers of 32
heads, MLP 11008, vocabulary 32000; 6.7 B parameters, never allocated), and `batch=N`, `seq=N`
set the batch:

    flint extract examples/hf_llama.py --mesh 2x4 --backend cpu --model-arg size=7b --model-arg batch=2 --model-arg seq=128 \
        -o traces/llama7b

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
CONFIGS = {
    "small": CONFIG,
    "7b": LlamaConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=4096,
    ),
}


def model(size="small"):
    if size not in CONFIGS:
        raise ValueError(f"size={size!r}: use one of {', '.join(CONFIGS)}")
    return LlamaForCausalLM(CONFIGS[size])


def example_inputs(batch=BATCH, seq=SEQ):
    tokens = torch.zeros(batch, seq, dtype=torch.int64)
    return {"input_ids": tokens, "labels": tokens}


def loss_fn(model, batch):
    return model(**batch)  # a CausalLMOutputWithPast: Flint takes its `loss`

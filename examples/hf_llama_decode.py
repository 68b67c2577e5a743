"""A Hugging Face `transformers` Llama serving: one decode step against a key/value cache, or the prefill.

`LlamaForCausalLM` as `transformers` defines it (sdpa attention, SwiGLU, RMSNorm, rotary
embeddings), built from a small config with grouped-query attention (8 query heads share 4
key/value heads of 16). No weights are loaded: Flint builds the model on the meta device.

- `phase="decode"` (the default): one step of a serving loop. The batch holds each sequence's next
  token and the cache of its `past` earlier positions, one key and one value tensor
  [batch, key/value heads, past, head dim] per layer (`batch/past_keys.0`, ...), so the cache is an
  input of the step; the forward builds the `DynamicCache` the model takes from those tensors. The
  model appends the token's keys and values, attends over past + 1 positions and returns the next
  token's logits and the grown cache (`keys`, `values` per layer).
- `phase="prefill"`: the prompt of `past` tokens, no cache in; the logits of its last position and
  the cache it fills come out.

Both keep only the last position's logits (`logits_to_keep=1`), as `generate` does. Layout: without
`--strategy`, the batch (and its cache) over the data axes and the model's own tensor-parallel plan
over the tensor axis (q, k, v, gate and up column-wise, o and down row-wise, the embedding row-wise
and the LM head column-wise). With one sequence per data rank (the default `batch=2` on a 2x4
mesh) torch's attention core, a batched matmul over merged (sequence, head) dimensions, splits by
heads too; with more, the partitioner gathers the heads (see examples/hf_llama.py). The cache comes
in whole on every rank of a tensor group, which uses only its own heads of it;
`--shard 'batch/past_.*=data,tensor,None,None'` splits it by heads as tensor-parallel serving keeps it.

    flint extract examples/hf_llama_decode.py --mesh 2x4 -o traces/hf_llama_decode
    flint extract examples/hf_llama_decode.py --mesh 2x4 --model-arg phase=prefill -o traces/hf_llama_prefill
"""

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

CONFIG = LlamaConfig(
    vocab_size=256,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=1024,
)
HEAD_DIM = CONFIG.hidden_size // CONFIG.num_attention_heads


def model():
    return LlamaForCausalLM(CONFIG)


def example_inputs(batch=2, past=32, phase="decode"):
    if phase == "prefill":
        return {"input_ids": torch.zeros(batch, past, dtype=torch.int64)}
    if phase != "decode":
        raise ValueError(f"phase={phase!r}: use decode or prefill")
    cache = (batch, CONFIG.num_key_value_heads, past, HEAD_DIM)
    layers = range(CONFIG.num_hidden_layers)
    return {
        "input_ids": torch.zeros(batch, 1, dtype=torch.int64),
        **{f"past_keys.{i}": torch.empty(cache) for i in layers},
        **{f"past_values.{i}": torch.empty(cache) for i in layers},
    }


def forward(model, batch):
    tokens = batch["input_ids"]
    if "past_keys.0" not in batch:  # prefill
        return model(input_ids=tokens, use_cache=True, logits_to_keep=1)
    layers = range(CONFIG.num_hidden_layers)
    cache = DynamicCache([(batch[f"past_keys.{i}"], batch[f"past_values.{i}"]) for i in layers], config=CONFIG)
    past = batch["past_keys.0"].shape[2]
    position = torch.full(tokens.shape, past, dtype=torch.int64)
    return model(input_ids=tokens, past_key_values=cache, position_ids=position, use_cache=True, logits_to_keep=1)

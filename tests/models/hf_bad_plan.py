"""A Llama whose tensor-parallel plan splits an RMSNorm column-wise: refused before tracing."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def model():
    return LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4))


def example_inputs():
    return {"input_ids": torch.zeros(4, 16, dtype=torch.int64)}


tp_plan = {"layers.*.input_layernorm": "colwise"}

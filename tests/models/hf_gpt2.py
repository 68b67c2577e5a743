"""Hugging Face GPT-2 inference with its defaults (sdpa attention, tied LM head, dropout off in
eval mode): `model(**batch)` returns a CausalLMOutputWithCrossAttentions holding the logits and
the key/value cache."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

BATCH, SEQ = 4, 16
CONFIG = GPT2Config(vocab_size=256, n_positions=SEQ, n_embd=64, n_layer=2, n_head=4)


def model():
    return GPT2LMHeadModel(CONFIG)


def example_inputs():
    return {"input_ids": torch.zeros(BATCH, SEQ, dtype=torch.int64)}

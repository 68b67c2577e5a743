"""A Hugging Face `BertForMaskedLM` from a small `BertConfig`, as a training step with its own
masked-LM loss (the batch carries `labels`). BERT has no tensor-parallel plan, so without
`--strategy` only the batch is laid out (over the data axes)."""

import torch
from transformers import BertConfig, BertForMaskedLM

BATCH, SEQ = 8, 16
CONFIG = BertConfig(
    vocab_size=256,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=SEQ,
)


def model():
    return BertForMaskedLM(CONFIG)


def example_inputs(batch=BATCH):
    tokens = torch.zeros(batch, SEQ, dtype=torch.int64)
    return {"input_ids": tokens, "labels": tokens}


def loss_fn(model, batch):
    return model(**batch)  # a MaskedLMOutput: Flint takes its `loss`

"""Hugging Face `transformers` encoder-decoder models, built from small configs, as a training step.

`--model-arg family=t5` (the default) is a `T5ForConditionalGeneration`, `family=bart` a
`BartForConditionalGeneration`, each exactly as `transformers` defines it with its defaults (T5:
relative position buckets, RMS layer norms, a ReLU feed-forward without biases, the LM head tied
to the shared embedding; BART: learned positions, LayerNorm, GELU, biases everywhere, the LM head
tied too). Both in one size: d_model 64, 4 heads of 16, a feed-forward of 128, 2 encoder and 2
decoder layers, a vocabulary of 256; a batch of 8 source sequences of 16 tokens and target
sequences (`labels`) of 8. The model shifts the labels right into the decoder's inputs and
computes its own loss; the optimizer is AdamW. Neither config declares a tensor-parallel plan
(`base_model_tp_plan`), so the layout is data parallel: `--strategy dp` splits the batch over
every rank. Without it the batch splits over the data axes only, and on 2x4 the 4 ranks of a
tensor group repeat the same step, but for the dropout masks: the partitioner draws them in parts
across the group and assembles them with all-reduces over it.

    flint extract examples/hf_seq2seq.py --mesh 2x4 --strategy dp -o traces/hf_t5
    flint extract examples/hf_seq2seq.py --mesh 2x4 --strategy dp --model-arg family=bart -o traces/hf_bart
"""

import torch
from transformers import BartConfig, BartForConditionalGeneration, T5Config, T5ForConditionalGeneration

BATCH, SOURCE, TARGET = 8, 16, 8
VOCAB, D_MODEL, HEADS, FFN, LAYERS = 256, 64, 4, 128, 2
FAMILIES = {
    "t5": (
        T5ForConditionalGeneration,
        T5Config(
            vocab_size=VOCAB, d_model=D_MODEL, d_kv=D_MODEL // HEADS, d_ff=FFN, num_heads=HEADS,
            num_layers=LAYERS, num_decoder_layers=LAYERS, decoder_start_token_id=0, pad_token_id=0,
        ),
    ),
    "bart": (
        BartForConditionalGeneration,
        BartConfig(
            vocab_size=VOCAB, d_model=D_MODEL, encoder_attention_heads=HEADS,
            decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN,
            encoder_layers=LAYERS, decoder_layers=LAYERS, max_position_embeddings=SOURCE,
        ),
    ),
}


def model(family="t5"):
    if family not in FAMILIES:
        raise ValueError(f"family={family!r}: use one of {', '.join(FAMILIES)}")
    cls, config = FAMILIES[family]
    return cls(config)


def example_inputs():
    return {
        "input_ids": torch.zeros(BATCH, SOURCE, dtype=torch.int64),
        "labels": torch.zeros(BATCH, TARGET, dtype=torch.int64),
    }


def loss_fn(model, batch):
    return model(**batch)  # a Seq2SeqLMOutput: Flint takes its `loss`

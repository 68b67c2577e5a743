"""A Hugging Face `ViTForImageClassification` from a small `ViTConfig`, as a training step: its
patch embedding is a convolution (kernel = stride = the patch size), the classifier's loss the
model's own (the batch carries `labels`)."""

import torch
from transformers import ViTConfig, ViTForImageClassification

BATCH, CHANNELS, IMAGE, PATCH, HIDDEN, LABELS = 8, 3, 32, 8, 64, 10
CONFIG = ViTConfig(
    image_size=IMAGE,
    patch_size=PATCH,
    num_channels=CHANNELS,
    hidden_size=HIDDEN,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    num_labels=LABELS,
)


def model():
    return ViTForImageClassification(CONFIG)


def example_inputs(batch=BATCH):
    return {
        "pixel_values": torch.empty(batch, CHANNELS, IMAGE, IMAGE),
        "labels": torch.zeros(batch, dtype=torch.int64),
    }


def loss_fn(model, batch):
    return model(**batch)  # an ImageClassifierOutput: Flint takes its `loss`

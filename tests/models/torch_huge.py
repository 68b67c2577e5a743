"""One nn.Linear of 65,536 x 65,536 f32 (17 GB of weights, more than the machine has): extracting
its SGD step must not allocate them."""

import torch
from torch import nn

BATCH, WIDTH = 64, 65536


def model():
    return nn.Linear(WIDTH, WIDTH, bias=False)


def example_inputs():
    return {"x": torch.empty(BATCH, WIDTH), "y": torch.empty(BATCH, WIDTH)}


def loss_fn(model, batch):
    return torch.mean((model(batch["x"]) - batch["y"]) ** 2)


optimizer = "sgd"

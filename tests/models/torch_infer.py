"""A PyTorch inference step (no loss_fn): a biased MLP with a buffer, Megatron-split by tp_plan."""

import torch
import torch.nn.functional as F
from torch import nn

BATCH, D_MODEL, D_HIDDEN = 32, 64, 256


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(D_MODEL, D_HIDDEN)
        self.down = nn.Linear(D_HIDDEN, D_MODEL)
        self.register_buffer("scale", torch.ones(D_MODEL))

    def forward(self, x):
        return self.down(F.gelu(self.up(x))) * self.scale


def model():
    return Net()


def example_inputs():
    return {"x": torch.empty(BATCH, D_MODEL)}


tp_plan = {"up": "colwise", "down": "rowwise"}

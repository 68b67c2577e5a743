"""A forward with an op torch-mlir has no StableHLO lowering for (`rfft`)."""

import torch
from torch import nn


class Spectral(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 9)

    def forward(self, x):
        return self.fc(x) * torch.fft.rfft(x).abs()


def model():
    return Spectral()


def example_inputs():
    return {"x": torch.empty(8, 16)}

"""A PyTorch model whose forward branches on a tensor's value: torch cannot export it."""

import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:
            return y
        return -y


def model():
    return Gate()


def example_inputs():
    return {"x": torch.empty(8, 16)}

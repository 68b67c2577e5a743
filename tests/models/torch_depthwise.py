"""A MobileNet-style block in PyTorch: a pointwise convolution, then depthwise 3x3 convolutions
(one group per channel) of stride 1 and 2, global average pooling and a classifier; SGD. Its
training step needs Flint's decomposition of grouped convolutions' weight gradients (torch-mlir's
own lowering of them fails)."""

import torch
import torch.nn.functional as F
from torch import nn

CHANNELS, CLASSES = 32, 10


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.pointwise = nn.Conv2d(3, CHANNELS, 1, bias=False)
        self.depthwise = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1, groups=CHANNELS, bias=False)
        self.strided = nn.Conv2d(CHANNELS, CHANNELS, 3, stride=2, padding=1, groups=CHANNELS, bias=False)
        self.fc = nn.Linear(CHANNELS, CLASSES)

    def forward(self, x):
        x = self.strided(F.relu(self.depthwise(F.relu(self.pointwise(x)))))
        return self.fc(x.mean((2, 3)))


def model():
    return Net()


def example_inputs(batch=16, size=32):
    return {"images": torch.empty(batch, 3, size, size), "labels": torch.zeros(batch, dtype=torch.int64)}


def loss_fn(model, batch):
    return F.cross_entropy(model(batch["images"]), batch["labels"])


optimizer = "sgd"
optimizer_options = {"lr": 0.1}

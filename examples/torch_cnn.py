"""A small CNN training step in PyTorch, written as people write ResNets: convolutions, BatchNorm,
ReLU, max and average pooling and a linear classifier, cross-entropy and SGD.

    x [B, 3, 32, 32] -> conv1 3x3, 3 -> 16 channels, padding 1 -> BatchNorm -> ReLU -> MaxPool 2x2
                     -> conv2 3x3, 16 -> 32 channels, padding 1 -> BatchNorm -> ReLU -> AvgPool 2x2
                     -> flatten [B, 32 * 8 * 8] -> fc 2048 -> 10

BatchNorm's running statistics are buffers (inputs of the step, `buffers/bn1.running_mean`), its
`num_batches_tracked` counter an int64 buffer that crosses into JAX as int32. The batch is split
over every mesh axis (data parallelism); the gradients are all-reduced.

    flint extract examples/torch_cnn.py --mesh 4 -o traces/torch_cnn
"""

import torch
import torch.nn.functional as F
from torch import nn

BATCH, CLASSES = 32, 10


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32 * 8 * 8, CLASSES)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.avg_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


def model():
    return CNN()


def example_inputs():
    return {"images": torch.empty(BATCH, 3, 32, 32), "labels": torch.zeros(BATCH, dtype=torch.int64)}


def loss_fn(model, batch):
    return F.cross_entropy(model(batch["images"]), batch["labels"])


optimizer = "sgd"
optimizer_options = {"lr": 0.1}

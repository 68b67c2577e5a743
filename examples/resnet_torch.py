"""ResNet-18 in plain PyTorch, written as people write it, as a training step (or inference).

    images [B, 3, 64, 64] -> conv 7x7/2, 64 -> BatchNorm -> ReLU -> max-pool 3x3/2
        -> 4 stages of 2 BasicBlocks, 64, 128, 256, 512 channels (each stage after the first
           halves the resolution in its first block's first conv, stride 2)
        -> adaptive average pool 1x1 -> fc 512 -> 1000

A BasicBlock is conv 3x3 -> BatchNorm -> ReLU -> conv 3x3 -> BatchNorm, plus the shortcut (the
identity, or where the block downsamples a 1x1 stride-2 conv and BatchNorm), then ReLU. The
convolutions have no bias, as BatchNorm follows each. The step is cross-entropy and SGD; the
BatchNorm running statistics are buffers (inputs of the step, `buffers/layer1.0.bn1.running_mean`),
which the step reads in inference and never returns. Small images keep the extraction quick;
the layer structure is torchvision's `resnet18`.

    flint extract examples/resnet_torch.py --mesh 2x4 --strategy dp -o traces/resnet_torch
    flint extract examples/resnet_torch.py --mesh 2x4 --strategy dp --model-arg mode=forward -o traces/resnet_infer

`--model-arg batch=N` and `--model-arg size=N` (the image side) change the input.
"""

import torch
import torch.nn.functional as F
from torch import nn

CLASSES = 1000


def conv3x3(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = conv3x3(cin, cout, stride)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = conv3x3(cout, cout)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(out + shortcut)


class ResNet(nn.Module):
    def __init__(self, layers=(2, 2, 2, 2), classes=CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        widths, cin = (64, 128, 256, 512), 64
        for i, (width, blocks) in enumerate(zip(widths, layers)):
            stride = 1 if i == 0 else 2
            stage = [BasicBlock(cin, width, stride)] + [BasicBlock(width, width) for _ in range(blocks - 1)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*stage))
            cin = width
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def model():
    return ResNet()


def example_inputs(batch=8, size=64, mode="train"):
    images = {"images": torch.empty(batch, 3, size, size)}
    return images if mode == "forward" else {**images, "labels": torch.zeros(batch, dtype=torch.int64)}


def loss_fn(model, batch):
    return F.cross_entropy(model(batch["images"]), batch["labels"])


def forward(model, batch):
    return model(batch["images"])


optimizer = "sgd"
optimizer_options = {"lr": 0.1}

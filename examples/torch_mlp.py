"""`examples/mlp.py` in PyTorch: the same 2-layer bf16 MLP training step (MSE loss in f32, SGD).

Same dimensions, dtype and layout: the batch is data-parallel over every mesh axis but the tensor
axis, `fc1` is column-parallel and `fc2` row-parallel over the tensor axis (`tp_plan`, PyTorch's
tensor-parallel idiom), so the trace has the JAX example's collectives and matmuls. The weights are
`nn.Linear`'s [out_features, in_features], the transpose of the JAX file's [in, out].

    flint extract examples/torch_mlp.py --mesh 2x4 -o traces/
"""

import torch
from torch import nn

BATCH, D_MODEL, D_HIDDEN = 256, 1024, 4096
LEARNING_RATE = 0.01


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(D_MODEL, D_HIDDEN, bias=False)
        self.fc2 = nn.Linear(D_HIDDEN, D_MODEL, bias=False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def model():
    """The module, built by Flint on the meta device (no weights are allocated)."""
    return MLP().to(torch.bfloat16)


def example_inputs():
    return {
        "x": torch.empty(BATCH, D_MODEL, dtype=torch.bfloat16),
        "y": torch.empty(BATCH, D_MODEL, dtype=torch.bfloat16),
    }


def loss_fn(model, batch):
    err = (model(batch["x"]) - batch["y"]).float()
    return torch.mean(err * err)


optimizer = "sgd"
optimizer_options = {"lr": LEARNING_RATE}
tp_plan = {"fc1": "colwise", "fc2": "rowwise"}

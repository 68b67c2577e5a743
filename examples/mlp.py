"""A 2-layer MLP training step in bf16: forward, mean-squared-error loss, backward, SGD update.

Layout: the batch is data-parallel over every mesh axis but the last; the hidden dimension is
tensor-parallel over the last axis, Megatron style (`w_in` split by columns, `w_out` by rows), so the
forward pass ends in one all-reduce over the tensor axis and each weight gradient is all-reduced over
the data axes. On a 1-D mesh the step is purely data-parallel.

    flint extract examples/mlp.py --mesh 8x8 -o traces/
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

BATCH, D_MODEL, D_HIDDEN = 256, 1024, 4096
LEARNING_RATE = 0.01


def step(params, batch):
    """One SGD step; returns the updated parameters and the loss."""

    def loss_fn(params):
        hidden = jax.nn.relu(batch["x"] @ params["w_in"])
        out = hidden @ params["w_out"]
        err = (out - batch["y"]).astype(jnp.float32)
        return jnp.mean(err * err)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    new_params = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)
    return new_params, loss


def workload(mesh, batch=BATCH, width=D_MODEL, hidden=D_HIDDEN):
    """Abstract inputs of `step` on `mesh` (Flint's model-file entry point), for a batch of
    `batch` rows, `width` features and a hidden layer `hidden` wide."""
    names = mesh.axis_names
    data = names[:-1] if len(names) > 1 else names
    tensor = names[-1] if len(names) > 1 else None

    def spec(shape, *partition):
        return jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, P(*partition)))

    params = {
        "w_in": spec((width, hidden), None, tensor),
        "w_out": spec((hidden, width), tensor, None),
    }
    rows = {"x": spec((batch, width), data, None), "y": spec((batch, width), data, None)}
    return step, (params, rows)

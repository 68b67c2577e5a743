"""A mixture-of-experts FFN layer training step in bf16: top-1 routing, expert parallelism, SGD.

Layout: the FIRST mesh axis is the expert axis (`data` in a positional mesh, `ep` ways). The
`EXPERTS` experts' weights are split over it, `EXPERTS / ep` whole experts per rank, and replicated
over any other axes, which act as plain data parallelism for them. The `TOKENS` tokens are split over
every mesh axis, so each rank routes its own `TOKENS / ranks` tokens.

The layer is written with `jax.shard_map` (every axis manual), so the communication is exactly what
the model asks for. Per rank:

    router:   logits = x @ w_router, softmax, top-1 expert and its probability (the gate)
    dispatch: each token gets slot `position-in-its-expert` of a [EXPERTS, CAPACITY, D_MODEL] buffer
              (a one-hot einsum); tokens past CAPACITY for their expert are dropped
    all_to_all over the expert axis: rank j receives expert slices j*E/ep.. of every rank's buffer,
              [EXPERTS/ep, ep*CAPACITY, D_MODEL]
    experts:  relu(x @ w_in) @ w_out per local expert (batched einsums)
    all_to_all back, then combine: y = sum over slots of gate * expert output (a one-hot einsum)

The loss is a mean squared error against a target, computed outside the shard_map.

Expected collectives per rank, on a mesh (ep, rest...):
  - all_to_all over the expert-axis group: 2 in the forward pass (dispatch, return) and 1 in the
    backward pass (the transpose of the return). The dispatch has no backward all_to_all: the tokens
    are an input and the one-hot routing has no gradient, so nothing flows back through it.
    Each moves EXPERTS * CAPACITY * D_MODEL bf16 per rank.
  - all_reduce of the router gradient over all ranks (the router is replicated everywhere);
  - all_reduce of each expert weight gradient over the other axes (if any; the expert replicas);
  - all_reduce of the f32 loss over all ranks.

    flint extract examples/moe.py --mesh 4x2 -o traces/
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

TOKENS, D_MODEL, D_FF, EXPERTS = 512, 128, 256, 8
CAPACITY = 16
"""Slots per expert in each rank's dispatch buffer (tokens one rank may send to one expert)."""
LEARNING_RATE = 0.01


def moe_layer(mesh):
    """The expert-parallel layer as a shard_map over `mesh` (first axis: experts)."""
    names = mesh.axis_names
    expert_axis = names[0]

    def local(x, w_router, w_in, w_out):
        # x: [t, D] this rank's tokens; w_in: [E/ep, D, F]; w_out: [E/ep, F, D]
        logits = x @ w_router  # [t, E]
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        expert = jnp.argmax(probs, axis=-1)  # [t]
        chosen = jax.nn.one_hot(expert, EXPERTS, dtype=jnp.int32)  # [t, E]
        gate = jnp.sum(probs * chosen, axis=-1)  # [t], differentiable through probs
        position = jnp.sum((jnp.cumsum(chosen, axis=0) - 1) * chosen, axis=-1)  # [t]
        # one_hot of a position >= CAPACITY is all zeros: the token is dropped.
        slot = jax.nn.one_hot(position, CAPACITY, dtype=x.dtype)  # [t, C]
        dispatch = chosen.astype(x.dtype)[:, :, None] * slot[:, None, :]  # [t, E, C]
        combine = dispatch * gate.astype(x.dtype)[:, None, None]

        buffers = jnp.einsum("tec,td->ecd", dispatch, x)  # [E, C, D]
        buffers = jax.lax.all_to_all(buffers, expert_axis, 0, 1, tiled=True)  # [E/ep, ep*C, D]
        hidden = jax.nn.relu(jnp.einsum("ecd,edf->ecf", buffers, w_in))
        out = jnp.einsum("ecf,efd->ecd", hidden, w_out)  # [E/ep, ep*C, D]
        out = jax.lax.all_to_all(out, expert_axis, 1, 0, tiled=True)  # [E, C, D]
        return jnp.einsum("tec,ecd->td", combine, out)

    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(P(names), P(), P(expert_axis), P(expert_axis)),
        out_specs=P(names),
    )


def make_step(mesh):
    layer = moe_layer(mesh)

    def step(params, batch):
        """One SGD step; returns the updated parameters and the loss."""

        def loss_fn(params):
            y = layer(batch["x"], params["w_router"], params["w_in"], params["w_out"])
            err = (y - batch["y"]).astype(jnp.float32)
            return jnp.mean(err * err)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        new_params = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)
        return new_params, loss

    return step


def workload(mesh):
    """Abstract inputs of the step on `mesh` (Flint's model-file entry point)."""
    names = mesh.axis_names

    def spec(shape, *partition):
        return jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, P(*partition)))

    params = {
        "w_router": spec((D_MODEL, EXPERTS)),
        "w_in": spec((EXPERTS, D_MODEL, D_FF), names[0]),
        "w_out": spec((EXPERTS, D_FF, D_MODEL), names[0]),
    }
    batch = {"x": spec((TOKENS, D_MODEL), names), "y": spec((TOKENS, D_MODEL), names)}
    return make_step(mesh), (params, batch)

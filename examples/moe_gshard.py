"""A mixture-of-experts FFN layer training step written for the compiler (GShard style), bf16, SGD.

Unlike `moe.py`, which moves tokens itself with `shard_map` and `all_to_all`, this step is plain
`jit` code: it names the logical axes of its inputs and of the dispatched tokens, and the layout
(`--strategy ep`, `--rule`, or this file's `logical_rules`) decides where they live. XLA's
partitioner then writes the communication, so the same file runs expert-parallel, data-parallel or
anything in between.

Model, per step: the `TOKENS` tokens are cut into `GROUPS` groups of `TOKENS / GROUPS` (the unit the
batch is split by). Per group, top-1 routing with `CAPACITY` slots per expert (tokens past it are
dropped), then

    dispatch: buffers[e, g, c, :] = the token of group g in slot c of expert e  (a one-hot einsum)
    experts:  relu(buffers @ w_in[e]) @ w_out[e]
    combine:  y[g, s, :] = gate * the expert output of token s's slot           (a one-hot einsum)

and a mean squared error against a target.

Logical axes: `batch` (token groups), `expert` (the experts of `w_in`, `w_out` and of the dispatched
buffers), `embed` (D_MODEL), `mlp` (D_FF). The dispatched buffers [expert, groups, capacity, embed]
leave `groups` to the compiler. Under `--strategy ep` on a mesh (ep, rest...) the groups are split over
every axis and the experts over the first one, so each rank sends every other rank of its expert
group the tokens routed to that rank's experts, and gets their outputs back:

    all_to_all over the expert group: dispatch and return in forward, the return's transpose in
    backward (the dispatch's input gradient is not needed: the tokens are an input);
    all_reduce of the router gradient over all ranks, of each expert weight gradient over the
    expert's replicas (the other axes), and of the f32 loss.

    flint extract examples/moe_gshard.py --mesh 4x2 --strategy ep -o traces/
"""

import jax
import jax.numpy as jnp

from flint.sharding import constrain, logical

TOKENS, D_MODEL, D_FF, EXPERTS = 1024, 128, 256, 8
GROUPS, CAPACITY = 8, 16
GROUP_SIZE = TOKENS // GROUPS
LEARNING_RATE = 0.01
DTYPE = jnp.bfloat16

BUFFERS = ("expert", "groups", None, None)
"""The dispatched tokens [experts, groups, capacity, d_model]; `groups` has no rule: the compiler's."""


def moe(x, params):
    """x: [groups, group_size, d_model] -> the layer's output, same shape."""
    logits = jnp.einsum("gsd,de->gse", x, params["router"])
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    chosen = jax.nn.one_hot(jnp.argmax(probs, axis=-1), EXPERTS, dtype=jnp.int32)  # [g, s, e]
    gate = jnp.sum(probs * chosen, axis=-1)  # [g, s]
    position = jnp.sum((jnp.cumsum(chosen, axis=1) - 1) * chosen, axis=-1)  # slot in its expert
    slot = jax.nn.one_hot(position, CAPACITY, dtype=x.dtype)  # all zeros past CAPACITY: dropped
    dispatch = chosen.astype(x.dtype)[..., None] * slot[:, :, None, :]  # [g, s, e, c]
    combine = dispatch * gate.astype(x.dtype)[..., None, None]

    buffers = constrain(jnp.einsum("gsec,gsd->egcd", dispatch, x), BUFFERS)
    hidden = jax.nn.relu(jnp.einsum("egcd,edf->egcf", buffers, params["experts"]["w_in"]))
    out = constrain(jnp.einsum("egcf,efd->egcd", hidden, params["experts"]["w_out"]), BUFFERS)
    return jnp.einsum("gsec,egcd->gsd", combine, out)


def step(params, batch):
    """One SGD step; returns the updated parameters and the loss."""

    def loss_fn(params):
        err = (moe(batch["x"], params) - batch["y"]).astype(jnp.float32)
        return jnp.mean(err * err)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads), loss


def workload(mesh):
    """Abstract inputs named by logical axes (Flint's model-file entry point)."""
    del mesh  # the layout comes from the logical axes
    params = {
        "router": logical((D_MODEL, EXPERTS), DTYPE, ("embed", None)),
        "experts": {
            "w_in": logical((EXPERTS, D_MODEL, D_FF), DTYPE, ("expert", "embed", "mlp")),
            "w_out": logical((EXPERTS, D_FF, D_MODEL), DTYPE, ("expert", "mlp", "embed")),
        },
    }
    tokens = logical((GROUPS, GROUP_SIZE, D_MODEL), DTYPE, ("batch", None, "embed"))
    return step, (params, {"x": tokens, "y": tokens})


def logical_rules(mesh):
    """Expert parallelism over the first mesh axis; token groups over every axis, and in the
    dispatched buffers over the others."""
    names = tuple(mesh.axis_names)
    return {"batch": names[1:] + names[:1], "expert": names[:1], "groups": names[1:]}

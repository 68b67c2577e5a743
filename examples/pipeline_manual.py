"""GPT pipelined by hand: GPipe over a stage axis with `jax.shard_map` and `lax.ppermute`.

The model is `examples/gpt.py`'s (its blocks, layernorm, cross-entropy and AdamW are imported from
there) with LAYERS layers. The mesh has a stage axis `pp` (S stages) and any other axes, which
together make the data group (dp ways): `--mesh pp=4` or `--mesh pp=4,dp=2`. Parameters of the
layers are stacked along a leading LAYERS axis split over `pp`, so stage s holds layers
[s·LAYERS/S, (s+1)·LAYERS/S); the embedding, final layernorm and head are replicated on every stage.

The step is one `shard_map` over the whole mesh (every axis manual). Each rank:

1. looks up the embedding of its batch shard (b = BATCH/dp sequences) and splits it into
   MICROBATCHES microbatches of mb = b/MICROBATCHES sequences;
2. runs the GPipe loop for T = MICROBATCHES + S - 1 ticks: at tick t stage 0 takes microbatch t
   (while t < MICROBATCHES), every stage runs its layers (a `lax.scan`) on what it holds, and
   after every tick but the last the result moves one stage on: `ppermute` over `pp` with pairs
   (s, s+1) for s < S-1. The last stage's results of ticks S-1 .. T-1 are the microbatches' outputs;
3. runs the final layernorm, the head and the f32 cross-entropy; the loss is the last stage's,
   summed over `pp` (the other stages contribute 0) and averaged over the data group.

It is SPMD, as written: every stage computes every tick (bubble ticks on zeros) and every stage
computes the lookup, the head and the loss, of which only stage 0's and the last stage's count.
`jax.grad` transposes each forward `ppermute` into one with the pairs reversed.

Expected point-to-point traffic per rank (stage s of S, mesh row-major, so the peer of rank r at
stage s+1 is the rank at the same position of the other axes):
- forward: T - 1 = MICROBATCHES + S - 2 collective-permutes, each a SEND to stage s+1 (s < S-1) and
  a RECV from stage s-1 (s > 0) of one microbatch's activation, bf16 [mb, SEQ, D_MODEL]:
  mb·SEQ·D_MODEL·2 bytes;
- backward: as many, reversed (SEND to s-1, RECV from s+1), of the activation's gradient, same size.
Collectives, all all-reduces: JAX sums the gradient of a value that is the same on every rank of
an axis wherever it meets per-rank work, so over `pp` the gradients of the replicated parameters
(embedding, final layernorm, head), each microbatch's embedding output (stage 0's `where` picks
it) and the f32 loss; with a data group, over it every layer's gradient once per tick (the stacked
layers are replicated over the data group and used once per tick), the other parameters' gradients
and the loss.

    flint extract examples/pipeline_manual.py --mesh pp=4 -o traces/
"""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import gpt

STAGE_AXIS = "pp"
LAYERS, MICROBATCHES = 8, 4


def data_axes(mesh):
    return tuple(name for name in mesh.axis_names if name != STAGE_AXIS)


def run_stage(x, layers):
    """This stage's layers, one `lax.scan` over its share of the stacked parameters."""

    def body(x, p):
        return gpt.block(x, p), None

    return jax.lax.scan(body, x, layers)[0]


def gpipe(layers, microbatches):
    """GPipe's forward over the stage axis: microbatches [M, mb, SEQ, D] in, the last stage's
    outputs [M, mb, SEQ, D] out (other stages return what passed through them)."""
    stages = jax.lax.axis_size(STAGE_AXIS)
    stage = jax.lax.axis_index(STAGE_AXIS)
    count = microbatches.shape[0]
    to_next = [(s, s + 1) for s in range(stages - 1)]
    state = jnp.zeros_like(microbatches[0])
    outputs = []
    ticks = count + stages - 1
    for tick in range(ticks):
        if tick < count:
            state = jnp.where(stage == 0, microbatches[tick], state)
        state = run_stage(state, layers)
        if tick >= stages - 1:
            outputs.append(state)
        if tick < ticks - 1:
            state = jax.lax.ppermute(state, STAGE_AXIS, to_next)
    return jnp.stack(outputs)


def make_loss(mesh):
    data = data_axes(mesh)

    def per_rank(params, batch):
        stage = jax.lax.axis_index(STAGE_AXIS)
        last = jax.lax.axis_size(STAGE_AXIS) - 1
        x = jnp.take(params["embed"], batch["tokens"], axis=0)
        x = x.reshape(MICROBATCHES, -1, *x.shape[1:])
        x = gpipe(params["layers"], x).reshape(-1, *x.shape[2:])
        x = gpt.layernorm(x, params["ln_f_scale"], params["ln_f_bias"])
        loss = gpt.cross_entropy(x @ params["head"], batch["targets"])
        loss = jax.lax.psum(jnp.where(stage == last, loss, 0.0), STAGE_AXIS)
        return jax.lax.pmean(loss, data) if data else loss

    return jax.shard_map(
        per_rank, mesh=mesh, in_specs=(param_specs(mesh), P(data or None)), out_specs=P()
    )


def param_specs(mesh):
    layers = {name: P(STAGE_AXIS) for name in gpt.LAYER_SHAPES}
    return {"layers": layers, **{name: P() for name in gpt.TOP_SHAPES}}


def workload(mesh):
    """The step and its abstract inputs on a mesh with a `pp` axis (Flint's entry point)."""
    if STAGE_AXIS not in mesh.axis_names:
        raise ValueError(f"the mesh needs a stage axis named {STAGE_AXIS!r}, e.g. --mesh pp=4")
    loss_fn = make_loss(mesh)

    def step(params, opt, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        params, opt = gpt.adamw(params, grads, opt)
        return params, opt, loss

    params, opt = gpt.abstract_state(mesh, param_specs(mesh), gpt.shapes(LAYERS))
    return step, (params, opt, gpt.abstract_batch(mesh, P(data_axes(mesh) or None)))

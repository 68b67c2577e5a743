"""A decoder-only transformer (GPT) training step: forward, f32 cross-entropy, backward, AdamW.

Model: token embedding (a gather from `embed`), LAYERS identical blocks run by one `jax.lax.scan` over
stacked parameters, each block

    x = x + attn(layernorm(x))      causal multi-head attention: q, k, v and output projections
    x = x + mlp(layernorm(x))       w_in -> gelu -> w_out

then a final layernorm, a separate LM head (`head`, not tied to `embed`) and softmax cross-entropy in
f32. Parameters and activations are bf16; layernorm statistics, softmax and the loss are f32. The update
is AdamW written out by hand: first and second moments (`m`, `v`) in f32, decoupled weight decay, bias
correction from an int32 step counter kept in the optimizer state.

Layout (this file, `workload`), on a mesh whose last axis is `tensor` (tp ways) and whose other axes
together make the data group (dp ways):

- the batch (tokens and targets) is split over the data axes; every parameter and its optimizer state
  is replicated over them (plain data parallelism);
- Megatron tensor parallelism over the last axis: the heads of `wq`, `wk`, `wv` and the columns of
  `w_in` are split (column-parallel), `wo` (by heads) and `w_out` (by rows) are row-parallel, so each
  block's attention and MLP outputs are summed over the tensor group in forward, and the input
  gradients of `w_in` and of `wq`, `wk`, `wv` are summed over it in backward;
- the vocabulary is split too (Megatron's vocab-parallel embedding and head): `embed` by rows and
  `head` by columns over the tensor axis. The lookup reads only the rows a rank holds (zeros for the
  other tokens) and the partial embeddings are summed over the tensor group; the logits stay split by
  vocabulary, so the cross-entropy's max, sum of exponentials and target logit are reduced over the
  tensor group (f32, one value per token) instead of gathering the logits;
- layernorm scales and biases are replicated.

Expected collectives per rank and step, all all-reduces (tensor group = the rank's mesh row, data
group = its mesh column; b = BATCH/dp):
- tensor group, bf16 [b, SEQ, D_MODEL]: the lookup; 2 per layer in forward; the head's input gradient;
  4 per layer in backward (w_in's input gradient, then q's, k's and v's one by one: XLA's partitioner
  reduces each partial-sum matmul on its own at this stage, not their sum);
- tensor group, f32 [b, SEQ]: 3 in the loss;
- data group: every parameter gradient at its TP-local size (each block's 10 inside the backward
  loop, LAYERS times; layernorm gradients in f32, as the layernorm applies its parameters in f32),
  and the f32 scalar loss.
The layer scans become `while` loops of LAYERS trips, one in forward and one in backward; Flint
unrolls them, so the per-layer collectives appear LAYERS times in the trace.

`examples/fsdp.py` reuses this model with ZeRO-3 / FSDP shardings (see there).

    flint extract examples/gpt.py --mesh 2x4 -o traces/
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from flint.sharding import constrain

VOCAB, D_MODEL, HEADS, D_FF, LAYERS, SEQ, BATCH = 2048, 256, 8, 768, 3, 128, 16
D_HEAD = D_MODEL // HEADS
LEARNING_RATE, BETA1, BETA2, EPS, WEIGHT_DECAY = 3e-4, 0.9, 0.95, 1e-8, 0.1
LN_EPS = 1e-5

PARAM, STATE = jnp.bfloat16, jnp.float32


def mesh_axes(mesh):
    """(data axes, tensor axis): every axis but the last is data; the last is tensor (None on 1-D)."""
    names = tuple(mesh.axis_names)
    if len(names) == 1:
        return names, None
    return names[:-1], names[-1]


# Logical axes of the activations (resolved by `logical_rules` or Flint's layout flags). The residual
# stream between sublayers names its sequence axis `seq`, whole here, so a layout can split it
# (Megatron sequence parallelism, `--strategy dp+tp+sp`); the sublayers read whole sequences, their
# q, k, v are split by heads and their MLP hidden by columns (Megatron's column-parallel outputs).
RESIDUAL = ("batch", "seq", None)
ACTIVATION = ("batch", None, None)
HEADS_SPLIT = ("batch", None, "heads", None)
MLP_SPLIT = ("batch", None, "mlp")


def tp_layout(data, tensor):
    """PartitionSpecs of every parameter for DP + Megatron TP (parameters replicated over `data`)."""
    del data
    layers = {
        "ln1_scale": P(),
        "ln1_bias": P(),
        "wq": P(None, None, tensor, None),  # column-parallel: heads split
        "wk": P(None, None, tensor, None),
        "wv": P(None, None, tensor, None),
        "wo": P(None, tensor, None, None),  # row-parallel: heads split
        "ln2_scale": P(),
        "ln2_bias": P(),
        "w_in": P(None, None, tensor),  # column-parallel
        "w_out": P(None, tensor, None),  # row-parallel
    }
    top = {
        "embed": P(tensor, None),  # vocab-parallel embedding: rows split
        "ln_f_scale": P(),
        "ln_f_bias": P(),
        "head": P(None, tensor),  # vocab-parallel head: columns split
    }
    return {"layers": layers, **top}


# ----------------------------------------------------------------------------------------- model


def layernorm(x, scale, bias):
    """Layernorm over the last axis with f32 statistics; returns the input's dtype."""
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + LN_EPS)
    return (y * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def attention(x, p):
    """Causal multi-head self-attention of x [batch, seq, d_model]."""
    q, k, v = (constrain(jnp.einsum("bsd,dhk->bshk", x, p[w]), HEADS_SPLIT) for w in ("wq", "wk", "wv"))
    scores = jnp.einsum("bshk,bthk->bhst", q, k).astype(jnp.float32) * (q.shape[-1] ** -0.5)
    causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
    out = jnp.einsum("bhst,bthk->bshk", probs, v)
    return jnp.einsum("bshk,hkd->bsd", out, p["wo"])


def mlp(x, p):
    return jax.nn.gelu(constrain(x @ p["w_in"], MLP_SPLIT)) @ p["w_out"]


def block(x, p):
    x = x + attention(constrain(layernorm(x, p["ln1_scale"], p["ln1_bias"]), ACTIVATION), p)
    x = constrain(x, RESIDUAL)
    x = x + mlp(constrain(layernorm(x, p["ln2_scale"], p["ln2_bias"]), ACTIVATION), p)
    return constrain(x, RESIDUAL)


def cross_entropy(logits, targets):
    """Mean softmax cross-entropy in f32; written out so the vocab-split reductions are visible."""
    logits = logits.astype(jnp.float32)
    top = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    lse = jnp.log(jnp.sum(jnp.exp(logits - top), axis=-1)) + top[..., 0]
    hit = targets[..., None] == jnp.arange(logits.shape[-1], dtype=targets.dtype)
    target_logit = jnp.sum(jnp.where(hit, logits, 0.0), axis=-1)
    return jnp.mean(lse - target_logit)


def loss_fn(params, batch):
    # The lookup reads the table vocab-split with D_MODEL whole: a no-op for this file's layout; under
    # FSDP (fsdp.py) it is the table's ZeRO-3 all-gather before use, like every other parameter's.
    table = constrain(params["embed"], ("vocab", None))
    x = constrain(jnp.take(table, batch["tokens"], axis=0), RESIDUAL)

    def body(x, p):
        return block(x, p), None

    x, _ = jax.lax.scan(body, x, params["layers"])
    x = layernorm(x, params["ln_f_scale"], params["ln_f_bias"])
    return cross_entropy(x @ params["head"], batch["targets"])


# ----------------------------------------------------------------------------------- optimizer


def adamw(params, grads, opt):
    """AdamW with f32 moments; params stay bf16 (updated in f32, rounded once)."""
    count = opt["count"] + 1
    step = count.astype(jnp.float32)
    correct1 = 1.0 - BETA1**step
    correct2 = 1.0 - BETA2**step

    def moments(m, v, g):
        g = g.astype(STATE)
        return BETA1 * m + (1.0 - BETA1) * g, BETA2 * v + (1.0 - BETA2) * g * g

    new = jax.tree.map(moments, opt["m"], opt["v"], grads)
    m = jax.tree.map(lambda _, mv: mv[0], grads, new)
    v = jax.tree.map(lambda _, mv: mv[1], grads, new)

    def update(p, m, v):
        pf = p.astype(STATE)
        delta = (m / correct1) / (jnp.sqrt(v / correct2) + EPS) + WEIGHT_DECAY * pf
        return (pf - LEARNING_RATE * delta).astype(p.dtype)

    return jax.tree.map(update, params, m, v), {"m": m, "v": v, "count": count}


def step(params, opt, batch):
    """One AdamW step; returns the new parameters, the new optimizer state and the loss."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    params, opt = adamw(params, grads, opt)
    return params, opt, loss


# -------------------------------------------------------------------------------------- inputs


def shapes(layers=LAYERS, vocab=VOCAB, width=D_MODEL):
    """Shape of every parameter of a model with `layers` blocks, a `vocab`-word vocabulary and a
    residual stream `width` wide (HEADS heads of width / HEADS, an MLP 3 * width wide)."""
    head, ff = width // HEADS, 3 * width
    layer = {
        "ln1_scale": (width,), "ln1_bias": (width,),
        "wq": (width, HEADS, head), "wk": (width, HEADS, head), "wv": (width, HEADS, head),
        "wo": (HEADS, head, width),
        "ln2_scale": (width,), "ln2_bias": (width,),
        "w_in": (width, ff), "w_out": (ff, width),
    }
    top = {"embed": (vocab, width), "ln_f_scale": (width,), "ln_f_bias": (width,), "head": (width, vocab)}
    return {"layers": {name: (layers, *shape) for name, shape in layer.items()}, **top}


LAYER_SHAPES = shapes()["layers"]
"""Shape of every per-block parameter, stacked along a leading LAYERS axis."""
TOP_SHAPES = {name: shape for name, shape in shapes().items() if name != "layers"}


def abstract_state(mesh, specs, shapes):
    """(params, opt) as ShapeDtypeStructs laid out by the PartitionSpecs `specs`."""

    def tree(dtype):
        return jax.tree.map(
            lambda shape, spec: jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec)),
            shapes,
            specs,
            is_leaf=lambda s: isinstance(s, tuple) and all(isinstance(d, int) for d in s),
        )

    opt = {
        "m": tree(STATE),
        "v": tree(STATE),
        "count": jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P())),
    }
    return tree(PARAM), opt


def abstract_batch(mesh, spec, batch=BATCH, seq=SEQ):
    """Tokens and targets [batch, seq], laid out by the PartitionSpec `spec`."""
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=NamedSharding(mesh, spec))
    return {"tokens": tokens, "targets": tokens}


def workload(mesh, layout=tp_layout, layers=LAYERS, vocab=VOCAB, width=D_MODEL, batch=BATCH, seq=SEQ):
    """Abstract inputs of `step` on `mesh` (Flint's model-file entry point). The model's size is
    set by its arguments (`flint extract --model-arg layers=12 --model-arg width=1024`);
    `examples/fsdp.py` calls it with its ZeRO-3 layout."""
    data, tensor = mesh_axes(mesh)
    params, opt = abstract_state(mesh, layout(data, tensor), shapes(layers, vocab, width))
    return step, (params, opt, abstract_batch(mesh, P(data, None), batch, seq))


def logical_rules(mesh):
    """The logical axes of the step's constraints: activations batch-split over the data axes with
    whole sequences, the embedding table read vocab-split and the heads and MLP hidden split over
    the tensor axis (Flint's `--rule` and `--strategy` replace these)."""
    data, tensor = mesh_axes(mesh)
    return {"batch": data, "seq": (), "vocab": tensor, "heads": tensor, "mlp": tensor}

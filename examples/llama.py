"""A Llama-style training step, written as Megatron-LM writes it: `step(params, opt, tokens, targets)`.

Model (Llama 3's architecture): token embedding, LAYERS blocks under one `jax.lax.scan`, each

    x = x + attn(rmsnorm(x))      grouped-query causal attention with rotary positions:
                                  HEADS query heads share KV_HEADS key and value heads
    x = x + mlp(rmsnorm(x))       SwiGLU: (silu(x @ w_gate) * (x @ w_up)) @ w_down

then a final RMSNorm, an untied LM head and f32 cross-entropy; AdamW as in `examples/gpt.py`.
Parameters and activations are bf16.

Logical names (the step's constraints; `--strategy` maps them, `logical_rules` gives this file's
own layout):

- `batch`: the batch's rows; `seq`: the residual stream's sequence (Megatron sequence parallelism
  splits it over the tensor axis, `dp+tp+sp`);
- `context`: the sequence of everything else the sublayers compute, queries included, which
  context parallelism (`--strategy dp+cp+tp`) splits over the mesh's `context` axis. Keys and
  values are named with their sequence whole, so each attention gathers them over the context
  axis (and its backward reduce-scatters their gradients), as Llama 3's all-gather context
  parallelism does; every other preset keeps `context` whole;
- `heads`, `mlp`, `vocab`: Megatron tensor parallelism (query and key-value heads, the MLP's
  hidden, the vocabulary).

Llama 3 405B (Dubey et al., 2024, table 3): `--model-arg layers=126 --model-arg width=16384
--model-arg heads=128 --model-arg kv_heads=8 --model-arg ffn=53248 --model-arg vocab=128256`.

    flint extract examples/llama.py --mesh data=2,context=2,tensor=2 --strategy dp+cp+tp -o traces/
"""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from flint.sharding import constrain, logical

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpt  # AdamW and the cross-entropy  # noqa: E402

sys.path.pop(0)

VOCAB, WIDTH, HEADS, KV_HEADS, FFN, LAYERS, SEQ, BATCH = 2048, 256, 8, 4, 704, 4, 256, 8
ROPE_THETA, NORM_EPS = 500_000.0, 1e-5
PARAM, STATE = jnp.bfloat16, jnp.float32

RESIDUAL = ("batch", "seq", None)
ACTIVATION = ("batch", "context", None)
QUERIES = ("batch", "context", "heads", None)
KEYS = ("batch", None, "heads", None)  # whole sequence: gathered over the context axis
HIDDEN = ("batch", "context", "mlp")
LOGITS = ("batch", "context", "vocab")


def rmsnorm(x, scale):
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + NORM_EPS)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def rotary(x):
    """Rotary position embedding of x [batch, seq, heads, head_dim] at positions 0..seq-1."""
    half = x.shape[-1] // 2
    frequencies = ROPE_THETA ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] * frequencies
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def attention(x, p):
    """Grouped-query causal attention: each key-value head serves HEADS / KV_HEADS query heads."""
    b, s, _ = x.shape
    q, k, v = (constrain(jnp.einsum("bsd,dhk->bshk", x, p[w]), QUERIES) for w in ("wq", "wk", "wv"))
    # computed on the rank's own positions, then gathered (bf16, after the rotation)
    q, k, v = constrain(rotary(q), QUERIES), constrain(rotary(k), QUERIES), v
    k, v = constrain(k, KEYS), constrain(v, KEYS)
    kv_heads, head_dim = k.shape[2], k.shape[3]
    q = q.reshape(b, s, kv_heads, q.shape[2] // kv_heads, head_dim)
    scores = jnp.einsum("bskgd,btkd->bkgst", q, k).astype(jnp.float32) * head_dim**-0.5
    causal = jnp.arange(s)[:, None] >= jnp.arange(s)[None, :]
    probs = jax.nn.softmax(jnp.where(causal, scores, jnp.finfo(jnp.float32).min), axis=-1)
    out = jnp.einsum("bkgst,btkd->bskgd", probs.astype(x.dtype), v).reshape(b, s, -1, head_dim)
    return jnp.einsum("bshk,hkd->bsd", constrain(out, QUERIES), p["wo"])


def mlp(x, p):
    gate = constrain(x @ p["w_gate"], HIDDEN)
    up = constrain(x @ p["w_up"], HIDDEN)
    return (jax.nn.silu(gate) * up) @ p["w_down"]


def block(x, p):
    x = constrain(x + attention(constrain(rmsnorm(x, p["attn_norm"]), ACTIVATION), p), RESIDUAL)
    return constrain(x + mlp(constrain(rmsnorm(x, p["mlp_norm"]), ACTIVATION), p), RESIDUAL)


def loss_fn(params, tokens, targets):
    x = constrain(jnp.take(params["embed"], tokens, axis=0), RESIDUAL)
    x, _ = jax.lax.scan(lambda x, p: (block(x, p), None), x, params["layers"])
    x = constrain(rmsnorm(x, params["norm"]), ACTIVATION)
    return gpt.cross_entropy(constrain(x @ params["head"], LOGITS), targets)


def step(params, opt, tokens, targets):
    """One AdamW step on the batch `tokens`, `targets` [batch, seq]."""
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
    params, opt = gpt.adamw(params, grads, opt)
    return params, opt, loss


def shapes(layers, width, heads, kv_heads, ffn, vocab):
    """(shape, logical names) of every parameter."""
    head_dim = width // heads
    layer = {
        "attn_norm": ((width,), (None,)),
        "wq": ((width, heads, head_dim), (None, "heads", None)),
        "wk": ((width, kv_heads, head_dim), (None, "heads", None)),
        "wv": ((width, kv_heads, head_dim), (None, "heads", None)),
        "wo": ((heads, head_dim, width), ("heads", None, None)),
        "mlp_norm": ((width,), (None,)),
        "w_gate": ((width, ffn), (None, "mlp")),
        "w_up": ((width, ffn), (None, "mlp")),
        "w_down": ((ffn, width), ("mlp", None)),
    }
    top = {
        "embed": ((vocab, width), ("vocab", None)),
        "norm": ((width,), (None,)),
        "head": ((width, vocab), (None, "vocab")),
    }
    stacked = {name: ((layers, *shape), (None, *names)) for name, (shape, names) in layer.items()}
    return {"layers": stacked, **top}


def workload(
    mesh, layers=LAYERS, width=WIDTH, heads=HEADS, kv_heads=KV_HEADS, ffn=FFN, vocab=VOCAB,
    batch=BATCH, seq=SEQ,
):
    """Abstract inputs of `step`, laid out by logical names (Flint's model-file entry point)."""
    del mesh  # laid out by `logical_rules` or `--strategy`

    def tree(dtype):
        return jax.tree.map(
            lambda item: logical(item[0], dtype, item[1]),
            shapes(layers, width, heads, kv_heads, ffn, vocab),
            is_leaf=lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], tuple),
        )

    opt = {"m": tree(STATE), "v": tree(STATE), "count": logical((), jnp.int32, ())}
    tokens = logical((batch, seq), jnp.int32, ("batch", "context"))
    return step, (tree(PARAM), opt, tokens, tokens)


def logical_rules(mesh):
    """This file's own layout: the batch over every axis but `context` and `tensor`, the sequence
    over `context` (context parallelism) where the mesh has one, Megatron TP over `tensor`."""
    names = tuple(mesh.axis_names)
    context = tuple(n for n in names if n == "context")
    tensor = tuple(n for n in names if n == "tensor")
    data = tuple(n for n in names if n not in context + tensor)
    return {
        "batch": data, "seq": context, "context": context, "heads": tensor, "mlp": tensor, "vocab": tensor,
    }

"""Decoder-only transformers for checking predictions against real GPUs: GPT- or Llama-style, a
training step or a decode step.

`arch="gpt"`: learned positions, LayerNorm with bias, multi-head attention with biased fused QKV,
GELU MLP of `ffn` (default 4 x hidden), untied head (Megatron-LM's GPT).
`arch="llama"`: rotary positions, RMSNorm, grouped-query attention (`kv_heads` key/value heads),
SwiGLU MLP of `ffn`, no biases, untied head (Llama 3).

`mode="train"`: one training step on `batch` sequences of `seq` tokens: f32 cross-entropy, backward,
Adam with bias correction (bf16 parameters, f32 moments); every block under `jax.checkpoint` and the
layers under one `lax.scan` over stacked parameters (`scan=False`: a Python loop over one parameter
dict per layer, as PyTorch holds them, so that no kernel slices a layer out of a stacked buffer).
It returns the new parameters, moments and step count, which replace (and so donate) the ones it
was given.

`mode="decode"`: one new token for each of `batch` sequences against a KV cache of `seq` positions,
at position `pos` (an input): the layers run under `lax.scan` over the stacked weights and the
stacked cache, each writing its key and value at `pos` (an in-place dynamic-update-slice) and
attending over the cache up to `pos`. It returns the logits and the updated cache, which replaces
(donates) the one it was given. These are the two patterns where a kernel touches a slice of a far
larger buffer: the scan's per-layer slice of stacked weights and the cache update.

Layout: the batch is split over every mesh axis (data parallel); parameters are replicated. The
programs are meant for one GPU (`--mesh data=1`):

    flint extract bench/models/decoder.py --mesh data=1 --backend gpu:h100 \\
        --model-arg arch=llama --model-arg mode=decode --model-arg layers=32 ...
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

PARAM, STATE = jnp.bfloat16, jnp.float32
BETA1, BETA2, LEARNING_RATE, EPS = 0.9, 0.95, 1e-4, 1e-8
NORM_EPS, ROPE_BASE = 1e-5, 500000.0


def layer_shapes(arch, hidden, heads, kv_heads, ffn, head_dim):
    if arch == "gpt":
        return {
            "ln1_s": (hidden,), "ln1_b": (hidden,), "wqkv": (hidden, 3, heads, head_dim),
            "bqkv": (3, heads, head_dim), "wo": (heads, head_dim, hidden), "bo": (hidden,),
            "ln2_s": (hidden,), "ln2_b": (hidden,), "w_in": (hidden, ffn), "b_in": (ffn,),
            "w_out": (ffn, hidden), "b_out": (hidden,),
        }
    if arch == "llama":
        return {
            "n1": (hidden,), "wq": (hidden, heads, head_dim), "wkv": (hidden, 2, kv_heads, head_dim),
            "wo": (heads, head_dim, hidden), "n2": (hidden,), "w_gate_up": (hidden, 2, ffn),
            "w_down": (ffn, hidden),
        }
    raise ValueError(f"arch must be 'gpt' or 'llama', not {arch!r}")


def param_shapes(arch, layers, hidden, heads, kv_heads, ffn, head_dim, seq, vocab, scan=True):
    """Each layer's parameters stacked along a leading axis of `layers` (for `lax.scan`), or with
    `scan=False` a list of one dict per layer, as PyTorch and Megatron-LM hold them."""
    top = {"embed": (vocab, hidden), "head": (hidden, vocab)}
    top.update({"pos": (seq, hidden), "lnf_s": (hidden,), "lnf_b": (hidden,)} if arch == "gpt"
               else {"nf": (hidden,)})
    shapes = layer_shapes(arch, hidden, heads, kv_heads, ffn, head_dim)
    if not scan:
        return {**top, "layers": [dict(shapes) for _ in range(layers)]}
    return {**top, "layers": {k: (layers, *s) for k, s in shapes.items()}}


def layernorm(x, scale, bias):
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mean).mean(-1, keepdims=True)
    return ((xf - mean) * jax.lax.rsqrt(var + NORM_EPS) * scale.astype(jnp.float32)
            + bias.astype(jnp.float32)).astype(x.dtype)


def rmsnorm(x, scale):
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + NORM_EPS)
    return (xf * scale.astype(jnp.float32)).astype(x.dtype)


def rotate(x, positions):
    """Rotary position embedding of x [b, s, heads, head_dim] at positions [s]."""
    half = x.shape[-1] // 2
    freq = ROPE_BASE ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = positions.astype(jnp.float32)[:, None] * freq[None]
    cos, sin = jnp.cos(angle)[None, :, None], jnp.sin(angle)[None, :, None]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def attend(q, k, v, mask):
    """q [b, s, heads, d], k/v [b, t, kv_heads, d], mask [s, t] -> [b, s, heads, d] (GQA)."""
    b, s, heads, d = q.shape
    groups = heads // k.shape[2]
    q = q.reshape(b, s, k.shape[2], groups, d)
    scores = jnp.einsum("bsngd,btnd->bngst", q, k).astype(jnp.float32) * d**-0.5
    probs = jax.nn.softmax(jnp.where(mask, scores, -1e30), -1).astype(v.dtype)
    return jnp.einsum("bngst,btnd->bsngd", probs, v).reshape(b, s, heads, d)


def qkv(arch, x, p, positions):
    """Queries [b, s, heads, d] and keys, values [b, s, kv_heads, d] of one block's input."""
    if arch == "gpt":
        h = layernorm(x, p["ln1_s"], p["ln1_b"])
        fused = jnp.einsum("bsd,dthk->bsthk", h, p["wqkv"]) + p["bqkv"]
        return fused[:, :, 0], fused[:, :, 1], fused[:, :, 2]
    h = rmsnorm(x, p["n1"])
    q = jnp.einsum("bsd,dhk->bshk", h, p["wq"])
    kv = jnp.einsum("bsd,dthk->bsthk", h, p["wkv"])
    return rotate(q, positions), rotate(kv[:, :, 0], positions), kv[:, :, 1]


def finish_block(arch, x, attended, p):
    """The attention output projection, the residual, the MLP and its residual."""
    if arch == "gpt":
        x = x + jnp.einsum("bshk,hkd->bsd", attended, p["wo"]) + p["bo"]
        h = layernorm(x, p["ln2_s"], p["ln2_b"])
        return x + jax.nn.gelu(h @ p["w_in"] + p["b_in"]) @ p["w_out"] + p["b_out"]
    x = x + jnp.einsum("bshk,hkd->bsd", attended, p["wo"])
    gate_up = jnp.einsum("bsd,dtf->bstf", rmsnorm(x, p["n2"]), p["w_gate_up"])
    return x + (jax.nn.silu(gate_up[:, :, 0]) * gate_up[:, :, 1]) @ p["w_down"]


def embed(arch, params, tokens, positions):
    x = params["embed"][tokens]
    return x + params["pos"][positions][None] if arch == "gpt" else x


def logits_of(arch, params, x):
    x = layernorm(x, params["lnf_s"], params["lnf_b"]) if arch == "gpt" else rmsnorm(x, params["nf"])
    return (x @ params["head"]).astype(jnp.float32)


def train_step(arch):
    def loss_fn(params, tokens, targets):
        seq = tokens.shape[1]
        positions = jnp.arange(seq)
        causal = jnp.tril(jnp.ones((seq, seq), bool))

        def block(x, p):
            return finish_block(arch, x, attend(*qkv(arch, x, p, positions), causal), p), None

        x = embed(arch, params, tokens, positions)
        if isinstance(params["layers"], list):
            for layer in params["layers"]:
                x, _ = jax.checkpoint(block)(x, layer)
        else:
            x, _ = jax.lax.scan(jax.checkpoint(block), x, params["layers"])
        logits = logits_of(arch, params, x)
        target = jnp.take_along_axis(logits, targets[..., None], -1)[..., 0]
        return jnp.mean(jax.nn.logsumexp(logits, -1) - target)

    def step(params, m, v, count, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        count = count + 1
        c1, c2 = 1 - BETA1 ** count.astype(STATE), 1 - BETA2 ** count.astype(STATE)

        def update(p, g, m, v):
            g = g.astype(STATE)
            m = BETA1 * m + (1 - BETA1) * g
            v = BETA2 * v + (1 - BETA2) * g * g
            p = p.astype(STATE) - LEARNING_RATE * (m / c1) / (jnp.sqrt(v / c2) + EPS)
            return p.astype(PARAM), m, v

        new = jax.tree.map(update, params, grads, m, v)
        part = lambda i: jax.tree.map(lambda t: t[i], new, is_leaf=lambda t: isinstance(t, tuple))
        return part(0), part(1), part(2), count, loss

    return step


def decode_step(arch):
    def step(params, cache, tokens, pos):
        positions = pos[None]
        x = embed(arch, params, tokens, positions)
        visible = (jnp.arange(cache["k"].shape[2]) <= pos)[None]

        def block(x, layer):
            p, k_cache, v_cache = layer
            q, k, v = qkv(arch, x, p, positions)
            k_cache = jax.lax.dynamic_update_slice(k_cache, k, (0, pos, 0, 0))
            v_cache = jax.lax.dynamic_update_slice(v_cache, v, (0, pos, 0, 0))
            return finish_block(arch, x, attend(q, k_cache, v_cache, visible), p), (k_cache, v_cache)

        x, (k, v) = jax.lax.scan(block, x, (params["layers"], cache["k"], cache["v"]))
        return logits_of(arch, params, x), {"k": k, "v": v}

    return step


def workload(mesh, arch="gpt", mode="train", layers=24, hidden=2048, heads=16, kv_heads=0, ffn=0,
             seq=2048, vocab=51200, batch=8, head_dim=0, scan=True):
    """The step and its abstract inputs. `kv_heads` 0 means as many as `heads`; `ffn` 0 means
    4 x hidden for GPT and 3.5 x hidden (rounded to 256) for Llama; `head_dim` 0 means hidden /
    heads (another value gives one tensor-parallel rank's share of a larger model: its heads, its
    slice of the MLP and of the vocabulary, at the model's width)."""
    kv_heads = kv_heads or heads
    head_dim = head_dim or hidden // heads
    ffn = ffn or (4 * hidden if arch == "gpt" else -(-7 * hidden // 2 // 256) * 256)
    batch_axes = tuple(mesh.axis_names)
    sharded = lambda shape, dtype, spec: jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))
    if not isinstance(scan, bool):
        raise ValueError(f"scan must be True or False (--model-arg scan=false), not {scan!r}")
    if not scan and mode != "train":
        raise ValueError("scan=False is for mode='train': a decode step scans its layers with their cache")
    shapes = param_shapes(arch, layers, hidden, heads, kv_heads, ffn, head_dim, seq, vocab, scan)
    state = lambda dtype: jax.tree.map(lambda s: sharded(s, dtype, P()), shapes,
                                       is_leaf=lambda s: isinstance(s, tuple))
    if mode == "train":
        tokens = sharded((batch, seq), jnp.int32, P(batch_axes, None))
        count = sharded((), jnp.int32, P())
        return train_step(arch), (state(PARAM), state(STATE), state(STATE), count, tokens, tokens)
    if mode == "decode":
        cache_shape = (layers, batch, seq, kv_heads, head_dim)
        cache = {name: sharded(cache_shape, PARAM, P(None, batch_axes)) for name in ("k", "v")}
        tokens = sharded((batch, 1), jnp.int32, P(batch_axes, None))
        return decode_step(arch), (state(PARAM), cache, tokens, sharded((), jnp.int32, P()))
    raise ValueError(f"mode must be 'train' or 'decode', not {mode!r}")

"""Inference of a small decoder-only transformer with a KV cache: one prefill, then one decode step.

The step takes the weights, an empty KV cache of `MAX_LEN` positions and a batch of `PROMPT`-token
prompts. Prefill runs the prompt through every layer with causal attention and writes each layer's
keys and values into cache positions [0, PROMPT) (`dynamic_update_slice`). The token that follows is
fed in as an input (`next_token`, the token the caller sampled from the prefill's logits, as a
serving loop does), and the decode step runs it at position PROMPT: each layer writes its key and value
at that position and attends over the whole cache, masked to positions <= PROMPT. The step returns
the prefill's logits of the last prompt position, the decode step's logits and the updated cache.

bf16 throughout (softmax and RMSNorm statistics in f32), pre-norm blocks with RMSNorm, ReLU MLP,
untied input embedding (replicated) and output projection. Layers are a plain Python loop.

Layout: the batch is split over every mesh axis but the last (`dp` ways); attention heads and the MLP
hidden dimension are tensor-parallel over the last axis (`tp` ways), Megatron style: `wq`, `wk`,
`wv` and `w_up` split by output columns (heads), `wo` and `w_down` by input rows, the KV cache by
heads, the output projection by vocabulary columns (logits stay split over the vocabulary). On a 1-D
mesh the step is purely data-parallel.

Expected collectives per rank: nothing but all-reduces over the tensor group, two per layer per
pass (the row-parallel attention output and MLP output): LAYERS x 2 of [batch/dp, PROMPT, D_MODEL]
bf16 in prefill and LAYERS x 2 of [batch/dp, 1, D_MODEL] bf16 in decode.

    flint extract examples/decode.py --mesh 2x4 -o traces/
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

BATCH, PROMPT, MAX_LEN = 8, 32, 64
D_MODEL, HEADS, HEAD_DIM, D_FF, VOCAB, LAYERS = 256, 8, 32, 1024, 1024, 2
EPS = 1e-6


def rms_norm(x, scale):
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + EPS)
    return (x32 * scale.astype(jnp.float32)).astype(x.dtype)


def attention(q, k, v, mask):
    """q [b, s, h, d], k/v [b, m, h, d], mask [s, m] -> [b, s, h, d]."""
    scores = jnp.einsum("bshd,bmhd->bhsm", q, k) / jnp.sqrt(jnp.float32(HEAD_DIM)).astype(q.dtype)
    scores = jnp.where(mask, scores.astype(jnp.float32), -1e30)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bhsm,bmhd->bshd", probs, v)


def block(layer, cache, x, start, mask, keys_from_cache):
    """One pre-norm block over x [b, s, D] at cache position `start`; returns (x, cache)."""
    h = rms_norm(x, layer["norm_attn"])
    q = jnp.einsum("bsd,dhk->bshk", h, layer["wq"])
    k = jnp.einsum("bsd,dhk->bshk", h, layer["wk"])
    v = jnp.einsum("bsd,dhk->bshk", h, layer["wv"])
    cache = {
        "k": jax.lax.dynamic_update_slice(cache["k"], k, (0, start, 0, 0)),
        "v": jax.lax.dynamic_update_slice(cache["v"], v, (0, start, 0, 0)),
    }
    if keys_from_cache:
        k, v = cache["k"], cache["v"]
    x = x + jnp.einsum("bshk,hkd->bsd", attention(q, k, v, mask), layer["wo"])
    h = rms_norm(x, layer["norm_mlp"])
    x = x + jax.nn.relu(h @ layer["w_up"]) @ layer["w_down"]
    return x, cache


def step(params, cache, prompt, next_token):
    """Prefill `prompt` [B, PROMPT], then decode `next_token` [B] at position PROMPT."""
    positions = jnp.arange(MAX_LEN)

    # Prefill: causal attention among the prompt's own keys; the cache is only written.
    x = params["embed"][prompt]
    causal = jnp.arange(PROMPT)[:, None] >= jnp.arange(PROMPT)[None, :]
    cache = list(cache)
    for i, layer in enumerate(params["layers"]):
        x, cache[i] = block(layer, cache[i], x, 0, causal, keys_from_cache=False)
    prefill_logits = rms_norm(x[:, -1], params["norm_out"]) @ params["unembed"]

    # Decode: one token at position PROMPT, attending over the whole cache up to that position.
    x = params["embed"][next_token][:, None, :]
    visible = (positions <= PROMPT)[None, :]
    for i, layer in enumerate(params["layers"]):
        x, cache[i] = block(layer, cache[i], x, PROMPT, visible, keys_from_cache=True)
    logits = rms_norm(x[:, 0], params["norm_out"]) @ params["unembed"]
    return prefill_logits, logits, cache


def workload(mesh):
    """Abstract inputs of `step` on `mesh` (Flint's model-file entry point)."""
    names = mesh.axis_names
    data = names[:-1] if len(names) > 1 else names
    tensor = names[-1] if len(names) > 1 else None

    def spec(shape, *partition, dtype=jnp.bfloat16):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(*partition)))

    layer = {
        "norm_attn": spec((D_MODEL,)),
        "wq": spec((D_MODEL, HEADS, HEAD_DIM), None, tensor),
        "wk": spec((D_MODEL, HEADS, HEAD_DIM), None, tensor),
        "wv": spec((D_MODEL, HEADS, HEAD_DIM), None, tensor),
        "wo": spec((HEADS, HEAD_DIM, D_MODEL), tensor),
        "norm_mlp": spec((D_MODEL,)),
        "w_up": spec((D_MODEL, D_FF), None, tensor),
        "w_down": spec((D_FF, D_MODEL), tensor),
    }
    params = {
        "embed": spec((VOCAB, D_MODEL)),
        "layers": [dict(layer) for _ in range(LAYERS)],
        "norm_out": spec((D_MODEL,)),
        "unembed": spec((D_MODEL, VOCAB), None, tensor),
    }
    kv = spec((BATCH, MAX_LEN, HEADS, HEAD_DIM), data, None, tensor)
    cache = [{"k": kv, "v": kv} for _ in range(LAYERS)]
    prompt = spec((BATCH, PROMPT), data, dtype=jnp.int32)
    next_token = spec((BATCH,), data, dtype=jnp.int32)
    return step, (params, cache, prompt, next_token)

"""The GPT training step of `examples/gpt.py` with ZeRO-3 / FSDP shardings on top of Megatron TP.

Same model, step and tensor parallelism as `gpt.py` (batch split over the data axes, heads / MLP
columns / vocabulary split over the last axis); in addition every parameter, and with it its AdamW
moments `m` and `v`, is split over the data axes along one dimension that tensor parallelism leaves
whole, so each rank stores 1/(dp*tp) of the model and of the optimizer state:

    wq, wk, wv  [L, D_MODEL, HEADS, D_HEAD]   D_MODEL over data, heads over tensor
    wo          [L, HEADS, D_HEAD, D_MODEL]   heads over tensor, D_MODEL over data
    w_in        [L, D_MODEL, D_FF]            D_MODEL over data, D_FF over tensor
    w_out       [L, D_FF, D_MODEL]            D_FF over tensor, D_MODEL over data
    embed       [VOCAB, D_MODEL]              vocabulary over tensor, D_MODEL over data
    head        [D_MODEL, VOCAB]              D_MODEL over data, vocabulary over tensor
    layernorm scales and biases [L, D_MODEL] / [D_MODEL]: D_MODEL over data

Because the batch is also split over the data axes, a rank cannot use its parameter shard directly.
Expected collectives per rank and step, on top of all of gpt.py's (which stay as they are):

- all-gathers over the data group of every parameter before it is used: in forward, the embedding
  table (gpt.py's lookup pins it to the vocab-parallel layout, which makes its ZeRO-3 gather explicit;
  left alone, XLA instead keeps the table split, all-gathers the tokens and sends the looked-up rows
  back with an all-to-all), and in every layer trip the four layernorm vectors (gathered as f32:
  they are cast before use and the cast runs on the shard), wq, wk, wv, wo, w_in and w_out, then the
  final layernorm and the head; in backward, each layer trip gathers again what the input gradients
  need (w_out, w_in, wo, wq, wk, wv and the two layernorm scales), since the backward loop receives
  the stacked shards, not the forward's gathered copies;
- the gradients: ZeRO's reduce-scatter over the data group, one per gradient gpt.py all-reduces
  there, at the same comm_size (a reduce-scatter's is its full input). XLA's partitioner writes each
  as an all-reduce followed by a dynamic-slice to the rank's shard; Flint fuses the pair, as the GPU
  and TPU compilers do (the CPU pipeline never does).

The AdamW update is then purely local on the shards.

    flint extract examples/fsdp.py --mesh 2x4 -o traces/
"""

from jax.sharding import PartitionSpec as P

import gpt  # the model, step and AdamW; only the parameter layout differs


def fsdp_layout(data, tensor):
    """PartitionSpecs of every parameter: gpt.py's TP split plus one dimension over `data`."""
    layers = {
        "ln1_scale": P(None, data),
        "ln1_bias": P(None, data),
        "wq": P(None, data, tensor, None),
        "wk": P(None, data, tensor, None),
        "wv": P(None, data, tensor, None),
        "wo": P(None, tensor, None, data),
        "ln2_scale": P(None, data),
        "ln2_bias": P(None, data),
        "w_in": P(None, data, tensor),
        "w_out": P(None, tensor, data),
    }
    top = {
        "embed": P(tensor, data),
        "ln_f_scale": P(data),
        "ln_f_bias": P(data),
        "head": P(data, tensor),
    }
    return {"layers": layers, **top}


def workload(mesh, layers=gpt.LAYERS, vocab=gpt.VOCAB, width=gpt.D_MODEL, batch=gpt.BATCH, seq=gpt.SEQ):
    """gpt.py's step and inputs with the ZeRO-3 layout, for a model of the given size."""
    return gpt.workload(mesh, layout=fsdp_layout, layers=layers, vocab=vocab, width=width, batch=batch, seq=seq)


logical_rules = gpt.logical_rules

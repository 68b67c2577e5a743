"""A GPT training step in PyTorch: `torch.nn` blocks, cross-entropy, AdamW.

Model (the dimensions of `examples/gpt.py`): token embedding (`nn.Embedding`), LAYERS blocks
(`nn.ModuleList`, unrolled by the tracer) of

    x = x + attn(ln1(x))    causal multi-head attention with q, k, v and o `nn.Linear`s
    x = x + mlp(ln2(x))     fc1 -> GELU -> fc2

then a final `nn.LayerNorm`, a separate LM head (`nn.Linear`, not tied) and cross-entropy on f32
logits. Parameters are bf16 and no `nn.Linear` has a bias; attention scores and softmax are f32. The
optimizer is Flint's AdamW (f32 moments, decoupled weight decay) with gpt.py's hyperparameters.

Layout: `tp_plan` is Megatron's, in PyTorch's tensor-parallel idiom: q, k, v and fc1 column-wise,
o and fc2 row-wise, the embedding row-wise (vocabulary-parallel) and the head column-wise (vocabulary
split); the batch is split over the data axes. Torch writes `q @ k^T` and `probs @ v` as batched
matmuls over the merged (batch, heads) dimension, which cannot be split over both axes while a rank
holds more than one sequence, so XLA gathers the heads and runs the attention core on all of them
(see tests/test_torch.py for the resulting collectives, derived by hand).

    flint extract examples/torch_gpt.py --mesh 2x4 --strategy dp+tp -o traces/

`Config` and the functions take their dimensions as arguments so that `bench/torch_big.py` can
extract a 1.5B-parameter configuration of the same code.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    vocab: int = 2048
    d_model: int = 256
    heads: int = 8
    d_ff: int = 768
    layers: int = 3
    seq: int = 128
    batch: int = 16

    @property
    def d_head(self) -> int:
        return self.d_model // self.heads


CONFIG = Config()


class Attention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.heads = c.heads
        self.q, self.k, self.v, self.o = (nn.Linear(c.d_model, c.d_model, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, d = x.shape

        def split(t):  # [b, s, d] -> [b, heads, s, d_head]
            return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = (q @ k.transpose(-2, -1)).float() * (d // self.heads) ** -0.5
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, torch.finfo(torch.float32).min)
        probs = scores.softmax(dim=-1).to(x.dtype)
        return self.o((probs @ v).transpose(1, 2).reshape(b, s, d))


class MLP(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.fc1 = nn.Linear(c.d_model, c.d_ff, bias=False)
        self.fc2 = nn.Linear(c.d_ff, c.d_model, bias=False)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(c.d_model), Attention(c)
        self.ln2, self.mlp = nn.LayerNorm(c.d_model), MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.d_model)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln_f(x))


def model(c: Config = CONFIG):
    """The module, built by Flint on the meta device (no weights are allocated)."""
    return GPT(c).to(torch.bfloat16)


def example_inputs(c: Config = CONFIG):
    tokens = torch.empty(c.batch, c.seq, dtype=torch.int64)
    return {"tokens": tokens, "targets": torch.empty_like(tokens)}


def loss_fn(model, batch):
    """Mean cross-entropy in f32, written out as gpt.py's (`F.cross_entropy` would pick the target
    logits with a gather, which the partitioner answers by gathering indices across the batch)."""
    logits = model(batch["tokens"]).float()
    vocab = torch.arange(logits.shape[-1], device=logits.device)
    target = torch.where(batch["targets"][..., None] == vocab, logits, 0.0).sum(dim=-1)
    return (torch.logsumexp(logits, dim=-1) - target).mean()


optimizer = "adamw"
optimizer_options = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
tp_plan = {
    "layers.*.attn.q": "colwise",
    "layers.*.attn.k": "colwise",
    "layers.*.attn.v": "colwise",
    "layers.*.attn.o": "rowwise",
    "layers.*.mlp.fc1": "colwise",
    "layers.*.mlp.fc2": "rowwise",
    "embed": "rowwise",
    "head": "colwise",
}

"""Hugging Face encoder-decoder models, `examples/hf_seq2seq.py`: T5 and BART training steps.

Both are built in one size: V = 256, D = 64, H = 4 heads of k = 16 (H·k = D), feed-forward
F = 128, L = 2 encoder and L = 2 decoder layers; a batch of B = 8 source sequences of Se = 16
tokens and target sequences (labels) of Sd = 8. Neither config has a tensor-parallel plan, so on
2x4 `--strategy dp` gives each of the 8 ranks b = 1 sequence pair. Matmuls, by hand, with
Te = b·Se encoder and Td = b·Sd decoder tokens:

- encoder layer: q, k, v, o [D -> D] on Te tokens; the attention core, QK^T and PV, 2·b·H·Se·Se·k
  each; the feed-forward [D -> F -> D] on Te;
- decoder layer: self-attention as the encoder's on Td tokens (core 2·b·H·Sd·Sd·k each);
  cross-attention with q and o on Td, k and v on the encoder's Te outputs, core 2·b·H·Sd·Se·k
  each; the feed-forward on Td;
- the LM head [D -> V] on Td (T5 and BART tie it to the shared embedding);
- backward, two matmuls per forward matmul (both operands of every one need a gradient: the
  input gradient flows down to the embedding, which is a parameter).

T5's relative position bias and BART's learned positions are embedding lookups, not matmuls, so
both families have the same matmul FLOPs. Collectives, all over the 8 ranks, f32 unless noted:
one all-reduce per parameter gradient except the shared embedding, which is reduced once per use
(the encoder's and decoder's token lookups and the tied LM head: 3 x [V, D]) before the three are
summed; the loss and its count of labels (int64); what torch's cross-entropy writes, as for Llama
in tests/test_hf_models.py (its target pick's (row, label) index pairs all-gathered, b·Sd of them
in int64, forward and backward, and their gradient's reduce-scatter of [B·Sd]). Besides those:

- T5: its position bias [H, S, S] is computed by the first layer of each stack and added in every
  layer, so its gradient, summed over the batch, is all-reduced once per layer (encoder [H, Se, Se],
  decoder self-attention [H, Sd, Sd]) before it is scattered into the bucket table, whose own
  gradient then needs nothing;
- BART: one all-reduce per learned position table. The encoder looks positions up per sequence
  (ids expanded to [b, Se]), so its lookup's backward scatters every token's gradient into the
  table and the partial table is reduced whole, [Se + 2, D] (BART offsets positions by 2 rows);
  the decoder looks them up once ([1, Sd]) and broadcasts them over the batch, so their gradient
  is summed over the batch first and reduced as the [Sd, D] rows read.

Since neither family declares a plan, the default layout on 2x4 (no `--strategy`) splits the batch
over the data axis only; it is extracted once with the default GPU backend, as the report that
torch-mlir ran out of memory lowering T5 was.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch_mlir")
pytest.importorskip("transformers")

from conftest import ADDRESS_SPACE_LIMIT, EXAMPLES, load_example, matmuls_and_collectives  # noqa: E402

from flint.schema import et_def_pb2 as pb  # noqa: E402
from flint.trace.contract import check_traces  # noqa: E402

AR, AG, RS = pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER
F32, I64 = 4, 8
SEQ2SEQ = EXAMPLES / "hf_seq2seq.py"
V, D, H, K, F, L = 256, 64, 4, 16, 128, 2
B, SE, SD = 8, 16, 8
RANKS = tuple(range(8))


def limited(*args: str) -> subprocess.CompletedProcess:
    """`flint ARGS` in a process whose address space is capped at ADDRESS_SPACE_LIMIT."""
    code = (
        "import resource\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE_LIMIT}, {ADDRESS_SPACE_LIMIT}))\n"
        "from flint.cli import main\nmain()"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def seq2seq(tmp_path_factory):
    """examples/hf_seq2seq.py extracted once per family and options, under the memory limit."""
    cache: dict[tuple[str, ...], Path] = {}

    def get(family: str, *options: str) -> Path:
        key = (family, *options)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"hf_{family}") / "traces"
            done = limited("extract", SEQ2SEQ, "--mesh", "2x4", "--model-arg", f"family={family}", *options, "-o", out)
            assert done.returncode == 0, done.stderr
            cache[key] = out
        return cache[key]

    return get


def matmul_flops(b: int) -> int:
    """Per-rank matmul FLOPs of the training step with b sequence pairs per rank."""
    te, td = b * SE, b * SD
    encoder = 4 * 2 * te * D * D + 2 * (2 * b * H * SE * SE * K) + 2 * (2 * te * D * F)
    decoder = (
        4 * 2 * td * D * D + 2 * (2 * b * H * SD * SD * K)  # self-attention
        + 2 * (2 * td * D * D) + 2 * (2 * te * D * D) + 2 * (2 * b * H * SD * SE * K)  # cross-attention
        + 2 * (2 * td * D * F)  # feed-forward
    )
    return 3 * (L * (encoder + decoder) + 2 * td * D * V)


def gradients(family: str) -> list[int]:
    """Bytes of every gradient all-reduce (f32) under data parallelism."""
    matrices = [D * D] * (4 * L + 8 * L) + [D * F, F * D] * (2 * L)  # attention; feed-forward
    shared = [V * D] * 3  # the tied embedding, once per use
    if family == "t5":
        norms = [D] * (2 * L + 1 + 3 * L + 1)  # RMS norms: per sublayer and each stack's final
        bias = [H * SE * SE] * L + [H * SD * SD] * L  # the position bias, per layer of each stack
        return [n * F32 for n in matrices + shared + norms + bias]
    norms = [D, D] * (2 * L + 1 + 3 * L + 1)  # LayerNorms (weight, bias): per sublayer, embeddings
    biases = [D] * (5 * L + 9 * L) + [F] * (2 * L)  # q, k, v, o, fc2 (and cross q, k, v, o); fc1
    positions = [(SE + 2) * D, SD * D]  # the encoder's table whole; the decoder's rows read
    return [n * F32 for n in matrices + shared + norms + biases + positions]


def data_parallel_collectives(family: str) -> list:
    b = B // len(RANKS)
    return sorted(
        [(AR, size, RANKS) for size in gradients(family)]
        + [(AR, F32, RANKS), (AR, I64, RANKS)]  # the loss and its label count
        + [(AG, b * SD * 2 * I64, RANKS)] * 2 + [(RS, B * SD * F32, RANKS)]  # cross-entropy's pick
    )


def test_config_matches_the_derivation():
    example = load_example("hf_seq2seq")
    assert (example.BATCH, example.SOURCE, example.TARGET) == (B, SE, SD)
    t5, bart = (example.FAMILIES[f][1] for f in ("t5", "bart"))
    assert (t5.vocab_size, t5.d_model, t5.num_heads, t5.d_kv, t5.d_ff) == (V, D, H, K, F)
    assert (t5.num_layers, t5.num_decoder_layers, t5.feed_forward_proj, t5.tie_word_embeddings) == (L, L, "relu", True)
    assert (bart.vocab_size, bart.d_model, bart.encoder_attention_heads, bart.decoder_attention_heads) == (V, D, H, H)
    assert (bart.encoder_ffn_dim, bart.decoder_ffn_dim, bart.encoder_layers, bart.decoder_layers) == (F, F, L, L)
    assert bart.max_position_embeddings == SE and bart.tie_word_embeddings


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_training_data_parallel_over_2x4_every_rank(seq2seq, family):
    """`--strategy dp` on 2x4, CPU backend: every rank's matmul FLOPs and collectives by hand."""
    directory = seq2seq(family, "--strategy", "dp", "--backend", "cpu")
    expected = data_parallel_collectives(family)
    for rank in RANKS:
        assert matmuls_and_collectives(directory, rank) == (matmul_flops(1), expected), f"rank {rank}"
    assert check_traces(directory) == []


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_training_default_layout_gpu(seq2seq, family):
    """The model's own layout on 2x4 with the default (GPU) backend: the step lowers and
    compiles (torch-mlir ran out of memory on the decoder's shifted labels before), and every op
    has a cost rule (`--strict`; T5's random draws advance the RNG state with
    `xla.rng_get_and_update_state`, 24 a step, and JAX 0.12's compiler reads the seed once with a
    `GetRngSeed` custom call)."""
    assert check_traces(seq2seq(family, "--strict")) == []


SHIFT = """
import resource
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from flint.frontend.torch_bridge import trace_to_stablehlo

def shift(x):
    y = x.new_zeros(x.shape)
    y[:, 1:] = x[:, :-1]
    return (y,)

with FakeTensorMode():
    x = torch.empty(2, 8, dtype=torch.int64)
print(trace_to_stablehlo(shift, [x]).stablehlo)
"""


def test_write_into_an_open_slice_lowers():
    """`y[:, 1:] = x[:, :-1]` (how T5 and BART shift labels right) lowers to a scatter over the
    slice's own 7 positions, not 2**63 - 1 of them (under the memory limit: that ran out)."""
    done = subprocess.run(
        [sys.executable, "-c", SHIFT.format(limit=ADDRESS_SPACE_LIMIT)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert "stablehlo.scatter" in done.stdout and "tensor<7x1xi64>" in done.stdout

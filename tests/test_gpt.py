"""The GPT examples' traces against numbers derived by hand from the model's dimensions and shardings.

`examples/gpt.py` (DP + Megatron TP, vocab-parallel embedding and head) and `examples/fsdp.py` (the
same plus ZeRO-3 / FSDP) are extracted in fresh processes; every rank's trace is read back and
compared with the derivations below, written out from the module's constants.

Notation, on a (dp, tp) mesh ("data", "tensor"): rank r = d * tp + t; its tensor group T is its mesh
row {d * tp + u}, its data group G its column {e * tp + t}. Per rank:

    b = BATCH / dp    sequences          S  = SEQ             tokens per sequence
    D = D_MODEL       model width        h  = HEADS / tp      heads,  k = D_HEAD  head width
    f = D_FF / tp     MLP columns        v  = VOCAB / tp      vocabulary rows / columns
    L = LAYERS        layer-scan trips   Dd = D_MODEL / dp    FSDP shard of D_MODEL

Matmuls (both files: FSDP all-gathers a weight before its matmul, so the matmuls are TP-local). Per
layer the forward has q, k, v (2·b·S·D·h·k each), QK^T and PV (2·b·h·S·S·k each), the output
projection (2·b·S·h·k·D) and the MLP's w_in and w_out (2·b·S·D·f each); after the layers the LM head
(2·b·S·D·v). Backward needs, for every one of them, two matmuls of the same size: the gradient of
each operand. For a weight matmul that is the input gradient and the weight gradient; for QK^T and
PV both operands are activations and both get gradients. None is skipped: the first layer's q/k/v
input gradients are needed because the embedding table is trained (its gradient is the scatter-add
of the layer-0 input gradient), the head's input gradient feeds the final layernorm and the layers,
and its weight gradient trains it. The embedding lookup itself is a gather, not a matmul, and its
backward is a scatter-add, so it adds no matmul. Total = 3 x forward.

Loop unrolling: the layer scan is one `while` of LAYERS trips in the forward and one in the backward;
the trace must hold each body LAYERS times (8 matmuls per forward trip, 16 per backward trip).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import pytest
from conftest import EXAMPLES, extract, load_example

from flint.schema import et_def_pb2 as pb
from flint.trace.contract import check_traces
from flint.trace.reader import attr_value, find_traces, read_comm_groups, read_trace

gpt = load_example("gpt")

BF16, F32 = 2, 4
AR, AG, RS = pb.ALL_REDUCE, pb.ALL_GATHER, pb.REDUCE_SCATTER
KIND_NAME = {AR: "all_reduce", AG: "all_gather", RS: "reduce_scatter"}

# (model, mesh) pairs extracted. FSDP is checked on 2x4 only: whether the head's backward matmul reuses
# the forward's gathered copy is the partitioner's choice (on 4x2 it reshards the head along another
# path for the forward matmul, dense replica groups instead of mesh axes, and gathers it again for
# backward), which the sharding math alone does not decide.
CASES = [("gpt", "2x4"), ("gpt", "4x2"), ("fsdp", "2x4")]

# The forward embedding lookup's all-reduce, by the op path XLA keeps (the node's `source_op`).
LOOKUP = "jvp(jit(_take))/gather"


@dataclass(frozen=True)
class Dims:
    dp: int
    tp: int

    @property
    def b(self):
        return gpt.BATCH // self.dp

    @property
    def h(self):
        return gpt.HEADS // self.tp

    @property
    def f(self):
        return gpt.D_FF // self.tp

    @property
    def v(self):
        return gpt.VOCAB // self.tp

    @property
    def dd(self):
        return gpt.D_MODEL // self.dp

    def tensor_group(self, rank):
        d = rank // self.tp
        return tuple(d * self.tp + u for u in range(self.tp))

    def data_group(self, rank):
        t = rank % self.tp
        return tuple(e * self.tp + t for e in range(self.dp))


def dims_of(mesh: str) -> Dims:
    dp, tp = (int(x) for x in mesh.split("x"))
    return Dims(dp, tp)


# ----------------------------------------------------------------------------------- matmuls


def matmul_flops(m: Dims) -> int:
    S, D, k, L = gpt.SEQ, gpt.D_MODEL, gpt.D_HEAD, gpt.LAYERS
    qkv = 3 * 2 * m.b * S * D * m.h * k
    scores = 2 * m.b * m.h * S * S * k  # QK^T: contract over the head width
    mix = 2 * m.b * m.h * S * S * k  # PV: contract over the keys
    out_proj = 2 * m.b * S * m.h * k * D
    mlp = 2 * m.b * S * D * m.f + 2 * m.b * S * m.f * D
    head = 2 * m.b * S * D * m.v
    forward = L * (qkv + scores + mix + out_proj + mlp) + head
    return 3 * forward


# ------------------------------------------------------------------------------- collectives


def gpt_collectives(m: Dims, rank: int) -> list[tuple[int, int, tuple[int, ...]]]:
    """(comm_type, comm_size, group) of every collective of `rank` in gpt.py, by hand.

    Tensor group, bf16 activations [b, S, D] (all-reduce: comm_size is the full buffer):
      - the vocab-parallel lookup: each rank gathers the rows of its vocabulary shard (zeros for
        tokens outside it) and the partial embeddings are summed;
      - forward, per layer: the row-parallel attention output and MLP output (2 x L);
      - backward: the head's input gradient (contracts over the split vocabulary); per layer the
        MLP input gradient (contracts over the split D_FF) and the q, k and v input gradients
        (contract over the split heads). XLA's partitioner turns each partial-sum matmul into a
        replicated value on its own, so q, k and v are reduced one by one (3 all-reduces, not the
        one Megatron does on their sum): 4 x L.
    Tensor group, f32 [b, S] (one value per token): the cross-entropy over the split vocabulary needs
      the max, the sum of exponentials and the target's logit (the one-hot select is summed over
      vocabulary shards): 3 all-reduces.
    Data group: every parameter gradient contracts over the split batch, so it is summed over the data
      group at its full per-rank (TP-local) size: per layer (inside the backward loop, L times)
      wq, wk, wv, wo [D, h, k] and w_in, w_out [D, f] in bf16, and the four layernorm scale / bias
      gradients [D] in f32 (the layernorm applies them in f32, so their gradients are summed before
      the cast back to bf16); then the head [D, v], the final layernorm's two [D] (f32) and the
      embedding's scatter-add [v, D]; and the f32 scalar loss (the per-token losses are alike over the
      tensor group, the mean sums the batch): 4 bytes.
    """
    S, D, k, L = gpt.SEQ, gpt.D_MODEL, gpt.D_HEAD, gpt.LAYERS
    T, G = m.tensor_group(rank), m.data_group(rank)
    act = (AR, m.b * S * D * BF16, T)
    colls = [act]  # embedding lookup
    colls += [act] * (2 * L)  # forward: attention out, MLP out
    colls += [(AR, m.b * S * F32, T)] * 3  # loss: max, sum of exp, target logit
    colls += [act]  # backward: head input gradient
    colls += [act] * (4 * L)  # backward: MLP input, q, k, v input gradients
    per_layer_grads = [D * m.h * k * BF16] * 4 + [D * m.f * BF16] * 2 + [D * F32] * 4
    colls += [(AR, size, G) for size in per_layer_grads] * L
    colls += [(AR, D * m.v * BF16, G), (AR, D * F32, G), (AR, D * F32, G)]  # head, final layernorm
    colls += [(AR, m.v * D * BF16, G)]  # embedding table (scatter-add)
    colls += [(AR, F32, G)]  # loss
    return colls


def fsdp_collectives(m: Dims, rank: int) -> list[tuple[int, int, tuple[int, ...]]]:
    """gpt.py's collectives, plus the FSDP all-gathers, with the gradient all-reduces as reduce-scatters.

    All-gathers over the data group (comm_size: the per-rank input, i.e. the shard):
      - forward: the embedding table [v, Dd] bf16, pinned by the lookup's sharding constraint; per
        layer (L times) the four layernorm vectors [Dd] (in f32: the cast to f32 is elementwise, so
        it runs on the shard and the gather moves f32), wq, wk, wv, wo [Dd, h, k] bf16 and w_in,
        w_out [Dd, f] bf16; the final layernorm's two [Dd] (f32) and the head [Dd, v] bf16;
      - backward: the layer loop's backward is a separate computation that receives the stacked
        parameter shards (not the gathered copies), so each trip gathers again what backward needs:
        w_out, w_in, wo, wq, wk, wv for the input gradients and the two layernorm scales (d xhat =
        dy * scale; the biases are not needed); outside the loops the final layernorm's scale is
        gathered again for the same reason (JAX re-broadcasts it for the backward multiply and the
        partitioner gathers per broadcast), while the head's backward matmul reads the very
        parameter value the forward one read and the partitioner reuses its gathered copy (on 2x4).
    Gradient reductions: ZeRO's reduce-scatter over the data group, one for every gradient gpt.py
      all-reduces there, at the same comm_size (a reduce-scatter's is its full input: the TP-local
      gradient). The partitioner writes each as an all-reduce and a dynamic-slice to the rank's shard,
      which Flint fuses as the GPU and TPU compilers do. The f32 scalar loss stays an all-reduce.
    """
    k, L = gpt.D_HEAD, gpt.LAYERS
    G = m.data_group(rank)
    colls = [
        (RS, size, group) if group == G and size > F32 else (kind, size, group)
        for kind, size, group in gpt_collectives(m, rank)
    ]
    ln, attn, mlp = m.dd * F32, m.dd * m.h * k * BF16, m.dd * m.f * BF16
    gathers = [m.v * m.dd * BF16]  # embedding table
    gathers += ([ln] * 4 + [attn] * 4 + [mlp] * 2) * L  # forward layers
    gathers += [ln, ln, m.dd * m.v * BF16]  # final layernorm, head
    gathers += [ln]  # backward: final layernorm scale
    gathers += ([mlp] * 2 + [attn] * 4 + [ln] * 2) * L  # backward layers
    return colls + [(AG, size, G) for size in gathers]


EXPECTED = {"gpt": gpt_collectives, "fsdp": fsdp_collectives}


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """Each (model, mesh) extracted once for this module: (directory, --json summary)."""
    cache: dict[tuple[str, str], tuple] = {}

    def get(model: str, mesh: str):
        if (model, mesh) not in cache:
            out = tmp_path_factory.mktemp(f"{model}-{mesh}") / "traces"
            cache[model, mesh] = (out, extract(EXAMPLES / f"{model}.py", mesh, out))
        return cache[model, mesh]

    return get


def read_rank(directory, rank):
    prefix, _ = find_traces(directory)
    groups = read_comm_groups(directory / f"{prefix}.comm_groups.json")
    return read_trace(directory / f"{prefix}.{rank}.et").nodes, groups


def collectives(nodes, groups):
    """[(comm_type, comm_size, group, source op)] of the collective nodes."""
    return [
        (
            attr_value(n, "comm_type"),
            attr_value(n, "comm_size"),
            groups[int(attr_value(n, "pg_name"))],
            attr_value(n, "source_op"),
        )
        for n in nodes
        if n.type == pb.COMM_COLL_NODE
    ]


def ranks(mesh):
    m = dims_of(mesh)
    return range(m.dp * m.tp)


# --------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("model, mesh", CASES)
def test_matmul_flops_every_rank(traces, model, mesh):
    directory, _ = traces(model, mesh)
    expected = matmul_flops(dims_of(mesh))
    for rank in ranks(mesh):
        nodes, _ = read_rank(directory, rank)
        dots = [n for n in nodes if attr_value(n, "op") in ("dot", "dot_general")]
        assert sum(attr_value(n, "num_ops") for n in dots) == expected, f"rank {rank}"


@pytest.mark.parametrize("model, mesh", CASES)
def test_layer_loops_are_unrolled(traces, model, mesh):
    """Each layer-scan body appears LAYERS times: 8 matmuls a forward trip, 16 a backward trip (by
    the op path each node of rank 0's graph file keeps as `source_op`)."""
    directory, _ = traces(model, mesh)
    graph = json.loads(next(directory.glob("*.graph.json")).read_text())
    names = [n["source_op"] for n in graph["nodes"] if n["op"] in ("dot", "dot_general")]
    forward = sum("/jvp()/while/body/" in name for name in names)
    backward = sum("/transpose(jvp())/while/body/" in name for name in names)
    assert (forward, backward) == (8 * gpt.LAYERS, 16 * gpt.LAYERS)
    assert len(names) == 3 * (8 * gpt.LAYERS + 1)  # plus the head: forward and two backward


@pytest.mark.parametrize("model, mesh", CASES)
def test_collectives_every_rank(traces, model, mesh):
    """Kind, comm_size and group of every collective of every rank, but the lookup's group.

    The group of the embedding lookup's all-reduce is checked on its own below; here it only has to
    exist once with its size, and is counted with the tensor group.
    """
    directory, _ = traces(model, mesh)
    m = dims_of(mesh)
    for rank in ranks(mesh):
        nodes, groups = read_rank(directory, rank)
        found = collectives(nodes, groups)
        lookup = [c for c in found if LOOKUP in c[3] and c[0] == AR]
        assert [(c[0], c[1]) for c in lookup] == [(AR, m.b * gpt.SEQ * gpt.D_MODEL * BF16)]
        observed = sorted(
            (kind, size, m.tensor_group(rank) if LOOKUP in name else group)
            for kind, size, group, name in found
        )
        assert observed == sorted(EXPECTED[model](m, rank)), f"rank {rank}"


@pytest.mark.parametrize("model, mesh", CASES)
def test_lookup_all_reduce_is_over_the_tensor_group(traces, model, mesh):
    """The vocab shards of one embedding row live on one mesh row: the lookup sums over it.

    Also: the communicator file then holds exactly the mesh rows and columns.
    """
    directory, _ = traces(model, mesh)
    m = dims_of(mesh)
    for rank in ranks(mesh):
        nodes, groups = read_rank(directory, rank)
        lookup = [c[2] for c in collectives(nodes, groups) if LOOKUP in c[3] and c[0] == AR]
        assert lookup == [m.tensor_group(rank)], f"rank {rank}"
    _, groups = read_rank(directory, 0)
    rows = {m.tensor_group(r) for r in ranks(mesh)}
    cols = {m.data_group(r) for r in ranks(mesh)}
    assert set(groups.values()) == rows | cols


@pytest.mark.parametrize("model, mesh", CASES)
def test_summary_totals(traces, model, mesh):
    """The --json per-rank totals: count and comm_size bytes of each collective kind."""
    _, summary = traces(model, mesh)
    m = dims_of(mesh)
    count, size = Counter(), Counter()
    for kind, nbytes, _ in EXPECTED[model](m, 0):
        count[KIND_NAME[kind]] += 1
        size[KIND_NAME[kind]] += nbytes
    assert summary["ranks"] == m.dp * m.tp
    assert summary["ranks_alike"] is True
    assert summary["per_rank"]["collectives"] == {
        kind: {"count": count[kind], "bytes": size[kind]} for kind in count
    }
    assert summary["per_rank"]["flops"] > matmul_flops(m)  # plus the elementwise work


@pytest.mark.parametrize("model, mesh", CASES)
def test_traces_satisfy_the_contract(traces, model, mesh):
    directory, _ = traces(model, mesh)
    assert check_traces(directory) == []

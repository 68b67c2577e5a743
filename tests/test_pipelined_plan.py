"""A pipelined step's files, planned from a piece written by hand: no JAX, every node known.

The piece runs on a stage mesh of 2 ranks (q = 0, 1): an embedding (PRE), a layer and an open-chain
shift from q = 0 to q = 1 with a node after it (FWD), the head (MID), the layer's backward (BWD,
which also gives the embedding's gradient), the update (POST) and the embedding's (POST_FIRST). On
`S = 2` stages of ranks [0, 1] and [2, 3] with `M = 2` microbatches under 1F1B, stage 0 runs F0 F1
B0 B1 U.0 and stage 1 runs F0 B0 F1 B1 U.0.
"""

from __future__ import annotations

from collections import Counter

import networkx as nx
import numpy as np

from flint.emit import ChakraEmitter, PipelinedPlan
from flint.emit.plan import COMPUTE, RECV, SEND
from flint.graph import WorkloadGraph
from flint.ir.parse import TensorType
from flint.pipelining import PipelineRequest
from flint.pipelining.compose import PipelinedStep
from flint.pipelining.regions import BWD, FWD, MID, POST, POST_FIRST, PRE, Regions, _accumulated
from flint.devices import load_device

ACTIVATION, SHIFT = 4096, 64
GRADIENT = TensorType((32, 16), "bf16", 16)
EMBEDDING_GRADIENT = TensorType((64, 16), "f32", 32)


def compute(name: str) -> dict:
    return dict(name=name, op="dot_general", kind="compute", flops=1000, bytes=256, transcendentals=0)


def piece() -> tuple[WorkloadGraph, Regions]:
    g = nx.DiGraph()
    g.add_node(0, **compute("embed"))
    g.add_node(1, **compute("layer"))
    g.add_node(2, name="shift", op="collective_permute", kind="collective", collective="collective_permute",
               flops=0, bytes=2 * SHIFT, transcendentals=0, comm_bytes=SHIFT, pairs=((0, 1),))
    g.add_node(3, **compute("after shift"))
    g.add_node(4, **compute("head"))
    g.add_node(5, **compute("layer grad"))
    g.add_node(6, **compute("update"))
    g.add_node(7, **compute("embedding update"))
    g.add_edges_from([(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)])
    g.add_edge(5, 6, values=((100, GRADIENT),))
    g.add_edge(5, 7, values=((101, EMBEDDING_GRADIENT),))
    region_of = {0: PRE, 1: FWD, 2: FWD, 3: FWD, 4: MID, 5: BWD, 6: POST, 7: POST_FIRST}
    regions = Regions(region_of, 1, frozenset({3}), frozenset({5}), ACTIVATION, ACTIVATION, frozenset(),
                      _accumulated(g, region_of, set(), after_forward={2, 3, 4, 5, 6, 7}))
    return WorkloadGraph(g, 2, ()), regions


def plan() -> PipelinedPlan:
    graph, regions = piece()
    return PipelinedPlan(PipelinedStep(graph, regions, PipelineRequest(2, 2), np.array([[0, 1], [2, 3]])))


def test_a_stage_has_a_class_per_role_its_piece_gives_its_ranks():
    classes = plan().classes
    assert classes.of_rank.tolist() == [0, 1, 2, 3]
    assert [role.stage for role in classes.roles] == [0, 0, 1, 1]


def test_each_rank_sends_and_receives_what_its_stage_and_position_say():
    """Per microbatch: the shift from q = 0 to q = 1 on each stage, an activation from stage 0 to
    stage 1 at the same position and its gradient back. Both halves of a transfer share a tag."""
    p = plan()
    found = {}
    for rank in range(4):
        nodes = list(p.planned(int(p.classes.of_rank[rank])))
        found[rank] = Counter((n.kind, n.name, n.peer_of[rank], n.data["comm_bytes"])
                              for n in nodes if n.kind in (SEND, RECV))
        ids = [n.id for n in nodes]
        assert ids == list(range(len(ids))), rank  # ids count up through the file
        assert all(dep < n.id for n in nodes for dep in (*n.deps, *n.ctrl)), rank
    for m in range(2):
        assert found[0][SEND, f"F{m}.0 shift", 1, SHIFT] == 1
        assert found[1][RECV, f"F{m}.0 shift", 0, SHIFT] == 1
        assert found[2][SEND, f"F{m}.0 shift", 3, SHIFT] == 1
        assert found[3][RECV, f"F{m}.0 shift", 2, SHIFT] == 1
        for q in (0, 1):
            assert found[q][SEND, f"activation of F{m}.0", 2 + q, ACTIVATION] == 1
            assert found[2 + q][RECV, f"activation of F{m}.0", q, ACTIVATION] == 1
            assert found[2 + q][SEND, f"gradient of B{m}.0", q, ACTIVATION] == 1
            assert found[q][RECV, f"gradient of B{m}.0", 2 + q, ACTIVATION] == 1
    assert all(sum(counts.values()) == 6 for counts in found.values())
    tags = {}
    for rank in range(4):
        for n in p.planned(int(p.classes.of_rank[rank])):
            if n.kind in (SEND, RECV):
                src, dst = (rank, n.peer_of[rank]) if n.kind == SEND else (n.peer_of[rank], rank)
                tags.setdefault((src, dst, n.tag), []).append(n.kind)
    assert all(sorted(kinds) == [RECV, SEND] for kinds in tags.values())


def test_what_follows_the_shift_waits_for_the_rank_s_own_half():
    """After the shift, q = 1 waits for the data it receives, q = 0 for its send."""
    p = plan()
    for rank, kind in ((0, SEND), (1, RECV)):
        nodes = {n.id: n for n in p.planned(rank)}
        after = [n for n in nodes.values() if n.name == "F0.0 after shift"]
        (dep,) = after[0].deps
        assert (nodes[dep].kind, nodes[dep].name) == (kind, "F0.0 shift")


def test_each_unit_starts_after_the_one_before_and_what_it_receives():
    """Stage 1's first forward waits for the activation; the first node of stage 0's first unit
    waits for nothing and takes time (its bytes raised for ASTRA-sim)."""
    p = plan()
    stage1 = {n.id: n for n in p.planned(2)}
    start = next(n for n in stage1.values() if n.name == "F0.0 start")
    assert [(stage1[d].kind, stage1[d].name) for d in start.ctrl] == [(RECV, "activation of F0.0")]
    stage0 = list(p.planned(0))
    assert stage0[0].name == "F0.0 embed" and stage0[0].deps == stage0[0].ctrl == ()
    assert stage0[0].data["bytes"] > 256
    assert [n.name for n in stage0 if n.kind == COMPUTE and n.name.endswith("start")] == [
        "F1.0 start", "B0.0 start", "B1.0 start", "U.0 start"]


def test_emitted_totals_count_each_class_s_file():
    """Rank 0: 2 forwards of 3 kernels (embed, layer, after shift), 2 backwards of one, the
    second backward's accumulate, an update of 2 (the layer's and the embedding's), 4 unit starts;
    2 shifts sent, 2 activations sent, 2 gradients received."""
    p = plan()
    emitter = ChakraEmitter(p, load_device("h100"), {"mesh": "pp=2,data=2"})
    emitter.template(0)
    totals = emitter.totals[0]
    assert totals.nodes == 2 * 3 + 2 + 1 + 2 + 4 + 6
    assert totals.collective_count == {"send": 4, "recv": 2}
    assert totals.collective_bytes == {"send": 2 * SHIFT + 2 * ACTIVATION, "recv": 2 * ACTIVATION}


def test_each_backward_after_the_first_adds_its_weight_gradient_to_the_sum():
    """The layer's gradient (bf16 [32, 16]: 1,024 bytes) is summed over microbatches: B1 reads
    the sum and its own gradient and writes the sum (3 x 1,024 bytes, one add per element), and
    the update reads the sum. B0 starts the sum. The embedding's gradient (f32 [64, 16]: 4,096
    bytes) is summed on the first stage alone, whose update reads it. On stage 1 the gradient sent
    back to stage 0 does not wait for the add."""
    p = plan()
    for rank, elements, nbytes in ((0, 32 * 16 + 64 * 16, 32 * 16 * 2 + 64 * 16 * 4), (2, 32 * 16, 32 * 16 * 2)):
        nodes = {n.id: n for n in p.planned(rank)}
        named = {n.name: n for n in nodes.values()}
        assert [n for n in named if "accumulate" in n] == ["B1.0 accumulate layer grad"], rank
        add = named["B1.0 accumulate layer grad"]
        assert add.deps == (named["B1.0 layer grad"].id,)
        assert (add.data["bytes"], add.data["flops"]) == (3 * nbytes, elements), rank
        assert named["U.0 update"].deps == (add.id,)
        assert rank != 0 or named["U.0 embedding update"].deps == (add.id,)
    stage1 = {n.name: n for n in p.planned(2)}
    assert stage1["gradient of B1.0"].deps == (stage1["B1.0 layer grad"].id,)

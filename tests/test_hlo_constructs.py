"""Replica-group encodings, collective sizes and cost rules, from small hand-written modules.

Each module is written the way XLA prints it after SPMD partitioning, converted to StableHLO by
jaxlib exactly as the partition stage does, then parsed and turned into a graph. Expected values are
worked out from the shapes in the text.
"""

from __future__ import annotations

import jaxlib._hlo as hlo
import pytest
from jax._src.lib import _jax

from flint.compile.capture import PartitionedModule, for_conversion
from flint.graph import build_graph
from flint.ir.parse import parse_module

ADD = """
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
"""


def graph_of(entry: str, ranks: int = 8, computations: str = ADD, scheduled: bool = False):
    """`scheduled`: the text is in execution order, as the optimised stage reads it."""
    header = f"HloModule m, num_partitions={ranks}" + (", is_scheduled=true" if scheduled else "")
    text = f"{header}\n{computations}\nENTRY main {{\n{entry}\n}}\n"
    proto = hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()
    stage = "optimized" if scheduled else "partitioned"
    if scheduled:
        proto = for_conversion(proto)
    module = PartitionedModule(stage, bytes(_jax.mlir.hlo_to_stablehlo(proto)), ranks, 0.0, 0.0)
    return build_graph(parse_module(module), ranks)


def only_node(graph):
    nodes = graph.nodes()
    assert len(nodes) == 1, nodes
    return nodes[0][1]


def all_reduce(groups: str, extra: str = ", channel_id=1, use_global_device_ids=true") -> str:
    return (
        "  p = f32[16,4] parameter(0)\n"
        f"  ROOT r = f32[16,4] all-reduce(p), replica_groups={groups}{extra}, to_apply=add"
    )


@pytest.mark.parametrize(
    "groups, expected",
    [
        ("{{0,1,2,3},{4,5,6,7}}", ((0, 1, 2, 3), (4, 5, 6, 7))),
        ("[2,4]<=[8]", ((0, 1, 2, 3), (4, 5, 6, 7))),
        # iota over [2,4], transposed: column j of [[0..3],[4..7]] is a group.
        ("[4,2]<=[2,4]T(1,0)", ((0, 4), (1, 5), (2, 6), (3, 7))),
    ],
    ids=["explicit", "iota", "iota-transposed"],
)
def test_flattened_id_encodings(groups, expected):
    node = only_node(graph_of(all_reduce(groups)))
    assert node["groups"] == expected
    assert node["comm_bytes"] == 16 * 4 * 4


def test_cross_partition_ids_are_ranks():
    """A channel without use_global_device_ids: ids are partition ids, which are ranks here."""
    node = only_node(graph_of(all_reduce("{{0,2},{1,3}}", ", channel_id=1"), ranks=4))
    assert node["groups"] == ((0, 2), (1, 3))


def test_empty_groups_mean_every_rank():
    node = only_node(graph_of(all_reduce("{}", ", channel_id=1")))
    assert node["groups"] == (tuple(range(8)),)


def test_cross_replica_over_one_replica_moves_nothing():
    """No channel: groups of replica ids; with one replica every group is one rank -> no node."""
    assert graph_of(all_reduce("{{0}}", ""), ranks=4).graph.number_of_nodes() == 0


def test_singleton_groups_are_left_out():
    groups = "{{0},{1},{2},{3},{4},{5},{6},{7}}"
    assert graph_of(all_reduce(groups)).graph.number_of_nodes() == 0


MESH_AXES = """
module @m {
  sdy.mesh @mesh = <["a"=2, "b"=4]>
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
    %0 = "stablehlo.all_reduce"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>,
        replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh, axes = AXES>,
        use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<8xf32>) -> tensor<8xf32>
    return %0 : tensor<8xf32>
  }
}
"""


@pytest.mark.parametrize(
    "axes, expected",
    [
        # Rank = 4a + b on the module's [2, 4] mesh.
        ('[#stablehlo.axis_ref<name = "a">]', ((0, 4), (1, 5), (2, 6), (3, 7))),
        ('[#stablehlo.axis_ref<name = "b">]', ((0, 1, 2, 3), (4, 5, 6, 7))),
        # "b":(2)2 is the minor half of b viewed as [2, 2]: b in {0, 1} or {2, 3} with the major fixed.
        (
            '[#stablehlo.axis_ref<name = "b", sub_axis_info = (2)2>]',
            ((0, 1), (2, 3), (4, 5), (6, 7)),
        ),
        # "b":(1)2 is the major half: b in {0, 2} or {1, 3}.
        (
            '[#stablehlo.axis_ref<name = "b", sub_axis_info = (1)2>]',
            ((0, 2), (1, 3), (4, 6), (5, 7)),
        ),
    ],
    ids=["axis-a", "axis-b", "minor-sub-axis", "major-sub-axis"],
)
def test_mesh_axes_encoding(axes, expected):
    text = MESH_AXES.replace("AXES", axes)
    module = PartitionedModule("partitioned", text.encode(), 8, 0.0, 0.0)
    node = only_node(build_graph(parse_module(module), 8))
    assert node["groups"] == expected


@pytest.mark.parametrize(
    "entry, kind, comm_bytes",
    [
        # All-gather: comm_size is the per-rank input, f32[8,4] = 128 bytes.
        (
            "  p = f32[8,4] parameter(0)\n  ROOT g = f32[32,4] all-gather(p), channel_id=1, "
            "replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}, use_global_device_ids=true",
            "all_gather",
            8 * 4 * 4,
        ),
        # Reduce-scatter: comm_size is the full input buffer, bf16[32,4] = 256 bytes.
        (
            "  p = bf16[32,4] parameter(0)\n  ROOT r = bf16[8,4] reduce-scatter(p), channel_id=1, "
            "replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}, use_global_device_ids=true, "
            "to_apply=addbf",
            "reduce_scatter",
            32 * 4 * 2,
        ),
        # All-to-all: comm_size is the per-rank buffer, f32[8,16] = 512 bytes.
        (
            "  p = f32[8,16] parameter(0)\n  ROOT a = f32[8,16] all-to-all(p), channel_id=1, "
            "replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}",
            "all_to_all",
            8 * 16 * 4,
        ),
        # Variadic all-reduce: one node for both operands, f32[4] + f32[8] = 48 bytes.
        (
            "  p = f32[4] parameter(0)\n  q = f32[8] parameter(1)\n"
            "  ROOT r = (f32[4], f32[8]) all-reduce(p, q), channel_id=1, "
            "replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=add",
            "all_reduce",
            (4 + 8) * 4,
        ),
    ],
    ids=["all-gather", "reduce-scatter", "all-to-all", "variadic-all-reduce"],
)
def test_collective_sizes(entry, kind, comm_bytes):
    computations = ADD + ADD.replace("add {", "addbf {").replace("f32", "bf16")
    node = only_node(graph_of(entry, computations=computations))
    assert (node["collective"], node["comm_bytes"]) == (kind, comm_bytes)
    assert node["groups"] in (((0, 1, 2, 3), (4, 5, 6, 7)), (tuple(range(8)),))


def test_collective_permute_pairs_and_self_pairs():
    entry = (
        "  p = f32[4] parameter(0)\n"
        "  ROOT c = f32[4] collective-permute(p), channel_id=1, source_target_pairs={{0,1},{1,0},{2,2}}"
    )
    node = only_node(graph_of(entry, ranks=4))
    assert node["pairs"] == ((0, 1), (1, 0))  # (2, 2) keeps data on its rank: nothing moves
    assert node["comm_bytes"] == 16


@pytest.mark.parametrize(
    "entry, flops, transcendentals, nbytes",
    [
        # Batched matmul: 2 * batch 4 * M 8 * N 32 * K 16; bytes (4*8*16 + 4*16*32 + 4*8*32) * 2.
        (
            "  a = bf16[4,8,16] parameter(0)\n  b = bf16[4,16,32] parameter(1)\n"
            "  ROOT d = bf16[4,8,32] dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, "
            "rhs_batch_dims={0}, rhs_contracting_dims={1}",
            2 * 4 * 8 * 32 * 16,
            0,
            (4 * 8 * 16 + 4 * 16 * 32 + 4 * 8 * 32) * 2,
        ),
        # Convolution: 2 * output elements (1*6*6*8) * window 3*3 * input features per group 4.
        (
            "  x = f32[1,8,8,4] parameter(0)\n  k = f32[3,3,4,8] parameter(1)\n"
            "  ROOT c = f32[1,6,6,8] convolution(x, k), window={size=3x3}, dim_labels=b01f_01io->b01f",
            2 * (6 * 6 * 8) * 9 * 4,
            0,
            (8 * 8 * 4 + 3 * 3 * 4 * 8 + 6 * 6 * 8) * 4,
        ),
        # Grouped convolution, 2 groups: kernel input features are already per group (2).
        (
            "  x = f32[1,8,8,4] parameter(0)\n  k = f32[3,3,2,8] parameter(1)\n"
            "  ROOT c = f32[1,6,6,8] convolution(x, k), window={size=3x3}, dim_labels=b01f_01io->b01f, "
            "feature_group_count=2",
            2 * (6 * 6 * 8) * 9 * 2,
            0,
            (8 * 8 * 4 + 3 * 3 * 2 * 8 + 6 * 6 * 8) * 4,
        ),
        # Padded ("same") 3x3 convolution on 4x4: per spatial dimension 4 outputs x 3 taps, less the
        # 2 that read padding (output 0's first tap, output 3's last): 10. 2 * 1 * 3 out features * 2
        # in features * 10 * 10.
        (
            "  x = f32[1,4,4,2] parameter(0)\n  k = f32[3,3,2,3] parameter(1)\n"
            "  ROOT c = f32[1,4,4,3] convolution(x, k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f",
            2 * 3 * 2 * 10 * 10,
            0,
            (4 * 4 * 2 + 3 * 3 * 2 * 3 + 4 * 4 * 3) * 4,
        ),
        # The input gradient of a stride-2, 2x2 convolution of 8x8 (4x4 outputs), as XLA writes it:
        # the 4x4 output gradient dilated by 2 (zeros between its elements), padded by 1, under a 2x2
        # window. Per dimension, 8 outputs x 2 taps = 16 pairs; 6 land on inserted zeros and 2 on
        # padding, leaving 8: each real product once, as in the forward's 4 outputs x 2 taps. So the
        # FLOPs equal the forward convolution's, 2 * 16 outputs * 4 taps.
        (
            "  g = f32[1,4,4,1] parameter(0)\n  k = f32[2,2,1,1] parameter(1)\n"
            "  ROOT c = f32[1,8,8,1] convolution(g, k), window={size=2x2 pad=1_1x1_1 lhs_dilate=2x2}, "
            "dim_labels=b01f_01io->b01f",
            2 * 16 * 4,
            0,
            (4 * 4 + 2 * 2 + 8 * 8) * 4,
        ),
        # Transcendental elementwise: 1 FLOP and 1 transcendental per element.
        ("  x = f32[64] parameter(0)\n  ROOT e = f32[64] exponential(x)", 64, 64, 64 * 4 * 2),
        # Reduce of 8x16 over dim 1 with an add body: (128 - 8) * 1 op.
        (
            "  x = f32[8,16] parameter(0)\n  z = f32[] constant(0)\n"
            "  ROOT r = f32[8] reduce(x, z), dimensions={1}, to_apply=add",
            128 - 8,
            0,
            (128 + 1 + 8) * 4,
        ),
        # Pred takes a byte per element; the compare is 1 FLOP per element.
        (
            "  a = f32[32] parameter(0)\n  b = f32[32] parameter(1)\n"
            "  ROOT c = pred[32] compare(a, b), direction=LT",
            32,
            0,
            32 * 4 * 2 + 32,
        ),
    ],
    ids=["batched-dot", "convolution", "grouped-convolution", "padded-convolution",
         "strided-convolution-input-gradient", "exp", "reduce", "pred-bytes"],
)
def test_cost_rules(entry, flops, transcendentals, nbytes):
    node = only_node(graph_of(entry, ranks=1))
    assert (node["flops"], node["transcendentals"], node["bytes"]) == (flops, transcendentals, nbytes)


def test_the_rng_seed_read_has_a_cost_rule():
    """The GPU compiler's read of the step's RNG seed (JAX 0.12): no FLOPs, its 8-byte result."""
    graph = graph_of('  ROOT s = u64[] custom-call(), custom_call_target="GetRngSeed"', ranks=1)
    assert graph.unknown_ops == ()
    node = only_node(graph)
    assert (node["flops"], node["bytes"]) == (0, 8)


def test_free_ops_are_not_nodes_and_keep_dependencies():
    entry = (
        "  a = f32[4,8] parameter(0)\n  e = f32[4,8] exponential(a)\n"
        "  r = f32[32] reshape(e)\n  c = f32[32] constant({...})\n"
        "  ROOT m = f32[32] multiply(r, r)"
    ).replace("  c = f32[32] constant({...})\n", "")
    graph = graph_of(entry, ranks=1)
    assert [data["op"] for _, data in graph.nodes()] == ["exponential", "multiply"]
    assert list(graph.graph.edges) == [(0, 1)]  # the reshape is bypassed, the dependency kept


def test_collective_broadcast_groups_and_bytes():
    entry = (
        "  p = bf16[16,4] parameter(0)\n"
        "  ROOT b = bf16[16,4] collective-broadcast(p), replica_groups={{0,1,2,3},{4,5,6,7}}, "
        "channel_id=1"
    )
    node = only_node(graph_of(entry))
    assert (node["collective"], node["comm_bytes"]) == ("collective_broadcast", 16 * 4 * 2)
    assert node["groups"] == ((0, 1, 2, 3), (4, 5, 6, 7))


@pytest.mark.parametrize(
    "start, done, kind, comm_bytes",
    [
        (
            "s = f32[16,4] all-reduce-start(p), replica_groups={{0,1,2,3},{4,5,6,7}}, channel_id=1, "
            "use_global_device_ids=true, to_apply=add",
            "d = f32[16,4] all-reduce-done(s)",
            "all_reduce",
            16 * 4 * 4,
        ),
        (
            "s = (f32[16,4], f32[64,4]) all-gather-start(p), replica_groups={{0,1,2,3},{4,5,6,7}}, "
            "dimensions={0}, channel_id=1, use_global_device_ids=true",
            "d = f32[64,4] all-gather-done(s)",
            "all_gather",
            16 * 4 * 4,
        ),
    ],
    ids=["all-reduce", "all-gather"],
)
def test_async_pair_is_one_collective_its_users_wait_for(start, done, kind, comm_bytes):
    out = "f32[64,4]" if kind == "all_gather" else "f32[16,4]"
    entry = f"  p = f32[16,4] parameter(0)\n  {start}\n  {done}\n  ROOT n = {out} negate(d)"
    graph = graph_of(entry)
    (_, collective), (_, negate) = graph.nodes()
    assert (collective["collective"], collective["comm_bytes"]) == (kind, comm_bytes)
    assert collective["groups"] == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert negate["op"] == "negate" and list(graph.graph.edges) == [(0, 1)]


def test_schedule_becomes_control_dependencies_that_let_async_work_overlap():
    """Scheduled: n, start, e, done, a, m. Each node follows the one before it, except that `e`
    (scheduled while the all-reduce is in flight) does not wait for the all-reduce."""
    entry = (
        "  p = f32[16] parameter(0)\n  q = f32[16] parameter(1)\n"
        "  n = f32[16] negate(q)\n"
        "  s = f32[16] all-reduce-start(p), replica_groups={}, channel_id=1, to_apply=add\n"
        "  e = f32[16] exponential(q)\n"
        "  d = f32[16] all-reduce-done(s)\n"
        "  a = f32[16] add(d, e)\n"
        "  m = f32[16] multiply(q, q)\n"
        "  ROOT t = (f32[16], f32[16], f32[16]) tuple(a, m, n)"
    )
    graph = graph_of(entry, scheduled=True)
    assert [data["op"] for _, data in graph.nodes()] == [
        "negate", "all_reduce", "exponential", "add", "multiply"
    ]
    edges = {(u, v): bool(data.get("ctrl")) for u, v, data in graph.graph.edges(data=True)}
    assert edges == {
        (0, 1): True,  # the all-reduce is issued after the negate
        (0, 2): True,  # the exp follows the negate, not the in-flight all-reduce
        (1, 3): False,  # data: the add reads the all-reduce's result ...
        (2, 3): False,  # ... and the exp's
        (3, 4): True,  # the multiply is scheduled after the add
    }


def test_data_edges_carry_each_value_once_in_the_type_its_reader_sees():
    """The multiply reads the negate's f32[16,4] twice (one value, 256 bytes); the exponential
    reads it through a free reshape, as f32[64]."""
    entry = (
        "  p = f32[16,4] parameter(0)\n  n = f32[16,4] negate(p)\n  m = f32[16,4] multiply(n, n)\n"
        "  r = f32[64] reshape(n)\n  x = f32[64] exponential(r)\n"
        "  ROOT t = (f32[16,4], f32[64]) tuple(m, x)"
    )
    graph = graph_of(entry)
    assert [data["op"] for _, data in graph.nodes()] == ["negate", "multiply", "exponential"]
    carried = {(u, v): [(t.shape, t.nbytes) for _, t in values]
               for u, v, values in graph.graph.edges(data="values")}
    assert carried == {(0, 1): [((16, 4), 256)], (0, 2): [((64,), 256)]}


def test_unscheduled_graph_has_data_edges_only():
    entry = "  q = f32[16] parameter(0)\n  n = f32[16] negate(q)\n  ROOT e = f32[16] exponential(q)"
    assert list(graph_of(entry).graph.edges) == []
    assert list(graph_of(entry, scheduled=True).graph.edges(data="ctrl")) == [(0, 1, True)]


OPTIMIZED_LOOP = """
cond_fusion {
  i = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT lt = pred[] compare(i, b), direction=LT
}

step_fusion {
  i = s32[] parameter(0)
  one = s32[] parameter(1)
  ROOT next = s32[] add(i, one)
}

cond {
  t = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(t), index=0
  five = s32[] constant(5)
  ROOT f = pred[] fusion(i, five), kind=kLoop, calls=cond_fusion
}

body {
  t = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(t), index=0
  c = s32[] copy(i)
  one = s32[] constant(1)
  next = s32[] fusion(c, one), kind=kLoop, calls=step_fusion
  x = f32[8] get-tuple-element(t), index=1
  e = f32[8] exponential(x)
  ROOT r = (s32[], f32[8]) tuple(next, e)
}
"""


def test_optimised_loop_counts_through_fusions_and_copies():
    """The optimised module wraps the loop's compare and increment in fusions and copies the
    counter; the trip count (5) is still read from the loop."""
    entry = (
        "  x = f32[8] parameter(0)\n  zero = s32[] constant(0)\n  z = s32[] copy(zero)\n"
        "  t = (s32[], f32[8]) tuple(z, x)\n"
        "  w = (s32[], f32[8]) while(t), condition=cond, body=body\n"
        "  ROOT y = f32[8] get-tuple-element(w), index=1"
    )
    graph = graph_of(entry, ranks=1, computations=OPTIMIZED_LOOP)
    exps = [n for n, data in graph.nodes() if data["op"] == "exponential"]
    assert len(exps) == 5
    assert all(graph.graph.has_edge(a, b) for a, b in zip(exps, exps[1:]))


def test_broadcast_is_replayed_from_a_chain_duration():
    """ASTRA-sim replays BROADCAST from duration_micros: a pipelined chain over the 4-rank group,
    3 hops of 5 us plus 128 bytes at 400 GB/s = 15.0003 us, rounded up."""
    from flint.devices import BUILTIN
    from flint.emit.chakra import NodeMessages
    from flint.emit.durations import RunningMicros
    from flint.emit.plan import COLLECTIVE, Planned
    from flint.schema import et_def_pb2 as pb
    from flint.trace.reader import attr_value

    entry = (
        "  p = bf16[16,4] parameter(0)\n"
        "  ROOT b = bf16[16,4] collective-broadcast(p), replica_groups={{0,1,2,3},{4,5,6,7}}, "
        "channel_id=1"
    )
    graph = graph_of(entry)
    messages = NodeMessages(BUILTIN["h100"], "roofline")
    (node,) = [n for n, data in graph.nodes() if data["kind"] == "collective"]
    data = graph.graph.nodes[node]
    message = messages.message(Planned(COLLECTIVE, 0, (), (), data, data["name"], 0), RunningMicros())
    assert attr_value(message, "comm_type") == pb.BROADCAST
    assert attr_value(message, "comm_size") == 128
    assert message.duration_micros == 16


def sliced_all_reduce(table: str, slice_sizes: str = "{8,4}", offsets: str = "o, z") -> str:
    """An all-reduce over pairs {0,1},{2,3} of 4 ranks, then a slice at a partition-id table offset,
    the way the partitioner writes a reduce-scatter."""
    return (
        "  p = f32[16,4] parameter(0)\n"
        "  r = f32[16,4] all-reduce(p), replica_groups={{0,1},{2,3}}, channel_id=1, "
        "use_global_device_ids=true, to_apply=add\n"
        "  c = f32[16,4] copy(r)\n"
        f"  t = s32[4] constant({table})\n"
        "  id = u32[] partition-id()\n"
        "  e = s32[1] dynamic-slice(t, id), dynamic_slice_sizes={1}\n"
        "  o = s32[] reshape(e)\n"
        "  z = s32[] constant(0)\n"
        f"  ROOT s = f32{slice_sizes.replace('{', '[').replace('}', ']')} dynamic-slice(c, {offsets}), "
        f"dynamic_slice_sizes={slice_sizes}"
    )


def test_all_reduce_then_own_slice_is_a_reduce_scatter():
    """Ranks 0 and 2 keep rows 8..15, ranks 1 and 3 rows 0..7: each pair splits the sum in two."""
    nodes = [data for _, data in graph_of(sliced_all_reduce("{8, 0, 8, 0}"), ranks=4).nodes()]
    # the copy and the slice are the collective's; the nodes keep the instructions' names as source
    assert [data["source_op"] for data in nodes] == ["r", "e"]
    node = nodes[0]
    assert (node["op"], node["collective"]) == ("reduce_scatter", "reduce_scatter")
    assert node["groups"] == ((0, 1), (2, 3))
    assert node["comm_bytes"] == 16 * 4 * 4  # comm_size of a reduce-scatter: its full input
    assert node["bytes"] == 16 * 4 * 4 + 8 * 4 * 4  # reads the input, writes the rank's piece


@pytest.mark.parametrize(
    "table, slice_sizes, offsets",
    [
        ("{0, 0, 8, 8}", "{8,4}", "o, z"),  # both ranks of a pair keep the same rows
        ("{0, 8, 0, 8}", "{8,2}", "o, z"),  # cuts two dimensions
        ("{0, 4, 8, 12}", "{4,4}", "o, z"),  # quarters over pairs
        ("{8, 0, 8, 0}", "{8,4}", "o, o"),  # the kept dimension is offset too
    ],
    ids=["same-piece", "two-dims", "wrong-size", "offset-kept-dim"],
)
def test_other_slices_of_an_all_reduce_stay_as_they_are(table, slice_sizes, offsets):
    graph = graph_of(sliced_all_reduce(table, slice_sizes, offsets), ranks=4)
    assert [data["op"] for _, data in graph.nodes()] == ["all_reduce", "copy", "dynamic_slice", "dynamic_slice"]

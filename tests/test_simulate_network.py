"""`flint simulate`'s network: ASTRA-sim dimensions laid over the mesh, derived by hand.

ASTRA-sim's NPU id varies fastest along network dimension 0, Flint's rank along the mesh's last
axis, so dimension 0 holds the innermost axes. On `hgx` the first tier is an 8-rank NVLink node
(400 GB/s, 936.25 ns) and the second the scale-out switch (50 GB/s, 2,000 ns).
"""

from __future__ import annotations

import math
import re

import pytest

from flint.devices import BUILTIN as DEVICES
from flint.errors import FlintError
from flint.step.models import collective_model, reader_collectives
from flint.step.nccl import NcclModel, Placement
from flint.step.network import Dimension, network_for

NVLINK = ("Switch", 400.0, 936.25)
SCALE_OUT = ("Switch", 50.0, 2000.0)


def dims(*rows):
    return tuple(Dimension(topology, npus, bw, lat, axes) for (topology, bw, lat), npus, axes in rows)


@pytest.mark.parametrize(
    "axes, expected",
    [
        # 8 ranks: one node holds tensor (4) and data (2)
        ([("data", 2), ("tensor", 4)], dims((NVLINK, 8, ("tensor", "data")))),
        # 16 ranks: tensor 4 and half of data in a node; data's high factor 2 across nodes
        ([("data", 4), ("tensor", 4)], dims((NVLINK, 8, ("tensor", "data")), (SCALE_OUT, 2, ("data",)))),
        # 256 ranks: tensor 8 fills a node; data 8 x pp 4 = 32 nodes
        ([("pp", 4), ("data", 8), ("tensor", 8)],
         dims((NVLINK, 8, ("tensor",)), (SCALE_OUT, 32, ("data", "pp")))),
        # an axis of 1 takes no place; 3 does not divide the 2 places left in a node of 8, and 12
        # ranks do not fit in one: all of it goes outside
        ([("data", 3), ("one", 1), ("tensor", 4)], dims((NVLINK, 4, ("tensor",)), (SCALE_OUT, 3, ("data",)))),
        # 6 ranks fit in one node of 8, whatever divides what: one node holds them all
        ([("data", 3), ("tensor", 2)], dims((NVLINK, 6, ("tensor", "data")))),
        # tensor 6 does not divide a node of 8: a node holds one group, 2 GPUs idle (before, 2 of
        # each group a node, the group across 3 nodes)
        ([("data", 2), ("tensor", 6)], dims((NVLINK, 6, ("tensor",)), (SCALE_OUT, 2, ("data",)))),
    ],
)
def test_hgx_lays_the_innermost_axes_in_a_node(axes, expected):
    network = network_for("hgx", axes)
    assert network.dimensions == expected
    assert network.npus == math.prod(size for _, size in axes)


def test_ranks_that_fit_in_one_nvl72_rack_share_it():
    """64 ranks (data 8 x tensor 8) in a rack of 72 GPUs: one NVLink domain of 64, whose all-reduces
    NCCL runs in one node. Before, data went to the NICs because 8 does not divide the 9 places left
    beside tensor's 8 (72 / 8), and the step came out as on 8-GPU hgx-b200 nodes."""
    network = network_for("nvl72", [("data", 8), ("tensor", 8)])
    assert network.dimensions == dims((("Switch", 900.0, 936.25), 64, ("tensor", "data")))
    assert network.dimensions_spanned(list(range(0, 64, 8))) == [0]
    # 144 ranks (data 18) span two racks: tensor 8 and data's low 9 in a rack, its high 2 across
    network = network_for("nvl72", [("data", 18), ("tensor", 8)])
    assert [(d.npus, d.axes) for d in network.dimensions] == [(72, ("tensor", "data")), (2, ("data",))]
    # 128 ranks (data 16): 9 places are left beside tensor's 8, and data's largest factor that fits
    # is 8, so two racks of 64 (8 GPUs of each idle); before, 16 nodes of 8, as on hgx-b200
    network = network_for("nvl72", [("data", 16), ("tensor", 8)])
    assert [(d.npus, d.axes) for d in network.dimensions] == [(64, ("tensor", "data")), (2, ("data",))]
    assert NcclModel(network).group_shape(range(0, 128, 8)) == Placement(16, 2)


def test_network_yaml_is_astra_sims_format():
    network = network_for("hgx", [("data", 4), ("tensor", 4)])
    rows = [line for line in network.to_yaml().splitlines() if not line.startswith("#")]
    assert rows == [
        "topology: [ Switch, Switch ]",
        "npus_count: [ 8, 2 ]",
        "bandwidth: [ 400.0, 50.0 ]",
        "latency: [ 936.25, 2000.0 ]",
    ]


def test_links_follow_the_dimensions_a_group_spans():
    network = network_for("hgx", [("data", 4), ("tensor", 4)])
    # ranks 0..3: a tensor group, inside a node; 0, 4: data's low factor, inside; 0, 8: across nodes
    assert network.dimensions_spanned([0, 1, 2, 3]) == [0]
    assert network.dimensions_spanned([0, 4]) == [0]
    assert network.dimensions_spanned([0, 4, 8, 12]) == [0, 1]


def test_a_yaml_network_must_cover_the_ranks(tmp_path):
    path = tmp_path / "net.yml"
    path.write_text("topology: [ Ring, Switch ]\nnpus_count: [ 4, 2 ]\nbandwidth: [ 100, 25 ]\nlatency: [ 500, 1000 ]\n")
    network = network_for(str(path), [("data", 2), ("tensor", 4)])
    assert [(d.topology, d.npus, d.bandwidth_gbps, d.latency_ns) for d in network.dimensions] == [
        ("Ring", 4, 100.0, 500.0), ("Switch", 2, 25.0, 1000.0)]
    with pytest.raises(FlintError, match="has 8 NPUs .* but the trace has 16 ranks"):
        network_for(str(path), [("data", 4), ("tensor", 4)])
    path.write_text("topology: [ Torus ]\nnpus_count: [ 8 ]\nbandwidth: [ 1 ]\nlatency: [ 1 ]\n")
    with pytest.raises(FlintError, match="'Torus' is not one of Ring, Switch, FullyConnected"):
        network_for(str(path), [("data", 8)])
    with pytest.raises(FlintError, match="unknown --network 'dgx': use one of .*hgx.*, a network file \\(.toml\\) or an ASTRA-sim network \\(.yml\\)"):
        network_for("dgx", [("data", 8)])


def test_a_network_of_one_node_holds_its_gpus_and_no_more(tmp_path):
    """A file with [node] gpus = 8 and no [scale_out] timed 16 ranks as one 16-GPU node, its gpus
    ignored: it is refused; 8 ranks are its one node. `flat` (no gpus: every rank in one NVLink
    domain, docs/simulate.md) still holds any number, 64 ranks on one switch of 400 GB/s, 936.25 ns."""
    path = tmp_path / "node.toml"
    path.write_text('name = "node"\n[node]\ngpus = 8\nbus_gbps = 200\n')
    assert network_for(str(path), [("data", 2), ("tensor", 4)]).dimensions == dims((NVLINK, 8, ("tensor", "data")))
    expected = (f"network {path} is one node of 8 GPUs and no [scale_out], but the trace has 16 ranks: "
                "add a [scale_out] to it, or give a network that has one")
    with pytest.raises(FlintError, match=re.escape(expected)):
        network_for(str(path), [("data", 4), ("tensor", 4)])
    assert network_for("flat", [("data", 8), ("tensor", 8)]).dimensions == dims((NVLINK, 64, ("tensor", "data")))


def test_nccls_model_refuses_a_yaml_of_three_dimensions(tmp_path):
    """NCCL's model knows a node and the NICs between nodes; a third dimension's bandwidth was
    ignored without a word (the step the same at 0.01 and 1,000 GB/s). ASTRA-sim's model takes it."""
    path = tmp_path / "three.yml"
    path.write_text("topology: [ Switch, Switch, Switch ]\nnpus_count: [ 4, 2, 2 ]\nbandwidth: [ 300, 50, 0.01 ]\n"
                    "latency: [ 500, 1000, 3000 ]\n")
    network = network_for(str(path), [("pp", 2), ("data", 2), ("tensor", 4)])
    with pytest.raises(FlintError, match=r"has 3 dimensions, and NCCL's model knows two .*--collectives astra-sim"):
        collective_model("nccl", network, DEVICES["h100"])
    assert collective_model("astra-sim", network, DEVICES["h100"]).network is network


def test_one_link_is_named_by_what_times_it():
    """--link-gbps under NCCL's model, which times no hop latency: the name said 'one link of 100
    GB/s, 0.93625 µs' (the flat preset's latency, which --link-latency-us is refused for there)."""
    nccl = reader_collectives(None, None, 8, link_gbps=100.0)
    assert nccl.network.name == "one link of 100 GB/s"
    astra = reader_collectives(None, None, 8, link_gbps=100.0, link_latency_us=2.0, model="astra-sim")
    assert astra.network.name == "one link of 100 GB/s, 2 µs"

"""Layouts chosen on the command line: presets, rules, config files, and their bad inputs.

Expected collectives come from `test_gpt`'s hand derivations for a (dp, tp) split of the batch and
the model: a preset that uses every mesh axis for data is dp = ranks, tp = 1; one that uses only the
tensor axis is dp = 1 (the batch replicated), tp = its size. Groups of one rank move nothing and are
left out of the expectation, as they are of the trace.
"""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLES, MODELS, extract, flint, load_example
from test_gpt import (
    AG,
    AR,
    BF16,
    F32,
    RS,
    Dims,
    collectives,
    fsdp_collectives,
    gpt,
    gpt_collectives,
    matmul_flops,
    read_rank,
)

from flint.errors import FlintError
from flint.schema import et_def_pb2 as pb
from flint.trace.reader import attr_value

A2A = pb.ALL_TO_ALL

PARAM_RULES = {
    # gpt.py's own Megatron layout (tp_layout), written as path patterns over params, m and v.
    "(params|opt/m|opt/v)/layers/(wq|wk|wv)": "None,None,tensor",
    "(params|opt/m|opt/v)/layers/wo": "None,tensor",
    "(params|opt/m|opt/v)/layers/w_in": "None,None,tensor",
    "(params|opt/m|opt/v)/layers/w_out": "None,tensor",
    "(params|opt/m|opt/v)/embed": "tensor",
    "(params|opt/m|opt/v)/head": "None,tensor",
    "(params|opt/m|opt/v)/(layers/ln.*|ln_f.*)": "",
    "batch/.*": "data",
}


def rank_files(directory):
    return sorted(p.name.split(".", 1)[1] for p in directory.glob("*.et"))


def same_traces(a, b) -> bool:
    """Every rank's file byte for byte (the prefixes may differ)."""
    (prefix_a,), (prefix_b,) = {p.name.split(".")[0] for p in a.glob("*.et")}, {
        p.name.split(".")[0] for p in b.glob("*.et")
    }
    return rank_files(a) == rank_files(b) and all(
        (a / f"{prefix_a}.{r}").read_bytes() == (b / f"{prefix_b}.{r}").read_bytes()
        for r in rank_files(a)
    )


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """Each (model, mesh, flags) extracted once for this module."""
    cache = {}

    def get(model: str, mesh: str, *flags: str):
        if (model, mesh, flags) not in cache:
            out = tmp_path_factory.mktemp(model) / "traces"
            extract(EXAMPLES / f"{model}.py", mesh, out, *flags)
            cache[model, mesh, flags] = out
        return cache[model, mesh, flags]

    return get


def expected_collectives(derive, m: Dims, rank: int):
    return sorted((kind, size, group) for kind, size, group in derive(m, rank) if len(group) > 1)


def fsdp_regathering_the_head(m: Dims, rank: int):
    """fsdp.py's collectives where the partitioner gathers the head [Dd, v] again for its backward
    matmul instead of reusing the forward's gathered copy (it does on 2x2x2, not on 2x4)."""
    return fsdp_collectives(m, rank) + [(AG, m.dd * m.v * BF16, m.data_group(rank))]


@pytest.mark.parametrize(
    "strategy, mesh, dims, derive",
    [
        ("dp", "4x2", Dims(8, 1), gpt_collectives),
        ("tp", "4x2", Dims(1, 2), gpt_collectives),
        ("dp+tp", "2x2x2", Dims(4, 2), gpt_collectives),
        ("dp", "2x2x2", Dims(8, 1), gpt_collectives),
        ("fsdp+tp", "2x2x2", Dims(4, 2), fsdp_regathering_the_head),
        ("fsdp", "4x2", Dims(8, 1), fsdp_collectives),
        ("tp", "2x2x2", Dims(1, 2), gpt_collectives),
    ],
    ids=["dp", "tp", "dp+tp-3d", "dp-3d", "fsdp+tp-3d", "fsdp", "tp-3d"],
)
def test_preset_collectives_every_rank(traces, strategy, mesh, dims, derive):
    """DP: only gradient (and loss) all-reduces over all ranks at full parameter size. TP: only the
    tensor group's activation all-reduces (2 per layer forward, 4 backward, lookup, loss, head).
    FSDP is fsdp.py's derivation (all-gathers before use, gradient reduce-scatters) with every rank
    in the data group. On a 3-D mesh the data group spans the two leading axes; FSDP+TP there is
    fsdp.py's layout with that data group."""
    out = traces("gpt", mesh, "--strategy", strategy)
    for rank in range(8):
        nodes, groups = read_rank(out, rank)
        found = sorted((kind, size, group) for kind, size, group, _ in collectives(nodes, groups))
        assert found == expected_collectives(derive, dims, rank), f"rank {rank}"
        dots = [n for n in nodes if attr_value(n, "op") in ("dot", "dot_general")]
        assert sum(attr_value(n, "num_ops") for n in dots) == matmul_flops(dims), f"rank {rank}"


def test_tp_preset_has_two_forward_all_reduces_per_layer(traces):
    out = traces("gpt", "4x2", "--strategy", "tp")
    nodes, groups = read_rank(out, 0)
    forward = [
        c for c in collectives(nodes, groups) if "/jvp()/while/body/" in c[3] and c[0] == AR
    ]
    assert len(forward) == 2 * gpt.LAYERS
    assert {c[1] for c in forward} == {gpt.BATCH * gpt.SEQ * gpt.D_MODEL * BF16}


@pytest.mark.parametrize(
    "strategy, mesh, dims",
    [("dp+tp+sp", "4x2", Dims(4, 2)), ("dp+tp+sp", "2x2x2", Dims(4, 2)), ("tp+sp", "8", Dims(1, 8))],
    ids=["dp+tp+sp", "dp+tp+sp-3d", "tp+sp-1d"],
)
def test_sequence_parallel_layers_gather_and_reduce_scatter(traces, strategy, mesh, dims):
    """Megatron SP: the residual stream between sublayers is split by sequence over the tensor
    group, so each sublayer all-gathers its input [b, S/tp, D] and reduce-scatters its output
    ([b, S, D] bf16, comm_size the full input) instead of all-reducing it: per layer forward AG, RS,
    AG, RS and no all-reduce. The gathered input is the layernorm's output, which the partitioner
    gathers before or after its cast to bf16 (f32 on 4x2, bf16 on 2x2x2): either element size.
    (`tp+sp` is checked on a tensor-only mesh: on a 4x2 mesh it leaves the data axis idle, the batch
    replicated, and XLA spends the idle axis on a layout of its own.)"""
    out = traces("gpt", mesh, "--strategy", strategy)
    S, D, L = gpt.SEQ, gpt.D_MODEL, gpt.LAYERS
    for rank in range(8):
        nodes, groups = read_rank(out, rank)
        forward = [c[:3] for c in collectives(nodes, groups) if "/jvp()/while/body/" in c[3]]
        group = dims.tensor_group(rank)
        gathered = dims.b * S // dims.tp * D
        scatter = (RS, dims.b * S * D * BF16, group)
        assert [c[0] for c in forward] == [AG, RS, AG, RS] * L, f"rank {rank}"
        assert [c for c in forward if c[0] == RS] == [scatter] * (2 * L), f"rank {rank}"
        assert {c[2] for c in forward} == {group}
        assert {c[1] for c in forward if c[0] == AG} <= {gathered * BF16, gathered * F32}


def test_expert_parallelism_that_splits_no_weight_says_so(tmp_path):
    """moe.py keeps its experts w_in [E, D, F] and w_out [E, F, D] beside the router [D, E], whose
    first dimension is not E: no parameters under one path share a first dimension of experts, so
    `--strategy ep` splits no weight (each stays whole in the manifest), and one warning says so;
    moe_gshard.py's experts sit under a path of their own (params/experts) and are split, silently."""
    run = flint("extract", EXAMPLES / "moe.py", "--mesh", "4x2", "--backend", "cpu", "--strategy", "ep",
                "-o", tmp_path / "moe")
    assert run.returncode == 0, run.stderr
    said = [line for line in run.stderr.splitlines() if "no weight is split over the expert axis data" in line]
    assert len(said) == 1 and "ep_plan" in said[0]
    specs = json.loads((tmp_path / "moe" / "manifest.json").read_text())["layout"]["inputs"]
    assert all(dim == [] for path, spec in specs.items() if path.startswith("params/") for dim in spec)
    run = flint("extract", EXAMPLES / "moe_gshard.py", "--mesh", "4x2", "--backend", "cpu", "--strategy", "ep",
                "-o", tmp_path / "gshard")
    assert run.returncode == 0 and "expert axis" not in run.stderr


@pytest.mark.parametrize("mesh, ep", [("4x2", 4), ("2x2x2", 2)], ids=["4x2", "2x2x2"])
def test_expert_parallel_preset_dispatches_with_all_to_all(traces, mesh, ep):
    """moe_gshard.py under `--strategy ep`: experts over the first axis (ep ways), one token group
    per rank. Per rank: 3 all_to_all over its expert group (the ranks that differ only in the first
    coordinate; dispatch, return, and the return's transpose in backward) of its [EXPERTS, 1,
    CAPACITY, D_MODEL] bf16 buffers; all-reduces of the w_in and w_out gradients [EXPERTS/ep, D, F]
    bf16 over the expert's replicas (same first coordinate), of the router gradient [D, EXPERTS]
    bf16 and of the f32 loss over all ranks."""
    moe = load_example("moe_gshard")
    out = traces("moe_gshard", mesh, "--strategy", "ep")
    replicas = 8 // ep
    buffers = moe.EXPERTS * (moe.GROUPS // 8) * moe.CAPACITY * moe.D_MODEL * BF16
    experts = moe.EXPERTS // ep * moe.D_MODEL * moe.D_FF * BF16
    everyone = tuple(range(8))
    for rank in range(8):
        expert_group = tuple(e * replicas + rank % replicas for e in range(ep))
        replica_group = tuple(rank // replicas * replicas + r for r in range(replicas))
        nodes, groups = read_rank(out, rank)
        found = sorted((kind, size, tuple(sorted(group))) for kind, size, group, _ in collectives(nodes, groups))
        assert found == sorted(
            [(A2A, buffers, expert_group)] * 3
            + [(AR, experts, replica_group)] * 2
            + [(AR, moe.D_MODEL * moe.EXPERTS * BF16, everyone), (AR, F32, everyone)]
        ), f"rank {rank}"
    assert same_traces(out, traces("moe_gshard", mesh))  # the model's own rules say the same


def test_presets_reproduce_the_hand_written_layouts(traces):
    """gpt.py's own layout is DP+TP by the preset's shape rules, fsdp.py's is FSDP+TP."""
    assert same_traces(traces("gpt", "4x2"), traces("gpt", "4x2", "--strategy", "dp+tp"))
    assert same_traces(traces("fsdp", "4x2"), traces("gpt", "4x2", "--strategy", "fsdp+tp"))
    assert not same_traces(traces("gpt", "4x2"), traces("fsdp", "4x2"))


def test_preset_rules_and_config_give_identical_traces(traces, tmp_path):
    """DP+TP three ways, starting from a model layout that is replaced entirely: the preset; the
    path rules plus logical rules on the command line; the same in a config file."""
    preset = traces("gpt", "4x2", "--strategy", "dp+tp")
    flags = [f"--shard={pattern}={spec}" for pattern, spec in PARAM_RULES.items()]
    flags += ["--rule", "batch=data", "--rule", "vocab=tensor"]
    extract(EXAMPLES / "fsdp.py", "4x2", tmp_path / "cli", *flags)
    config = tmp_path / "layout.toml"
    config.write_text(
        "[rules]\nbatch = 'data'\nvocab = 'tensor'\n\n[shard]\n"
        + "".join(f"'{pattern}' = '{spec}'\n" for pattern, spec in PARAM_RULES.items())
    )
    extract(EXAMPLES / "fsdp.py", "4x2", tmp_path / "config", "--config", str(config))
    assert same_traces(preset, tmp_path / "cli")
    assert same_traces(preset, tmp_path / "config")


def test_explain_lists_every_input_with_its_source(tmp_path):
    run = flint(
        "extract", EXAMPLES / "mlp.py", "--mesh", "data=2,tensor=4", "-o", tmp_path / "t",
        "--strategy", "fsdp+tp", "--shard", "batch/y=None,tensor", "--explain",
    )
    assert run.returncode == 0, run.stderr
    rows = {line.split()[0]: line.split() for line in run.stderr.splitlines() if "/" in line.split()[0]}
    # mlp: D = 1024 (batch width), w_in [D, 4096] column-parallel, w_out [4096, D] row-parallel;
    # FSDP takes the other dimension over data.
    assert rows["params/w_in"][4:] == ["(data,", "tensor)", "strategy", "fsdp+tp"]
    assert rows["params/w_out"][4:] == ["(tensor,", "data)", "strategy", "fsdp+tp"]
    assert rows["batch/x"][4:] == ["(data,", "None)", "strategy", "fsdp+tp"]
    assert rows["batch/y"][4:] == ["(None,", "tensor)", "cli"]


@pytest.mark.parametrize(
    "flags, words",
    [
        (("--rule", "batch=nope"), ("rule batch=nope", "unknown mesh axis 'nope'")),
        (("--shard", "params/w_in=None,nope"), ("params/w_in", "unknown mesh axis 'nope'")),
        (("--shard", "params/w_in=data,tensor,None"), ("params/w_in", "rank 2", "3 dimensions")),
        (("--shard", "params/w_in=data+tensor,tensor"), ("params/w_in", "'tensor' twice")),
        (("--shard", "batch/x=None,nope+"), ("unknown mesh axis",)),
        (("--mesh", "3x2", "--shard", "params/w_in=data"), ("params/w_in", "dimension 0", "data")),
        (("--config", "missing.toml"), ("missing.toml", "not found")),
    ],
    ids=["rule-axis", "shard-axis", "too-long", "axis-twice", "empty-axis", "indivisible", "config"],
)
def test_bad_layouts_are_refused_in_one_line(tmp_path, flags, words):
    mesh = () if "--mesh" in flags else ("--mesh", "2x4")
    run = flint("extract", EXAMPLES / "mlp.py", *mesh, *flags, "-o", tmp_path / "t")
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), run.stderr
    assert all(word in lines[0] for word in words), lines[0]
    assert not (tmp_path / "t").exists()


def test_rule_matching_nothing_is_a_warning(tmp_path):
    run = flint(
        "extract", EXAMPLES / "mlp.py", "--mesh", "2x4", "-o", tmp_path / "t", "--shard", "params/nothing=data"
    )
    assert run.returncode == 0, run.stderr
    assert "warning: --shard params/nothing (cli) matches no input" in run.stderr


def test_logical_inputs_follow_the_rules(tmp_path):
    """A model naming logical axes of its inputs gets them split by --rule, unsplit without one."""
    from flint.compile.backend import make_virtual_mesh
    from flint.frontend import load_workload
    from flint.layout import LayoutRequest, apply_layout, parse_rule
    from flint.mesh import parse_mesh

    mesh = make_virtual_mesh(parse_mesh("2x4"))
    workload = load_workload(MODELS / "logical.py", mesh)
    request = LayoutRequest(rules=(parse_rule("mlp=tensor"), parse_rule("batch=data")))
    _, layout = apply_layout(workload, mesh, request)
    assert {i.path: i.spec for i in layout.inputs} == {
        "params/w": ((), ("tensor",)),
        "x": (("data",), ()),
    }
    _, bare = apply_layout(workload, mesh, LayoutRequest())
    assert {i.path: i.spec for i in bare.inputs} == {"params/w": ((), ()), "x": ((), ())}
    with pytest.raises(FlintError, match="unknown mesh axis 'model'"):
        apply_layout(workload, mesh, LayoutRequest(rules=(parse_rule("mlp=model"),)))
    with pytest.raises(FlintError, match="unknown strategy 'zero'"):  # e.g. from a config file
        apply_layout(workload, mesh, LayoutRequest(strategy="zero"))


def test_example_layout_file_takes_effect(traces):
    """examples/layout.toml (README "Exploring layouts") on gpt.py, 4x2. The manifest records what
    the file asks for: its strategy, its rules, and for every input the spec of the last [shard]
    pattern matching its whole path, else the strategy's own. And the trace does it: the file
    splits w_in and w_out (and their AdamW moments) over the data axis too, so each layer
    all-gathers both [D/dp, f] bf16 shards over the data group in forward and again in backward,
    and reduce-scatters their gradients there instead of all-reducing them (same comm_size: the
    full TP-local gradient [D, f]); every other collective is DP+TP's (test_gpt)."""
    import json
    import re
    import tomllib

    config = tomllib.loads((EXAMPLES / "layout.toml").read_text())
    out = traces("gpt", "4x2", "--config", str(EXAMPLES / "layout.toml"))
    layout = json.loads((out / "manifest.json").read_text())["layout"]
    preset = traces("gpt", "4x2", "--strategy", config["strategy"])
    base = json.loads((preset / "manifest.json").read_text())["layout"]

    assert layout["strategy"] == config["strategy"]
    for name, axes in config["rules"].items():
        assert layout["rules"][name] == [a for a in axes.split("+") if a != "None"], name
    expected = {}
    for path, spec in base["inputs"].items():
        for pattern, text in config["shard"].items():
            if re.fullmatch(pattern, path):
                dims = [[] if a in ("", "None") else a.split("+") for a in text.split(",")]
                spec = dims + [[]] * (len(spec) - len(dims))
        expected[path] = spec
    assert layout["inputs"] == expected
    split = {path for path, spec in expected.items() if spec != base["inputs"][path]}
    assert split == {f"{tree}/layers/{w}" for tree in ("params", "opt/m", "opt/v")
                     for w in ("w_in", "w_out")}
    assert expected["params/layers/w_in"] == [[], ["data"], ["tensor"]]
    assert expected["params/layers/w_out"] == [[], ["tensor"], ["data"]]

    m = Dims(4, 2)
    gradient, shard = gpt.D_MODEL * m.f * BF16, m.dd * m.f * BF16
    for rank in range(8):
        data = m.data_group(rank)
        want = [(RS, size, group) if (kind, size, group) == (AR, gradient, data) else (kind, size, group)
                for kind, size, group in gpt_collectives(m, rank)]
        want += [(AG, shard, data)] * (4 * gpt.LAYERS)
        nodes, groups = read_rank(out, rank)
        found = sorted((kind, size, group) for kind, size, group, _ in collectives(nodes, groups))
        assert found == sorted(want), f"rank {rank}"
        dots = [n for n in nodes if attr_value(n, "op") in ("dot", "dot_general")]
        assert sum(attr_value(n, "num_ops") for n in dots) == matmul_flops(m), f"rank {rank}"

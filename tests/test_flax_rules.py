"""`--rule` on Flax models' own logical names: linen's boxed parameters and logical constraints,
nnx's sharding metadata, and the warnings for rules that cannot apply.

Both models (tests/models/flax_linen.py, flax_nnx.py) are the same f32 MLP training step on a 2x4
mesh (data = 2 ways, tensor = 4; rank r = 4d + t): x [B, D] -> relu(x @ w_in [D, F]) @ w_out [F, D],
MSE against y, SGD; B = 64, D = 256, F = 512, the batch split over data by its own sharding, so
b = B/2 = 32 rows per rank. Per rank the step has five matmuls: forward x @ w_in and h @ w_out,
backward d_out @ w_out^T, h^T @ d_out (w_out's gradient) and x^T @ d_h (w_in's); each is
2 * b * (the rank's share of D * F) FLOPs. Gradients of replicated dimensions are summed over the
data group; the f32 loss (4 bytes) over every group its mean spans.
"""

from __future__ import annotations

import pytest
from conftest import MODELS, extract_warnings, matmuls_and_collectives

from flint.schema import et_def_pb2 as pb

pytest.importorskip("flax")

AR = pb.ALL_REDUCE
F32 = 4
B, D, F = 64, 256, 512
b = B // 2
LINEN, NNX = MODELS / "flax_linen.py", MODELS / "flax_nnx.py"


def tensor_group(rank):
    return tuple(range(rank // 4 * 4, rank // 4 * 4 + 4))


def data_group(rank):
    return (rank % 4, rank % 4 + 4)


def megatron(rank):
    """w_in column-parallel [D, F/4], w_out row-parallel [F/4, D]: the forward output is summed over
    the tensor group (b x D); each weight gradient is TP-local (D x F/4) and summed over data."""
    flops = 5 * 2 * b * D * (F // 4)
    return flops, sorted(
        [(AR, b * D * F32, tensor_group(rank))]
        + [(AR, D * F // 4 * F32, data_group(rank))] * 2
        + [(AR, F32, data_group(rank))]
    )


def data_parallel(rank):
    """Both weights whole: the tensor ranks repeat the work; gradients (D x F) summed over data."""
    return 5 * 2 * b * D * F, sorted([(AR, D * F * F32, data_group(rank))] * 2 + [(AR, F32, data_group(rank))])


def embed_split(rank):
    """`embed` over tensor: w_in row-parallel [D/4, F] (x is sliced locally), so h (b x F) is summed
    over the tensor group, and so is d_h in backward (d_out @ w_out^T with w_out [F, D/4]); the
    output is split by columns, so the loss is summed over the tensor group, then over data; each
    weight gradient (D/4 x F) is summed over data."""
    flops = 5 * 2 * b * (D // 4) * F
    return flops, sorted(
        [(AR, b * F * F32, tensor_group(rank))] * 2
        + [(AR, F32, tensor_group(rank)), (AR, F32, data_group(rank))]
        + [(AR, D // 4 * F * F32, data_group(rank))] * 2
    )


def assert_every_rank(out, derive):
    for rank in range(8):
        assert matmuls_and_collectives(out, rank) == derive(rank), f"rank {rank}"


def test_linen_names_follow_rules(tmp_path):
    """linen kernels ("embed", "mlp") and ("mlp", "embed") and the constraint ("batch", "mlp")."""
    found = extract_warnings(LINEN, "2x4", tmp_path / "t", "--rule", "batch=data", "--rule", "mlp=tensor",
                             "--rule", "embed=None")
    assert found == []
    assert_every_rank(tmp_path / "t", megatron)


def test_linen_names_laid_out_the_other_way(tmp_path):
    """The same model with `embed` split instead of `mlp`, from the command line alone."""
    found = extract_warnings(LINEN, "2x4", tmp_path / "t", "--rule", "embed=tensor", "--rule", "mlp=None",
                             "--rule", "batch=data")
    assert found == []
    assert_every_rank(tmp_path / "t", embed_split)


def test_nnx_metadata_follows_the_models_flax_table(tmp_path):
    """nnx `with_partitioning` and `out_sharding` names under the model's own Flax rule table
    (mlp over tensor)."""
    found = extract_warnings(NNX, "2x4", tmp_path / "t")
    assert found == []
    assert_every_rank(tmp_path / "t", megatron)


def test_config_and_command_line_rules_override_the_models(tmp_path):
    """Precedence: the model's table < the config file's [rules] < --rule."""
    config = tmp_path / "layout.toml"
    config.write_text("[rules]\nmlp = 'None'\n")
    extract_warnings(NNX, "2x4", tmp_path / "config", "--config", str(config))
    assert_every_rank(tmp_path / "config", data_parallel)
    extract_warnings(NNX, "2x4", tmp_path / "cli", "--config", str(config), "--rule", "mlp=tensor")
    assert_every_rank(tmp_path / "cli", megatron)


def test_rule_naming_nothing_is_a_warning(tmp_path):
    """`batch` names no input of the linen model but its constraint uses it: no warning for it;
    `nothing` is used nowhere, from the command line or from a config file."""
    config = tmp_path / "layout.toml"
    config.write_text("[rules]\nunused = 'tensor'\n")
    found = extract_warnings(
        LINEN, "2x4", tmp_path / "t", "--config", str(config),
        "--rule", "batch=data", "--rule", "mlp=tensor", "--rule", "embed=None", "--rule", "nothing=data",
    )
    assert found == [
        "warning: --rule unused (config layout.toml) names no logical axis of any input or constraint",
        "warning: --rule nothing (cli) names no logical axis of any input or constraint",
    ]
    assert_every_rank(tmp_path / "t", megatron)


def test_flax_name_without_a_rule_is_a_warning(tmp_path):
    """`embed` is on both linen kernels and no rule maps it: it stays whole, and the user is told."""
    found = extract_warnings(LINEN, "2x4", tmp_path / "t", "--rule", "batch=data", "--rule", "mlp=tensor")
    assert found == [
        "warning: logical axis 'embed' of variables/params/w_in/kernel, variables/params/w_out/kernel "
        "has no rule: left unsplit (give --rule embed=AXES, or embed=None to keep it whole)"
    ]
    assert_every_rank(tmp_path / "t", megatron)

"""Every batch input is cut into microbatches: a batch in two arguments (`step(params, opt,
tokens, targets)`, as Megatron-LM writes it), a batch the model declares (`batch_argnums`), and
the one line where Flint cannot tell which arguments hold the batch.

`tests/models/pipeline_gpt_args.py` is `examples/gpt.py` with 4 layers, a 256-word vocabulary and
16 sequences, on `pp=2,data=2,tensor=2` with M = 4 microbatches: a microbatch is 16 / 4 = 4
sequences, 2 per data rank, so one activation is bf16 [2, SEQ, D_MODEL] = 2 * 128 * 256 * 2 =
131,072 bytes. Rank r = 4p + 2d + t (stage p, data position d, tensor position t): its peer on the
other stage is r +- 4.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from conftest import MODELS, extract, flint, transfers

SEQ, D_MODEL, M = 128, 256, 4
ACTIVATION = 16 // M // 2 * SEQ * D_MODEL * 2
PIPELINE = ("--pipeline-stages", "2", "--microbatches", str(M))


def test_tokens_and_targets_as_two_arguments_pipeline(tmp_path):
    out = tmp_path / "out"
    extract(MODELS / "pipeline_gpt_args.py", "pp=2,data=2,tensor=2", out, "--strategy", "dp+tp", *PIPELINE)
    manifest = json.loads((out / "manifest.json").read_text())
    inputs = manifest["layout"]["inputs"]
    assert inputs["tokens"] == inputs["targets"] == [["data"], []]  # both split as the batch
    assert manifest["pipeline"]["activation_bytes"] == ACTIVATION
    found = transfers(out)
    for rank, ts in found.items():
        peer = rank + 4 if rank < 4 else rank - 4
        assert Counter((t.send, t.dst if t.send else t.src) for t in ts) == {(True, peer): M, (False, peer): M}
        assert {t.size for t in ts} == {ACTIVATION}


SCANNED = '''
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

{declaration}

def step(params, x, y):
    def layer(h, w):
        return jnp.tanh(h @ w["w"] + w["b"]), None

    def loss(params):
        h, _ = jax.lax.scan(layer, x, params["layers"])
        return jnp.mean((h - y) ** 2)

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)

def workload(mesh):
    spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, P()))
    layers = {{"w": spec(4, 64, 64), "b": spec(4, 64)}}
    return step, ({{"layers": layers}}, spec(16, 64), spec(16, 64))
'''


def test_a_batch_flint_cannot_tell_is_one_line_naming_the_argument(tmp_path):
    """x [16, 64] f32, unsplit, has the batch's 16 rows like y: a batch or a weight, shape cannot
    tell."""
    model = tmp_path / "scanned.py"
    model.write_text(SCANNED.format(declaration=""))
    out = tmp_path / "out"
    run = flint("extract", model, "--mesh", "pp=2", "--backend", "cpu", "-o", out, *PIPELINE)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "step argument 'x' (float32[16, 64]) has the batch's 16 rows" in run.stderr
    assert "batch_argnums = (1, 2)" in run.stderr
    assert not out.exists()


def test_a_declared_batch_is_cut(tmp_path):
    """With `batch_argnums = (1, 2)` x and y are cut into 4 microbatches of 4 rows: the activation
    the layer loop carries is f32 [4, 64] = 1,024 bytes."""
    model = tmp_path / "scanned.py"
    model.write_text(SCANNED.format(declaration="batch_argnums = (1, 2)"))
    summary = extract(model, "pp=2", tmp_path / "out", *PIPELINE)
    assert summary["pipeline"]["activation_bytes"] == 16 // M * 64 * 4


def test_batch_arrays_without_one_number_of_rows_are_one_line(tmp_path):
    model = tmp_path / "scanned.py"
    model.write_text(SCANNED.format(declaration="").replace(
        "spec(16, 64), spec(16, 64))", "spec(16, 64), {'y': spec(16, 64), 'scale': spec(64)})"
    ).replace("(h - y)", "(h - y['y']) * y['scale']"))
    run = flint("extract", model, "--mesh", "pp=2", "--backend", "cpu", "-o", tmp_path / "out", *PIPELINE)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "do not share one number of rows (y: [16, 64])" in run.stderr


@pytest.mark.parametrize("declaration, message", [
    ("batch_argnums = (3,)", "batch_argnums names argument 3 but the step takes 3"),
    ("batch_argnums = 'x'", "give the positions of the batch step arguments"),
])
def test_a_bad_batch_declaration_is_one_line(tmp_path, declaration, message):
    model = tmp_path / "scanned.py"
    model.write_text(SCANNED.format(declaration=declaration))
    run = flint("extract", model, "--mesh", "pp=2", "--backend", "cpu", "-o", tmp_path / "out", *PIPELINE)
    assert run.returncode == 2 and message in run.stderr and len(run.stderr.strip().splitlines()) == 1

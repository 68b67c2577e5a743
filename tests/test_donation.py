"""Memory as a training step uses it.

A real training step donates its parameters and optimizer state (`jax.jit(step, donate_argnums=...)`),
so a rank holds one copy of them: its peak is arguments + temporaries + the outputs that reuse no
argument buffer. Flint donates each argument an output replaces (or what the model file declares in
`donate_argnums`; `--no-donate`: nothing). `examples/mlp.py` on 2x4 (see tests/test_gpu.py) is an
SGD step: per rank its parameters are the two [D_MODEL, h] bf16 shards, h = D_HIDDEN/4, and its new
parameters, of the same shapes, are what XLA aliases.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import EXAMPLES, extract, flint, load_example, needs_torch

from flint.trace.reader import attr_value, read_trace

mlp = load_example("mlp")
BF16, F32 = 2, 4
DP, TP = 2, 4
PARAMS = 2 * mlp.D_MODEL * (mlp.D_HIDDEN // TP) * BF16
"""Bytes of one rank's parameter shards, and of its new parameters."""


@pytest.fixture(scope="module")
def mlp_gpu(tmp_path_factory):
    out = tmp_path_factory.mktemp("donation")
    donated = extract(EXAMPLES / "mlp.py", "2x4", out / "donated", "--backend", "gpu:h100")
    kept = extract(EXAMPLES / "mlp.py", "2x4", out / "kept", "--backend", "gpu:h100", "--no-donate")
    return out, donated, kept


def manifest(directory: Path) -> dict:
    return json.loads((directory / "manifest.json").read_text())


def test_sgd_step_donates_its_parameters(mlp_gpu):
    """By hand: the parameters are donated and their new values aliased to them, so the peak
    counts them once; what remains of the outputs is the f32 loss and the output tuple's table."""
    out, summary, _ = mlp_gpu
    memory = summary["memory_per_rank"]
    assert memory["donated"] == memory["aliased"] == PARAMS
    assert memory["arguments"] == PARAMS + 2 * (mlp.BATCH // DP) * mlp.D_MODEL * BF16
    assert F32 <= memory["outputs"] - PARAMS < 64
    assert memory["peak"] == memory["arguments"] + memory["temporaries"] + memory["outputs"] - PARAMS
    recorded = manifest(out / "donated")
    assert recorded["donated_arguments"] == ["params"]
    assert recorded["memory_per_rank"] == memory


def test_peak_is_the_compilers_own_analysis(mlp_gpu):
    """The same step compiled here for the same virtual H100s with the parameters donated: XLA's
    memory analysis gives the same arguments, temporaries, outputs and aliased bytes, and the peak
    is arguments + temporaries + outputs not aliased."""
    import jax

    from flint.compile.backend import make_virtual_mesh, parse_backend
    from flint.compile.capture import WHOLE_LOOPS
    from flint.mesh import parse_mesh

    _, summary, _ = mlp_gpu
    mesh = make_virtual_mesh(parse_mesh("2x4"), parse_backend("gpu:h100"))
    step, args = mlp.workload(mesh)
    with jax.set_mesh(mesh):
        compiled = jax.jit(step, donate_argnums=(0,)).lower(*args).compile(compiler_options=WHOLE_LOOPS)
    own = compiled.memory_analysis()
    memory = summary["memory_per_rank"]
    assert (memory["arguments"], memory["temporaries"], memory["outputs"], memory["aliased"]) == (
        own.argument_size_in_bytes, own.temp_size_in_bytes, own.output_size_in_bytes, own.alias_size_in_bytes
    )
    assert memory["peak"] == (
        own.argument_size_in_bytes + own.temp_size_in_bytes + own.output_size_in_bytes - own.alias_size_in_bytes
    )


def test_no_donate_keeps_both_copies_and_the_same_kernels(mlp_gpu):
    """`--no-donate` aliases nothing: the peak holds the old and the new parameters. Donation moves
    buffers, not work: the same kernels, FLOPs, bytes and collectives per rank."""
    out, donated, kept = mlp_gpu
    memory = kept["memory_per_rank"]
    assert memory["donated"] == memory["aliased"] == 0
    assert memory["peak"] == memory["arguments"] + memory["outputs"] + memory["temporaries"]
    assert memory["peak"] > donated["memory_per_rank"]["peak"]
    assert manifest(out / "kept")["donated_arguments"] == []
    assert kept["per_rank"] == donated["per_rank"]
    kinds = lambda d: [attr_value(n, "kernel") for n in read_trace(out / d / "mlp.0.et").nodes]  # noqa: E731
    assert kinds("kept") == kinds("donated")


MOMENTUM = '''
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
{declaration}

def step(params, velocity, batch):
    loss, grads = jax.value_and_grad(lambda p: jnp.mean((batch @ p["w"]) ** 2))(params)
    velocity = jax.tree.map(lambda v, g: 0.9 * v + g, velocity, grads)
    return jax.tree.map(lambda p, v: (p - 0.01 * v).astype(p.dtype), params, velocity), velocity, loss

def workload(mesh):
    spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P()))
    return step, ({{"w": spec((64, 32), jnp.bfloat16)}}, {{"w": spec((64, 32), jnp.float32)}},
                  spec((16, 64), jnp.bfloat16))
'''


@pytest.mark.parametrize("declaration, donated, nbytes", [
    ("", ["params", "velocity"], 64 * 32 * (BF16 + F32)),
    ("donate_argnums = (1,)", ["velocity"], 64 * 32 * F32),
    ("donate_argnums = ()", [], 0),
])
def test_a_model_file_says_what_it_donates(tmp_path, declaration, donated, nbytes):
    """Without a declaration the parameters and the velocity are donated (outputs replace both);
    `donate_argnums` in the model file names its own, as it would pass them to `jax.jit`."""
    model = tmp_path / "momentum.py"
    model.write_text(MOMENTUM.format(declaration=declaration))
    summary = extract(model, "data=2", tmp_path / "out")
    assert manifest(tmp_path / "out")["donated_arguments"] == donated
    assert summary["memory_per_rank"]["donated"] == summary["memory_per_rank"]["aliased"] == nbytes


@pytest.mark.parametrize("declaration, message", [
    ("donate_argnums = (3,)", "donate_argnums names argument 3 but the step takes 3"),
    ("donate_argnums = 'params'", "give the positions of the donated step arguments"),
])
def test_a_bad_donation_declaration_is_one_line(tmp_path, declaration, message):
    model = tmp_path / "momentum.py"
    model.write_text(MOMENTUM.format(declaration=declaration))
    run = flint("extract", model, "--mesh", "data=2", "--backend", "cpu", "-o", tmp_path / "out")
    assert run.returncode == 2 and message in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_an_output_replaces_one_argument_at_most():
    """The default matches whole arguments to top-level outputs by tree, shapes and dtypes: a
    decode step's cache (not its parameters, which it returns no new values of), each output
    once, and never an argument of scalars only (a loss would match any)."""
    import jax
    import jax.numpy as jnp

    from flint.compile.donation import replaced_arguments

    a = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
    decode = lambda params, cache, token: (token @ params["w"], {"k": cache["k"] + 1.0})  # noqa: E731
    assert replaced_arguments(decode, ({"w": a(8, 16)}, {"k": a(4, 8)}, a(1, 8))) == (1,)
    assert replaced_arguments(lambda x, y: (x + y,), (a(4), a(4))) == (0,)
    assert replaced_arguments(lambda lr, x: (x * lr, jnp.sum(x)), (a(), a(4))) == (1,)
    assert replaced_arguments(lambda x: x.astype(jnp.bfloat16), (a(4),)) == ()


@needs_torch
def test_a_torch_training_step_donates_its_parameters(tmp_path):
    """`examples/torch_mlp.py` trains with SGD: its parameters are what the step replaces."""
    summary = extract(EXAMPLES / "torch_mlp.py", "2x4", tmp_path / "t", "--backend", "gpu:h100")
    assert manifest(tmp_path / "t")["donated_arguments"] == ["params"]
    assert summary["memory_per_rank"]["donated"] == summary["memory_per_rank"]["aliased"] > 0


def test_a_sweep_point_can_keep_its_arguments(tmp_path):
    from flint.exploration.point import extract_command
    from flint.exploration.spec import Point, read_spec

    command = extract_command(Path("m.py"), Point("data=2", {"donate": False}), tmp_path)
    assert command[-1] == "--no-donate"
    assert "--donate" not in extract_command(Path("m.py"), Point("data=2"), tmp_path)
    spec = tmp_path / "s.toml"
    spec.write_text('model = "m.py"\ndonate = "no"\n[mesh]\nshapes = ["data=2"]\n')
    with pytest.raises(Exception, match="donate 'no' is not true or false"):
        read_spec(spec)

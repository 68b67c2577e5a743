"""Compiling where the real GPU compiler would.

Where XLA's GPU compiler cannot tile a Triton GEMM, the real compiler's program runs cuBLAS GEMMs
(`--xla_gpu_enable_triton_gemm=false`): Flint compiles again with that per-compile debug option,
warns in one line, and records it in the manifest. The compiler of JAX 0.10.2 failed so on
`tests/models/triton_tile.py` for an A100 (as on Megatron-LM's 1.7B GPT at 32,768 tokens per
rank); those of JAX 0.11.2 and 0.12 tile it, so the fallback is tested with an injected failure.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import MODELS, flint

from flint.compile.capture import CUBLAS_GEMM, compile_with_fallback


def manifest(directory) -> dict:
    return json.loads((directory / "manifest.json").read_text())


def test_the_fallback_retries_a_gemm_triton_cannot_tile():
    """An injected tiling failure: the dump directory is emptied and the step compiled again with
    cuBLAS GEMMs; any other failure is raised as it is, with no second compile."""
    calls, restarts = [], []

    def compile_once(options):
        calls.append(options)
        if options.get("xla_gpu_enable_triton_gemm", True):
            raise RuntimeError("INTERNAL: Couldn't find output tile sizes that satisfy hlo: %dot.5 = bf16[32768,2304]")
        return "compiled"

    assert compile_with_fallback(compile_once, {"a": 1}, lambda: restarts.append(1)) == ("compiled", "cublas_gemm")
    assert calls == [{"a": 1}, {"a": 1, **CUBLAS_GEMM}] and restarts == [1]
    assert compile_with_fallback(lambda options: "compiled", {"a": 1}) == ("compiled", None)

    def broken(options):
        calls.append(options)
        raise RuntimeError("INTERNAL: something else")

    calls.clear()
    with pytest.raises(RuntimeError, match="something else"):
        compile_with_fallback(broken, {})
    assert len(calls) == 1


def test_an_a100_step_that_triton_tiles_needs_no_fallback(tmp_path):
    """tests/models/triton_tile.py on 2 A100s and on 2 H100s: no warning and no fallback recorded;
    on the A100s the FLOPs by hand (per data rank b = BATCH/2: the attention einsum's
    2*b*HEADS*SEQ*SEQ*HEAD_DIM and the projection's 2*b*SEQ*WIDTH*WIDTH, nothing fused in)."""
    spec = importlib.util.spec_from_file_location("triton_tile", MODELS / "triton_tile.py")
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    BATCH, HEADS, SEQ, HEAD_DIM, WIDTH = model.BATCH, model.HEADS, model.SEQ, model.HEAD_DIM, model.WIDTH
    run = flint("extract", MODELS / "triton_tile.py", "--mesh", "data=2", "--backend", "gpu:a100",
                "-o", tmp_path / "a100", "--json")
    assert run.returncode == 0 and "Triton" not in run.stderr, run.stderr
    assert "compiler_fallback" not in json.loads(run.stdout)
    assert manifest(tmp_path / "a100")["compiler_fallback"] is None
    b = BATCH // 2
    flops = 2 * b * HEADS * SEQ * SEQ * HEAD_DIM + 2 * b * SEQ * WIDTH * WIDTH
    assert json.loads(run.stdout)["per_rank"]["flops"] == flops
    h100 = flint("extract", MODELS / "triton_tile.py", "--mesh", "data=2", "--backend", "gpu:h100",
                 "-o", tmp_path / "h100", "--json")
    assert h100.returncode == 0 and "Triton" not in h100.stderr
    assert "compiler_fallback" not in json.loads(h100.stdout)
    assert manifest(tmp_path / "h100")["compiler_fallback"] is None

"""Output guarantees: determinism, naming, IR dumps, device rooflines, the JSON summary."""

from __future__ import annotations

import json

from conftest import EXAMPLES, MODELS, extract, flint

from flint.trace.reader import attr_value, read_trace


def test_two_runs_are_byte_identical(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    extract(EXAMPLES / "mlp.py", "2x4", a)
    extract(EXAMPLES / "mlp.py", "2x4", b)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        if name != "manifest.json":
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    manifests = [json.loads((d / "manifest.json").read_text()) for d in (a, b)]
    for manifest in manifests:
        del manifest["command"]  # names the output directory, which differs on purpose
    assert manifests[0] == manifests[1]


def test_name_prefix_and_ir_dump(tmp_path):
    summary = extract(
        EXAMPLES / "mlp.py", "2x4", tmp_path / "t", "--name", "step", "--dump-ir", tmp_path / "ir"
    )
    assert summary["name"] == "step" and summary["ranks"] == 8
    assert (tmp_path / "t" / "step.7.et").exists()
    ir = (tmp_path / "ir" / "step.partitioned.mlir").read_text()
    # The partitioned module is per rank: x is [256/2, 1024] bf16 and w_in [1024, 4096/4].
    assert "tensor<128x1024xbf16>" in ir and "tensor<1024x1024xbf16>" in ir
    assert "stablehlo.all_reduce" in ir


def test_duration_follows_the_roofline_of_the_named_device(tmp_path):
    """Whole microseconds that add up: every prefix of a rank's nodes is within half a microsecond
    of the exact roofline times of the slow device (1 TFLOP/s, 1000 GB/s)."""
    spec = tmp_path / "slow.json"
    spec.write_text(json.dumps({"name": "slow", "peak_tflops": 1.0, "mem_bw_gbps": 1000.0}))
    extract(EXAMPLES / "mlp.py", "2x4", tmp_path / "t", "--device", str(spec))
    for rank in range(8):
        exact = emitted = 0.0
        for node in read_trace(tmp_path / "t" / f"mlp.{rank}.et").nodes:
            flops, nbytes = attr_value(node, "num_ops"), attr_value(node, "tensor_size")
            if flops is None:
                continue
            exact += max(flops / 1e12, nbytes / 1e12) * 1e6
            emitted += node.duration_micros
            assert abs(emitted - exact) <= 0.5, f"rank {rank} node {node.id}"
    # The first matmul: 2*128*1024*1024 FLOPs at 1 TFLOP/s is 268.435456 us.
    first_dot = next(n for n in read_trace(tmp_path / "t" / "mlp.0.et").nodes if attr_value(n, "op") in ("dot", "dot_general"))
    assert first_dot.duration_micros in (268, 269)


def test_json_summary_matches_manifest(tmp_path):
    summary = extract(EXAMPLES / "mlp.py", "2x4", tmp_path / "t")
    manifest = json.loads((tmp_path / "t" / "manifest.json").read_text())
    per_rank = dict(manifest["rank_totals"][0])
    del per_rank["ranks"]
    assert summary["per_rank"] == per_rank
    assert summary["files"] == 8 + 3


def test_json_stays_json_when_the_model_file_prints(tmp_path):
    """What the model file writes to standard output, from Python or native code, goes to standard
    error: standard output is the command's answer alone."""
    printed = ["printed on import", "written to fd 1 on import", "printed by workload", "printed while tracing"]
    extracted = flint("extract", MODELS / "prints.py", "--mesh", "2", "--backend", "cpu", "-o", tmp_path / "t",
                      "--json")
    validated = flint("validate", MODELS / "prints.py", "--mesh", "2", "--json")
    for run in (extracted, validated):
        assert run.returncode == 0, run.stderr
        json.loads(run.stdout)
        assert all(line in run.stderr for line in printed), run.stderr
    assert json.loads(extracted.stdout)["ranks"] == 2

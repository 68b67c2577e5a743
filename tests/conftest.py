"""Shared fixtures: run the real `flint` command in a subprocess, as a user would.

Each extraction gets a fresh process because JAX fixes its virtual device count once per process.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections import Counter
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import tomllib

from flint.schema import et_def_pb2 as pb
from flint.trace.reader import attr_value, find_traces, read_comm_groups, read_trace

# Tests that run Flint's stages in this process share one JAX, whose CPU backend is made once, by
# whichever test starts it first: with the 8 devices of the 2x4 meshes those tests build.
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("torch_mlir") is None,
    reason="needs PyTorch and torch-mlir (flint-traces[torch])",
)
"""For a test of a PyTorch model file; a module of such tests calls `pytest.importorskip` instead."""

ADDRESS_SPACE_LIMIT = 10 << 30
"""Bytes of address space for an extraction run under a cap, so that a runaway lowering fails
instead of filling the machine: PyPI's CUDA build of torch alone maps 3.2 GB on import."""

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MODELS = Path(__file__).resolve().parent / "models"


def device_table(path: Path) -> dict:
    """A device file's numbers as written, for deriving kernel times by hand."""
    return tomllib.loads(Path(path).read_text())


DEVICES = ROOT / "src" / "flint" / "devices" / "data"


def hand_kernel_micros(node: pb.Node, device: dict) -> float:
    """The calibrated kernel model written out from its formula (docs/timing-memory.md):
    overhead + max(compute, bytes / (bandwidth x efficiency)); a GEMM at the matrix peak for its
    operand width x GEMM efficiency x the share of its waves of tiles it fills x k / (k + overhead)."""
    c = device.get("calibration", {})
    flops, nbytes = attr_value(node, "num_ops"), attr_value(node, "tensor_size")
    gemm = next((list(a.int64_list.values) for a in node.attr if a.name == "gemm"), None)
    kernel = next((a.string_val for a in node.attr if a.name == "kernel"), None)
    bandwidth = device["mem_bw_gbps"] * 1e9
    if gemm is None:
        vector = device.get("vector_tflops", device["peak_tflops"]) * 1e12
        # An untiled transpose of the minor dimension moves its bytes at the transpose efficiency,
        # a Triton block-level fusion at the Triton efficiency.
        efficiency = c.get(f"{kernel}_efficiency") if kernel in ("transpose", "triton") else None
        efficiency = efficiency or c["memory_efficiency"]
        return c["kernel_overhead_us"] + max(flops / vector, nbytes / (bandwidth * efficiency)) * 1e6
    batch, m, n, k, bits = gemm
    # A side narrower than the tile takes the power of two at or above it, down to 16.
    tile_m, tile_n = (min(t, max(16, 2 ** math.ceil(math.log2(side)))) for t, side in zip(c["gemm_tile"], (m, n)))
    units = device["compute_units"]
    tiles = math.ceil(m / tile_m) * math.ceil(n / tile_n) * batch
    fill = m * n * batch / (math.ceil(tiles / units) * units * tile_m * tile_n)
    peak = device["peak_tflops"] * 1e12 * (2 if bits <= 8 else 0.5 if bits >= 32 else 1)
    # 8-bit operands at the device's 8-bit GEMM efficiency, where it has one.
    efficiency = c.get("gemm_efficiency_8bit") if bits <= 8 and c.get("gemm_efficiency_8bit") else c["gemm_efficiency"]
    rate = peak * efficiency * fill * k / (k + c["gemm_k_overhead"])
    return c["kernel_overhead_us"] + max(flops / rate, nbytes / (bandwidth * c["gemm_efficiency"])) * 1e6


def nvls_pipelined(total: int, chunk: int, ops: int, bandwidth: float, stages: int = 3, latency: float = 21.0,
                   largest: int = 128 * 1024, step: float = 4.8) -> float:
    """NVLS or NVLS-Tree by its chunks (µs), by hand from flint.step.nccl's formula: rounds of `ops`
    (channels x heads) chunks of `chunk` bytes, each round `step` (hgx's 4.8 µs) plus its bytes at
    the bandwidth that makes rounds of `largest` chunks reach `bandwidth` (algorithm GB/s), `stages`
    rounds deep, after `latency` (hgx's 21.0 µs, and the network's hops across nodes) less an
    all-reduce's three steps; one round of fewer bytes takes `stages` of its own."""
    per_byte = 1 / (bandwidth * 1e3) - step / (ops * largest)
    whole = ops * chunk
    return latency - 3 * step + (max(total / whole, 1) + stages - 1) * (step + min(total, whole) * per_byte)


def load_example(name: str):
    """`examples/NAME.py` as a module, for the constants the hand derivations start from."""
    spec = importlib.util.spec_from_file_location(f"{name}_example", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


def flint(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> Run:
    """Run `flint ARGS` in a fresh process; `env` replaces the environment (None: inherit it)."""
    done = subprocess.run(
        [sys.executable, "-m", "flint", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def _extract(model: Path, mesh: str, out: Path, *extra: str) -> Run:
    """Run `flint extract`; fail the test on a non-zero exit.

    On the CPU backend unless `extra` names another: most hand derivations are of the CPU
    compiler's partitioned module (one node per op), not of the GPU compiler's kernels."""
    backend = () if "--backend" in extra else ("--backend", "cpu")
    run = flint("extract", model, "--mesh", mesh, "-o", out, *backend, *extra)
    assert run.returncode == 0, run.stderr
    return run


def extract(model: Path, mesh: str, out: Path, *extra: str) -> dict:
    """`flint extract --json`'s summary (see `_extract`)."""
    return json.loads(_extract(model, mesh, out, "--json", *extra).stdout)


def extract_warnings(model: Path, mesh: str, out: Path, *extra: str) -> list[str]:
    """The `warning:` lines of a successful `flint extract` (see `_extract`)."""
    return [line for line in _extract(model, mesh, out, *extra).stderr.splitlines() if line.startswith("warning:")]


@pytest.fixture(scope="session")
def mlp_traces(tmp_path_factory):
    """`examples/mlp.py` extracted once per mesh shape for the whole session."""
    cache: dict[str, Path] = {}

    def get(mesh: str) -> Path:
        if mesh not in cache:
            out = tmp_path_factory.mktemp("mlp") / "traces"
            extract(EXAMPLES / "mlp.py", mesh, out)
            cache[mesh] = out
        return cache[mesh]

    return get


def matmuls_and_collectives(directory: Path, rank: int):
    """(matmul FLOPs, sorted [(comm_type, comm_size, group ranks)]) of one rank's trace, as read back."""
    prefix, _ = find_traces(directory)
    groups = read_comm_groups(directory / f"{prefix}.comm_groups.json")
    trace = read_trace(directory / f"{prefix}.{rank}.et")
    flops = sum(
        attr_value(n, "num_ops") for n in trace.nodes if attr_value(n, "op") in ("dot", "dot_general")
    )
    collectives = sorted(
        (attr_value(n, "comm_type"), attr_value(n, "comm_size"), tuple(groups[int(attr_value(n, "pg_name"))]))
        for n in trace.nodes
        if n.type == pb.COMM_COLL_NODE
    )
    return flops, collectives


@dataclass(frozen=True)
class Transfer:
    """One SEND or RECV of a rank's trace, as read back."""

    send: bool
    src: int
    dst: int
    tag: int
    size: int


def transfers(directory: Path) -> dict[int, list[Transfer]]:
    """Every rank's SENDs and RECVs in file order."""
    found = {}
    for path in find_traces(directory)[1]:
        trace = read_trace(path)
        found[trace.rank] = [
            Transfer(
                n.type == pb.COMM_SEND_NODE,
                *(attr_value(n, a) for a in ("comm_src", "comm_dst", "comm_tag", "comm_size")),
            )
            for n in trace.nodes
            if n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)
        ]
    return found


def assert_sends_match_receives(found: dict[int, list[Transfer]]) -> None:
    """Every SEND has exactly one RECV on its peer with the same source, tag and size, and back."""
    sends = Counter((t.src, t.dst, t.tag, t.size) for ts in found.values() for t in ts if t.send)
    recvs = Counter((t.src, t.dst, t.tag, t.size) for ts in found.values() for t in ts if not t.send)
    assert sends == recvs
    assert max(sends.values()) == 1  # tags are unique per pair of ranks
    for rank, ts in found.items():
        assert all((t.src if t.send else t.dst) == rank for t in ts)

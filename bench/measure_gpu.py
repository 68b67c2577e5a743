"""Measure held-out steps on the real GPU this runs on, for `bench/heldout.py` to compare with Flint.

    python bench/measure_gpu.py -o DIR [--suite bench/gpu_steps.toml] [--only NAME,...] [--budget-s S]

Each step of the suite runs in a process of its own, so that the device's `peak_bytes_in_use` is that
step's: its inputs are made on the GPU (random bf16/f32 values, a 1 Mi-element pattern repeated, so
that no temporary outweighs them; integers 0, integer scalars 1), it is compiled with the arguments
its outputs replace donated (loaded and donated as Flint loads and donates it:
`flint.frontend.model_file`, `flint.compile.donation`), run `--warmup` times, timed `--steps` times
(each call waited for, each replaced argument given the output that replaces it) and profiled once
with `jax.profiler`.

Writes, per step, one line of DIR/<device>.jsonl (step times, the compiler's memory analysis, the
device's peak bytes in use, and each fusion's emitter in the GPU's compile, by the name its kernel
has in the profile) and DIR/<device>-<step>.trace.json.gz, the GPU's kernels of the profiled step in
trace-event JSON (what `flint calibrate` reads). The emitters are recorded because on a GPU, XLA's
fusion autotuner times each fusion with a reduction or a transpose under both its own emitter and
Triton and keeps the faster: a choice that a compile without a GPU does not make. Steps left when
`--budget-s` has passed are skipped, and say so. Needs JAX on a GPU and Flint's source (`src/`, put
on the path here).

A PyTorch model file's step runs as PyTorch runs it instead (`measure_torch.py`: eager, or
`compile = true` in the suite; PyTorch on the GPU). A step that names an `exported` file runs that
serialized program (`export_step.py`: a PyTorch file's step as Flint lowers it) under XLA, as above,
with the suite's `donated` arguments.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATTERN = 1 << 20


def suite(path: Path, only: str) -> list[dict]:
    steps = tomllib.loads(path.read_text())["step"]
    if only:
        wanted = only.split(",")
        steps = [s for s in steps if s["name"] in wanted]
    return steps


def device_tag(kind: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'."""
    for word in kind.lower().split():
        if word[:1].isalpha() and any(c.isdigit() for c in word):
            return word
    return kind.lower().replace(" ", "-")


def materialize(abstract, seed: int = 0):
    """Real arrays for a tree of ShapeDtypeStructs, placed as their shardings say."""
    import jax
    import jax.numpy as jnp

    leaves, treedef = jax.tree_util.tree_flatten(abstract)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    out = []
    for key, leaf in zip(keys, leaves):
        shape, dtype = tuple(leaf.shape), leaf.dtype

        def make(key, shape=shape, dtype=dtype):
            if jnp.issubdtype(dtype, jnp.floating):
                base = 0.02 * jax.random.normal(key, (min(PATTERN, max(1, math.prod(shape))),), jnp.float32)
                return jnp.resize(base.astype(dtype), shape)
            return jnp.full(shape, 1 if not shape else 0, dtype)

        out.append(jax.jit(make, out_shardings=leaf.sharding)(key))
    return jax.tree_util.tree_unflatten(treedef, out)


def feed_back(args: tuple, outputs, replacing: dict[int, int]) -> tuple:
    """The next call's arguments: each donated argument replaced by the output that replaces it
    (`replacing`: argument position -> output position)."""
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    return tuple(outputs[replacing[i]] if i in replacing else arg for i, arg in enumerate(args))


def compact_profile(directory: Path, destination: Path) -> int:
    """Keep the GPU's kernels of a jax.profiler trace (its process names and complete events)."""
    found = sorted(directory.rglob("perfetto_trace.json.gz")) or sorted(directory.rglob("*.trace.json.gz"))
    if not found:
        return 0
    events = json.loads(gzip.decompress(found[0].read_bytes()))
    events = events["traceEvents"] if isinstance(events, dict) else events
    gpus = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
            and "GPU" in str(e.get("args", {}).get("name", ""))}
    kept = [e for e in events if e.get("ph") == "M" and e.get("name") == "process_name"]
    kernels = [{k: e[k] for k in ("ph", "pid", "tid", "ts", "dur", "name") if k in e}
               | ({"args": {"hlo_op": e["args"]["hlo_op"]}} if "hlo_op" in e.get("args", {}) else {})
               for e in events if e.get("ph") == "X" and e.get("pid") in gpus]
    destination.write_bytes(gzip.compress(json.dumps({"traceEvents": kept + kernels}).encode()))
    return len(kernels)


def kernel_emitters(compiled) -> dict[str, str]:
    """Each fusion of a compiled step, by the name the profile gives its kernel, and the emitter
    the compiler chose for it: its backend kind (`__triton`, `__triton_gemm`, ...) or `native` for
    XLA's own loop and reduction emitters."""
    from flint.analysis.calibrate import profile_name
    from flint.compile.gpu_module import emitter_of, scheduled_instructions
    from flint.schema.hlo_envelope_pb2 import HloModule

    emitters = {}
    for serialized in compiled.runtime_executable().hlo_modules():
        module = HloModule.FromString(serialized.as_serialized_hlo_module_proto())
        for instruction in scheduled_instructions(module):
            if instruction.opcode == "fusion":
                emitters[profile_name(instruction.name)] = emitter_of(instruction) or "native"
    return emitters


def exported_step(path: Path, donated: list[int], device):
    """A step serialized by `bench/export_step.py` (a PyTorch file's, lowered where torch-mlir is):
    (its function, its arguments' abstract tree on `device`, the arguments to donate)."""
    import jax

    exported = jax.export.deserialize(bytearray(path.read_bytes()))
    sharding = jax.sharding.SingleDeviceSharding(device)
    leaves = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in exported.in_avals]
    args, _ = jax.tree_util.tree_unflatten(exported.in_tree, leaves)
    return exported.call, tuple(args), tuple(donated)


def run_step(step: dict, out: Path, steps: int, warmup: int) -> dict:
    import jax
    import numpy as np

    sys.path.insert(0, str(ROOT / "src"))
    from flint.compile.donation import donated_arguments, replacements
    from flint.frontend.model_file import load_workload
    from flint.mesh import parse_mesh

    device = jax.devices()[0]
    axes = step.get("mesh", "data=1")
    spec = parse_mesh(axes)
    mesh = jax.sharding.Mesh(np.array([device]).reshape(spec.shape), spec.axis_names)
    if "exported" in step:
        fn, abstract, donated = exported_step(ROOT / step["exported"], step["donated"], device)
    else:
        workload = load_workload(ROOT / step["model"], mesh, step.get("args", {}))
        fn, abstract = workload.step, workload.args
        with jax.set_mesh(mesh):
            donated = donated_arguments(workload)
    with jax.set_mesh(mesh):
        replacing = {position: output for position, output in replacements(fn, abstract).items()
                     if position in donated}
    args = materialize(abstract)
    jax.block_until_ready(args)
    inputs_bytes = (device.memory_stats() or {}).get("bytes_in_use")
    started = time.perf_counter()
    compiled = jax.jit(fn, donate_argnums=donated).lower(*args).compile()
    compile_s = time.perf_counter() - started
    for _ in range(warmup):
        result = compiled(*args)
        jax.block_until_ready(result)
        args = feed_back(args, result, replacing)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        result = compiled(*args)
        jax.block_until_ready(result)
        times.append(time.perf_counter() - started)
        args = feed_back(args, result, replacing)
    tag = device_tag(device.device_kind)
    with tempfile.TemporaryDirectory() as profile_dir:
        jax.profiler.start_trace(profile_dir, create_perfetto_trace=True)
        result = compiled(*args)
        jax.block_until_ready(result)
        jax.profiler.stop_trace()
        kernels = compact_profile(Path(profile_dir), out / f"{tag}-{step['name']}.trace.json.gz")
    analysis = compiled.memory_analysis()
    memory = {k: getattr(analysis, k) for k in ("argument_size_in_bytes", "output_size_in_bytes",
                                                 "temp_size_in_bytes", "alias_size_in_bytes")}
    stats = device.memory_stats() or {}
    memory.update(peak_bytes_in_use=stats.get("peak_bytes_in_use"), inputs_bytes_in_use=inputs_bytes)
    return dict(name=step["name"], model=step["model"], mesh=axes, args=step.get("args", {}), device=tag,
                device_kind=device.device_kind, jax=jax.__version__, xla_flags=os.environ.get("XLA_FLAGS", ""),
                donated=list(donated), compile_s=round(compile_s, 2), step_s=times,
                step_median_s=sorted(times)[len(times) // 2], profiled_kernels=kernels, memory=memory,
                emitters=kernel_emitters(compiled))


def run_any_step(step: dict, out: Path, steps: int, warmup: int) -> dict:
    """A JAX model file's step or an exported one (`run_step`), or a PyTorch file's as PyTorch
    runs it (`measure_torch.run_torch_step`)."""
    sys.path.insert(0, str(ROOT / "src"))
    from flint.frontend.torch_model import is_torch_model
    from measure_torch import load, run_torch_step

    if "exported" not in step:
        module = load(ROOT / step["model"])
        if is_torch_model(module):
            return run_torch_step(step, module, out, steps, warmup, device_tag)
    return run_step(step, out, steps, warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--out", type=Path, required=True)
    parser.add_argument("--suite", type=Path, default=ROOT / "bench" / "gpu_steps.toml")
    parser.add_argument("--only", default="", help="comma-separated step names")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=1e9, help="start no step after this many seconds")
    parser.add_argument("--step-timeout-s", type=float, default=240)
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    steps = suite(options.suite, options.only or options.worker)
    if options.worker:
        print(json.dumps(run_any_step(steps[0], options.out, options.steps, options.warmup)), flush=True)
        return
    started = time.perf_counter()
    for step in steps:
        if time.perf_counter() - started > options.budget_s:
            print(f"{step['name']}: skipped, the budget of {options.budget_s:.0f} s is spent", flush=True)
            continue
        command = [sys.executable, __file__, "-o", str(options.out), "--suite", str(options.suite),
                   "--worker", step["name"], "--steps", str(options.steps), "--warmup", str(options.warmup)]
        t0 = time.perf_counter()
        try:
            run = subprocess.run(command, capture_output=True, text=True, timeout=options.step_timeout_s)
        except subprocess.TimeoutExpired:
            print(f"{step['name']}: timed out after {options.step_timeout_s:.0f} s", flush=True)
            continue
        lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
        if run.returncode or not lines:
            print(f"{step['name']}: failed (rc {run.returncode}): {run.stderr.strip()[-1500:]}", flush=True)
            continue
        record = json.loads(lines[-1])
        with open(options.out / f"{record['device']}.jsonl", "a") as sink:
            sink.write(lines[-1] + "\n")
        setup = f"compile {record['compile_s']}" if "compile_s" in record else f"warm-up {record['warmup_s']}"
        print(f"{step['name']}: {record['step_median_s'] * 1e3:.1f} ms, peak "
              f"{(record['memory']['peak_bytes_in_use'] or 0) / 1e9:.2f} GB, {record['profiled_kernels']} kernels, "
              f"{setup} s, {time.perf_counter() - t0:.0f} s in all", flush=True)


if __name__ == "__main__":
    main()

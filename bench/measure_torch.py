"""One PyTorch training step of a Flint model file, run as PyTorch runs it, for `measure_gpu.py`.

The step is the one Flint extracts from the file (`flint.frontend.torch_step`): `loss_fn(model,
batch)` in train mode, torch's autograd, then the file's optimizer with Flint's semantics: SGD, or
AdamW with f32 moments and decoupled weight decay, each parameter updated in f32 and rounded once.
Here the update runs in place, one parameter at a time, as a PyTorch user's optimizer does (no
second copy of the state), and gradients are freed after it (`p.grad = None`). With `compile`, the
loss and its backward (AOTAutograd) and the update are compiled by `torch.compile` (Inductor).

Inputs: floating ones random (normal, scale 1), integer ones 0 (valid token ids and labels). Peak
memory is `torch.cuda.max_memory_allocated()` over the timed steps: parameters, optimizer state and
the step's temporaries, the counterpart of JAX's `peak_bytes_in_use`.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # importable by name, as torch.compile's tracer looks modules up
    spec.loader.exec_module(module)
    return module


def filled(tensor):
    import torch

    if tensor.is_floating_point():
        return torch.randn_like(tensor)
    return torch.zeros_like(tensor)


def optimizer_update(module, params: list):
    """The file's optimizer as an in-place update of `params` from their `.grad`."""
    import torch

    options = dict(getattr(module, "optimizer_options", {}))
    if getattr(module, "optimizer", "adamw") == "sgd":
        lr = options["lr"]

        def sgd():
            for p in params:
                p.sub_(lr * p.grad)

        return sgd
    lr, (b1, b2), eps, decay = options["lr"], options["betas"], options["eps"], options["weight_decay"]
    m = [torch.zeros_like(p, dtype=torch.float32) for p in params]
    v = [torch.zeros_like(p, dtype=torch.float32) for p in params]
    count = torch.zeros((), dtype=torch.float32, device=params[0].device)

    def adamw():
        count.add_(1)
        correct1, correct2 = 1 - b1**count, 1 - b2**count
        for p, m_, v_ in zip(params, m, v):
            g = p.grad.float()
            m_.mul_(b1).add_(g, alpha=1 - b1)
            v_.mul_(b2).addcmul_(g, g, value=1 - b2)
            pf = p.float()
            delta = (m_ / correct1) / ((v_ / correct2).sqrt() + eps) + decay * pf
            p.copy_(pf - lr * delta)

    return adamw


def kernels_of(chrome_trace: Path, destination: Path) -> int:
    """The GPU kernels of a torch.profiler trace, written as jax.profiler's compact trace-event
    JSON (`flint.analysis.calibrate.read_profile` reads both)."""
    import gzip

    events = json.loads(chrome_trace.read_text())["traceEvents"]
    kernels = [{"ph": "X", "pid": 1, "tid": e.get("tid", 0), "ts": e["ts"], "dur": e["dur"], "name": e["name"]}
               for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    gpu = {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0 (torch)"}}
    destination.write_bytes(gzip.compress(json.dumps({"traceEvents": [gpu, *kernels]}).encode()))
    return len(kernels)


def run_torch_step(step: dict, module, out: Path, steps: int, warmup: int, tag_of) -> dict:
    """`step` of the suite, whose model file is `module` (as `load` loaded it)."""
    import torch

    from flint.frontend.torch_model import arguments_for

    args = step.get("args", {})
    torch.manual_seed(0)
    with torch.device("cuda"):
        net = module.model(**arguments_for(module.model, args))
        batch = {k: filled(t) for k, t in module.example_inputs(**arguments_for(module.example_inputs, args)).items()}
    net.train()
    params = [p for p in net.parameters() if p.requires_grad]
    update = optimizer_update(module, params)

    def loss_and_backward():
        loss = module.loss_fn(net, batch)
        loss.backward()
        return loss

    @torch.no_grad()
    def apply():
        update()
        for p in params:
            p.grad = None

    if step.get("compile"):
        loss_and_backward, apply = torch.compile(loss_and_backward), torch.compile(apply)

    def train_step():
        loss = loss_and_backward()
        apply()
        return loss

    torch.cuda.synchronize()
    inputs_bytes = torch.cuda.memory_allocated()
    started = time.perf_counter()
    for _ in range(warmup):
        train_step()
        torch.cuda.synchronize()
    warmup_s = time.perf_counter() - started
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        train_step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated()
    tag = tag_of(torch.cuda.get_device_name())
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
            train_step()
            torch.cuda.synchronize()
        profiler.export_chrome_trace(str(trace))
        kernels = kernels_of(trace, out / f"{tag}-{step['name']}.trace.json.gz")
    return dict(name=step["name"], model=step["model"], mesh=step.get("mesh", "data=1"), args=args, device=tag,
                device_kind=torch.cuda.get_device_name(), torch=torch.__version__,
                compiled=bool(step.get("compile")), warmup_s=round(warmup_s, 2), step_s=times,
                step_median_s=sorted(times)[len(times) // 2], profiled_kernels=kernels,
                memory={"peak_bytes_in_use": peak, "inputs_bytes_in_use": inputs_bytes})

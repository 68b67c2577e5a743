"""Time each extraction stage against a bare `jax.jit(step).lower(...).compile()` in one process.

    python bench/extract.py [MODEL] [--mesh 8x8] [--repeat 3]

Prints seconds per stage (best of --repeat) and two ratios measured in the same run: the whole
extraction over the bare compile, and Flint's own stages (load, parse, graph, emit, check) over the
bare compile. The target at 64 ranks is an own-stages ratio of at most 1.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=str(ROOT / "examples" / "mlp.py"))
    parser.add_argument("--mesh", default="8x8")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from flint.compile.backend import make_virtual_mesh
    from flint.devices import load_device
    from flint.frontend import load_workload
    from flint.mesh import parse_mesh
    from flint.pipeline import ExtractRequest, extract

    spec = parse_mesh(args.mesh)
    mesh = make_virtual_mesh(spec)
    import jax

    workload = load_workload(Path(args.model), mesh)
    bare, stages = [], []
    for i in range(args.repeat):
        # A fresh function object each time, so JAX's compilation cache cannot answer.
        step = lambda *a, _f=workload.step: _f(*a)  # noqa: E731
        start = time.perf_counter()
        with jax.set_mesh(mesh):
            jax.jit(step).lower(*workload.args).compile()
        bare.append(time.perf_counter() - start)
        with tempfile.TemporaryDirectory() as tmp:
            request = ExtractRequest(
                model=Path(args.model), mesh=spec, output=Path(tmp) / "t", device=load_device("h100")
            )
            stages.append(extract(request).seconds)
    best = {name: min(run[name] for run in stages) for name in stages[0]}
    bare_s = min(bare)
    own = sum(best[name] for name in ("load", "parse", "graph", "emit", "check"))
    total = sum(best.values())
    print(f"model {Path(args.model).name}, mesh {spec} ({spec.size} ranks), best of {args.repeat}")
    print(f"{'stage':<12}{'seconds':>10}")
    for name, seconds in best.items():
        print(f"{name:<12}{seconds:>10.3f}")
    print(f"{'extraction':<12}{total:>10.3f}")
    print(f"{'bare compile':<12}{bare_s:>10.3f}")
    print(f"ratio extraction / bare compile      {total / bare_s:6.2f}")
    print(f"ratio own stages / bare compile      {own / bare_s:6.2f}   (target <= 1.00)")


if __name__ == "__main__":
    main()

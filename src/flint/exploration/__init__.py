"""Design-space exploration: one model over a grid of meshes, layouts, pipelines, devices and
networks, each point extracted in a process of its own, then scheduled and simulated.

In: a sweep spec (TOML, `flint.exploration.spec`). Out: a directory with `results.jsonl` (the log a rerun
resumes from) and `results.csv`, and the points ranked by step time among those that fit.

May import: the foundation, `simulation`, and `emit`'s helpers for output directories
(extraction runs as the `flint extract` command, so it needs none of the pipeline's packages).
"""

from flint.exploration.rank import pareto_front, ranked
from flint.exploration.run import SweepOutcome, SweepRequest, run_sweep
from flint.exploration.spec import Point, SweepSpec, read_spec

__all__ = ["Point", "SweepOutcome", "SweepRequest", "SweepSpec", "pareto_front", "ranked", "read_spec",
           "run_sweep"]

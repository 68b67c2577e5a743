"""Flint: Chakra execution traces from JAX steps, partitioned by the XLA compiler on a virtual mesh.

The package is laid out as the pipeline runs, one package per stage, each importing only from the
stages before it and from the foundation below them all (`tests/test_structure.py` checks this):

    foundation   errors, schema (generated protobuf), devices, mesh, sharding (what model files import)
    trace        the Chakra format: framing, reader, contract, node timing
    frontend     1  model file -> Workload
    layout       2  shardings from the model, --strategy, --config, --rule, --shard
    compile      3  XLA (CPU, GPU or TPU compiler) compiles the step for a virtual mesh; the module
                    and the memory it needs are captured
    ir           4  typed ops through the MLIR bindings; cost, loop and folding rules
    graph        5  networkx workload graph: loops unrolled, calls inlined
    pipelining   6  (optional) copies of one stage's graph laid out by a schedule
    emit         7  .et per rank, communicator groups, manifest
    isolation    a child process that Ctrl-C stops at once, leaving nothing behind
    pipeline     `extract()`: the stages in order, each artifact kept
    analysis     tools that read traces back: inspect, graph, timeline, validate
    simulation   ASTRA-sim's inputs for a trace, its run and its results (`flint simulate`)
    exploration  a grid of points, each extracted in a process of its own and simulated (`flint sweep`)
    api          `flint.extract`, `flint.simulate`, `flint.sweep` for Python scripts
    cli          wiring only
    launch       the `flint` entry point: an interrupt while importing ends quietly
"""

from flint.version import __version__

__all__ = ["__version__", "extract", "simulate", "sweep"]
_API = ("extract", "simulate", "sweep")


def __getattr__(name: str):
    """`flint.extract` and friends, imported on first use: `import flint` stays light (model
    files import `flint.sharding`)."""
    if name in _API:
        from flint import api

        return getattr(api, name)
    raise AttributeError(f"module 'flint' has no attribute {name!r}")

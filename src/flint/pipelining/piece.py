"""The piece that is compiled: one microbatch of one chunk of layers, on one stage's mesh."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from flint.errors import FlintError
from flint.frontend import Workload
from flint.layout import Layout, stacked_paths
from flint.mesh import MeshSpec, ways
from flint.pipelining.schedules import PipelineRequest


def stage_mesh(mesh: MeshSpec, axis: int) -> MeshSpec:
    """The mesh of one stage: every axis but the stage axis (one rank if there is none)."""
    shape = mesh.shape[:axis] + mesh.shape[axis + 1 :]
    names = mesh.axis_names[:axis] + mesh.axis_names[axis + 1 :]
    return MeshSpec(shape, names) if shape else MeshSpec((1,), ("data",))


def stage_ranks(mesh: MeshSpec, axis: int) -> np.ndarray:
    """`[stage, q]`: the rank at row-major position q of the stage mesh on each stage."""
    ranks = np.arange(mesh.size).reshape(mesh.shape)
    return np.moveaxis(ranks, axis, 0).reshape(mesh.shape[axis], -1)


def one_microbatch(
    workload: Workload, layout: Layout, request: PipelineRequest, mesh
) -> tuple[Workload, int]:
    """The step on one microbatch (1/M of the batch's rows) and one chunk (1/(S·V) of the stacked
    layers, optimizer state included), shardings as laid out; and the layers of a chunk."""
    import jax

    if layout.batch_doubt:
        raise FlintError(f"--pipeline-stages cuts every batch input into microbatches, but {layout.batch_doubt}")
    chunks = request.stages * request.virtual_stages
    stacked = stacked_paths(layout)
    if not stacked:
        raise FlintError(
            "--pipeline-stages splits stacked layers (parameters sharing one leading size, as under "
            "lax.scan), and the step's inputs have none"
        )
    leaves, treedef = jax.tree_util.tree_flatten(workload.args)
    resized, chunk_layers = [], 0
    for item, leaf in zip(layout.inputs, leaves):
        shape = list(item.shape)
        if item.batch and shape:
            parts, what = request.microbatches, f"batch input {item.path} ({shape[0]} rows)"
            pieces = f"{parts} microbatches"
        elif item.path in stacked:
            parts, what = chunks, f"{item.path} ({shape[0]} layers)"
            pieces = f"{parts} chunks ({request.stages} stages x {request.virtual_stages} virtual stages)"
        else:
            resized.append(leaf)
            continue
        if shape[0] % parts and item.path in stacked:
            near = " or ".join(str(n) for n in (shape[0] // parts * parts, -(-shape[0] // parts) * parts) if n)
            raise FlintError(
                f"{what} does not divide into {pieces}: every chunk is one compiled piece, so "
                f"Flint cannot place them unevenly as Megatron-LM does (Llama 3 405B's 126 layers on "
                f"16 stages: 7 on the first and the last, 8 on the others); model {near} layers, or "
                f"choose stages that divide them"
            )
        if shape[0] % parts:
            raise FlintError(f"{what} does not divide into {pieces}")
        shape[0] //= parts
        if item.path in stacked:
            chunk_layers = shape[0]
        pieces = ways(mesh, item.spec[0]) if item.spec else 1
        if shape[0] % pieces:
            raise FlintError(
                f"{what}: one piece of {shape[0]} does not split over mesh axis "
                f"{'+'.join(item.spec[0])} ({pieces} ways): use fewer microbatches or another layout"
            )
        resized.append(jax.ShapeDtypeStruct(tuple(shape), leaf.dtype, sharding=leaf.sharding))
    return replace(workload, args=tuple(jax.tree_util.tree_unflatten(treedef, resized))), chunk_layers

"""A PyTorch model file as the same `Workload` as a JAX one: its traced step, inputs and own layout.

The model's own layout, used without `--strategy`/`--shard`: every batch input split along its
first dimension over the data axes (every mesh axis but the tensor axis), and the modules of
`tp_plan` split Megatron style over the tensor axis (the one named `tensor`, `tp` or `model`, else
the last; a 1-D mesh is all data). Presets follow `tp_plan` for the weights it names, since square
weights (q, k, v and output projections are all [D, D]) cannot be told apart by shape.

Integer batch inputs cross into JAX as int32 (JAX's default width) and are cast back to the
example's dtype before the model sees them; int64 outputs leave as int32.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from pathlib import Path

from flint.errors import FlintError
from flint.frontend.torch_bridge import require_torch
from flint.frontend.torch_model import PLAN_STYLES, read_model
from flint.frontend.torch_step import build_step, jax_dtype
from flint.frontend.workload import Workload, input_path
from flint.mesh import tensor_axis, ways

# ------------------------------------------------------------------------------ tensor parallelism


def plan_dims(net, plan: Mapping[str, str], path: Path) -> dict[str, int | None]:
    """Parameter name -> the dimension the tensor axis splits (None: replicated), from `plan`.

    As in `torch.distributed.tensor.parallel` and `transformers`: a column-wise `nn.Linear` splits
    its output features (weight [out, in] dimension 0, and the bias), a row-wise one its input
    features (weight dimension 1, bias whole); a column-wise `nn.Embedding` splits the embedding
    dimension, a row-wise one the vocabulary. A plan entry may name a parameter (a fused
    `gate_up_proj`): column-wise splits its next-to-last dimension, row-wise its last. Names match
    by `fnmatch` (`layers.*.fc1`), from the root or, as in a `transformers` config's
    `base_model_tp_plan`, from the base model (`model.layers.*.fc1`). A packed style splits the
    packed dimension in contiguous blocks, not per packed part. Checked before any tracing.
    """
    import torch

    dims: dict[str, int | None] = {}
    modules, params = dict(net.named_modules()), dict(net.named_parameters())
    base = getattr(net, "base_model_prefix", "")
    for pattern, style in plan.items():
        if style not in PLAN_STYLES:
            raise FlintError(
                f"{path.name}: tp_plan[{pattern!r}] = {style!r}: use one of {', '.join(PLAN_STYLES)}"
            )
        split = PLAN_STYLES[style]
        patterns = [pattern] + ([f"{base}.{pattern}"] if base and base in modules else [])
        matched = [n for n in [*modules, *params] if n and any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        if not matched:
            raise FlintError(f"{path.name}: tp_plan entry {pattern!r} matches no module or parameter of model()")
        for name in matched:
            if name in params:
                dims[name] = _parameter_dim(split, params[name].dim())
                continue
            layer = modules[name]
            if split is None:
                dims.update({f"{name}.{p}": None for p, _ in layer.named_parameters()})
                continue
            if isinstance(layer, torch.nn.Linear):
                weight, bias = (0, 0) if split == "colwise" else (1, None)
            elif isinstance(layer, torch.nn.Embedding):
                weight, bias = (1 if split == "colwise" else 0), None
            else:
                raise FlintError(
                    f"{path.name}: tp_plan entry {pattern!r} matches {name}, a "
                    f"{type(layer).__name__}: only nn.Linear and nn.Embedding modules can be split "
                    "(or name its parameters)"
                )
            dims[f"{name}.weight"] = weight
            if getattr(layer, "bias", None) is not None:
                dims[f"{name}.bias"] = bias
    return dims


def _parameter_dim(split: str | None, ndim: int) -> int | None:
    """The split dimension of a parameter named by the plan: column-wise its output features (the
    next-to-last dimension, a vector's only one), row-wise its input features (the last; a vector
    stays whole)."""
    if split is None or (split == "rowwise" and ndim == 1):
        return None
    return ndim - 1 if split == "rowwise" or ndim == 1 else ndim - 2


def _mesh_roles(mesh) -> tuple[tuple[str, ...], str | None]:
    """(data axes, tensor axis) of the model's own layout."""
    names = tuple(mesh.axis_names)
    if len(names) == 1:
        return names, None
    tensor = tensor_axis(names)
    return tuple(n for n in names if n != tensor), tensor


# ------------------------------------------------------------------------------ the workload


def _tensor_parallel(names: list[str], dims: Mapping[str, int | None]) -> dict[str, int | None]:
    """Input path -> planned tensor-parallel dimension, for parameters and their moments."""
    prefixes = ["params"] + (["opt/m", "opt/v"] if "opt" in names else [])
    return {f"{prefix}/{name}": dim for prefix in prefixes for name, dim in dims.items()}


def load_torch_workload(module, path: Path, mesh, where, model_args: Mapping[str, object] | None = None):
    """The `Workload` of a PyTorch model file, built with `model_args`: the traced step, its inputs
    and the model's layout."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    require_torch(path.name)
    spec = read_model(module, path, where, model_args)
    planned = plan_dims(spec.module, spec.tp_plan, path)
    step, names, trees = build_step(spec, path, where)
    declared = _tensor_parallel(names, planned)
    data, tensor = _mesh_roles(mesh)
    data_ways = ways(mesh, data)

    def abstract(keypath, t):
        shape = tuple(t.shape)
        path = input_path(names, keypath)
        entries = [None] * len(shape)
        if path.startswith("batch/") and shape and shape[0] % data_ways == 0:
            entries[0] = data
        if tensor is not None and declared.get(path) is not None:
            entries[declared[path]] = tensor
        sharding = NamedSharding(mesh, P(*entries))
        return jax.ShapeDtypeStruct(shape, jax_dtype(t.dtype), sharding=sharding)

    args = jax.tree_util.tree_map_with_path(abstract, trees)
    # A training step replaces its parameters and optimizer state, which a real one donates.
    donate = tuple(i for i, name in enumerate(names) if name in ("params", "opt")) if spec.training else ()
    return Workload(
        name=path.stem, path=path, step=step, args=tuple(args), tensor_parallel=declared, donate=donate
    )

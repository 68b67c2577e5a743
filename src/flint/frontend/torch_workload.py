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
from flint.frontend.torch_experts import is_experts, router_parameters
from flint.frontend.torch_model import EP_STYLES, MODULE_STYLES, PLAN_STYLES, read_model
from flint.frontend.torch_step import build_step, jax_dtype
from flint.frontend.workload import Workload, input_path
from flint.mesh import EXPERT_AXIS_NAMES, axis_named, tensor_axis, ways

# ------------------------------------------------------------------------------ tensor parallelism


def plan_dims(net, plan: Mapping[str, str], path: Path, own: bool = False) -> dict[str, int | None]:
    """Parameter name -> the dimension the tensor axis splits (None: replicated), from `plan`.

    As in `torch.distributed.tensor.parallel` and `transformers`: a column-wise `nn.Linear` splits
    its output features (weight [out, in] dimension 0, and the bias), a row-wise one its input
    features (weight dimension 1, bias whole); a column-wise `nn.Embedding` splits the embedding
    dimension, a row-wise one the vocabulary. A plan entry may name a parameter (a fused
    `gate_up_proj`): column-wise splits its next-to-last dimension, row-wise its last. Names match
    by `fnmatch` (`layers.*.fc1`), from the root or, as in a `transformers` config's
    `base_model_tp_plan`, from the base model (`model.layers.*.fc1`). A packed style splits the
    packed dimension in contiguous blocks, not per packed part, but for stacked experts' weights
    (`packed_dims`). A mixture-of-experts module's style
    (`MODULE_STYLES`) splits nothing of its own: its stacked weights' entries do (`gate_up_proj`
    [E, 2I, H] packed column-wise: dimension 1; `down_proj` [E, H, I] row-wise: dimension 2). An
    entry matching nothing is refused, except in the model's `own` plan, which names modules that
    some configurations lack. Checked before any tracing.
    """
    import torch

    dims: dict[str, int | None] = {}
    modules, params = dict(net.named_modules()), dict(net.named_parameters())
    for pattern, style, matched in _plan_entries("tp_plan", PLAN_STYLES, net, plan, path, own):
        split = PLAN_STYLES[style]
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


def packed_dims(net, plan: Mapping[str, str], path: Path, own: bool = False) -> dict[str, int]:
    """Parameter name -> its packed dimension, for the stacked experts' weights of `plan`'s packed
    styles (`gate_up_proj` of a `transformers` experts module, `torch_experts`).

    As Hugging Face's `packed_colwise` (a strided shard): a dimension packing two parts (gate, then
    up) is split in each part alike, so a rank holds the same features of both. Flint passes such
    a parameter to the step as that dimension viewed as (2, size / 2), splits the second, and the
    experts read it so. Other packed parameters are split in contiguous blocks (`plan_dims`)."""
    dims = plan_dims(net, {p: s for p, s in plan.items() if s == "packed_colwise"}, path, own)
    params, modules = dict(net.named_parameters()), dict(net.named_modules())
    return {
        name: dim
        for name, dim in dims.items()
        if dim is not None
        and name.endswith(".gate_up_proj")
        and is_experts(modules.get(name.rpartition(".")[0]))
        and not modules[name.rpartition(".")[0]].is_transposed  # [E, 2I, H], as nn.Linear's
        and params[name].shape[dim] % 2 == 0
    }


def _matches(pattern: str, modules, params, base: str) -> list[str]:
    """Names of the modules and parameters `pattern` matches, from the root or the base model."""
    patterns = [pattern] + ([f"{base}.{pattern}"] if base and base in modules else [])
    return [n for n in [*modules, *params] if n and any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def expert_dims(net, plan: Mapping[str, str], path: Path, own: bool = False) -> dict[str, int]:
    """Parameter name -> the dimension the expert axis splits, from an expert-parallel `plan` (a
    `transformers` config's `base_model_ep_plan`): `grouped_gemm` splits a stacked expert weight
    [E, ...] by expert; a module's style (`ep_dispatch_experts`) splits nothing of its own."""
    dims: dict[str, int] = {}
    params = dict(net.named_parameters())
    for pattern, style, matched in _plan_entries("ep_plan", EP_STYLES, net, plan, path, own):
        for name in matched:
            if name not in params:
                raise FlintError(
                    f"{path.name}: ep_plan entry {pattern!r} = {style!r} matches {name}, a module: name "
                    "its stacked expert weights"
                )
            dims[name] = EP_STYLES[style]
    return dims


def _plan_entries(kind: str, styles: Mapping, net, plan: Mapping[str, str], path: Path, own: bool):
    """Each entry of a `kind` plan (`tp_plan`, `ep_plan`) whose style splits something, with the
    module and parameter names it matches; an unknown style, or (outside the model's `own` plan)
    an entry matching nothing, is refused."""
    modules, params = dict(net.named_modules()), dict(net.named_parameters())
    base = getattr(net, "base_model_prefix", "")
    for pattern, style in plan.items():
        if style not in styles and style not in MODULE_STYLES:
            raise FlintError(
                f"{path.name}: {kind}[{pattern!r}] = {style!r}: use one of {', '.join([*styles, *MODULE_STYLES])}"
            )
        matched = _matches(pattern, modules, params, base)
        if not matched and not own:
            raise FlintError(f"{path.name}: {kind} entry {pattern!r} matches no module or parameter of model()")
        if style not in MODULE_STYLES:
            yield pattern, style, matched


def _parameter_dim(split: str | None, ndim: int) -> int | None:
    """The split dimension of a parameter named by the plan: column-wise its output features (the
    next-to-last dimension, a vector's only one), row-wise its input features (the last; a vector
    stays whole)."""
    if split is None or (split == "rowwise" and ndim == 1):
        return None
    return ndim - 1 if split == "rowwise" or ndim == 1 else ndim - 2


def _mesh_roles(mesh, experts: bool = False) -> tuple[tuple[str, ...], str | None, str | None]:
    """(data axes, tensor axis, expert axis) of the model's own layout.

    The expert axis is one named `expert` or `ep`, when the model has an expert-parallel plan
    (`experts`); it is a data axis as well (each of its ranks holds other tokens), and the tensor
    axis is chosen among the other axes (none when only one is left: it is all data)."""
    names = tuple(mesh.axis_names)
    expert = axis_named(names, EXPERT_AXIS_NAMES, "") if experts else ""
    others = tuple(n for n in names if n != expert)
    if len(others) <= 1 and (expert or len(names) == 1):
        return names, None, expert or None
    tensor = tensor_axis(others)
    return tuple(n for n in names if n != tensor), tensor, expert or None


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
    planned = plan_dims(spec.module, spec.tp_plan, path, own="tp_plan" in spec.own_plans)
    by_expert = expert_dims(spec.module, spec.ep_plan, path, own="ep_plan" in spec.own_plans)
    packed = packed_dims(spec.module, spec.tp_plan, path, own="tp_plan" in spec.own_plans)
    planned = {name: dim + 1 if name in packed else dim for name, dim in planned.items()}
    planned.update({name: None for name in router_parameters(spec.module) if name not in planned})
    by_expert = {name: dim + (name in packed and dim >= packed[name]) for name, dim in by_expert.items()}
    step, names, trees = build_step(spec, path, where, packed)
    declared = _tensor_parallel(names, planned)
    data, tensor, expert = _mesh_roles(mesh, experts=bool(by_expert))
    experts = {path: dim for path, dim in _tensor_parallel(names, by_expert).items() if dim is not None}
    expert_split = experts if expert else {}
    data_ways = ways(mesh, data)

    def abstract(keypath, t):
        shape = tuple(t.shape)
        path = input_path(names, keypath)
        entries = [None] * len(shape)
        if path.startswith("batch/") and shape and shape[0] % data_ways == 0:
            entries[0] = data
        if tensor is not None and declared.get(path) is not None:
            entries[declared[path]] = tensor
        if path in expert_split and shape[expert_split[path]] % mesh.shape[expert] == 0:
            entries[expert_split[path]] = expert
        sharding = NamedSharding(mesh, P(*entries))
        return jax.ShapeDtypeStruct(shape, jax_dtype(t.dtype), sharding=sharding)

    args = jax.tree_util.tree_map_with_path(abstract, trees)
    # A training step replaces its parameters and optimizer state, which a real one donates.
    donate = tuple(i for i, name in enumerate(names) if name in ("params", "opt")) if spec.training else ()
    return Workload(
        name=path.stem, path=path, step=step, args=tuple(args), tensor_parallel=declared,
        expert_parallel=experts, donate=donate,
    )

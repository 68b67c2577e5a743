"""Load the user's model file into a step function and its abstract inputs.

A model file is ordinary Python that imports JAX and defines::

    def workload(mesh: jax.sharding.Mesh, **model_args) -> tuple[Callable, tuple]:
        return step, (params, batch)

`step` is the function to extract (a training or inference step) and the tuple holds its positional
arguments as pytrees of `jax.ShapeDtypeStruct` carrying `NamedSharding`s over `mesh` (or
`flint.sharding.logical` arrays named by logical axes). Keyword arguments after `mesh` (layers,
widths, batch size) are the model's knobs: `flint extract --model-arg layers=16` and sweeps set them
without editing the file. Nothing is allocated: shapes and shardings
are all the compiler needs, so a 70B-parameter step fits anywhere. An optional
`logical_rules(mesh) -> {name: axes}` gives the model's own rules for its logical axis names (or
Flax's rule table, `(name, axes)` pairs). Inputs may be Flax's boxed parameters as they are (a
linen `init`'s variables, an nnx state): `flint.layout.flax_names` reads their names. An optional
module-level `donate_argnums = (0, 1)` names the step arguments the program donates, as it would
pass them to `jax.jit` (`()`: none); without it, each argument an output replaces is donated.
Likewise an optional `batch_argnums = (2, 3)` names the step arguments that hold the batch (each
of their arrays has the batch's rows first), which the presets split over the data axes and
`--pipeline-stages` cuts into microbatches; without it Flint finds them (`flint.layout.batch`).

A model file that defines `model()` (an `nn.Module`) instead of `workload` is a PyTorch model; see
`flint.frontend.torch_model` for that convention. It ends up as the same `Workload`.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import operator
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flint.errors import FlintError
from flint.frontend.torch_bridge import TORCH_MODULES, missing_torch
from flint.frontend.torch_model import is_torch_model
from flint.frontend.torch_workload import load_torch_workload
from flint.frontend.workload import Workload
from flint.sharding import LogicalArray, axes_of

ENTRY_POINT = "workload"
RULES_ENTRY_POINT = "logical_rules"
DONATE = "donate_argnums"
BATCH = "batch_argnums"


def _where(exc: BaseException, path: Path) -> str:
    """`model.py:12` for the deepest frame inside the model file, so the user knows where to look."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    return f"{path.name}:{frames[-1].lineno}" if frames else path.name


def _failed(exc: BaseException, path: Path) -> str:
    """What the model file's code did and where: `raised ValueError at model.py:12: bad shape`, or
    `called sys.exit(3) at model.py:12`, which is no `Exception` and would end Flint silently."""
    if isinstance(exc, SystemExit):
        return (
            f"called sys.exit({exc.code!r}) at {_where(exc, path)}: a model file must not exit, "
            "remove the call"
        )
    message = str(exc).splitlines()[0] if str(exc) else ""  # the rest with --debug
    return f"raised {type(exc).__name__} at {_where(exc, path)}: {message}"


def _import(path: Path):
    if path.is_dir():
        raise FlintError(f"model file {str(path)!r} is a directory: give the path of a Python file")
    if not path.is_file():
        raise FlintError(f"model file {str(path)!r} not found: give the path of a Python file")
    if path.suffix != ".py":
        raise FlintError(f"model file {str(path)!r} is not a Python file (.py): give the model's .py file")
    module_name = f"flint_model_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        where = f" at line {exc.lineno}" if exc.lineno else ""
        raise FlintError(f"model file {path.name} is not valid Python: {exc.msg}{where}") from exc
    except (Exception, SystemExit) as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name in TORCH_MODULES:
            raise missing_torch(path.name, exc.name) from None
        raise FlintError(f"model file {path.name}, on import, {_failed(exc, path)}") from exc
    finally:
        sys.path.remove(str(path.parent))
    return module


def _check_inputs(args: tuple[Any, ...], path: Path) -> None:
    """Reject real arrays: inputs are described, never allocated. Shardings are checked by the
    layout stage, whichever source they end up coming from."""
    import jax

    leaves = jax.tree_util.tree_flatten_with_path(args, is_leaf=lambda x: isinstance(x, LogicalArray))
    for keypath, leaf in leaves[0]:
        if not isinstance(leaf, (jax.ShapeDtypeStruct, LogicalArray)):
            raise FlintError(
                f"{path.name}: input args{jax.tree_util.keystr(keypath)} is of type {type(leaf).__name__}, "
                "not a jax.ShapeDtypeStruct: describe inputs by shape, dtype and sharding (no real arrays)"
            )
        if not all(_is_size(d) for d in leaf.shape):
            raise FlintError(
                f"{path.name}: input args{jax.tree_util.keystr(keypath)} has shape {tuple(leaf.shape)}: each "
                "dimension must be a whole number, 0 or more: check the model arguments that size it"
            )


def _is_size(dim: Any) -> bool:
    """A dimension's size: an integer (numpy's too), not a bool, not negative."""
    try:
        return not isinstance(dim, bool) and operator.index(dim) >= 0
    except TypeError:
        return False


def _logical_rules(module, path: Path, mesh):
    """The model's own logical-axis rules, from its optional `logical_rules(mesh)`."""
    entry = getattr(module, RULES_ENTRY_POINT, None)
    if entry is None:
        return None
    try:
        rules = entry(mesh)
    except (Exception, SystemExit) as exc:
        raise FlintError(f"{path.name}: {RULES_ENTRY_POINT}(mesh) {_failed(exc, path)}") from exc
    found: dict[str, tuple[str, ...]] = {}
    for name, axes in rules.items() if isinstance(rules, Mapping) else rules:  # or Flax's (name, axes) pairs
        found.setdefault(name, axes_of(axes))  # a name's first rule wins, as in Flax's table
    return found


def _argnums(module, name: str, meaning: str, path: Path, count: int) -> tuple[int, ...] | None:
    """The model's own `name` (positions of the step's arguments, as `jax.jit`'s
    `donate_argnums`), or None without one."""
    if not hasattr(module, name):
        return None
    value = getattr(module, name)
    positions = (value,) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(positions, (tuple, list)) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in positions
    ):
        raise FlintError(
            f"{path.name}: {name} = {value!r}: give the positions of the {meaning} step "
            f"arguments, e.g. {name} = (0, 1), or () for none"
        )
    outside = [i for i in positions if not -count <= i < count]
    if outside:
        raise FlintError(
            f"{path.name}: {name} names argument {outside[0]} but the step takes {count} "
            f"(positions 0 to {count - 1})"
        )
    return tuple(sorted({i % count for i in positions}))


def _step_and_args(result: Any, path: Path) -> tuple[Any, Any]:
    """`workload(mesh)`'s result as (step, args), or what is wrong with it."""
    must = f"{path.name}: {ENTRY_POINT}(mesh) must return (step, args)"
    if not isinstance(result, tuple):
        raise FlintError(f"{must}, a tuple, but returned an object of type {type(result).__name__}")
    if len(result) != 2:
        raise FlintError(f"{must}, but returned a tuple of {len(result)}")
    if not callable(result[0]):
        raise FlintError(
            f"{must}, but its first element is of type {type(result[0]).__name__}, not a callable step "
            "function: return the function itself, not its name or its result"
        )
    return result


def parse_model_arg(text: str) -> tuple[str, Any]:
    """`NAME=VALUE` from the command line: VALUE as a Python literal (16, 0.5, True, 'gelu'),
    `true` or `false` in any case as a bool, else as the string it is. A shell user's `false`
    read as the string "false" would be true in every `if`."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip().isidentifier():
        raise FlintError(f"--model-arg {text!r} is not NAME=VALUE: give e.g. --model-arg layers=16")
    name, value = name.strip(), value.strip()
    if value.lower() in ("true", "false"):
        return name, value.lower() == "true"
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return name, value


def check_model_args(signature: inspect.Signature, model_args: Mapping[str, Any], path: Path,
                     give: str = "--model-arg {}=VALUE") -> None:
    """Refuse, before anything runs, a `workload` that does not take the mesh first, a model
    argument that it does not take and one that it needs and is not given (`give` says how to give
    it)."""
    kinds = [p.kind for p in signature.parameters.values()]
    if not kinds or kinds[0] not in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                     inspect.Parameter.VAR_POSITIONAL):
        raise FlintError(f"{path.name}: {ENTRY_POINT} must take the mesh first: def {ENTRY_POINT}(mesh, ...) "
                         "(see examples/mlp.py)")
    try:
        signature.bind(None, **model_args)
    except TypeError as exc:
        params = list(signature.parameters)[1:]
        unknown = sorted(set(model_args) - set(params))
        if unknown:
            takes = f"it takes {', '.join(params)}" if params else "it takes none"
            raise FlintError(
                f"{path.name}: {ENTRY_POINT}(mesh, ...) has no model argument {unknown[0]!r}: {takes}"
            ) from None
        missing = [name for name, p in list(signature.parameters.items())[1:]
                   if name not in model_args and p.default is p.empty
                   and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if missing:
            raise FlintError(f"{path.name}: {ENTRY_POINT}(mesh, ...) needs the model argument {missing[0]!r}: "
                             f"give {give.format(missing[0])}") from None
        raise FlintError(f"{path.name}: {ENTRY_POINT}(mesh, ...) cannot take these model arguments: {exc}") from None


def declared_signature(path: Path) -> inspect.Signature | None:
    """The signature of a model file's `workload` as its text declares it, read without running
    the file, so that a sweep can check its model arguments once rather than in every point's
    process (defaults stand unevaluated). None where the text does not settle it: a file that
    does not parse, or whose name `workload` is bound other than by one plain top-level def (a
    decorator, an assignment, an import, a PyTorch model file's absence of it)."""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    binds = [node for node in ast.walk(tree) if ENTRY_POINT in _names_bound(node)]
    if len(binds) != 1 or binds[0] not in tree.body or not isinstance(binds[0], ast.FunctionDef) \
            or binds[0].decorator_list:
        return None
    return _signature(binds[0].args)


def _names_bound(node: ast.AST) -> set[str]:
    """The names a syntax node binds (`*` for a star import, which may bind any)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        return {node.id}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        names = {(a.asname or a.name).split(".")[0] for a in node.names}
        return names | ({ENTRY_POINT} if "*" in names else set())
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return set(node.names)
    return set()


def _signature(args: ast.arguments) -> inspect.Signature:
    """An `inspect.Signature` of a def's arguments; each default is its unevaluated expression."""
    p = inspect.Parameter
    positional = [*args.posonlyargs, *args.args]
    defaults = [p.empty] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = [p(a.arg, p.POSITIONAL_ONLY if i < len(args.posonlyargs) else p.POSITIONAL_OR_KEYWORD, default=d)
              for i, (a, d) in enumerate(zip(positional, defaults))]
    if args.vararg is not None:
        params.append(p(args.vararg.arg, p.VAR_POSITIONAL))
    params += [p(a.arg, p.KEYWORD_ONLY, default=p.empty if d is None else d)
               for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg is not None:
        params.append(p(args.kwarg.arg, p.VAR_KEYWORD))
    return inspect.Signature(params)


def load_workload(path: Path, mesh, model_args: Mapping[str, Any] | None = None) -> Workload:
    """Run the model file and call its `workload(mesh, **model_args)`."""
    path = Path(path).resolve()
    model_args = dict(model_args or {})
    module = _import(path)
    if is_torch_model(module):
        return load_torch_workload(module, path, mesh, _where, model_args)
    entry = getattr(module, ENTRY_POINT, None)
    if not callable(entry):
        raise FlintError(
            f"model file {path.name} defines no {ENTRY_POINT}(mesh) function: add one returning "
            "(step, args) with args as jax.ShapeDtypeStructs (see examples/mlp.py)"
        )
    check_model_args(inspect.signature(entry), model_args, path)
    try:
        result = entry(mesh, **model_args)
    except (Exception, SystemExit) as exc:
        raise FlintError(f"{path.name}: {ENTRY_POINT}(mesh) {_failed(exc, path)}") from exc
    step, args = _step_and_args(result, path)
    args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
    _check_inputs(args, path)
    return Workload(
        name=path.stem, path=path, step=step, args=args, rules=_logical_rules(module, path, mesh),
        donate=_argnums(module, DONATE, "donated", path, len(args)),
        batch=_argnums(module, BATCH, "batch", path, len(args)),
    )

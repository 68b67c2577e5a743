"""A sweep's specification (a TOML file) and the grid of points it expands to.

    model = "gpt.py"                      # the model file, relative to the spec
    backend = "gpu:h100"                  # any extract option may be fixed here ...

    [mesh]
    ranks = 64                            # every factorization of 64 ranks over these axes,
    axes = ["pp", "data", "tensor"]       # outermost first (or: shapes = ["data=8,tensor=8", ...])

    [grid]                                # ... or varied here: the sweep runs their product
    strategy = ["dp+tp", "fsdp+tp"]
    schedule = ["1f1b", "gpipe"]
    microbatches = [8]
    network = ["hgx"]
    collectives = ["nccl"]                # or astra-sim: as flint simulate --collectives
    model_args = { layers = [4], batch = [64] }

A mesh axis named `pp` (or `stage`) larger than 1 pipelines the model over that many stages; the
pipeline options (schedule, microbatches, virtual_stages) apply only there, so on a mesh without one
their variants are the same point, skipped with that reason. Every value is checked as it is read:
one that no point could run with refuses the spec, where it would otherwise skip points one by one
(an ASTRA-sim network's NPUs too, against each mesh it is swept with). A key is fixed or in [grid],
not both.

Files a spec names (the model, and a `network` or `device` that is a file) are read relative to the
spec's directory. A point's id covers its mesh, options and model arguments, and the SHA-256 of the
bytes of each file it reads: a sweep of another model (or of the same one edited, or of an edited
network or device file) into the same directory runs its points afresh, where a file moved
unchanged keeps its results. A module the model file imports is not covered.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flint.compile.backend import parse_backend
from flint.compile.capture import STAGES
from flint.devices import BUILTIN, load_device
from flint.devices.kernels import DURATIONS
from flint.errors import FlintError, read_toml
from flint.frontend.model_file import check_model_args, declared_signature
from flint.layout.presets import STRATEGIES
from flint.mesh import MeshSpec, parse_mesh
from flint.pipelining.schedules import SCHEDULES
from flint.step.models import COLLECTIVE_MODELS
from flint.step.network import Network, read_network_spec
from flint.step.network_files import BUILTIN_NETWORKS

OPTIONS = ("backend", "stage", "strategy", "device", "network", "collectives", "durations", "donate", "schedule",
           "microbatches", "virtual_stages")
"""What a point may set besides its mesh and model arguments (extract's and simulate's options)."""
PIPELINE_OPTIONS = ("schedule", "microbatches", "virtual_stages")
CHOICES = {"strategy": STRATEGIES, "schedule": SCHEDULES, "durations": DURATIONS, "stage": STAGES,
           "collectives": COLLECTIVE_MODELS}
"""The options whose values are names from a list (extract's and simulate's)."""
STAGE_AXES = ("pp", "stage")


FILE_SUFFIXES = {"network": (".toml", ".yml", ".yaml"), "device": (".toml", ".json")}
"""The options whose value may name a file (rather than a built-in), by the suffixes it would have."""


@dataclass(frozen=True)
class Point:
    """One configuration of the sweep: `options` holds extract's and simulate's settings, as the
    spec writes them; `files`, the files it reads ("model", and "network" or "device" where they
    name one), resolved, and `digests` the SHA-256 of each one's bytes."""

    mesh: str
    options: Mapping[str, Any] = field(default_factory=dict)
    model_args: Mapping[str, Any] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    digests: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """A stable id: the same configuration of the same files' contents has the same id in every
        run of the sweep (wherever the files are)."""
        text = json.dumps(self.as_json() | {"digests": dict(self.digests)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def file(self, option: str, default: str) -> str:
        """What to give extract or simulate for `option`: the file it names, resolved, or its value."""
        return self.files.get(option) or str(self.options.get(option, default))

    @property
    def pipeline_stages(self) -> int | None:
        mesh = parse_mesh(self.mesh)
        sizes = [size for name, size in zip(mesh.axis_names, mesh.shape) if name in STAGE_AXES]
        return sizes[0] if sizes and sizes[0] > 1 else None

    def as_json(self) -> dict:
        return {"mesh": self.mesh, **self.options, "model_args": dict(self.model_args)}


@dataclass(frozen=True)
class SweepSpec:
    """The model file and the points to run, in grid order."""

    path: Path
    model: Path
    points: tuple[Point, ...]
    skipped: Mapping[str, str]
    """Point key -> why it does not run (the same as another point, for instance)."""


def read_spec(path: Path) -> SweepSpec:
    """Read and expand a sweep spec; every problem is one line naming the key."""
    data = read_toml(path, "sweep spec")
    model = data.get("model")
    if not isinstance(model, str):
        raise FlintError(f"sweep spec {path}: give the model file as model = \"model.py\" (relative to the spec)")
    unknown = set(data) - {"model", "mesh", "grid", "model_args", *OPTIONS}
    if unknown:
        raise FlintError(f"sweep spec {path}: unknown key {sorted(unknown)[0]!r}: use model, mesh, grid, "
                         f"model_args or one of {', '.join(OPTIONS)}")
    grid = data.get("grid", {})
    for table, value in (("grid", grid), ("model_args", data.get("model_args", {})),
                         ("grid.model_args", grid.get("model_args", {}) if isinstance(grid, dict) else {})):
        if not isinstance(value, dict):
            raise FlintError(f"sweep spec {path}: {table} is {value!r}, not a table: write [{table}] and its keys")
    if set(grid) - {"model_args", *OPTIONS}:
        bad = sorted(set(grid) - {"model_args", *OPTIONS})
        raise FlintError(f"sweep spec {path}: [grid] key {bad[0]!r} is not model_args or one of {', '.join(OPTIONS)}")
    fixed = {k: data[k] for k in OPTIONS if k in data}
    fixed_args = data.get("model_args", {})
    both = [k for k in OPTIONS if k in fixed and k in grid] + \
        [f"model_args.{k}" for k in grid.get("model_args", {}) if k in fixed_args]
    if both:
        raise FlintError(f"sweep spec {path}: {both[0]} is given both fixed and in [grid]: give it in one place")
    axes = {k: _values(grid[k], f"[grid] {k}", path) for k in OPTIONS if k in grid}
    files: dict[tuple[str, str], Path] = {}
    for option in OPTIONS:
        for value in ([fixed[option]] if option in fixed else []) + axes.get(option, []):
            if (found := _check_option(option, value, path)) is not None:
                files[option, value] = found
    model_axes = {k: _values(v, f"[grid] model_args.{k}", path) for k, v in grid.get("model_args", {}).items()}
    model_path = (path.parent / model).resolve()
    _check_model_args(model_path, [*fixed_args, *model_axes], path)
    meshes = _meshes(data.get("mesh"), path)
    if not model_path.is_file():
        relative = "" if Path(model).is_absolute() else " (a relative path is read from the spec's directory)"
        raise FlintError(f"sweep spec {path}: model file {model_path} not found{relative}")
    digests = {file: _digest(file) for file in {model_path, *files.values()}}
    points, skipped = _expand(meshes, fixed, axes, fixed_args, model_axes,
                              lambda point: _with_files(point, model_path, files, digests))
    _check_astra_sim_networks(points, files, path)
    return SweepSpec(path, model_path, tuple(points), skipped)


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise FlintError(f"cannot read {path}: {exc.strerror}") from None


def _with_files(point: Point, model: Path, files: Mapping[tuple[str, str], Path],
                digests: Mapping[Path, str]) -> Point:
    """`point` with the files it reads and their digests (which its id covers)."""
    named = {"model": model} | {option: files[option, point.options[option]] for option in FILE_SUFFIXES
                                if (option, point.options.get(option)) in files}
    return Point(point.mesh, point.options, point.model_args, files={o: str(f) for o, f in named.items()},
                 digests={o: digests[f] for o, f in named.items()})


def _check_astra_sim_networks(points: list[Point], files: Mapping[tuple[str, str], Path], path: Path) -> None:
    """An ASTRA-sim network (.yml) fits one rank count: refuse, before any point runs, a mesh it is
    swept with whose ranks its NPUs do not match (each such point would fail after its extraction)."""
    networks: dict[str, Network] = {}
    for point in points:
        value = point.options.get("network")
        file = files.get(("network", value))
        if file is None or file.suffix not in (".yml", ".yaml"):
            continue
        network = networks.setdefault(value, read_network_spec(str(file)))
        if network.npus != ranks(point):
            sizes = "x".join(str(d.npus) for d in network.dimensions)
            raise FlintError(f"sweep spec {path}: network {value} has {network.npus} NPUs ({sizes}) but mesh "
                             f"{point.mesh} has {ranks(point)} ranks: an ASTRA-sim network fits one rank count; "
                             "sweep it with meshes of its NPUs only")


def _check_model_args(model: Path, names: list[str], path: Path) -> None:
    """Refuse model argument names that the model file's workload, as its text declares it, does not
    take (or one it needs that none gives): each point would be skipped for it, one by one."""
    signature = declared_signature(model)
    if signature is not None:
        try:
            check_model_args(signature, dict.fromkeys(names), model, give="model_args.{} in the spec")
        except FlintError as exc:
            raise FlintError(f"sweep spec {path}: {exc}") from None


def _check_option(option: str, value: Any, path: Path) -> Path | None:
    """One line, before any point runs, for a value no point could run with; the file it names
    (a network or device file, relative to the spec's directory), if any."""
    where = f"sweep spec {path}: {option} {value!r}"
    if option in CHOICES and value not in CHOICES[option]:
        raise FlintError(f"{where} is not one of {', '.join(CHOICES[option])}")
    if option == "donate" and not isinstance(value, bool):
        raise FlintError(f"{where} is not true or false")
    if option in ("microbatches", "virtual_stages") and (isinstance(value, bool) or not isinstance(value, int)
                                                         or value < 1):
        raise FlintError(f"{where} is not a positive integer")
    if option not in ("backend", "device", "network"):
        return None
    if not isinstance(value, str):
        raise FlintError(f"{where} is not a name or a file")
    file = _file(option, value, path)
    try:
        if option == "backend":
            parse_backend(value)
        elif option == "device":
            load_device(str(file) if file else value)
        else:
            read_network_spec(str(file) if file else value)  # a YAML's NPUs: checked against each mesh
    except FlintError as exc:
        raise FlintError(f"sweep spec {path}: {exc}") from None
    return file


def _file(option: str, value: str, path: Path) -> Path | None:
    """The file a `network` or `device` value names, relative to the spec's directory (as the model
    file is); None for a built-in name or a value that names no file (refused as it is read)."""
    builtin = BUILTIN_NETWORKS if option == "network" else BUILTIN
    if option not in FILE_SUFFIXES or value in builtin or Path(value).suffix not in FILE_SUFFIXES[option]:
        return None
    file = (path.parent / Path(value).expanduser()).resolve()
    if not file.exists():
        relative = "" if Path(value).expanduser().is_absolute() else \
            " (a relative path is read from the spec's directory)"
        raise FlintError(f"sweep spec {path}: {option} file {value!r} not found: looked for {file}{relative}")
    return file


def _values(value: Any, where: str, path: Path) -> list:
    """A key's values, each once: a value listed twice would make two points of one."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise FlintError(f"sweep spec {path}: {where} is an empty list")
    again = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if again is not None:
        raise FlintError(f"sweep spec {path}: {where} lists {again!r} twice: list each value once")
    return values


def _meshes(mesh: Any, path: Path) -> list[str]:
    """The meshes of a [mesh] table: listed shapes, or every factorization of a rank count."""
    if not isinstance(mesh, dict) or not ({"shapes"} <= set(mesh) or {"ranks", "axes"} <= set(mesh)):
        raise FlintError(f"sweep spec {path}: give [mesh] shapes = [\"data=8,tensor=8\", ...], or ranks = N "
                         "and axes = [\"data\", \"tensor\"]")
    unknown = sorted(set(mesh) - {"shapes", "ranks", "axes"})
    if unknown:
        raise FlintError(f"sweep spec {path}: [mesh] key {unknown[0]!r} is not shapes, ranks or axes")
    if "shapes" in mesh and {"ranks", "axes"} & set(mesh):
        raise FlintError(f"sweep spec {path}: [mesh] gives shapes and ranks or axes: give shapes, or ranks and axes")
    if "shapes" in mesh:
        shapes = [str(s) for s in _values(mesh["shapes"], "[mesh] shapes", path)]
        seen: dict[MeshSpec, str] = {}
        for shape in shapes:
            try:
                parsed = parse_mesh(shape, "[mesh] shape")
            except FlintError as exc:
                raise FlintError(f"sweep spec {path}: {exc}") from None
            if parsed in seen:
                raise FlintError(f"sweep spec {path}: [mesh] shapes {seen[parsed]!r} and {shape!r} are one mesh, "
                                 f"{parsed}: list it once")
            seen[parsed] = shape
        return shapes
    ranks, axes = mesh["ranks"], mesh["axes"]
    if not (isinstance(ranks, int) and not isinstance(ranks, bool) and ranks >= 1 and isinstance(axes, list) and axes
            and all(isinstance(a, str) and a.isidentifier() for a in axes) and len(set(axes)) == len(axes)):
        raise FlintError(f"sweep spec {path}: [mesh] ranks must be a positive integer and axes distinct names")
    return [",".join(f"{a}={s}" for a, s in zip(axes, sizes)) for sizes in factorizations(ranks, len(axes))]


def factorizations(n: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every ordered way to write n as a product of `parts` positive factors."""
    if parts == 1:
        yield (n,)
        return
    for first in divisors(n):
        for rest in factorizations(n // first, parts - 1):
            yield (first, *rest)


def divisors(n: int) -> list[int]:
    """n's divisors in order, found up to its square root: a rank count may be in the billions."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _expand(meshes, fixed, axes, fixed_args, model_axes, with_files: Callable[[Point], Point] = lambda p: p
            ) -> tuple[list[Point], dict[str, str]]:
    points, skipped, seen = [], {}, {}
    option_names, model_names = list(axes), list(model_axes)
    for mesh in meshes:
        for option_values in itertools.product(*(axes[k] for k in option_names)):
            for arg_values in itertools.product(*(model_axes[k] for k in model_names)):
                point = with_files(Point(mesh, {**fixed, **dict(zip(option_names, option_values))},
                                         {**fixed_args, **dict(zip(model_names, arg_values))}))
                points.append(point)
                effective = _effective(point)
                if effective in seen:
                    skipped[point.key] = (f"no pipeline axis (pp) on mesh {mesh}: the pipeline options do "
                                          f"not apply; the same as point {seen[effective]}")
                else:
                    seen[effective] = point.key
    return points, skipped


def _effective(point: Point) -> str:
    """What the point runs: its pipeline options count only on a mesh with a pipeline axis."""
    options = dict(point.options)
    if point.pipeline_stages is None:
        for name in PIPELINE_OPTIONS:
            options.pop(name, None)
    return json.dumps({"mesh": point.mesh, **options, "model_args": dict(point.model_args)}, sort_keys=True)


def ranks(point: Point) -> int:
    return math.prod(parse_mesh(point.mesh).shape)

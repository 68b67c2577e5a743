"""What the user asks for: `--strategy`, `--rule`, `--shard` and the config file, merged.

Inputs are named by path: the step's parameter name, then the pytree keys, joined by `/`
(`params/layers/w_in`, `opt/m/embed`, `batch/tokens`). A `--shard` pattern is a regular expression
that must match a whole path; its SPEC gives one entry per leading dimension: a mesh axis, several
joined by `+`, or `None`/`_`/nothing for an unsplit one (`'params/.*/w_in=None,data,tensor'`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from flint.errors import FlintError, read_toml

Spec = tuple[tuple[str, ...], ...]
"""One entry per leading dimension: the mesh axes it is split over (empty: unsplit)."""


@dataclass(frozen=True)
class ShardRule:
    """`--shard PATTERN=SPEC`: inputs whose path fully matches `pattern` get `spec`."""

    pattern: str
    spec: Spec
    origin: str


@dataclass(frozen=True)
class LayoutRequest:
    """The user's layout choices, config file and command line merged (command line last)."""

    strategy: str | None = None
    rules: tuple[tuple[str, tuple[str, ...], str], ...] = ()
    shards: tuple[ShardRule, ...] = ()


def parse_spec(text: str) -> Spec:
    """`data,None,tensor+fsdp` -> (("data",), (), ("tensor", "fsdp"))."""
    entries = []
    for entry in text.split(","):
        entry = entry.strip()
        if entry in ("", "None", "none", "_"):
            entries.append(())
        else:
            entries.append(tuple(axis.strip() for axis in entry.split("+")))
    return tuple(entries)


def _split_assignment(text: str, flag: str, example: str) -> tuple[str, str]:
    key, sep, value = text.rpartition("=")
    if not sep or not key.strip():
        raise FlintError(f"{flag} {text!r} is not NAME=VALUE: write it like {example}")
    return key.strip(), value.strip()


def parse_shard(text: str, origin: str = "cli") -> ShardRule:
    pattern, spec = _split_assignment(text, "--shard", "'params/.*/w_in=None,data,tensor'")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise FlintError(f"--shard {text!r}: the pattern is not a regular expression ({exc})") from None
    return ShardRule(pattern, parse_spec(spec), origin)


def parse_rule(text: str, origin: str = "cli") -> tuple[str, tuple[str, ...], str]:
    name, axes = _split_assignment(text, "--rule", "batch=data or mlp=tensor")
    return name, tuple(a.strip() for a in axes.split("+") if a.strip() not in ("", "None")), origin


def read_config(path: Path) -> LayoutRequest:
    """A TOML layout: `strategy = "..."`, `[rules] name = "axes"`, `[shard] "pattern" = "spec"`."""
    data = read_toml(path, "config file")
    unknown = set(data) - {"strategy", "rules", "shard"}
    if unknown:
        raise FlintError(
            f"config file {path}: unknown key {sorted(unknown)[0]!r} (use strategy, rules, shard)"
        )
    origin = f"config {Path(path).name}"
    return LayoutRequest(
        strategy=data.get("strategy"),
        rules=tuple(parse_rule(f"{k}={v}", origin) for k, v in data.get("rules", {}).items()),
        shards=tuple(parse_shard(f"{k}={v}", origin) for k, v in data.get("shard", {}).items()),
    )


def merge(config: LayoutRequest | None, cli: LayoutRequest) -> LayoutRequest:
    """Command-line choices on top of the config file's."""
    if config is None:
        return cli
    return LayoutRequest(
        strategy=cli.strategy or config.strategy,
        rules=config.rules + cli.rules,
        shards=config.shards + cli.shards,
    )


def recorded(layout: Mapping, origin: str) -> LayoutRequest:
    """The layout a trace's manifest records (its final rules and every input's sharding), as a
    request that reproduces it exactly."""
    return LayoutRequest(
        rules=tuple((name, tuple(axes), origin) for name, axes in layout.get("rules", {}).items()),
        shards=tuple(
            ShardRule(re.escape(path), tuple(tuple(axes) for axes in spec), origin)
            for path, spec in layout.get("inputs", {}).items()
        ),
    )

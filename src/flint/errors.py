"""The one exception type the CLI turns into a one-line message, and the reading of users' data files
(TOML, and the numbers in device and network files) that every command shares, so that each problem
with such a file is one of those lines.

Every stage raises `FlintError` for problems the user can fix (bad flags, a broken model file, a sharding
that does not divide); anything else is a bug and keeps its traceback under `--debug`.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Collection
from pathlib import Path


class FlintError(Exception):
    """A problem with the user's input, phrased as what was wrong and what to do about it."""


def read_toml(path: Path | str, what: str) -> dict:
    """The TOML file `path`, which the user gave as a `what` (`"sweep spec"`, `"network file"`)."""
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FlintError(f"{what} {str(path)!r} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FlintError(f"cannot read {what} {str(path)!r}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise FlintError(f"{what} {str(path)!r} is not valid TOML: {exc}") from None


def number_field(table: dict, key: str, *, positive: bool = False, default: float | None = None) -> float:
    """`table[key]` as a finite number of at least 0 (above 0 where `positive`), or `default` where
    it is absent (None: it must be there). A TypeError or ValueError names the key and the value;
    the caller says which file. Python's JSON reads NaN and Infinity, which would pass a sign check
    (NaN) or reach a manifest, which JSON cannot hold (Infinity)."""
    if key not in table and default is not None:
        return default
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{key} is {value!r}, not a number")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{key} is {value!r}, not a finite number {'above 0' if positive else 'of at least 0'}")
    return float(value)


def optional_field(field: Callable[..., float], table: dict, key: str, **options) -> float | None:
    """`field(table, key, **options)` where `key` is there and not null (JSON's), else None: a
    number whose absence means something of its own (a model's default, not a value)."""
    return field(table, key, **options) if table.get(key) is not None else None


def fraction_field(table: dict, key: str, *, default: float | None = None) -> float:
    """`table[key]` as a share: above 0 and at most 1."""
    value = number_field(table, key, default=default)
    if not 0 < value <= 1:
        raise ValueError(f"{key} is {value!r}, not a fraction (above 0, at most 1)")
    return value


def invalid(exc: Exception, needs: str) -> str:
    """What was wrong with a file's table, from what reading it raised: a missing key (KeyError)
    with what the file `needs`; anything else (a bad value, an unknown key) in its own words, which
    name the key and what it must be."""
    return f"{exc.args[0]!r} is missing: {needs}" if isinstance(exc, KeyError) else str(exc)


def known_keys(table: dict, allowed: Collection[str], name: str | None = None) -> None:
    """Refuse a key of `table` (the file's top level, or its table `name`) that is not one of
    `allowed`: a misspelt key or table (`[scaleout]`, `[calibraton]`) would otherwise be dropped and
    the file read as if it were absent, a different answer without a word. A ValueError names the
    key and the keys allowed."""
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        where = f"[{name}] key" if name else "key or table"
        raise ValueError(f"unknown {where} {unknown[0]!r}: use {', '.join(allowed)}")


def sources_field(table: dict) -> tuple[tuple[str, str], ...]:
    """`table["sources"]` (absent: none) as sorted (key, source) pairs: a table of text, the source
    of each number by its key, so that a file can say where its numbers come from."""
    sources = table.get("sources", {})
    if not isinstance(sources, dict):
        raise TypeError(f"sources is {sources!r}, not a table: give [sources] with each number's source as text")
    for key, source in sources.items():
        if not isinstance(source, str):
            raise TypeError(f"sources key {key!r} is {source!r}, not text: give its source as a string")
    return tuple(sorted(sources.items()))

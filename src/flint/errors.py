"""The one exception type the CLI turns into a one-line message, and the reading of users' TOML files
that every command shares, so that each problem with such a file is one of those lines.

Every stage raises `FlintError` for problems the user can fix (bad flags, a broken model file, a sharding
that does not divide); anything else is a bug and keeps its traceback under `--debug`.
"""

from __future__ import annotations

import tomllib
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

"""The `flint` command's entry point: Ctrl-C while Python is still importing Flint ends it quietly.

The command line itself (`flint.cli`) turns an interrupt into exit 130 once it runs; importing it
and its libraries takes a moment before that, in which Python would print a traceback instead.
"""

from __future__ import annotations

import sys

INTERRUPTED = 130


def main() -> None:
    try:
        from flint.cli import main as cli
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: nothing was written\n")
        sys.exit(INTERRUPTED)
    cli()

"""`python -m flint` is the `flint` command."""

from flint.cli import main

main()

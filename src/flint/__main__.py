"""`python -m flint`: the `flint` command."""

from flint.launch import main

main()

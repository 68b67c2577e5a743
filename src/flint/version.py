"""Flint's version, in a module of its own: the stages record it without importing the package
root, which offers `flint.extract` and friends from the top of the pipeline."""

__version__ = "0.1.0"

"""The frontend's artifact: a step and its abstract inputs, whichever framework the model is in."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Workload:
    """What the model file describes, ready to be lowered."""

    name: str
    path: Path
    step: Callable[..., Any]
    args: tuple[Any, ...]
    rules: Mapping[str, tuple[str, ...]] | None = None
    tensor_parallel: Mapping[str, int | None] | None = None
    """Input path -> the dimension the model's own plan splits over the tensor axis (None: kept
    whole), for inputs whose tensor parallelism shape alone cannot decide (PyTorch `tp_plan`)."""
    donate: tuple[int, ...] | None = None
    """The step arguments the model says it donates (its `donate_argnums`); None: those an output
    replaces (`flint.compile.donation`)."""
    batch: tuple[int, ...] | None = None
    """The step arguments the model says hold the batch (its `batch_argnums`); None: Flint finds
    them (`flint.layout.batch`)."""
    expert_parallel: Mapping[str, int] | None = None
    """Input path -> the dimension the model's expert-parallel plan splits by expert (a
    `transformers` config's `base_model_ep_plan`), which `--strategy ep` follows."""


def _key_name(key) -> str:
    for attribute in ("key", "name", "idx"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def input_path(arguments: list[str], keypath) -> str:
    """An input's path: its step argument's name, then its pytree keys, joined by `/`.

    Every later stage and every command-line rule names inputs this way, so it is fixed here."""
    return "/".join([arguments[keypath[0].idx], *(_key_name(k) for k in keypath[1:])])

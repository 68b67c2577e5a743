"""What model files import to name logical axes, so a layout can be changed without editing them.

A model that says which logical axis each dimension is (`batch`, `vocab`, `mlp`, ...) lets the user
map those names onto mesh axes from the command line (`--rule batch=data`), the way Flax and MaxText
do. Two calls do it:

    w = logical((D_MODEL, D_FF), jnp.bfloat16, ("embed", "mlp"))   # an abstract input, in workload()
    x = constrain(x, ("batch", None, None))                        # an activation, inside the step

A name with a rule is split over the rule's mesh axes; a name without one leaves that dimension to
the compiler (unconstrained in `constrain`, unsplit for an input); `None` means unsplit. The rules
in effect while Flint lowers the step come from the layout stage (`flint.layout`); outside Flint no
rule is set and `constrain` returns its input unchanged, so model files still run as plain JAX.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

LogicalRules = Mapping[str, tuple[str, ...]]
"""Logical axis name -> mesh axes it is split over (in order)."""

_RULES: contextvars.ContextVar[LogicalRules | None] = contextvars.ContextVar("flint_rules", default=None)


@dataclass(frozen=True)
class LogicalArray:
    """An abstract input described by logical axis names instead of a sharding."""

    shape: tuple[int, ...]
    dtype: Any
    names: tuple[str | None, ...]


def logical(shape, dtype, names) -> LogicalArray:
    """An abstract input whose dimensions are named logical axes (`None` for an unnamed one)."""
    shape, names = tuple(int(d) for d in shape), tuple(names)
    if len(names) != len(shape):
        raise ValueError(f"{len(names)} logical names for a tensor of rank {len(shape)}")
    return LogicalArray(shape, dtype, names)


@contextlib.contextmanager
def rules_in_effect(rules: LogicalRules | None) -> Iterator[None]:
    """Make `rules` what `constrain` resolves names with, while the step is traced (None: no
    rules, `constrain` does nothing)."""
    token = _RULES.set(rules)
    try:
        yield
    finally:
        _RULES.reset(token)


def axes_of(entry) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry or rule value (None, an axis, or several)."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def entry_of(axes: tuple[str, ...]):
    """The PartitionSpec entry splitting a dimension over `axes` (None: unsplit)."""
    return axes[0] if len(axes) == 1 else axes or None


def resolve(names, rules: LogicalRules, unnamed):
    """PartitionSpec entries for logical `names`; `unnamed` stands for a name without a rule."""
    return [
        None if name is None else entry_of(tuple(rules[name])) if name in rules else unnamed
        for name in names
    ]


def constrain(x, names):
    """`with_sharding_constraint` of `x` by logical axis names under the rules in effect."""
    rules = _RULES.get()
    if rules is None:
        return x
    import jax
    from jax.sharding import PartitionSpec as P

    return jax.lax.with_sharding_constraint(x, P(*resolve(names, rules, P.UNCONSTRAINED)))

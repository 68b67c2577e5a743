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

A Flax model names its axes with Flax's own calls instead (`nn.with_logical_partitioning`,
`nn.with_logical_constraint`, nnx's sharding metadata) and resolves them against Flax's rule table
(`nn.logical_axis_rules`). While the step is traced that table holds the same rules, so Flax's
constraints, and linen's parameters as the step unboxes them, follow `--rule` too.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
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
    """Make `rules` what `constrain` (and Flax, where the model uses it) resolves names with, while
    the step is traced (None: no rules, `constrain` does nothing and Flax's own table stays)."""
    token = _RULES.set(rules)
    try:
        with _flax_rules_in_effect(rules):
            yield
    finally:
        _RULES.reset(token)


def flax_rule_table(rules: LogicalRules) -> tuple[tuple[str, Any], ...]:
    """`rules` as Flax writes them: (name, mesh axes) pairs, first come first served."""
    return tuple((name, entry_of(tuple(axes))) for name, axes in rules.items())


def _flax_rules_in_effect(rules: LogicalRules | None):
    """Flax's rule table set to `rules`. Flax is no dependency of Flint: only a model file that
    imported it can name axes through it, so it is looked up among the loaded modules."""
    flax_spmd = sys.modules.get("flax.core.spmd")
    if rules is None or flax_spmd is None:
        return contextlib.nullcontext()
    return flax_spmd.logical_axis_rules(flax_rule_table(rules))


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

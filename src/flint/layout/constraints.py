"""Which logical names the step's own constraints use, for a `--rule` that names no input.

A rule that no input carries may still act inside the step: `flint.sharding.constrain`, Flax's
`nn.with_logical_constraint`, a linen parameter unboxed there. Those names exist only while the step
is traced, so the step is traced once more, abstractly (`jax.eval_shape`, nothing compiled), with
each name in question mapped to a mesh axis the mesh does not have: the first constraint that uses
one stops the trace with an error naming that axis. The names found are dropped and the rest traced
again, until a trace finishes; the names never met there are used by nothing.
"""

from __future__ import annotations

from flint.frontend import Workload
from flint.sharding import LogicalRules, rules_in_effect

PROBE_AXIS = "flint_probe_{}"
"""A mesh axis name no mesh has, one per name in question."""


def _messages(exc: BaseException):
    while exc is not None:
        yield str(exc)
        exc = exc.__cause__ or exc.__context__


def constrained_names(workload: Workload, mesh, rules: LogicalRules, names: set[str]) -> set[str]:
    """Those of `names` that a constraint in the step resolves while it is traced under `rules`. A
    step that fails for another reason counts as using them all (its real trace reports the error)."""
    import jax

    probes = {name: PROBE_AXIS.format(i) for i, name in enumerate(sorted(names))}
    used: set[str] = set()
    while probes:
        trial = {**rules, **{name: (axis,) for name, axis in probes.items()}}
        try:
            with jax.set_mesh(mesh), rules_in_effect(trial):
                jax.eval_shape(workload.step, *workload.args)
        except Exception as exc:
            text = "\n".join(_messages(exc))
            met = {name for name, axis in probes.items() if repr(axis) in text or f" {axis} " in text}
            if not met:
                return used | set(probes)
            used |= met
            probes = {name: axis for name, axis in probes.items() if name not in met}
        else:
            break
    return used

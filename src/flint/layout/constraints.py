"""Which logical names and mesh axes the step's own constraints use, for a `--rule` that names no
input and for a mesh axis that splits none.

A rule that no input carries may still act inside the step: `flint.sharding.constrain`, Flax's
`nn.with_logical_constraint`, a linen parameter unboxed there. Those names exist only while the step
is traced, so the step is traced once more, abstractly (`jax.eval_shape`, nothing compiled), with
each name in question mapped to a mesh axis the mesh does not have: the first constraint that uses
one stops the trace with an error naming that axis. The names found are dropped and the rest traced
again, until a trace finishes; the names never met there are used by nothing.

Mesh axes are read from the step lowered for the mesh (nothing compiled): the shardings it carries
(its inputs', its sharding constraints', a `shard_map`'s) name the axes that split something.
"""

from __future__ import annotations

import re

from flint.frontend import Workload
from flint.sharding import LogicalRules, rules_in_effect

PROBE_AXIS = "flint_probe_{}"
"""A mesh axis name no mesh has, one per name in question."""
_SHARDINGS = re.compile(r"<@[\w.$-]+, \[([^\]]*)\]|manual_axes=\{([^}]*)\}")
"""The dimension shardings of a Shardy sharding (`#sdy.sharding<@mesh, [{"data"}, {}]>`, a
constraint's or a `shard_map`'s `<@mesh, [...]>`; not its `replicated={...}`) and a manual
computation's axes: the axes that split something."""


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


def axes_in_step(workload: Workload, mesh, rules: LogicalRules) -> set[str]:
    """The mesh axes that the step lowered for `mesh` under `rules` splits something over: an input,
    a sharding constraint, a `shard_map`. A step that fails to lower counts as using them all (its
    real trace reports the error)."""
    import jax

    try:
        with jax.set_mesh(mesh), rules_in_effect(rules):
            text = jax.jit(workload.step).lower(*workload.args).as_text()
    except Exception:
        return set(mesh.axis_names)
    named = " ".join(a or b for a, b in _SHARDINGS.findall(text))
    return set(re.findall(r'"([^"]+)"', named)) & set(mesh.axis_names)

"""Stage 2, layout: every input's sharding and the logical-axis rules, from the model and the user.

In: a `Workload` from the frontend, the `jax.sharding.Mesh`, and a `LayoutRequest` (`--strategy`,
`--config`, `--rule`, `--shard`). Out: the workload with its inputs resharded and the `Layout`
that says where each sharding came from. `request` parses what the user asks for, `inputs` names
the inputs by path, `flax_names` reads the logical names of Flax's boxed parameters, `presets`
derives the `--strategy` layouts by shape, `constraints` finds which names the step's own
constraints use, `apply` combines them in order of precedence and checks the result against the
mesh.

Imports: the frontend and the foundation modules.
"""

from flint.layout.apply import apply_layout
from flint.layout.inputs import InputLayout, Layout
from flint.layout.presets import STRATEGIES, stacked_paths
from flint.layout.request import (
    LayoutRequest,
    ShardRule,
    merge,
    parse_rule,
    parse_shard,
    read_config,
    recorded,
)

__all__ = [
    "STRATEGIES",
    "InputLayout",
    "Layout",
    "LayoutRequest",
    "ShardRule",
    "apply_layout",
    "merge",
    "parse_rule",
    "parse_shard",
    "read_config",
    "recorded",
    "stacked_paths",
]

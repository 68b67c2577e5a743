"""A Flax nnx MLP training step whose parameters carry nnx sharding metadata as logical names.

Written as an nnx user writes it: `w_in` an `nnx.Linear` whose kernel [D, F] is made by
`nnx.with_partitioning(init, ("embed", "mlp"))`, `w_out` an `nnx.Param` [F, D] with
`out_sharding=("mlp", "embed")`; the abstract model from `nnx.eval_shape` (eager sharding off: the
layout places it), split into a graph and a state, and the step merges them back. Its own rules are
Flax's rule table (`logical_rules`): Megatron tensor parallelism over the last mesh axis, the batch
over the first, `embed` whole; `--rule` replaces any of them. The batch is data-parallel over the
first mesh axis by its own sharding. f32 throughout; MSE loss, SGD.

`--model-arg annotated=False` builds the same model with no names at all, as before it was
annotated: `--strategy` then has only the shapes (and with `hidden` = D, square weights).
"""

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

BATCH, D_MODEL, D_FF = 64, 256, 512
LEARNING_RATE = 0.01


class MLP(nnx.Module):
    def __init__(self, width, hidden, annotated, rngs):
        init = nnx.initializers.lecun_normal()
        kernel_init = nnx.with_partitioning(init, ("embed", "mlp")) if annotated else init
        self.w_in = nnx.Linear(width, hidden, use_bias=False, kernel_init=kernel_init, rngs=rngs)
        names = {"out_sharding": ("mlp", "embed")} if annotated else {}
        self.w_out = nnx.Param(init(rngs.params(), (hidden, width)), **names)

    def __call__(self, x):
        return jax.nn.relu(self.w_in(x)) @ self.w_out[...]


def workload(mesh, hidden=D_FF, annotated=True):
    with nnx.use_eager_sharding(False):
        model = nnx.eval_shape(lambda: MLP(D_MODEL, hidden, annotated, nnx.Rngs(0)))
    graph, state = nnx.split(model)

    def step(state, batch):
        def loss_fn(state):
            err = nnx.merge(graph, state)(batch["x"]) - batch["y"]
            return jnp.mean(err * err)

        loss, grads = jax.value_and_grad(loss_fn)(state)
        return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, state, grads), loss

    rows = jax.ShapeDtypeStruct((BATCH, D_MODEL), jnp.float32, sharding=NamedSharding(mesh, P(mesh.axis_names[0])))
    return step, (state, {"x": rows, "y": rows})


def logical_rules(mesh):
    data, tensor = mesh.axis_names
    return (("batch", data), ("embed", None), ("mlp", tensor))

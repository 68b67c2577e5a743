"""A Flax linen MLP training step whose parameters carry Flax's own logical axis names.

Written as a linen user writes it: `nn.Dense` kernels made by `nn.with_logical_partitioning`
(`w_in` [D, F] named ("embed", "mlp"), `w_out` [F, D] named ("mlp", "embed")), the hidden
activation constrained by `nn.with_logical_constraint(h, ("batch", "mlp"))`, the variables from
`jax.eval_shape(model.init, ...)` as they come (boxed). It has no rules of its own: where the names
go is the layout's (`flint extract ... --rule mlp=tensor`). The batch is data-parallel over the first
mesh axis by its own sharding. f32 throughout; MSE loss, SGD.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

BATCH, D_MODEL, D_FF = 64, 256, 512
LEARNING_RATE = 0.01


class MLP(nn.Module):
    hidden: int

    @nn.compact
    def __call__(self, x):
        init = nn.initializers.lecun_normal()
        h = nn.Dense(self.hidden, use_bias=False, name="w_in",
                     kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")))(x)
        h = nn.with_logical_constraint(nn.relu(h), ("batch", "mlp"))
        return nn.Dense(x.shape[-1], use_bias=False, name="w_out",
                        kernel_init=nn.with_logical_partitioning(init, ("mlp", "embed")))(h)


MODEL = MLP(D_FF)


def step(variables, batch):
    def loss_fn(variables):
        err = MODEL.apply(variables, batch["x"]) - batch["y"]
        return jnp.mean(err * err)

    loss, grads = jax.value_and_grad(loss_fn)(variables)
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, variables, grads), loss


def workload(mesh):
    rows = jax.ShapeDtypeStruct((BATCH, D_MODEL), jnp.float32, sharding=NamedSharding(mesh, P(mesh.axis_names[0])))
    variables = jax.eval_shape(MODEL.init, jax.random.key(0), jax.ShapeDtypeStruct((BATCH, D_MODEL), jnp.float32))
    return step, (variables, {"x": rows, "y": rows})

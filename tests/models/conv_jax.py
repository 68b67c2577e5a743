"""Two convolutions as JAX writes them (`lax.conv_general_dilated`, NHWC images, HWIO kernels), a
training step with SGD: a 3x3 convolution of stride 2 and padding 1, a ReLU, a 3x3 convolution of
stride 1 and padding 1, and a mean-square loss. Backward needs both kernels' gradients and the
input gradient of the second convolution (not of the first: the images are no parameter). The
batch is split over every mesh axis, the kernels replicated."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

BATCH, SIDE, CHANNELS, HIDDEN, OUT = 16, 16, 8, 16, 32
LEARNING_RATE = 0.01
NHWC = ("NHWC", "HWIO", "NHWC")


def step(params, images):
    def loss_fn(params):
        hidden = jax.lax.conv_general_dilated(
            images, params["w1"], (2, 2), ((1, 1), (1, 1)), dimension_numbers=NHWC
        )
        out = jax.lax.conv_general_dilated(
            jax.nn.relu(hidden), params["w2"], (1, 1), ((1, 1), (1, 1)), dimension_numbers=NHWC
        )
        return jnp.mean(out * out)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads), loss


def workload(mesh, batch=BATCH):
    def array(shape, *partition):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, P(*partition)))

    params = {"w1": array((3, 3, CHANNELS, HIDDEN)), "w2": array((3, 3, HIDDEN, OUT))}
    return step, (params, array((batch, SIDE, SIDE, CHANNELS), tuple(mesh.axis_names)))

import jax


def step(x):
    return x

"""The three-block program of the Pathways-on-Cloud blog: block A on one slice, B on a second, C on a third."""
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw

slice_a = pw.virtual_slice(2, axes="data", name="slice_a")
slice_b = pw.virtual_slice((2, 2), axes=("data", "model"), name="slice_b")
slice_c = pw.virtual_slice(2, axes="data", name="slice_c")


@pw.jit(slice=slice_a, in_specs=P("data"), out_specs=P("data"))
def block_a(x):
    return jnp.tanh(x)


@pw.jit(slice=slice_b, in_specs=P("data", "model"), out_specs=P("data", "model"))
def block_b(x):
    return x * x


@pw.jit(slice=slice_c, in_specs=P("data"), out_specs=P("data"))
def block_c(x):
    return -x


@pw.program
def three_blocks(x):
    return block_c(block_b(block_a(x)))


if __name__ == "__main__":
    # Run it on the embedded cluster (2 islands x 4 CPU devices by default)
    # and check it against plain JAX running the same three functions.
    import jax
    import numpy as np

    x = np.random.default_rng(0).normal(size=(8, 16)).astype(np.float32)
    result = three_blocks(x)
    expected = jax.jit(block_c.fn)(jax.jit(block_b.fn)(jax.jit(block_a.fn)(x)))
    print(f"three_blocks on {result!r}")
    print(np.asarray(result)[:2])
    print("matches plain JAX:", np.array_equal(np.asarray(result), np.asarray(expected)))

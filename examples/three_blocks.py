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

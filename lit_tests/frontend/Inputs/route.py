"""A program with a data-dependent step, exported by lit_tests/frontend/export.mlir."""
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw

small = pw.virtual_slice(2, axes="data", name="small")
large = pw.virtual_slice((2, 4), axes=("data", "model"), name="large", device_kind="cpu")


@pw.jit(slice=small, in_specs=P("data"))
def is_positive(x):
    return jnp.sum(x) > 0


@pw.jit(slice=small, in_specs=P("data"), out_specs=P("data"))
def cheap(x):
    return x + 1


@pw.jit(slice=large, in_specs=P("data", "model"), out_specs=P("data", "model"))
def expensive(x):
    return jnp.tanh(x) * 2


@pw.program
def route(x):
    return cheap(pw.cond(is_positive(x), expensive, cheap, x))

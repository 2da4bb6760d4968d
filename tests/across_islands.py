"""The two-island program the Ray and conformance tests run: `grow` on a slice of 2 devices of island0,
`bend` on a 2x2 slice of island1, and `across` = grow(bend(grow(x))), with plain JAX's answer."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw

left = pw.virtual_slice(2, axes="x", name="left", island="island0")
right = pw.virtual_slice((2, 2), axes=("a", "b"), name="right", island="island1")


@partial(pw.jit, slice=left, in_specs=P("x"), out_specs=P("x"))
def grow(x):
    return x * 2.0 + 1.0


@partial(pw.jit, slice=right, in_specs=P("a", "b"), out_specs=P("a"))
def bend(x):
    return jnp.sin(x)


@pw.program
def across(x):
    return grow(bend(grow(x)))


def expected(x):
    """Plain JAX's `across(x)`."""
    g, b = jax.jit(grow.fn), jax.jit(bend.fn)
    return np.asarray(g(b(g(x))))

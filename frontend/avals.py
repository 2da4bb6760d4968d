"""Abstract values: the global shape and dtype of a program value.

The front end never needs data, only `jax.ShapeDtypeStruct`s; this module
makes them from example arguments and from text such as `f32[8,16]`, and gives
their MLIR tensor types.

An abstract value keeps what `jax.jit` keys a trace on: shape, dtype and weak
type (a Python scalar is weakly typed, as in JAX). An extended dtype, such as
a typed PRNG key's `key<fry>`, has no tensor type of its own: in pw IR and in
the runtime it is its key data (`jax.random.key_data`, `ui32[..., 2]` for
threefry), its "wire" value; the front end wraps it again at the boundary.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import numpy as np
from jax._src.core import trace_state_clean   # whether a JAX trace is under way: no public reader
from mlir import ir

from pathways_mlir.dialect.element_types import ELEMENT_TYPES, NUMPY_NAMES
from pathways_mlir.runtime.executables import native_dtype
from pathways_mlir.runtime.remote_client import RemoteSharedRef

_DTYPE_NAMES = NUMPY_NAMES | {"pred": "bool"}
# An element type (`complex<f32>` too, as MLIR and `format_aval` spell it, or typed PRNG keys' `key<fry>`) and
# dimensions of ASCII digits, none empty (`f32[4,,5]` and `f32[٣]` are no shapes).
_AVAL_TEXT = re.compile(r"^\s*(\w+|complex<\w+>|key<\w+>)\s*\[\s*((?:\d+\s*(?:,\s*\d+\s*)*)?)\]\s*$", re.ASCII)
# What is taken as an array besides scalars: NumPy and JAX arrays (a handle is one, a JAX tracer too), abstract
# values and a service's shared object (duck typing took any object with a shape and a dtype, whose run failed).
ARRAYS = (np.ndarray, jax.Array, jax.ShapeDtypeStruct, jax.core.ShapedArray, RemoteSharedRef)


def aval_of(x: Any) -> jax.ShapeDtypeStruct:
    """Returns the abstract value of an array, a scalar or a `jax.ShapeDtypeStruct`.

    The dtype is canonicalised as JAX would (float64 becomes float32 unless
    x64 is enabled), in this machine's byte order; Python scalars are weakly
    typed, NumPy scalars are not; extended dtypes (typed PRNG keys) are kept.
    """
    if isinstance(x, (bool, int, float, complex)):
        aval = jax.typeof(x)
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)
    if isinstance(x, np.generic):
        x = np.asarray(x)
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):      # (an abstract value of any kind, as JAX takes it)
        raise not_an_array(x)
    if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in x.shape):
        raise TypeError(f"an abstract value's dimensions are integers of 0 or more, not {tuple(x.shape)}")
    dtype = x.dtype if is_extended(x.dtype) else native_dtype(jax.dtypes.canonicalize_dtype(x.dtype))
    return jax.ShapeDtypeStruct(tuple(x.shape), dtype, weak_type=bool(getattr(x, "weak_type", False)))


def not_an_array(x: Any) -> TypeError:
    """The one-line error for an argument that is neither an array nor a scalar."""
    return TypeError(f"expected an array, a scalar or a jax.ShapeDtypeStruct, not {type(x).__name__} {x!r:.80}")


def has_tracers(tree: Any) -> bool:
    """Whether the call happens inside `jax.jit`, `jax.grad`, ... of JAX: `tree` holds a JAX tracer, or a
    JAX trace is under way (a call with no array argument inside one has no tracer to show it)."""
    return not trace_state_clean() or any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


def is_extended(dtype) -> bool:
    """Whether `dtype` is a JAX extended dtype (a typed PRNG key's, for one)."""
    # A NumPy dtype (bfloat16's too) never is: a look that saves JAX's issubdtype on every argument leaf.
    return not isinstance(dtype, np.dtype) and jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


def wire_aval(aval: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    """Returns the abstract value the runtime holds for `aval`: its key data for a typed key."""
    if is_extended(aval.dtype):
        return jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(aval.shape, aval.dtype))
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype)


def wrap_keys(data: Any, dtype) -> Any:
    """Wraps key data (an array or tracer) as typed keys of extended dtype `dtype`."""
    # A key dtype has no public accessor for its PRNG implementation.
    return jax.random.wrap_key_data(data, impl=dtype._impl)


def signature_of(aval: jax.ShapeDtypeStruct) -> tuple:
    """What `jax.jit` keys a trace on for one argument: shape, dtype and weak type."""
    return aval.shape, aval.dtype, aval.weak_type


def parse_aval(text: str) -> jax.ShapeDtypeStruct:
    """Parses `f32[8,16]`, `bf16[4]`, `i1[]`, `complex<f32>[2]` or `float32[2,2]` into an abstract value, and
    typed PRNG keys as `format_aval` writes them, `key<fry>[4]` (or by implementation, `key<threefry2x32>[]`)."""
    match = _AVAL_TEXT.match(text)
    if not match:
        raise ValueError(f"'{text}' is not a shape such as f32[8,16]")
    element, dims = match.groups()
    shape = tuple(int(d) for d in dims.replace(" ", "").split(",") if d)
    if element.startswith("key<"):
        _check_dims(text, shape)
        return jax.ShapeDtypeStruct(shape, _key_dtype(text, element[4:-1]))
    dtype = _DTYPE_NAMES.get(element, element)
    if dtype not in ELEMENT_TYPES:
        raise ValueError(f"'{text}' has unknown element type '{element}' "
                         f"(use f32, bf16, i32, i1, ui8, ... or a numpy dtype name)")
    _check_dims(text, shape)
    return aval_of(jax.ShapeDtypeStruct(shape, jax.numpy.dtype(dtype)))


def _check_dims(text: str, shape: tuple[int, ...]) -> None:
    if any(d >= 1 << 63 for d in shape):
        raise ValueError(f"'{text}' has a dimension of more than a 64-bit integer holds (the IR's tensor types)")


def _key_dtype(text: str, impl: str):
    """The dtype of typed PRNG keys of `impl`: a key dtype's tag (`fry`, as `key<fry>` names it) or a name
    `jax.random.key` takes (`threefry2x32`)."""
    from jax.extend import random as prng

    tags = {i.tag: i for i in (prng.threefry_prng_impl, prng.rbg_prng_impl, prng.unsafe_rbg_prng_impl)}
    try:
        return jax.eval_shape(lambda: jax.random.key(0, impl=tags.get(impl, impl))).dtype
    except ValueError:
        raise ValueError(f"'{text}' has unknown PRNG implementation '{impl}' (use key<fry>, key<rbg>, key<urbg> "
                         f"or a name jax.random.key takes, such as threefry2x32)") from None


def format_aval(aval: jax.ShapeDtypeStruct) -> str:
    """Returns `f32[8,16]` for a float32 8x16 abstract value, `key<fry>[4]` for 4 typed keys."""
    element = str(aval.dtype) if is_extended(aval.dtype) else _element_type(aval)
    return f"{element}[{','.join(str(d) for d in aval.shape)}]"


def tensor_type(aval: jax.ShapeDtypeStruct) -> ir.Type:
    """Returns the ranked tensor type of an abstract value's wire value (needs an active context)."""
    aval = wire_aval(aval)
    return ir.Type.parse(f"tensor<{''.join(f'{d}x' for d in aval.shape)}{_element_type(aval)}>")


def _element_type(aval: jax.ShapeDtypeStruct) -> str:
    check_element_type(aval.dtype, "a value")
    return ELEMENT_TYPES[np.dtype(aval.dtype).name]


def check_element_type(dtype, what: str) -> None:
    """Raises TypeError in one line, naming `what`, if `dtype` has no pw element type (an extended one, a typed
    key's, travels as its key data)."""
    if is_extended(dtype):
        return
    if dtype == jax.dtypes.float0:
        raise TypeError(f"{what} has dtype float0, a gradient's with respect to an integer (allow_int=True), "
                        f"which holds no data and has no pw element type: differentiate with respect to "
                        f"floating-point values only")
    name = np.dtype(dtype).name
    if name not in ELEMENT_TYPES:
        raise TypeError(f"{what} has dtype {name}, which has no pw element type: jax.export, which carries a "
                        f"placed function's code, cannot serialise it (known: {', '.join(ELEMENT_TYPES)})")

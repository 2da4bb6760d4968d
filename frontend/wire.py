"""Values at the runtime boundary: what a program's arguments and results are on the wire.

The runtime holds plain arrays only. A program's argument leaves go to it as

- a typed PRNG key array (any extended dtype): its key data
  (`jax.random.key_data`, sharded as the key array is);
- a Python or NumPy scalar: a 0-d NumPy array of the dtype it was traced
  with (int32 for a Python int unless x64 is on);
- anything else (arrays, handles) as it is,

and a result that the program returns as a typed key comes back as a
`KeyHandle`: the handle of its key data and the key's dtype, which wraps it
again (`jax.random.wrap_key_data`) when read and goes back to the wire as the
same handle when passed to another program. A result JAX types weakly (a
Python scalar returned, `lr * 0.5` of a Python float `lr`), which `jax.jit`
returns as a weakly typed array, comes back as a `WeakHandle`: the runtime's
handle (the plan and the runtime know no weak types), whose value is read
weakly typed, so that it takes its type from what it meets (`bf16 * lr` stays
bfloat16) and goes into another call traced as weak, as `jax.jit`'s does.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax._src import dtypes as jax_dtypes, tree_util as jax_tree_util   # JAX's registries (see KeyHandle)
from jax._src.random.prng import PRNGKeyArray     # (a key array over given key data, which `wrap_key_data` reads)

from pathways_mlir.runtime.array_reference import ArrayReference, Reference
from pathways_mlir.runtime.executables import ARRAY_TYPE

from .avals import is_extended, wrap_keys


class _OfHandle:
    """What a reference that wraps the runtime's handle of its value (`data`) does as that handle does."""

    __slots__ = ()      # each subclass holds `data` (in its own layout: a weakly typed one's is JAX's array's)
    _from_elsewhere = property(lambda self: self.data._from_elsewhere)
    # A service's shared object's token (`RemoteSharedRef.token`), which its owner hands to readers.
    token = property(lambda self: self.data.token)

    def owned(self):
        """The runtime's handle this reference wraps."""
        return self.data

    def wrapping(self, other):
        """`other`, another runtime reference to this value (its shared reference), wrapped as this reference
        wraps its handle: a shared key reads as keys, a shared weakly typed value weakly typed."""
        return from_wire(other, self.aval)

    def block_until_ready(self):
        """Waits until the value has been computed."""
        self.data.block_until_ready()
        return self

    def copy_to_host_async(self) -> None:
        """Announces that the value will be read soon (the runtime handle's `copy_to_host_async`)."""
        self.data.copy_to_host_async()

    def is_ready(self) -> bool:
        """Whether reading the value would not wait (the runtime handle's `is_ready`)."""
        return self.data.is_ready()

    def is_deleted(self) -> bool:
        """Whether the value was released."""
        return self.data.is_deleted()

    def delete(self) -> None:
        """Releases the value now."""
        self.data.delete()

    def donate(self, to: str) -> None:
        """Releases the value, which `to` was given to reuse."""
        self.data.donate(to)


class KeyHandle(_OfHandle, Reference, jax.Array):
    """A handle to typed PRNG keys on devices: `result()` returns the key array.

    It has the key array's `shape` and `dtype` (`key<fry>`), and programs and
    placed functions take it as an argument like the key array it holds. So
    do JAX's transformations (`jax.jit`, `jax.vmap`, ...) and indexing
    (`keys[0]`, `keys[...]`, `len(keys)`, `for key in keys`), on the key
    array (waiting for it): a flax NNX model whose state a placed function
    returned runs outside it too. It is a `jax.Array`, as a key array is, so
    `jax.random`'s functions, `jax.device_get` and every method of the key
    array take it.
    """

    __slots__ = ("data", "dtype", "shape")
    _kind = "key array"

    def __init__(self, data, aval: jax.ShapeDtypeStruct):
        self.data = data            # the runtime's handle of the key data
        self.dtype = aval.dtype
        self.shape = aval.shape

    def result(self, timeout: float | None = None) -> jax.Array:
        """Returns the typed key array, waiting until it is produced."""
        return wrap_keys(self.data.result(timeout), self.dtype)

    def __array__(self, dtype=None, copy=None):
        """As the key array's: JAX refuses it, saying to take `jax.random.key_data` (NumPy made an array of one
        object of the handle, which flax's msgpack checkpoints then refused with an unrelated message)."""
        return np.asarray(self.result(), dtype=dtype, copy=copy)

    def __reduce__(self):
        """Pickles the keys' data and implementation (waiting for them); they unpickle as a key array."""
        return _keys, (np.asarray(self.data), self.dtype._impl.name)

    def __repr__(self) -> str:
        where = getattr(self.data, "slice", None)       # a service's handle does not name its slice
        return f"KeyHandle(shape={self.shape}, dtype={self.dtype}{'' if where is None else f', slice={where}'})"


# JAX takes a key array apart by its registry of extended-dtype arrays where it dispatches (`jax.jit`'s arguments,
# `jax.device_get`): a key handle is its key array there.
jax_tree_util.dispatch_registry.register_node(KeyHandle, lambda keys: ((keys.result(),), None),
                                              lambda _, parts: parts[0])


def _key_array(keys: KeyHandle) -> jax.Array:
    """The key array a JAX primitive takes for `keys` (`jax.random.key_data`, `jax.random.split`): its value; or,
    released (donated, deleted), a key array over its released key data handle, as a deleted JAX key array is
    one over its deleted key data: it says its shape, dtype and sharding (Orbax's restore target
    `to_shape_dtype_struct` reads them through `key_data`), and reading its value raises as the handle's does."""
    if keys.is_deleted():
        return PRNGKeyArray(keys.dtype._impl, keys.data)
    return keys.result()


# (JAX takes a handle's value by its type's handler, before its bases': a reference's is its `result()`)
jax_dtypes.register_canonicalize_value_handler(KeyHandle, _key_array)


class WeakHandle(_OfHandle, ArrayReference):
    """A handle to a weakly typed result (see the module): an array reference whose `result()` is the weakly
    typed JAX array that `jax.jit` would have returned, and whose `weak_type` is True."""

    __slots__ = ("data",)
    weak_type = True

    def __init__(self, data):
        self.data = data            # the runtime's handle of the value

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def dtype(self):
        return self.data.dtype

    def result(self, timeout: float | None = None) -> jax.Array:
        """Returns the weakly typed JAX array, waiting until it is produced."""
        value = self.data.result(timeout)
        # The same buffers, typed weakly: JAX's array class takes an aval, as JAX's own dispatch makes one.
        return ARRAY_TYPE(value.aval.update(weak_type=True), value.sharding, value._arrays, committed=value._committed)

    def _host_value(self, timeout: float | None = None) -> np.ndarray:
        return self.data._host_value(timeout)

    def __repr__(self) -> str:
        return f"Weak{self.data!r}"


def _keys(data: np.ndarray, impl: str) -> jax.Array:
    """The key array of pickled key data (`KeyHandle.__reduce__`)."""
    return jax.random.wrap_key_data(data, impl=impl)


def to_wire(x: Any, aval: jax.ShapeDtypeStruct) -> Any:
    """Returns what the runtime receives for argument leaf `x`, traced as `aval`."""
    if isinstance(x, _OfHandle):
        return x.data
    if is_extended(aval.dtype):
        return jax.random.key_data(x)
    if isinstance(x, (bool, int, float, complex, np.generic)):
        return np.asarray(x, dtype=aval.dtype)
    return x


def from_wire(handle: Any, aval: jax.ShapeDtypeStruct) -> Any:
    """Returns what the user receives for a result handle of abstract value `aval`."""
    if is_extended(aval.dtype):
        return KeyHandle(handle, aval)
    return WeakHandle(handle) if aval.weak_type else handle


def value_type(ref: Reference) -> dict:
    """What a service's shared object's token carries to readers of `ref`, besides its data's shape and dtype, for
    them to read it as `ref` reads it (`shared_as`): `prng_impl`, the name of its typed PRNG keys' implementation
    (None for an array), and `weak_type`."""
    return {"prng_impl": ref.dtype._impl.name if is_extended(ref.dtype) else None, "weak_type": ref.weak_type}


def shared_as(ref: Reference, prng_impl: str | None, weak_type: bool) -> Any:
    """A service's shared object `ref` (a `RemoteSharedRef` of its data) read as its owner's reference reads it,
    which `value_type` described: typed PRNG keys of implementation `prng_impl` (a `KeyHandle`), a weakly typed
    value (a `WeakHandle`), or `ref` itself. Raises ValueError in one line for keys this process cannot read."""
    if prng_impl is None:
        return from_wire(ref, jax.ShapeDtypeStruct(ref.shape, ref.dtype, weak_type=weak_type))
    data = jax.ShapeDtypeStruct(ref.shape, ref.dtype)
    try:
        keys = jax.eval_shape(lambda d: jax.random.wrap_key_data(d, impl=prng_impl), data)
    except (TypeError, ValueError) as error:
        raise ValueError(f"a shared object of {data.dtype}{list(data.shape)} is typed PRNG keys of "
                         f"implementation {prng_impl!r:.60}, which this process cannot read: "
                         f"{str(error).splitlines()[0]:.200}") from None
    return from_wire(ref, keys)

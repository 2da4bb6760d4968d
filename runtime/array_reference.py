"""The array protocol of a reference to an array that lives elsewhere (on devices, or in a service).

A subclass gives `shape`, `dtype` and `result(timeout)`, the value as a JAX
array; `ArrayReference` makes it behave like an array for the user, on its
value (waiting for it). It is a `jax.Array` (a subclass of JAX's array base,
as JAX's own array types are), so `isinstance(ref, jax.Array)` holds where a
library checks for an array (Orbax's checkpointers, optax, flax), and every
method, operator and property that JAX's array declares is its value's:

- NumPy: `np.asarray(ref)` (the value itself, read-only), `np.array(ref)` (a copy of its own), `ref.item()`,
  `ref.tolist()`;
- Python: `bytes(ref)`, `float(ref)`, `int(ref)`, `bool(ref)`, `print(ref)` and `str(ref)` (the value, as
  the JAX array prints it; `repr` names the reference), `f"{ref:.3f}"`, `len(ref)`,
  `for row in ref`;
- operators and indexing, as a JAX array's: `ref + 1`, `-ref`, `ref @ w`,
  `ref < 0`, `ref == x`, `ref[index]`, ...; each gives a JAX array
  (`result()`'s operator), so `ref[...] += 1` makes a new array, as it
  does for a JAX array (flax NNX's variables count so);
- the JAX array's methods and properties that compute on the value:
  `ref.sum(axis=0)`, `ref.mean()`, `ref.argmax(-1)`, `ref.reshape(2, -1)`,
  `ref.T`, `ref.at[0].set(1.0)`, `ref.copy()`, ... (the list below); each gives
  a JAX array; `ref.nbytes` and `ref.itemsize` come from the shape and dtype;
- JAX takes it wherever it takes an array, on its value: `jnp.asarray(ref)`,
  `jnp.sum(ref)`, `jnp.where(ref > 0, ref, 0)`, a `jax.jit` function called
  on it, `jax.grad(f)(ref)`. JAX no longer abstracts `__jax_array__` objects,
  so the module registers the class with JAX's abstractification (an aval of
  the reference's shape and dtype) and argument canonicalisation (its
  `result()`), two registries of `jax._src` (jax 0.10). A program or placed
  function takes it too, and there the value stays on the cluster;
- NumPy defers to it as to a JAX array (`__array_priority__`): `np_array + ref`,
  `np.float64(2) * ref` and `np_mask < ref` are the JAX array's operators, so
  they give a JAX array of JAX's dtype (float32 beside a float64 NumPy array),
  not a NumPy array of NumPy's; `ref.aval` is JAX's abstract value, without
  waiting; `x in ref` and `ref.__array_namespace__()` are the JAX array's;
- where the value lies, as the JAX array `result()` gives it in this process
  (waiting for it): `ref.sharding`, `ref.device`, `ref.devices()`,
  `ref.addressable_shards`, `ref.addressable_data(i)`, `ref.global_shards`,
  `ref.is_fully_addressable`, `ref.is_fully_replicated`, `ref.committed`,
  `ref.format`, `ref.on_device_size_in_bytes()`, `ref.to_device(d)`, so Orbax's restore
  target `jax.tree.map(ocp.utils.to_shape_dtype_struct, state)` takes a state of
  references; on the embedded backend these are the devices the value lives on;
  from an island in another process (a Ray actor's, a service's), the array
  fetched here, whose `sharding`, `device`, `devices()`, `committed` and
  `is_fully_*` are those of an array made here from host data, read without
  fetching it; `np.from_dlpack(ref)` takes the value too. Released (deleted,
  donated, its client closed), a reference still says what a deleted JAX
  array says: `sharding`, `is_fully_*`, `committed` (of a value in this
  process, from where its plan placed it) and `format` (with no layout), so
  the restore target of a state a step took still builds; of a value in this
  process, the rest raises, as reading it does;
- `ref.is_ready()` and `ref.is_deleted()`, as a JAX array's, without waiting
  (each subclass says how it knows); `ref.copy_to_host_async()` announces that
  the value will be read (a `Handle` of a Ray actor's result and a `RemoteHandle`
  have it brought back with the next value read there; the others do nothing),
  so `jax.device_get` takes it and reads a pytree in one request per island.

A reference stays hashable by identity
(a key in dicts and sets), though `==` compares values, as NumPy's does.
`copy.copy` and `copy.deepcopy` give the reference itself (one owner per
result; donating it donates the one result), and `pickle` writes its value,
which loads as a NumPy array.
`Handle`, `SharedRef` and `RemoteHandle` are such references; the first two
name a result by its run and buffer (`RunResult`). A reference to typed PRNG
keys (`frontend/wire.KeyHandle`) shares their base, `Reference`: JAX, indexing,
iteration, printing, copies and the refusal to change in place, but no NumPy protocol or
operators (a key array has neither); it is a `jax.Array` too.
"""

from __future__ import annotations

import math
import numbers
import operator
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core as jax_core, dtypes as jax_dtypes   # JAX's registries of array types (see the module)
from jax.experimental.layout import Format

from .executables import ARRAY_TYPE, host_data_array, named_sharding, numpy_dtype
from .orbax_checkpoints import register_with_orbax
from .run import Stored


def wait_limit(timeout) -> float | None:
    """Returns the seconds a wait for a result may take, as a result's `timeout` gives them: None (as long as
    it takes) for None or a number past what a lock can wait (`threading.TIMEOUT_MAX`, infinity), else the
    number (0 or less: only what is there already). Raises ValueError in one line for anything else: a NaN
    deadline is never reached, so such a wait would never end, and a bool is refused as a run's timeout is
    (`dispatch.check_timeout`)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or timeout != timeout:
        raise ValueError(f"a result's timeout must be a number of seconds or None, not {timeout!r:.40}")
    return None if timeout >= threading.TIMEOUT_MAX else timeout


class Reference:
    """Base of every reference to a value that lives elsewhere, of an array (`ArrayReference`) or of typed
    PRNG keys (`frontend/wire.KeyHandle`): a subclass gives `shape`, `dtype` and `result(timeout)`. JAX takes
    it wherever it takes its value, indexing and iteration are the value's, it cannot be changed in place,
    and a copy is the reference itself (see the module's docstring)."""

    __slots__ = ()
    __hash__ = object.__hash__   # by identity (JAX's array base has none: its `==` compares values)
    _from_elsewhere = False      # whether `result()` is made here of a value fetched from another process
    _kind = "array"          # what it refers to, in messages
    weak_type = False        # whether its value is weakly typed, as a Python scalar's (`frontend/wire.WeakHandle`)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def aval(self) -> jax_core.ShapedArray:
        """JAX's abstract value of the value (shape, dtype, weak type), without waiting for it."""
        return jax_core.ShapedArray(self.shape, self.dtype, weak_type=self.weak_type)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """The value's bytes (all shards together), without waiting for it: Orbax reads it of every leaf."""
        return self.size * self.itemsize

    def __getitem__(self, index):
        return self.result()[index]

    def __setitem__(self, index, value):
        raise TypeError(f"{type(self).__name__} refers to an immutable {self._kind}, as a JAX array is: to change "
                        f"its value in place (as flax NNX does to a variable or an RNG stream outside a placed "
                        f"function), take the value first (`.result()`)")

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError(f"len() of a 0-d {self._kind} reference")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError(f"iteration over a 0-d {self._kind} reference")
        return iter(self.result())

    def __str__(self) -> str:
        """The value as the JAX array prints it (`print(loss)`, a key array's `Array((2,), dtype=key<fry>)
        overlaying: ...`), waiting for it; `repr` names the reference."""
        return str(self.result())

    def __format__(self, spec: str) -> str:
        return format(self.result(), spec)

    def copy_to_host_async(self) -> None:
        """Does nothing here: JAX's hint to start copying the value to the host (`jax.device_get` gives it before
        it reads each value); a reference's value is copied when it is read, waiting for it if need be (a
        subclass whose value lives in another process has it brought back with the next value read there)."""

    def owned(self) -> "Reference":
        """The runtime's handle of the value, which a client cancels or shares: this reference, or the handle
        that a front end's wrapper holds (a typed key's or a weakly typed value's, `frontend/wire.py`)."""
        return self

    def wrapping(self, other: "Reference") -> "Reference":
        """`other`, another runtime reference to this value (its shared reference, `Client.share`), read as this
        reference reads it: `other` itself here; a front end's wrapper wraps it as it wraps the handle it holds,
        so that a shared typed key or weakly typed value reads as the owner's does."""
        return other

    def __copy__(self) -> "Reference":
        """The reference itself: its value is immutable, and a copy would be a second owner of one result (each
        would release it). `copy.deepcopy` of a pytree of references shares them the same way; for a value
        of its own, take `jnp.array(ref, copy=True)` (`result()` may be the result's own array, which donating
        the reference deletes)."""
        return self

    def __deepcopy__(self, memo) -> "Reference":
        return self


class ArrayReference(Reference, jax.Array):
    """Base of the references that behave like arrays; see the module's docstring."""

    __slots__ = ()
    __array_priority__ = 100     # NumPy's binary operators defer to ours, as to a JAX array's (which sets 100)

    def _host_value(self, timeout: float | None = None) -> np.ndarray:
        """The value as a NumPy array, waiting at most `timeout` seconds as `result` does (a subclass may bring
        it here without making a JAX array first)."""
        return np.asarray(self.result(timeout))

    def __array__(self, dtype=None, copy=None):
        """The value as NumPy takes it, as a JAX array's `__array__` gives it: `copy=True` (`np.array(ref)`) a
        new array the caller may write; `copy=False` the value itself, or ValueError if `dtype` needs a copy;
        `copy=None` (`np.asarray(ref)`) the value itself where its dtype is `dtype` (read-only, as a JAX
        array's value is), else a converted copy."""
        return np.asarray(self._host_value(), dtype=dtype, copy=copy)

    def __bytes__(self) -> bytes:
        """`bytes(ref)`: the value's raw bytes, as `bytes` of a JAX array gives them through its buffer protocol
        (waiting for it); of an integer scalar, as of a JAX or NumPy one, that many zero bytes (`__index__`)."""
        return bytes(self._host_value())

    def __jax_array__(self):
        return self.result()

    @property
    def format(self) -> Format:
        """The value's layout and sharding, as the JAX array `result()` gives them (waiting for it); of a
        released reference, no layout and its `sharding`, as a deleted JAX array's."""
        return Format(None, self.sharding) if self.is_deleted() else self.result().format

    def item(self, *index):
        """The value's element (`np.ndarray.item`), as a Python scalar."""
        return self._host_value().item(*index)

    def tolist(self):
        """The value as nested Python lists (`np.ndarray.tolist`)."""
        return self._host_value().tolist()

    def astype(self, dtype):
        """The value converted to `dtype`, as a JAX array."""
        return self.result().astype(dtype)

    def __float__(self) -> float:
        return float(self.result())

    def __int__(self) -> int:
        return int(self.result())

    def __complex__(self) -> complex:
        return complex(self.result())

    def __index__(self) -> int:
        return operator.index(self.result())

    def __bool__(self) -> bool:
        return bool(self.result())

    def __reduce__(self):
        """Pickles the value (waiting for it), which unpickles as a NumPy array: the reference names a result
        in this process's cluster, which another process cannot reach."""
        return np.asarray, (self._host_value(),)


def _on_value(name: str):
    """Returns the operator or method `name` of a reference: the JAX array's of its value."""
    def apply(self, *others, **options):
        return getattr(self.result(), name)(*others, **options)
    apply.__name__ = name
    return apply


def _property_of_value(name: str) -> property:
    """Returns the property `name` of a reference: the JAX array's of its value."""
    return property(lambda self: getattr(self.result(), name), doc=f"The value's `{name}`, as a JAX array.")


class ReleasedPlacement:
    """Where a released reference's value lay, as a deleted JAX array still says it without its value
    (`ANSWERED`): the sharding it had, and what that sharding says. The value was committed there: a result
    lies where its plan placed it, as `jax.jit`'s results lie on their shardings."""

    __slots__ = ("sharding",)
    ANSWERED = frozenset({"sharding", "is_fully_addressable", "is_fully_replicated", "committed"})
    committed = True

    def __init__(self, sharding):
        self.sharding = sharding

    is_fully_addressable = property(lambda self: self.sharding.is_fully_addressable)
    is_fully_replicated = property(lambda self: self.sharding.is_fully_replicated)


def _released_placement(ref: "Reference"):
    """Where the value of `ref`, a reference to a result in this process, lay once released
    (`RunResult.released_placement`); None if it is not released."""
    return ref.owned().released_placement(ref.ndim) if ref.is_deleted() else None


def _placement(name: str, method: bool = False):
    """Returns the property (or method) `name` of a reference that says where its value lies, as the JAX array
    `result()` gives it in this process: of a value from another process, it is that of an array made here
    from host data, fetching nothing (reading `sharding` fetched the whole value each time). Released (deleted,
    donated), a reference to a value in this process answers what a deleted JAX array does (`ReleasedPlacement`),
    from where its plan placed the value; the rest raises as reading the value does."""
    answered_released = name in ReleasedPlacement.ANSWERED

    def get(self):
        if self._from_elsewhere:
            value = host_data_array()
        else:
            released = _released_placement(self) if answered_released else None
            value = self.result() if released is None else released
        return getattr(value, name)
    if method:
        def call(self, *args, **options):
            return get(self)(*args, **options)
        call.__name__ = name
        return call
    return property(get, doc=f"The value's `{name}`, as a JAX array here.")


# Where the value lies, as the JAX array `result()` gives it in this process: a key array has these too.
for _name in ("sharding", "device", "is_fully_addressable", "is_fully_replicated", "committed"):
    setattr(Reference, _name, _placement(_name))
Reference.devices = _placement("devices", method=True)
for _name in ("addressable_shards", "global_shards", "format"):
    setattr(Reference, _name, _property_of_value(_name))
for _name in ("addressable_data", "on_device_size_in_bytes", "to_device"):
    setattr(Reference, _name, _on_value(_name))
# Every other method, operator and property of JAX's array is a reference's value's: JAX's array base only declares
# them, for its own array types; so are a few of its array type beyond its base, for an array reference.
_OWN = {"__doc__", "__module__", "__slots__", "__weakref__", "__hash__", "__numpy_dtype__", "shape", "dtype"}
for _name, _member in list(vars(jax.Array).items()):
    if _name not in _OWN and _name not in vars(Reference):
        setattr(Reference, _name, _property_of_value(_name) if isinstance(_member, property) else _on_value(_name))
for _name in ("clone", "tobytes", "__dlpack__", "__dlpack_device__"):
    setattr(ArrayReference, _name, _on_value(_name))
del _name, _member


class RunResult(ArrayReference):
    """A reference to buffer `_buffer` of run `_run` on the runtime's islands `_islands` (set by the subclass):
    its shape, dtype and sharding are the plan's. The subclass gives `_value(timeout)`, the array its island
    fetch returns: a JAX array from an island in this process, NumPy from one in another (a Ray actor's);
    `result()` is always a JAX array, as on every backend, and `np.asarray(ref)` takes NumPy's as it is."""

    __slots__ = ()
    _from_elsewhere = property(lambda self: not self._islands.in_process)

    def result(self, timeout: float | None = None):
        """Returns the JAX array, waiting until it is produced (at most `timeout` seconds, None: as long as it
        takes; TimeoutError past it); raises if the run failed."""
        value = self._value(timeout)
        return value if type(value) is ARRAY_TYPE else jnp.asarray(value)

    def _host_value(self, timeout: float | None = None) -> np.ndarray:
        return np.asarray(self._value(timeout))

    def released_placement(self, rank: int):
        """What answers, without the value, where the result lay (the names of `ReleasedPlacement.ANSWERED`):
        a `ReleasedPlacement` of the `NamedSharding` its plan places it with, over its first `rank` dimensions
        (a key array's data has one more than the keys), as its island makes it (`IslandLayout.build`); of a
        host buffer, which no plan places, its settled value (a deleted JAX array still says it) or, for host
        data, an array made here from host data (where `result()` puts it, uncommitted). None if it has no
        value yet, or its island was lost."""
        plan, info = self._run.plan, self._run.plan.buffers[self._buffer]
        if info.slice is None:          # a host buffer (a cond's result, an argument returned as it is)
            future = self._run.host.get(self._buffer)
            if future is None or not future.done() or future.exception() is not None:
                return None
            value = future.result()
            if type(value) is Stored:   # (a cond's result its island's store kept)
                return ReleasedPlacement(value.sharding)
            return value if type(value) is ARRAY_TYPE else host_data_array()
        island = self._islands.get(plan.island_of(self._buffer))
        if island is None:              # (its island was lost since)
            return None
        return ReleasedPlacement(named_sharding(island.mesh(plan, info.slice), info.sharding[:rank]))

    @property
    def shape(self) -> tuple[int, ...]:
        return self._run.plan.buffers[self._buffer].shape

    @property
    def dtype(self):
        return numpy_dtype(self._run.plan.buffers[self._buffer].dtype)


# JAX (0.10) looks up a type, then its bases, in these registries: every reference is abstracted by its shape
# and dtype, without waiting for its value, and becomes its value where JAX places arguments.
jax_core.pytype_aval_mappings[Reference] = lambda ref: ref.aval
jax_dtypes.register_canonicalize_value_handler(Reference, lambda ref: ref.result())
# Orbax's checkpointers save a reference (a key handle's too) as its value, read once, once Orbax is imported
# (`orbax_checkpoints`).
register_with_orbax(Reference)

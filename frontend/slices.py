"""Virtual slices: the device meshes that placed functions run on.

A virtual slice is a request to the resource manager for a mesh of devices
(its shape, one name per mesh axis, and constraints such as the device kind).
The front end needs no real devices: a slice is only its mesh shape, so the
same program can be exported for 8 devices or 2048.
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pathways_mlir.dialect import ops

from .provenance import Site

if TYPE_CHECKING:
    import jax


@dataclass(frozen=True, eq=False)
class Slice:
    """A virtual device mesh; each `virtual_slice` call requests a distinct one."""

    shape: tuple[int, ...]
    axes: tuple[str, ...]
    constraints: Mapping[str, Any] = field(default_factory=dict)
    name: str | None = None
    site: Site | None = None      # where it was requested: errors about the slice point there
    explicit_axes: tuple[str, ...] = ()   # the axes of JAX's type `Explicit` (sharding in types); the rest `Auto`

    @property
    def size(self) -> int:
        """Returns the number of devices in the slice."""
        return math.prod(self.shape)

    @property
    def axis_sizes(self) -> dict[str, int]:
        """Returns {axis name: size}."""
        return dict(zip(self.axes, self.shape))

    @property
    def elastic(self) -> bool:
        """True if placement may give the slice a smaller shape (it has a range of sizes)."""
        return "min_shape" in self.constraints

    @property
    def mesh(self) -> "jax.sharding.AbstractMesh | None":
        """The mesh a placed function on the slice is traced under (its axes, by name, size and type), so that
        its code may name them (`jax.shard_map`, collectives, `with_sharding_constraint(x, P(...))`, and on
        `Explicit` axes `jax.sharding.reshard` and `out_sharding=`); None for an elastic slice, whose size is
        known only when it is placed."""
        import jax

        if self.elastic:
            return None
        types = tuple(jax.sharding.AxisType.Explicit if a in self.explicit_axes else jax.sharding.AxisType.Auto
                      for a in self.axes)
        return jax.sharding.AbstractMesh(self.shape, self.axes, axis_types=types)

    def declared(self, symbol: str) -> ops.VirtualSlice:
        """Returns the slice as the IR declares it, under symbol `symbol`."""
        return ops.VirtualSlice(symbol, self.shape, self.axes, self.constraints)

    def __repr__(self) -> str:
        low = self.constraints.get("min_shape", self.shape)
        mesh = ", ".join(f"{a}={n}" if lo == n else f"{a}={lo}..{n}" for a, lo, n in zip(self.axes, low, self.shape))
        return f"Slice({self.name or 'unnamed'}: {mesh})"


_RANGE = re.compile(r"\s*(\d+)\s*\.\.\s*(\d+)\s*")


def virtual_slice(shape: int | str | Sequence[int | str], axes: Sequence[str], *, name: str | None = None,
                  axis_types: Any = None, **constraints: Any) -> Slice:
    """Requests a virtual slice: a 1-D, 2-D or 3-D mesh with one name per axis.

    `name` is its symbol in the IR (by default `slice0`, `slice1`, ... in the
    order a program first uses them). Constraints: `device_kind` (str),
    `island` (str), `min_memory_bytes` (int), `same_island` (bool),
    `min_shape` (a tuple: the slice is elastic, see below); a constraint given
    as None is no constraint.

        pw.virtual_slice((2, 4), axes=("data", "model"), device_kind="cpu")

    An elastic slice gives a range of sizes for an axis as `"lo..hi"`, or
    its smallest shape as `min_shape`; placement (pw-place) picks the largest
    shape in the range that fits the devices available when the program is
    lowered, and it lowers again when the cluster changes. Programs are
    traced at the largest shape (a value sharded over an axis must divide by
    its largest size); placement skips the sizes a sharded value does not
    divide by.

        pw.virtual_slice(("4..8", 2), axes=("data", "model"))   # = (8, 2) with min_shape=(4, 2)

    `axis_types` are the axes' `jax.sharding.AxisType`s, as `jax.make_mesh`
    takes them (one for every axis, or one per axis; default `Auto`). On an
    `Explicit` axis a placed function is written for JAX's explicit sharding
    mode: its arguments' types carry their `in_specs` over the explicit axes
    (`jax.typeof(x)` is `float32[8@data,2]`), its code may use
    `jax.sharding.reshard` and `out_sharding=`, and a result lands as its type
    says unless `out_specs` says otherwise. An elastic slice's axes are `Auto`.

        pw.virtual_slice(4, axes="data", axis_types=jax.sharding.AxisType.Explicit)
    """
    where = f"slice '{name}'" if name else "a slice"
    shape = (shape,) if isinstance(shape, (int, str)) else tuple(shape)
    low = tuple(_low(d, where) for d in shape)
    shape = tuple(_high(d) for d in shape)
    if not isinstance(axes, str) and not (isinstance(axes, Sequence) and all(isinstance(a, str) for a in axes)):
        raise TypeError(f"a slice's axes are a name or a sequence of names, not {type(axes).__name__} {axes!r:.40}")
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    if not 1 <= len(shape) <= 3 or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ValueError(f"a slice shape is 1 to 3 positive integers or 'lo..hi' ranges, not {shape}")
    if len(axes) != len(shape) or not all(isinstance(a, str) and a for a in axes) \
            or len(set(axes)) != len(axes):
        raise ValueError(f"a slice of shape {shape} needs {len(shape)} distinct axis names, not {axes}")
    for key, value in constraints.items():
        kind = ops.CONSTRAINT_KINDS.get(key)
        if kind is None or key == "max_shape":
            known = ", ".join(k for k in ops.CONSTRAINT_KINDS if k != "max_shape")
            raise TypeError(f"unknown slice constraint '{key}' (known: {known})")
        if value is None:
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TypeError(f"slice constraint '{key}' must be a {kind.__name__}, not {value!r}")
    constraints = {key: value for key, value in constraints.items() if value is not None}
    if low != shape:
        if "min_shape" in constraints:
            raise ValueError(f"{where}: give its range once, as 'lo..hi' sizes or as min_shape, not both")
        constraints["min_shape"] = low
    problem = ops.VirtualSlice(where, shape, axes, constraints).range_problem()
    if problem is not None:
        raise ValueError(f"{where}: {problem}")
    if constraints.get("min_shape") == shape:
        del constraints["min_shape"]
    explicit = _explicit_axes(axis_types, axes, where)
    if explicit and "min_shape" in constraints:
        raise ValueError(f"{where}: an elastic slice's axes are Auto (its shape is chosen when it is placed, so "
                         f"there is no mesh for types to name), not Explicit {list(explicit)}")
    return Slice(shape, axes, dict(constraints), name,
                 Site.of_call("virtual_slice", inspect.currentframe().f_back), explicit)


def _explicit_axes(axis_types: Any, axes: tuple[str, ...], where: str) -> tuple[str, ...]:
    """The names of the axes `axis_types` makes `Explicit` (one `jax.sharding.AxisType` for all axes, or one per
    axis; None: all `Auto`); ValueError for anything else, or a `Manual` axis (only `shard_map` makes one)."""
    if axis_types is None:
        return ()
    from jax.sharding import AxisType

    types = (axis_types,) * len(axes) if isinstance(axis_types, AxisType) else axis_types
    if not isinstance(types, (tuple, list)) or len(types) != len(axes) or \
            not all(isinstance(t, AxisType) and t is not AxisType.Manual for t in types):
        raise ValueError(f"{where}: axis_types is one jax.sharding.AxisType (Auto or Explicit) for all its axes, "
                         f"or one per axis ({len(axes)}), not {axis_types!r:.80}")
    return tuple(a for a, t in zip(axes, types) if t is AxisType.Explicit)


def _low(dim: int | str, where: str) -> int | str:
    """The smallest size of one mesh dimension: `dim` itself, or `lo` of a `"lo..hi"` range."""
    if not isinstance(dim, str):
        return dim
    match = _RANGE.fullmatch(dim)
    if match is None or not 0 < int(match[1]) <= int(match[2]):
        raise ValueError(f"{where}: a range of sizes is 'lo..hi' with 0 < lo <= hi, not {dim!r}")
    return int(match[1])


def _high(dim: int | str) -> int | str:
    """The largest size of one mesh dimension (a `"lo..hi"` range is checked by `_low` first)."""
    return int(_RANGE.fullmatch(dim)[2]) if isinstance(dim, str) else dim

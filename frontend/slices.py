"""Virtual slices: the device meshes that placed functions run on.

A virtual slice is a request to the resource manager for a mesh of devices
(its shape, one name per mesh axis, and constraints such as the device kind).
The front end needs no real devices: a slice is only its mesh shape, so the
same program can be exported for 8 devices or 2048.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pathways_mlir.dialect import ops

from .provenance import Site


@dataclass(frozen=True, eq=False)
class Slice:
    """A virtual device mesh; each `virtual_slice` call requests a distinct one."""

    shape: tuple[int, ...]
    axes: tuple[str, ...]
    constraints: Mapping[str, Any] = field(default_factory=dict)
    name: str | None = None
    site: Site | None = None      # where it was requested: errors about the slice point there

    @property
    def size(self) -> int:
        """Returns the number of devices in the slice."""
        return math.prod(self.shape)

    @property
    def axis_sizes(self) -> dict[str, int]:
        """Returns {axis name: size}."""
        return dict(zip(self.axes, self.shape))

    def __repr__(self) -> str:
        mesh = ", ".join(f"{a}={n}" for a, n in zip(self.axes, self.shape))
        return f"Slice({self.name or 'unnamed'}: {mesh})"


def virtual_slice(shape: int | Sequence[int], axes: Sequence[str], *, name: str | None = None,
                  **constraints: Any) -> Slice:
    """Requests a virtual slice: a 1-D, 2-D or 3-D mesh with one name per axis.

    `name` is its symbol in the IR (by default `slice0`, `slice1`, ... in the
    order a program first uses them). Constraints: `device_kind` (str),
    `island` (str), `min_memory_bytes` (int), `same_island` (bool).

        pw.virtual_slice((2, 4), axes=("data", "model"), device_kind="cpu")
    """
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    if not 1 <= len(shape) <= 3 or not all(isinstance(d, int) and d > 0 for d in shape):
        raise ValueError(f"a slice shape is 1 to 3 positive integers, not {shape}")
    if len(axes) != len(shape) or not all(isinstance(a, str) and a for a in axes) \
            or len(set(axes)) != len(axes):
        raise ValueError(f"a slice of shape {shape} needs {len(shape)} distinct axis names, not {axes}")
    for key, value in constraints.items():
        kind = ops.CONSTRAINT_KINDS.get(key)
        if kind is None:
            raise TypeError(f"unknown slice constraint '{key}' (known: {', '.join(ops.CONSTRAINT_KINDS)})")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TypeError(f"slice constraint '{key}' must be a {kind.__name__}, not {value!r}")
    return Slice(shape, axes, dict(constraints), name,
                 Site.of_call("virtual_slice", inspect.currentframe().f_back))

"""Shardings of a tensor over the named axes of a virtual slice.

A sharding has one entry per tensor dimension, each the tuple of slice axes
that dimension is split over, major axis first; an empty tuple means the
dimension is replicated. In IR it is an `ArrayAttr` of `ArrayAttr`s of
strings: `[["data"], []]` splits a matrix by rows over the "data" axis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence


def zero_size(shape: Sequence[int]) -> bool:
    """Whether a tensor of `shape` has no elements. Such a tensor is always replicated: it has no data to
    split, and JAX 0.10.2 lays out a `jax.jit` result of zero size sharded over several devices wrongly (each
    shard keeps the whole shape, and the array's value cannot be read)."""
    return 0 in shape


@dataclass(frozen=True)
class Sharding:
    """How each dimension of a tensor is split over slice axes."""

    dims: tuple[tuple[str, ...], ...]

    @staticmethod
    def replicated(rank: int) -> "Sharding":
        """Returns the sharding that keeps every dimension whole."""
        return Sharding(tuple(() for _ in range(rank)))

    @staticmethod
    def from_python(value: Sequence[Sequence[str]]) -> "Sharding":
        """Builds a sharding from its attribute value, e.g. `[["data"], []]`."""
        return Sharding(tuple(tuple(axes) for axes in value))

    @staticmethod
    def checked(value) -> "Sharding | None":
        """Builds a sharding from an attribute value, or returns None unless it is a list of lists of axis names."""
        if not isinstance(value, list) or not all(
                isinstance(axes, list) and all(isinstance(a, str) for a in axes) for axes in value):
            return None
        return Sharding.from_python(value)

    def to_python(self) -> list[list[str]]:
        """Returns the attribute value of this sharding."""
        return [list(axes) for axes in self.dims]

    @property
    def rank(self) -> int:
        return len(self.dims)

    def used_axes(self) -> tuple[str, ...]:
        """Returns every axis this sharding splits over, in dimension order."""
        return tuple(axis for axes in self.dims for axis in axes)

    def repeated_axes(self) -> list[str]:
        """Returns the axes this sharding splits over more than once (`[["x"], ["x"]]`), which no layout can."""
        used = self.used_axes()
        return sorted({a for a in used if used.count(a) > 1})

    def dim_ways(self, axis_sizes: Mapping[str, int]) -> tuple[int, ...]:
        """Returns into how many pieces each dimension is split."""
        return tuple(math.prod(axis_sizes[a] for a in axes) for axes in self.dims)

    def ways(self, axis_sizes: Mapping[str, int]) -> int:
        """Returns the number of distinct shards (devices not holding a copy)."""
        return math.prod(self.dim_ways(axis_sizes))

    def shard_shape(self, shape: Sequence[int], axis_sizes: Mapping[str, int]) -> tuple[int, ...]:
        """Returns the shape of one shard of a tensor of `shape` (dims must divide)."""
        return tuple(d // w for d, w in zip(shape, self.dim_ways(axis_sizes)))

    def problems(self, shape: Sequence[int], axis_sizes: Mapping[str, int]) -> list[str]:
        """Returns why this sharding cannot split a tensor of `shape` (empty if it can): a tensor of no
        elements is replicated (`zero_size`)."""
        if self.rank != len(shape):
            return [f"sharding {self} has rank {self.rank} but the tensor has rank {len(shape)}"]
        problems = []
        used = self.used_axes()
        for axis in used:
            if axis not in axis_sizes:
                problems.append(f"sharding {self} names axis '{axis}' which the slice does not have "
                                f"(axes: {', '.join(axis_sizes) or 'none'})")
        for axis in self.repeated_axes():
            problems.append(f"sharding {self} uses axis '{axis}' more than once")
        if problems:
            return problems
        for dim, (size, ways) in enumerate(zip(shape, self.dim_ways(axis_sizes))):
            if size % ways:
                problems.append(f"dimension {dim} of size {size} is split {ways} ways by {self}, "
                                f"which does not divide it")
        if zero_size(shape) and used:
            problems.append(f"shape {list(shape)} has no elements but is split by {self}: a zero-size value is "
                            f"replicated")
        return problems

    def __str__(self) -> str:
        return "[" + ", ".join("[" + ", ".join(f'"{a}"' for a in axes) + "]" for axes in self.dims) + "]"

"""The array protocol of a reference to an array that lives elsewhere (on devices, or in a service).

A subclass gives `shape`, `dtype` and `result(timeout)`, the value as a JAX
array; `ArrayReference` makes it behave like an array for the user:
`np.asarray(ref)`, `ref.ndim`, `ref[index]`, and JAX functions accept it.
`Handle`, `SharedRef` and `RemoteHandle` are such references; the first two
name a result by its run and buffer (`RunResult`).
"""

from __future__ import annotations

import numpy as np

from .executables import numpy_dtype


class ArrayReference:
    """Base of the references that behave like arrays; see the module's docstring."""

    __slots__ = ()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def _host_value(self) -> np.ndarray:
        """The value as a NumPy array (a subclass may bring it here without making a JAX array first)."""
        return np.asarray(self.result())

    def __array__(self, dtype=None, copy=None):
        value = self._host_value()
        return value.astype(dtype) if dtype is not None else value

    def __jax_array__(self):
        return self.result()

    def __getitem__(self, index):
        return np.asarray(self)[index]


class RunResult(ArrayReference):
    """A reference to buffer `_buffer` of run `_run` (set by the subclass): its shape and dtype are the
    plan's."""

    __slots__ = ()

    @property
    def shape(self) -> tuple[int, ...]:
        return self._run.plan.buffers[self._buffer].shape

    @property
    def dtype(self):
        return numpy_dtype(self._run.plan.buffers[self._buffer].dtype)

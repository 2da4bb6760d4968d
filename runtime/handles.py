"""Handles: what a client holds for a buffer that lives on devices.

A handle names one logical (possibly sharded) buffer in the object store,
however many shards it has. It behaves like an array for the user:
`np.asarray(h)`, `h.block_until_ready()`, `h.shape`, `h.dtype`, and JAX
functions accept it. Dropping the last reference to a handle, or calling
`delete()`, releases the buffer.
"""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np

from pathways_mlir.dialect.plan import BufferInfo

from .executables import numpy_dtype


class Handle:
    """An owned reference to a device buffer."""

    def __init__(self, island, run_id: int, buffer: int, info: BufferInfo, future: Future):
        self._island = island          # None for a host value: nothing to release
        self._run_id = run_id
        self._buffer = buffer
        self._info = info
        self._future = future

    @property
    def shape(self) -> tuple[int, ...]:
        return self._info.shape

    @property
    def dtype(self):
        return numpy_dtype(self._info.dtype)

    @property
    def ndim(self) -> int:
        return len(self._info.shape)

    def result(self):
        """Returns the JAX array (waiting for its producer to be enqueued)."""
        if self._future is None:
            raise ValueError(f"handle to buffer {self._buffer} of run {self._run_id} was deleted")
        return self._future.result()

    def block_until_ready(self) -> "Handle":
        """Waits until the buffer's value has been computed."""
        value = self.result()
        if hasattr(value, "block_until_ready"):
            value.block_until_ready()
        return self

    def __array__(self, dtype=None, copy=None):
        array = np.asarray(self.result())
        return array.astype(dtype) if dtype is not None else array

    def __jax_array__(self):
        return self.result()

    def __getitem__(self, index):
        return np.asarray(self)[index]

    def delete(self) -> None:
        """Releases the buffer now."""
        if self._island is not None and self._future is not None:
            self._island.release(self._run_id, self._buffer)
        self._future = None

    def __del__(self):
        try:
            self.delete()
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass

    def __repr__(self) -> str:
        return f"Handle(shape={self.shape}, dtype={self._info.dtype}, slice={self._info.slice})"

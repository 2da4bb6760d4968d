"""Handles: what a client holds for a buffer that lives on devices.

A handle names one logical (possibly sharded) result in the object store,
however many shards it has. It behaves like an array for the user:
`np.asarray(h)`, `h.block_until_ready()`, `h.shape`, `h.dtype`, and JAX
functions accept it. Dropping the last reference to a handle, or calling
`delete()`, releases the result, even if it has not been produced yet (it
is then dropped when it is); one the cyclic garbage collector finalizes is
released at the next call of a client or of the runtime. A released handle, or one of a closed client,
raises instead of returning data.

`h.result()` is the object store's own array, not a copy: a `jax.jit` it is donated to, or its `delete()`,
deletes it behind the handle. The handle then says `is_deleted()`, and reading it or passing it to a run
raises one line at the call; the store keeps the deleted array, and the scheduler's ledger its bytes, until
the handle is released, which drops both once, as for any other result.
"""

from __future__ import annotations

import _thread
import gc
import queue
from typing import TYPE_CHECKING

from .admission import OutOfDeviceMemory
from .array_reference import RunResult, wait_limit
from .executables import ARRAY_TYPE
from .island_work import RunFailed, StoreRef
from .run import Run, Stored

if TYPE_CHECKING:
    from .client import Client


# The cyclic garbage collector runs finalizers wherever an allocation starts it, maybe on a thread that holds
# an island's or the scheduler's lock: a handle it finalizes must not take those locks then (a deadlock),
# so its release waits in `_DROPPED` for the next client or runtime call (`release_dropped`).
_COLLECTING = [False]
_DROPPED: queue.SimpleQueue = queue.SimpleQueue()      # (client, run, buffer); safe to put from a finalizer


def _note_collection(phase: str, info: dict) -> None:
    _COLLECTING[0] = phase == "start"


gc.callbacks.append(_note_collection)


nothing_dropped = _DROPPED.empty
"""nothing_dropped() says whether no handle's release waits: a look without a Python call, for the fast paths
(most calls find none)."""


def release_dropped() -> None:
    """Releases the results of the handles the garbage collector finalized since the last call."""
    while not _DROPPED.empty():      # (a look first: most calls find none, and an exception costs more)
        try:
            client, run, buffer = _DROPPED.get_nowait()
        except queue.Empty:
            return
        try:
            client.release(run, buffer)
        except KeyboardInterrupt:
            _DROPPED.put((client, run, buffer))      # Ctrl-C stopped it halfway: released again at the next call
            raise


class Handle(RunResult):
    """An owned reference to a result on devices."""

    __slots__ = ("_client", "_run", "_buffer", "_deleted", "_donated_to", "__weakref__")
    _islands = property(lambda self: self._client.runtime.islands)

    def __init__(self, client: "Client", run: Run, buffer: int):
        self._client = client
        self._run = run
        self._buffer = buffer
        self._deleted = False
        self._donated_to = None

    @property
    def slice(self) -> str | None:
        """The virtual slice the result lives on (None for a host value)."""
        return self._run.plan.buffers[self._buffer].slice

    @property
    def island(self) -> str | None:
        """The island the result lives on (None for a host value)."""
        return self._run.island_of(self._buffer)

    def reference(self) -> StoreRef:
        """Returns the result as an argument its island takes from its own store (no value is fetched)."""
        self._check()
        return StoreRef(self._run.id, self._buffer)

    def _value(self, timeout: float | None):
        timeout = wait_limit(timeout)
        self._check_released()
        value = self._client.fetch(self._run, self._buffer, timeout, self)   # (checked again before a wait)
        # The array itself says whether it was deleted outside pathways-mlir: cheaper than `_check`'s look in the
        # store, on every read.
        if type(value) is ARRAY_TYPE and value.is_deleted():
            raise ValueError(self._deleted_outside())
        return value

    def copy_to_host_async(self) -> None:
        """Announces that the value will be read soon (`jax.device_get` gives this to every leaf of a pytree
        before it reads them): an island in another process (a Ray actor's) brings it back with the next value
        read from it, so a pytree's values cost one request per island, not one each. Nothing for a released
        handle (reading it raises) or a run with a deadline (its values are read only once it is over)."""
        if self._deleted or self._client.closed or self._run.deadline is not None or self._run.error is not None:
            return
        island = self._run.island_of(self._buffer)
        if island is not None:
            self._islands[island].want(self._run.id, self._buffer, self.nbytes)

    def _check(self) -> None:
        """Raises ValueError in one line if the result was released (deleted, donated, or its client closed), or
        its array was deleted outside pathways-mlir (`_array_deleted`)."""
        self._check_released()
        if self._array_deleted():
            raise ValueError(self._deleted_outside())

    def _check_released(self) -> None:
        """Raises ValueError in one line if the result was released: deleted, donated, or its client closed."""
        if self._donated_to is not None:
            raise ValueError(f"handle to buffer {self._buffer} of run {self._run.id} was donated to "
                             f"{self._donated_to}: a donated handle cannot be used again")
        if self._deleted:
            raise ValueError(f"handle to buffer {self._buffer} of run {self._run.id} was released")
        if self._client.closed:
            raise ValueError(f"handle to buffer {self._buffer} of run {self._run.id} belongs to closed "
                             f"client {self._client.id}: its result was released")

    def _deleted_outside(self) -> str:
        """The error's line for a result whose array was deleted outside pathways-mlir."""
        return (f"handle to buffer {self._buffer} of run {self._run.id}: its array was deleted outside pathways-mlir "
                f"(donated to a jax.jit, or deleted through result())")

    def _array_deleted(self) -> bool:
        """Whether the array this process keeps for the result was deleted outside pathways-mlir: `result()` is
        the object store's own array (no copy), which a `jax.jit` it is donated to, or its `delete()`, deletes
        behind the handle. A look without waiting or fetching: a result not produced yet, or kept in another
        process (a Ray actor's, read here as a copy), is not. Its store keeps the deleted array, and the ledger
        its bytes, until the handle is released, as for any other result."""
        run, buffer = self._run, self._buffer
        island = run.island_of(buffer)
        if island is None:                  # a host buffer: its settled value, or the store that kept it since
            future = run.host.get(buffer)
            if future is None or not future.done() or future.cancelled() or future.exception() is not None:
                return False
            value = future.result()
            if type(value) is not Stored:
                return type(value) is ARRAY_TYPE and value.is_deleted()
            island = value.island
        islands = self._islands
        if not islands.in_process or island not in islands:    # (an island lost since keeps nothing here)
            return False
        array = islands[island].store.get((run.id, buffer))
        return type(array) is ARRAY_TYPE and array.is_deleted()

    def block_until_ready(self) -> "Handle":
        """Waits until the buffer's value has been computed."""
        value = self._value(None)
        if hasattr(value, "block_until_ready"):      # (NumPy, from an island in another process, is ready)
            value.block_until_ready()
        return self

    def is_ready(self) -> bool:
        """Whether reading the value would not wait, without waiting: True once its run is over or failed
        (reading raises its error), or once the value is there and computed (a run's results may be before the
        run is seen over). Raises ValueError as reading it would if it was released."""
        self._check()
        if self._run.error is not None or self._client.runtime.run_done(self._run):
            return True
        try:
            value = self._value(0)
        except TimeoutError:
            return False
        except (RunFailed, OutOfDeviceMemory):
            return True
        return value.is_ready() if hasattr(value, "is_ready") else True   # (NumPy, from another process: ready)

    def is_deleted(self) -> bool:
        """Whether the result was released (deleted, donated, or its client closed), or its array was deleted
        outside pathways-mlir (`_array_deleted`), as a `jax.Array` donated to a `jax.jit` says it is."""
        return self._deleted or self._client.closed or self._array_deleted()

    def delete(self) -> None:
        """Releases the result now."""
        if not self._deleted:
            self._deleted = True
            self._client.release(self._run, self._buffer)

    def donate(self, to: str) -> None:
        """Releases the result, which `to` (a run that took it, already started) was given to reuse."""
        if not self._deleted:
            self._donated_to = to
            self._deleted = True
            self._client.release(self._run, self._buffer, donated=True)

    def __del__(self):
        try:
            if self._deleted:
                return
            self._deleted = True
            if _COLLECTING[0]:              # inside a collection: released later, lock-free now
                _DROPPED.put((self._client, self._run, self._buffer))
                return
            self._client.release(self._run, self._buffer)
        except KeyboardInterrupt:
            # Ctrl-C stopped the release halfway, and Python drops an exception a finalizer raises: the release is
            # made again at the next call, and the interrupt goes to the main thread again, from another thread
            # (from this one it would be raised here, before this returns, and dropped again).
            _DROPPED.put((self._client, self._run, self._buffer))
            _thread.start_new_thread(_thread.interrupt_main, ())
        except Exception:  # noqa: BLE001  (interpreter shutdown: this module's globals may be gone already)
            pass

    def __repr__(self) -> str:
        info = self._run.plan.buffers[self._buffer]
        return f"Handle(shape={info.shape}, dtype={info.dtype}, slice={info.slice})"

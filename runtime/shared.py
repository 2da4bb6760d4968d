"""Shared objects: one client's result that other clients read, held once on the devices.

`client.share(handle)` returns a `SharedRef` to one of the client's results
(a frozen base model, say). Any client given the reference may pass it to
its programs as an argument, read-only, while the owner keeps the object:

- The object stays where it is: a run that reads it on its home sharding
  gets the array itself, and the memory ledger counts its bytes once, for
  the owner, not again in each reader's peak (`admission.run_need`'s
  `stored`). On the Ray backend it goes as a reference, as a handle does
  (`Client._argument`): read in place on its own island, pulled from there
  by a reader on another, whose peak counts that copy, which is real.
- A reader cannot release, donate or change it: the reference has no
  `delete` or `donate`, a program that donates it is refused before it runs
  (`frontend/compiled.py`), and only a donated input is ever written in
  place, which the owner's shared handle cannot be either (`Client.start`).
- It is reclaimed when the owner releases it (deletes its handle, or
  closes) and no run that reads it is in flight: the gang scheduler counts
  the runs reading it from their submission until they are over, and keeps
  the bytes until the last is (`GangScheduler.release_result`). A run
  submitted after the owner released it fails at once with a ValueError.

Through a service (`pw-serve`), the reference a connection gets is an
unguessable token (`runtime/endpoint.py`): a client that was never given it
cannot name the object, and a guessed token is refused.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from pathways_mlir.dialect.plan import ProgramPlan

from .array_reference import RunResult
from .object_store import ObjectKey

if TYPE_CHECKING:
    from .handles import Handle
    from .runtime import Runtime


class SharedRef(RunResult):
    """A read-only reference to another client's result on devices; pass it to programs like a handle."""

    __slots__ = ("_runtime", "_run", "_buffer", "_owner", "owner_client")
    _islands = property(lambda self: self._runtime.islands)

    def __init__(self, runtime: "Runtime", handle: "Handle"):
        self._runtime = runtime
        self._run = handle._run
        self._buffer = handle._buffer
        self._owner = weakref.ref(handle)      # the owner's handle: dropping it releases the object
        self.owner_client = handle._client.id

    @property
    def key(self) -> ObjectKey:
        """The object's key in the store: (run id, buffer id)."""
        return self._run.id, self._buffer

    @property
    def released(self) -> bool:
        """Whether the owner has released the object (its handle is gone or deleted, or it closed)."""
        handle = self._owner()
        return handle is None or handle._deleted or handle._donated_to is not None or handle._client.closed

    def _value(self, timeout: float | None):
        """The object's array; raises ValueError once the owner has released it (checked again before the island
        would wait for it: released there, it is never produced again)."""
        self._check()
        island = self._runtime.islands[self._run.island_of(self._buffer)]
        try:
            return island.fetch(self._run.id, self._buffer, timeout, self)
        except (ValueError, TimeoutError):
            if self.released:
                raise ValueError(self.gone()) from None
            raise

    def _check(self) -> None:
        """Raises ValueError in one line once the owner has released the object."""
        if self.released:
            raise ValueError(self.gone())

    def is_ready(self) -> bool:
        """True: an object is shared once its run is over (`Client.share`); raises ValueError once released."""
        self._check()
        return True

    def is_deleted(self) -> bool:
        """Whether the owner has released the object."""
        return self.released

    def placed_as(self, plan: ProgramPlan, buffer: int) -> bool:
        """Whether input `buffer` of `plan` has this object's placement and sharding, so that a run reads the
        array itself (embedded backend), with no copy."""
        mine, theirs = self._run.plan.buffers[self._buffer], plan.buffers[buffer]
        if theirs.slice is None or (mine.sharding, mine.bytes_per_device) != (theirs.sharding, theirs.bytes_per_device):
            return False
        here, there = self._run.plan.slices[mine.slice], plan.slices[theirs.slice]
        return (here.island, here.devices, here.shape, here.axes) == (there.island, there.devices, there.shape,
                                                                      there.axes)

    def gone(self) -> str:
        """Says that the object was released, naming it."""
        return (f"shared object (buffer {self._buffer} of run {self._run.id}) was released by its owner, "
                f"client {self.owner_client}")

    def __repr__(self) -> str:
        info = self._run.plan.buffers[self._buffer]
        return (f"SharedRef(shape={info.shape}, dtype={info.dtype}, slice={info.slice}, "
                f"owner=client {self.owner_client})")

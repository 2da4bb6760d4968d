"""One run of a program plan: its buffer futures and its owner.

Every buffer of the plan gets a `Future` when the run is created, so that
steps can be handed to islands before the steps that produce their inputs
have executed (parallel asynchronous dispatch): a future resolves to a JAX
array as soon as its producer has been enqueued on the devices.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from pathways_mlir.dialect.plan import ProgramPlan

_run_ids = itertools.count()


@dataclass(eq=False)
class Run:
    """The state of one program run shared by the islands that execute it."""

    plan: ProgramPlan
    client_id: int
    id: int = field(default_factory=lambda: next(_run_ids))
    futures: dict[int, Future] = field(default_factory=dict)
    done: Future = field(default_factory=Future)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        self.futures = {b: Future() for b in self.plan.buffers}

    @property
    def owner(self) -> tuple[str, int, int]:
        """The owner of the run's intermediates in the object store."""
        return ("run", self.client_id, self.id)

    def owner_of(self, buffer: int) -> tuple:
        """The owner of one buffer: the client for outputs, the run for intermediates."""
        return ("client", self.client_id) if buffer in self.plan.outputs else self.owner

    def key(self, buffer: int) -> tuple[int, int]:
        """The object-store key of one of the run's buffers."""
        return (self.id, buffer)

    def value(self, buffer: int):
        """Waits for a buffer's producer to be enqueued and returns its array."""
        return self.futures[buffer].result()

    def resolve(self, buffer: int, value) -> None:
        """Sets a buffer's array (once)."""
        future = self.futures[buffer]
        if not future.done():
            future.set_result(value)

    def fail(self, error: BaseException, buffers=None) -> None:
        """Fails the given buffers (all if None) and the run itself."""
        with self._lock:
            for b in (self.futures if buffers is None else buffers):
                if not self.futures[b].done():
                    self.futures[b].set_exception(error)
            if not self.done.done():
                self.done.set_exception(error)

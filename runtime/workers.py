"""A small pool of daemon worker threads that the runtime shuts down itself.

`concurrent.futures` pools refuse new work once the interpreter starts
exiting, before `atexit` handlers run, so work still in flight (a run's
completion, a DCN move) would fail during a clean exit. These workers keep
accepting work until the runtime closes them, which it does at exit after
its islands have drained.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable


class Workers:
    """Runs submitted callables on `count` daemon threads, in submission order per thread."""

    def __init__(self, count: int, name: str):
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._threads = [threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True)
                         for i in range(count)]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[[], None]) -> None:
        """Queues `fn` to run on a worker thread (its exceptions are the caller's to catch)."""
        self._queue.put(fn)

    def close(self) -> None:
        """Runs the work already queued, then stops the threads."""
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()

    def _loop(self) -> None:
        while True:
            fn = self._queue.get()
            if fn is None:
                return
            fn()

"""A lock its waiters get in the order they asked for it.

Python's own `threading.Lock` lets the thread that releases it take it again at once, ahead of threads
already waiting: a `RemoteClient` thread polling for a result (a request every few seconds, each holding the
connection's lock while the endpoint holds on) kept the lock from another thread's `cancel` for one to 17
polls (5 to 85 s) in `tests/test_service_errors.py`. With `FairLock` the waiting thread goes next.
"""

from __future__ import annotations

import collections
import threading
import time


class FairLock:
    """A non-reentrant lock granted first come, first served (see the module); `acquire(timeout=...)` gives up
    its place in line when its time is out."""

    def __init__(self):
        self._state = threading.Condition(threading.Lock())
        self._held = False
        self._line: collections.deque = collections.deque()      # the waiters, in the order they asked

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Takes the lock once every thread that asked before has had it; returns False if `blocking` is
        False and it is held or asked for, or once `timeout` seconds (if not negative) have passed."""
        with self._state:
            if not self._held and not self._line:
                self._held = True
                return True
            if not blocking:
                return False
            me = object()
            self._line.append(me)
            deadline = None if timeout < 0 else time.monotonic() + timeout
            while self._held or self._line[0] is not me:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self._line.remove(me)
                    self._state.notify_all()          # the next in line may be first now
                    return False
                self._state.wait(left)
            self._line.popleft()
            self._held = True
            return True

    def release(self) -> None:
        """Releases the lock to the first thread in line."""
        with self._state:
            if not self._held:
                raise RuntimeError("release of a FairLock that is not held")
            self._held = False
            self._state.notify_all()

    def __enter__(self) -> "FairLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

"""`runtime/fair_lock.py`: waiters get the lock in the order they asked, also against a thread that takes
it again at once (Python's own lock let a polling thread starve another's request for minutes)."""

import threading
import time

import pytest

from pathways_mlir.runtime.fair_lock import FairLock

WAIT = 30.0     # seconds any wait of these tests may take


def test_a_waiting_thread_goes_before_the_one_that_releases_and_asks_again():
    lock, order, asked = FairLock(), [], threading.Event()
    lock.acquire()

    def other():
        asked.set()
        with lock:
            order.append("other")

    thread = threading.Thread(target=other)
    thread.start()
    asked.wait(WAIT)
    deadline = time.monotonic() + WAIT
    while not lock._line:                  # (the other thread is in line)
        assert time.monotonic() < deadline, "the other thread asks for the lock"
        time.sleep(0.001)
    lock.release()
    with lock:                             # asks again at once, behind the other thread
        order.append("first again")
    thread.join(WAIT)
    assert order == ["other", "first again"]


def test_a_timed_acquire_gives_up_its_place_and_the_next_goes_on():
    lock = FairLock()
    lock.acquire()
    assert not lock.acquire(timeout=0.05) and not lock.acquire(blocking=False)
    assert not lock._line                  # the one that timed out left the line
    lock.release()
    assert lock.acquire(timeout=0)
    lock.release()
    with pytest.raises(RuntimeError, match="not held"):
        lock.release()

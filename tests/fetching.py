"""Bounded waits in tests: reading results, a condition coming true, a runtime emptying, a process stopping."""

import os
import signal
import time

import jax
import numpy as np

from pathways_mlir.runtime.handles import Handle

TIMEOUT = 120.0   # seconds to wait for one result


def fetch(tree):
    """Returns `tree` with each handle replaced by its value as a NumPy array (waits at most TIMEOUT each)."""
    return jax.tree.map(lambda x: np.asarray(x.result(TIMEOUT)) if isinstance(x, Handle) else x, tree)


def until(condition, what: str, timeout: float) -> None:
    """Waits until `condition()` holds; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.01)


def settled(runtime, timeout: float) -> bool:
    """Whether, within `timeout` seconds, the islands hold no results and no device memory is reserved (the
    device work of failed runs may still be finishing)."""
    deadline = time.monotonic() + timeout
    while runtime.object_count() or sum(runtime.usage().values()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stop_process(pid: int, timeout: float) -> None:
    """Stops process `pid` (SIGSTOP) and waits until each of its threads has stopped; fails after `timeout`
    seconds. `kill` returns before: the thread the signal wakes stops the others once it runs, and on a loaded
    machine the others may go on meanwhile (a stopped service answered a request sent after the signal)."""
    os.kill(pid, signal.SIGSTOP)
    until(lambda: all(_thread_state(pid, tid) in "tTX" for tid in os.listdir(f"/proc/{pid}/task")),
          f"every thread of process {pid} stopped", timeout)


def _thread_state(pid: int, tid: str) -> str:
    """The state letter of one thread (/proc's), "X" if it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return "X"

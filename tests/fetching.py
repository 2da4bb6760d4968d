"""Bounded waits in tests: reading results, a condition coming true, a runtime emptying."""

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

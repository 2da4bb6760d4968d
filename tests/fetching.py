"""Reading results in tests: every wait for a handle is bounded."""

import jax
import numpy as np

from pathways_mlir.runtime.handles import Handle

TIMEOUT = 120.0   # seconds to wait for one result


def fetch(tree):
    """Returns `tree` with each handle replaced by its value as a NumPy array (waits at most TIMEOUT each)."""
    return jax.tree.map(lambda x: np.asarray(x.result(TIMEOUT)) if isinstance(x, Handle) else x, tree)

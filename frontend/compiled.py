"""The last stage of the front end: a lowered program, lowered for a cluster and loaded on it.

JAX's stages are traced -> lowered -> compiled; ours are the same:

    lowered = step.lower(x)          # trace: device-agnostic pw IR (frontend/lowered.py)
    compiled = lowered.compile()     # place, insert transfers, emit plans, load them on the islands
    y = compiled(x)                  # one run: a lookup and one message per island

A `Compiled` belongs to one runtime. It lowers again, on its next call,
when the runtime's topology has changed since (a device removed or added),
so programs follow the cluster; on a service (`pw.connect`), when the
service refuses a run as lowered for an older topology. Calling a program or placed function
directly uses `StageCache`: one `Compiled` per runtime and argument
signature, kept on the function itself, so a repeated call never traces,
lowers or parses a plan again.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

import jax

from .lowered import Lowered


class Compiled:
    """A program's plan on one runtime; calling it runs the program and returns handles."""

    def __init__(self, lowered: Lowered, runtime):
        self.lowered = lowered
        self.runtime = runtime
        self.plan = None
        self._version = -1
        self._lock = threading.Lock()
        self._refresh()

    def _refresh(self) -> None:
        from pathways_mlir.passes import lower, program_plans

        version, topology = self.runtime.resources.snapshot()
        plan = program_plans(lower(self.lowered.module, topology))[self.lowered.program]
        self.runtime.load(plan)
        self.plan, self._version = plan, version

    def __call__(self, *args: Any, client=None, dispatch: str = "parallel") -> Any:
        """Runs the program on `args` (a pytree like the example arguments); returns handles."""
        from pathways_mlir.runtime.client import default_client
        from pathways_mlir.runtime.resource_manager import TopologyChanged

        if self.runtime.resources.version != self._version:
            with self._lock:
                if self.runtime.resources.version != self._version:
                    self._refresh()
        client = client or default_client(self.runtime)
        if client.runtime is not self.runtime:
            raise ValueError("this program was compiled for another runtime than the client's")
        leaves = jax.tree_util.tree_leaves(args)
        try:
            handles = client.run(self.plan, leaves, dispatch)
        except TopologyChanged:       # a service's topology changed since this process read it (pw.connect)
            with self._lock:
                self._refresh()
            handles = client.run(self.plan, leaves, dispatch)
        return jax.tree_util.tree_unflatten(self.lowered.out_tree, handles)


def _signature(args: tuple) -> tuple:
    leaves, tree = jax.tree_util.tree_flatten(args)
    return tree, tuple((tuple(x.shape), x.dtype) for x in leaves)


class StageCache:
    """One `Compiled` per runtime and argument signature, for one program or placed function."""

    def __init__(self, lower: Callable[..., Lowered]):
        self._lower = lower
        self._by_runtime: "weakref.WeakKeyDictionary[Any, dict[tuple, Compiled]]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._last: tuple = (None, {})      # the runtime of the latest call and its stages: a fast lookup

    def get(self, args: tuple, runtime) -> Compiled:
        """Returns the stage for `args` on `runtime`, tracing and lowering only the first time."""
        key = _signature(args)
        per_runtime = self._last[1] if self._last[0] is runtime else self._by_runtime.get(runtime, {})
        found = per_runtime.get(key)
        if found is not None:
            self._last = (runtime, per_runtime)
            return found
        with self._lock:
            per_runtime = self._by_runtime.setdefault(runtime, {})
            if key not in per_runtime:
                avals = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)
                per_runtime[key] = Compiled(self._lower(*avals), runtime)
            return per_runtime[key]

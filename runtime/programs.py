"""Running traced programs: the path from a Python call to plans on devices.

Calling a `@pathways_mlir.program` or a `pathways_mlir.jit` function outside
a trace comes here. The program is traced once per argument signature into
its device-agnostic pw module, which is never changed; it is lowered (placed,
transfers inserted, scheduled, cut into per-island plans) against the
resource manager's current topology, and lowered again whenever the topology
has changed since (a device removed or added), so programs follow the
cluster. The client then runs the plan and the results come back as handles
in the program's output pytree.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import jax

from pathways_mlir.dialect.plan import ProgramPlan

from .client import Client
from .runtime import Runtime, get_runtime


@dataclass
class _Signature:
    """One traced signature of a program and its plan per runtime, for that runtime's topology version."""

    lowered: Any                     # frontend.lowered.Lowered
    plans: "weakref.WeakKeyDictionary[Any, tuple[int, ProgramPlan]]"   # resource manager -> (version, plan)


_signatures: "weakref.WeakKeyDictionary[Any, dict[tuple, _Signature]]" = weakref.WeakKeyDictionary()
_default_clients: "weakref.WeakKeyDictionary[Runtime, Client]" = weakref.WeakKeyDictionary()
_lock = threading.RLock()


def default_client(runtime: Runtime | None = None) -> Client:
    """Returns the client that calls without an explicit client use (one per runtime)."""
    runtime = runtime or get_runtime()
    with _lock:
        client = _default_clients.get(runtime)
        if client is None:
            client = _default_clients[runtime] = Client(runtime)
        return client


def plan_for(traceable, args: tuple, runtime: Runtime) -> tuple[ProgramPlan, Any]:
    """Returns the plan of `traceable` for these arguments on the current topology, and its Lowered."""
    from pathways_mlir.passes import lower, program_plans

    leaves = jax.tree_util.tree_leaves(args)
    key = (jax.tree_util.tree_structure(args),
           tuple((tuple(x.shape), str(jax.numpy.dtype(x.dtype))) for x in leaves))
    with _lock:
        signature = _signatures.setdefault(traceable, {}).get(key)
        if signature is None:
            avals = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)
            signature = _Signature(traceable.lower(*avals), weakref.WeakKeyDictionary())
            _signatures[traceable][key] = signature
        version, topology = runtime.resources.snapshot()
        cached = signature.plans.get(runtime.resources)
        if cached is not None and cached[0] == version:
            return cached[1], signature.lowered
        # A runtime's plan for an older topology is stale; other runtimes keep theirs.
        lowered_module = lower(signature.lowered.module, topology)
        plan = program_plans(lowered_module)[signature.lowered.program]
        signature.plans[runtime.resources] = (version, plan)
        return plan, signature.lowered


def execute(traceable, args: tuple, client: Client | None = None, dispatch: str = "parallel") -> Any:
    """Runs a program (or placed function) on `args`; returns its results as handles."""
    client = client or default_client()
    plan, lowered = plan_for(traceable, args, client.runtime)
    handles = client.run(plan, jax.tree_util.tree_leaves(args), dispatch)
    return jax.tree_util.tree_unflatten(lowered.out_tree, handles)

"""pathways-mlir: an open, compiler-first Pathways built around MLIR.

Layers, one folder each: `frontend` (the client API below, which traces JAX
programs into pw IR), `dialect` (the `pw` dialect and its Python helpers),
`passes` (the lowering passes and pipelines), `runtime` (the client,
resource manager, schedulers, executors and object store) and `cli`
(`pw-opt`, `pw-export`, `pw-run`, `pw-bench`, `pw-sim`, `pw-serve`).

    import pathways_mlir as pw
    s = pw.virtual_slice((2, 4), axes=("data", "model"))
    f = pw.jit(fn, slice=s, in_specs=P("data"), out_specs=P("data"))
    @pw.program
    def step(x): return f(x)
    step.lower(jax.ShapeDtypeStruct((8, 16), jnp.float32)).as_text()
"""

from .runtime.cluster import prepare_host_devices_before_jax as _prepare_host_devices_before_jax
from .runtime.uncaught import install as _install_one_line_errors

__version__ = "0.1.0"

_FRONTEND = ["ElasticTrainer", "PlacementError", "cond", "jit", "pipeline", "program", "virtual_slice"]
# name -> its module under the package (the runtime's, or the dialect's for a plan's errors)
_MODULES = {"Client": "runtime.client", "IslandLost": "runtime.island_work", "IslandWedged": "runtime.island_work",
            "RunCancelled": "runtime.island_work", "RunFailed": "runtime.island_work",
            "TopologyChanged": "runtime.resource_manager", "ServiceError": "runtime.remote_client",
            "PlanError": "dialect.plan_json",
            "OutOfDeviceMemory": "runtime.admission", "SharedRef": "runtime.shared", "cancel": "runtime.client",
            "configure": "runtime.runtime", "connect": "runtime.service", "get_runtime": "runtime.runtime",
            "status": "runtime.runtime"}
__all__ = [*_FRONTEND, *_MODULES]

# The embedded cluster's CPU devices must be asked of XLA before JAX starts:
# importing pathways_mlir first arranges it for JAX's first import (PW_CLUSTER,
# default 2 islands x 4). Nothing here can fail: a bad PW_CLUSTER is an error
# where the cluster is made, and tools that never start JAX never read it.
_prepare_host_devices_before_jax()

# A script that leaves one of this package's own errors uncaught ends with
# its one-line message and the script's line, not a traceback through our
# internals (PW_TRACEBACK=1 shows it); runtime/uncaught.py.
_install_one_line_errors()


def __getattr__(name: str):
    # The front end and the runtime import JAX; load them on first use so that
    # tools that only read IR (`pw-opt`) start fast.
    if name in _FRONTEND:
        from . import frontend

        return getattr(frontend, name)
    if name in _MODULES:
        import importlib

        return getattr(importlib.import_module(f".{_MODULES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

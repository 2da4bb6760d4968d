"""pathways-mlir: an open, compiler-first Pathways built around MLIR.

Layers, one folder each: `frontend` (the client API below, which traces JAX
programs into pw IR), `dialect` (the `pw` dialect and its Python helpers),
`passes` (the lowering passes and pipelines), `runtime` (the client,
resource manager, schedulers, executors and object store) and `cli`
(`pw-opt`, `pw-export`).

    import pathways_mlir as pw
    s = pw.virtual_slice((2, 4), axes=("data", "model"))
    f = pw.jit(fn, slice=s, in_specs=P("data"), out_specs=P("data"))
    @pw.program
    def step(x): return f(x)
    step.lower(jax.ShapeDtypeStruct((8, 16), jnp.float32)).as_text()
"""

__version__ = "0.1.0"

__all__ = ["PlacementError", "cond", "jit", "program", "virtual_slice"]


def __getattr__(name: str):
    # The front end imports JAX; load it on first use so that tools that only
    # read IR (`pw-opt`) start fast.
    if name in __all__:
        from . import frontend

        return getattr(frontend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""pathways-mlir: an open, compiler-first Pathways built around MLIR.

Layers, one folder each: `dialect` (the `pw` dialect and its Python
helpers), `passes` (the lowering passes and pipelines), `runtime` (the
client, resource manager, schedulers, executors and object store) and `cli`
(`pw-opt`).
"""

__version__ = "0.1.0"

"""The result of tracing: a pw module and the signature of its entry program."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import jax
from mlir import ir

if TYPE_CHECKING:
    from .compiled import Compiled


@dataclass(frozen=True, eq=False)
class Lowered:
    """A traced program, exported to pw IR; nothing has run.

    `module` holds the entry program `program` (a `func.func {pw.program}`),
    the programs of any `cond` branches, the virtual slices and the compiled
    functions. The entry program's arguments are the leaves of the traced
    example arguments (the pytree `(args, kwargs)` without the static ones,
    structure `in_tree`, as `jax.jit`'s) and its results the leaves of the
    Python function's result (`out_tree`). `donated` says, per argument
    leaf, whether the call donates it (empty when none is).
    """

    module: ir.Module  # keeps its context alive
    program: str
    in_tree: jax.tree_util.PyTreeDef
    in_avals: tuple[jax.ShapeDtypeStruct, ...]
    out_tree: jax.tree_util.PyTreeDef
    out_avals: tuple[jax.ShapeDtypeStruct, ...]
    donated: tuple[bool, ...] = ()

    def as_text(self, *, debug_info: bool = False) -> str:
        """Returns the pw IR as text; `debug_info` adds the Python locations of ops."""
        return self.module.operation.get_asm(enable_debug_info=debug_info)

    def save(self, path: str | os.PathLike, *, debug_info: bool = False) -> None:
        """Writes the pw IR to `path`, for `pw-opt` to read."""
        with open(path, "w") as f:
            f.write(self.as_text(debug_info=debug_info))

    def compile(self, runtime=None) -> "Compiled":
        """Lowers the program for `runtime`'s cluster (default: the process's) and loads its plans there."""
        from pathways_mlir.runtime.runtime import get_runtime

        from .compiled import Compiled

        return Compiled(self, runtime or get_runtime())

"""The result of tracing: a pw module and the signature of its entry program."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
from mlir import ir

from .errors import PlacementError, require_bool

if TYPE_CHECKING:
    from pathways_mlir.dialect.plan import ProgramPlan

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

    `in_avals_flat` and `out_avals_flat` are their avals, one per leaf.

    It answers what `jax.jit(f).lower(...)` answers (`in_avals`, `args_info`,
    `out_info`, `donate_argnums`, `as_text`, `compiler_ir`,
    `cost_analysis`), for the whole program: its IR is the pw dialect, which
    holds each computation's StableHLO as a nested module.
    """

    module: ir.Module  # keeps its context alive
    program: str
    in_tree: jax.tree_util.PyTreeDef
    in_avals_flat: tuple[jax.ShapeDtypeStruct, ...]
    out_tree: jax.tree_util.PyTreeDef
    out_avals_flat: tuple[jax.ShapeDtypeStruct, ...]
    donated: tuple[bool, ...] = ()
    # The functions kept in this process that its compiled functions name (`keep_in_process`): held here, so that
    # each plan lowered from it runs them, and gone with it once no loaded plan holds them either.
    kept: tuple = ()

    @property
    def in_avals(self) -> Any:
        """The arguments' abstract values (`jax.core.ShapedArray`), in the traced arguments' structure."""
        return self.in_tree.unflatten([jax.core.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type)
                                       for a in self.in_avals_flat])

    @property
    def args_info(self) -> Any:
        """The arguments as `jax.stages.ArgInfo`s (aval and whether it is donated), in the traced arguments'
        structure `(args, kwargs)`, as `jax.jit`'s stages give them."""
        donated = self.donated or (False,) * len(self.in_avals_flat)
        return jax.tree.map(jax.stages.ArgInfo, self.in_avals, self.in_tree.unflatten(donated))

    @property
    def out_info(self) -> Any:
        """The results' `jax.ShapeDtypeStruct`s, in the structure of the Python function's result; without weak
        types, as `jax.jit`'s stages give them (a weakly typed result is still a `WeakHandle` when run)."""
        return self.out_tree.unflatten([jax.ShapeDtypeStruct(a.shape, a.dtype) for a in self.out_avals_flat])

    @property
    def donate_argnums(self) -> tuple[int, ...]:
        """The indices of the donated argument leaves, as `jax.jit`'s stages give them."""
        return tuple(i for i, d in enumerate(self.donated) if d)

    def as_text(self, dialect: str | None = None, *, debug_info: bool = False) -> str:
        """Returns the pw IR as text; `debug_info` adds the Python locations of ops. `dialect` may only be
        "pw" (the default)."""
        require_bool("Lowered.as_text", "debug_info", debug_info)
        return self.compiler_ir(dialect).operation.get_asm(enable_debug_info=debug_info)

    def compiler_ir(self, dialect: str | None = None) -> ir.Module:
        """Returns the pw module; `dialect` may only be "pw" (the default): the program spans several
        computations, each with its StableHLO nested in the module, so there is no one StableHLO module."""
        if dialect not in (None, "pw"):
            raise ValueError(f"program @{self.program} is lowered to the pw dialect, not {dialect!r}: each of its "
                             f"computations' StableHLO is a nested module of the pw module (compiler_ir())")
        return self.module

    def cost_analysis(self) -> dict[str, float]:
        """Returns the estimated cost of one run, keyed as `jax.jit`'s stages key theirs: "flops" and "bytes
        accessed" (the bytes each computation must read and write), from pw's one cost model
        (`passes/cost.py`), summed over the computations a run calls (a `cond`: its costlier branch). With
        "unknown_trip_counts", some loops counted once (their trip count is not static)."""
        from pathways_mlir.passes.cost import program_cost

        cost = program_cost(self.module, self.program)
        analysis = {"flops": float(cost.flops), "bytes accessed": float(cost.bytes)}
        if cost.unknown_trip_counts:
            analysis["unknown_trip_counts"] = float(cost.unknown_trip_counts)
        return analysis

    def save(self, path: str | os.PathLike, *, debug_info: bool = False) -> None:
        """Writes the pw IR to `path`, for `pw-opt` to read."""
        require_bool("Lowered.save", "debug_info", debug_info)    # before the file is opened, and emptied
        with open(path, "w") as f:
            f.write(self.as_text(debug_info=debug_info))

    def plan_on(self, topology) -> "ProgramPlan":
        """The entry program's plan, lowered onto `topology` (every pass of `pw-lower`). Raises `PlacementError`
        with the lowering's diagnostics if no island can hold a slice (more devices or bytes than an island
        has, its pinned island lost): the program cannot run where it is placed."""
        from pathways_mlir.passes import LoweringError, lower_to_plans

        try:
            return lower_to_plans(self.module, topology)[self.program]
        except LoweringError as error:
            raise PlacementError(str(error)) from None

    def compile(self, runtime=None) -> "Compiled":
        """Lowers the program for `runtime`'s cluster (default: the process's) and loads its plans there."""
        from pathways_mlir.runtime.runtime import get_runtime

        from .compiled import Compiled

        return Compiled(self, runtime or get_runtime())

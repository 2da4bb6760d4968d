"""Placed functions: a `jax.jit`-able function bound to a virtual slice and its shardings.

Inside a program trace, each call of a placed function records one
`pw.compute` on the slice; the function itself is compiled once per argument
signature (see `executables`).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import jax
from mlir import ir

from pathways_mlir.dialect import ops

from . import specs, tracer
from .compiled import Compiled, StageCache
from .lowered import Lowered
from .provenance import Site, name_of
from .slices import Slice


class PlacedFunction:
    """A Python function placed on a virtual slice; see `jit`."""

    def __init__(self, fn: Callable, slice_: Slice, in_specs: Any, out_specs: Any):
        if not isinstance(slice_, Slice):
            raise TypeError(f"slice must come from pathways_mlir.virtual_slice, not {type(slice_).__name__}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.slice = slice_
        self.in_specs = in_specs
        self.out_specs = out_specs
        self._stages = StageCache(self.lower)

    def lower(self, *example_args: Any) -> Lowered:
        """Exports this function on its own: a program with one computation (op-by-op mode)."""
        site = Site.of_call(name_of(self.fn), inspect.currentframe().f_back)
        return tracer.lower(site, lambda *args: _record(tracer.current_program(), self, args, site),
                            example_args)

    def __call__(self, *args: Any) -> Any:
        """Runs the function on its slice (op-by-op); inside a program trace, records one computation."""
        program = tracer.current_program()
        if program is None:
            return self.run(*args)
        site = Site.of_call(name_of(self.fn), inspect.currentframe().f_back)
        return _record(program, self, args, site)

    def run(self, *args: Any, dispatch: str = "parallel", client=None) -> Any:
        """Runs the function as a one-computation program with a chosen dispatch mode and client."""
        return self.compiled(*args, runtime=client.runtime if client else None)(*args, client=client,
                                                                                  dispatch=dispatch)

    def compiled(self, *args: Any, runtime=None) -> Compiled:
        """Returns the `Compiled` stage a call with these arguments uses on `runtime` (cached)."""
        from pathways_mlir.runtime.runtime import get_runtime

        return self._stages.get(args, runtime or get_runtime())


def _record(program: tracer.ProgramBuilder, placed: PlacedFunction, args: tuple, site: Site) -> Any:
    """Adds the `pw.compute` of one call to `program`."""
    leaves, in_tree = jax.tree_util.tree_flatten_with_path(args)
    inputs = [program.own(x, site, f"argument{jax.tree_util.keystr(path)}") for path, x in leaves]
    in_avals = [v.aval for v in inputs]
    module = program.module
    slice_name = module.slice_symbol(placed.slice)
    in_shardings = specs.shardings(placed.in_specs, jax.tree_util.tree_unflatten(in_tree, in_avals),
                                   "in", site, placed.slice, slice_name)
    with tracer.lowering(site, slice_name):
        executable = module.executable(placed.fn, in_tree, in_avals)
    out_shardings = specs.shardings(placed.out_specs,
                                    jax.tree_util.tree_unflatten(executable.out_tree, executable.out_avals),
                                    "out", site, placed.slice, slice_name)
    label = module.label(site.name)
    with ir.InsertionPoint(program.block):
        op = ops.build_compute(executable.symbol, slice_name, [v.ir_value for v in inputs],
                               executable.result_types, in_shardings, out_shardings, label,
                               loc=site.location())
    results = program.values(op.results, executable.out_avals, f"{label} result")
    return jax.tree_util.tree_unflatten(executable.out_tree, results)


def jit(fn: Callable | None = None, /, *, slice: Slice, in_specs: Any = None,
        out_specs: Any = None) -> PlacedFunction | Callable[[Callable], PlacedFunction]:
    """Places `fn` on `slice`, sharding its arguments by `in_specs` and results by `out_specs`.

    Specs are `jax.sharding.PartitionSpec`s over the slice's axis names, or
    None for replicated, given as a pytree prefix of the arguments (a tuple
    with one entry per positional argument) or of the results; a single spec
    applies to all. Without `fn`, returns a decorator, as `jax.jit` does.

        @pw.jit(slice=s, in_specs=P("data"), out_specs=P("data"))
        def block_a(x):
            return jnp.tanh(x)
    """
    if fn is None:
        return functools.partial(jit, slice=slice, in_specs=in_specs, out_specs=out_specs)
    return PlacedFunction(fn, slice, in_specs, out_specs)

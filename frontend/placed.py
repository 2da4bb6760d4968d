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
import jax.numpy as jnp
import numpy as np
from mlir import ir

from pathways_mlir.dialect import ops

from . import specs, tracer
from .avals import has_tracers
from .errors import PlacementError
from .compiled import StageCache, StagedFunction
from .lowered import Lowered
from .provenance import Site, name_of
from .signature import Call, Signature, argument_name, check_options
from .slices import Slice


class PlacedFunction(StagedFunction):
    """A Python function placed on a virtual slice; see `jit`."""

    def __init__(self, fn: Callable, slice_: Slice, in_specs: Any, out_specs: Any, **options: Any):
        if not isinstance(slice_, Slice):
            raise TypeError(f"slice must come from pathways_mlir.virtual_slice, not {type(slice_).__name__}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.slice = slice_
        # a list is the tuple of positional arguments' specs, as `jax.jit` takes its `in_shardings` list
        self.in_specs = tuple(in_specs) if isinstance(in_specs, list) else in_specs
        self.out_specs = out_specs
        self._signature = Signature(fn, name_of(fn), **options)
        statics = dict(static_argnums=tuple(self._signature.static_nums) or None,
                       static_argnames=tuple(self._signature.static_names) or None)
        self._jitted = jax.jit(fn, **statics)      # what it is inside a JAX transformation
        self._stages = StageCache(self._lower, self._signature)
        self._with_constants: dict = {}     # see `with_constants`

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Exports this function on its own: a program with one computation (op-by-op mode)."""
        return self._lower(self._signature.split(args, kwargs), inspect.currentframe().f_back)

    def _lower(self, call: Call, frame=None) -> Lowered:
        site = Site.of_call(name_of(self.fn), frame or inspect.currentframe().f_back)

        def one_call(*args, **kwargs):
            return _record(tracer.current_program(), self, Call(args, kwargs, call.static), site)
        return tracer.lower(site, one_call, call.tree, self._signature.donated(call))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the function on its slice (op-by-op); inside a program trace, records one computation.

        Inside a JAX transformation (`jax.jit`, `jax.grad`, `jax.vmap`,
        `lax.scan`, ...), the body of another placed function included, it
        traces as its function, as a nested `jax.jit`: placement applies only
        where a program calls it. Under `jax.disable_jit()` it runs its
        function eagerly, as `jax.jit` does.
        """
        program = tracer.current_program()
        if program is None:
            if not kwargs:       # (keywords may be `run`'s options)
                return self._stages.run(args, kwargs, "parallel", traced=self._jitted)
            if jax.config.jax_disable_jit or has_tracers((args, kwargs)):
                return self._jitted(*args, **kwargs)
            return self._call(args, kwargs)
        if has_tracers((args, kwargs)):
            return self._jitted(*args, **kwargs)      # called by a placed function's body as the program traces
        site = Site.of_call(name_of(self.fn), inspect.currentframe().f_back)
        return _record(program, self, self._signature.split(args, kwargs), site)

    def with_constants(self, fn: Callable, tree: Any, constants: dict[int, Any]) -> tuple[Callable, Any]:
        """For a call inside a program whose argument leaves `constants` (by index in `tree`'s leaves) are
        Python or NumPy scalars: returns `fn` of the other leaves, with the constants put back in its code as
        JAX arrays, as a `jax.jit` trace gives them (weakly typed for a Python scalar: `c * c` of an int wraps
        in int32, and `lr.astype` exists; the raw Python value computed exactly, or had no `astype`), one
        function per `fn`, tree and constants, so that one executable serves every call of them; and `tree`
        with None in their places."""
        full = jax.tree_util.tree_structure(tree)
        key = (fn, full, tuple((i, type(x), repr(x)) for i, x in constants.items()))   # repr: -0.0 is not 0.0
        bound = self._with_constants.get(key)
        if bound is None:
            def bound(*args, **kwargs):
                rest = iter(jax.tree_util.tree_leaves((args, kwargs)))
                leaves = [jnp.asarray(constants[i]) if i in constants else next(rest)
                          for i in range(full.num_leaves)]
                args, kwargs = jax.tree_util.tree_unflatten(full, leaves)
                return fn(*args, **kwargs)
            bound = self._with_constants.setdefault(key, functools.wraps(fn)(bound))
        leaves = jax.tree_util.tree_leaves(tree)
        return bound, jax.tree_util.tree_unflatten(full, [None if i in constants else x for i, x in enumerate(leaves)])


def _record(program: tracer.ProgramBuilder, placed: PlacedFunction, call: Call, site: Site) -> Any:
    """Adds the `pw.compute` of one call to `program`."""
    if call.kwargs and not specs.is_spec(placed.in_specs):
        raise PlacementError(f"{site}: keyword-only arguments {', '.join(call.kwargs)} need one in_specs "
                             f"for all arguments: a tuple of in_specs matches positional arguments only")
    for _, static in (*call.static[0], *call.static[1]):
        if isinstance(static.value, tracer.Value):      # jax.jit refuses a tracer there: not hashable
            raise ValueError(f"{site}: static argument {static.value!r} has no value while the program is traced: "
                             f"pass it as a traced argument, or a Python value")
    fn, tree = placed._signature.bound(call.static), call.tree
    constants = {i: x for i, x in enumerate(jax.tree_util.tree_leaves(tree)) if _is_constant(x)}
    if constants:
        fn, tree = placed.with_constants(fn, tree, constants)
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    in_tree = jax.tree_util.tree_structure(tree)
    inputs = [program.own(x, site, argument_name(path),
                          "a Python or NumPy scalar is taken as a constant; an array constant: pass it as a "
                          "program argument, or make it in a placed function") for path, x in leaves]
    in_avals = [v.aval for v in inputs]
    module = program.module
    slice_name = module.slice_symbol(placed.slice)
    in_args, in_kwargs = jax.tree_util.tree_unflatten(in_tree, in_avals)
    in_shardings = specs.shardings(placed.in_specs, (in_args, in_kwargs) if in_kwargs else in_args,
                                   "in", site, placed.slice, slice_name)
    with tracer.lowering(site, slice_name):
        try:
            executable = module.executable(fn, in_tree, in_avals, placed.slice.mesh,
                                           specs.explicit_types(in_shardings, placed.slice))
        except (ValueError, RuntimeError) as error:
            if not (placed.slice.elastic and "mesh" in str(error)):
                raise
            raise PlacementError(f"{site}: the function names mesh axes (jax.shard_map, a collective or a sharding "
                                 f"constraint by PartitionSpec), but {placed.slice} is elastic: its shape is chosen "
                                 f"when it is placed, so there is no mesh to trace the function under; give the "
                                 f"slice a fixed shape") from None
    out_specs = placed.out_specs
    if out_specs is None and any(executable.out_constraints):       # where the function itself puts its results
        out_specs = jax.tree_util.tree_unflatten(executable.out_tree,
                                                 [c if c is not None else jax.sharding.PartitionSpec()
                                                  for c in executable.out_constraints])
    out_shardings = specs.shardings(out_specs, jax.tree_util.tree_unflatten(executable.out_tree, executable.out_avals),
                                    "out", site, placed.slice, slice_name)
    label = module.label(site.name)
    with ir.InsertionPoint(program.block):
        op = ops.build_compute(executable.symbol, slice_name, [v.ir_value for v in inputs],
                               executable.result_types, in_shardings, out_shardings, label,
                               loc=site.location())
    results = program.values(op.results, executable.out_avals, f"{label} result")
    return jax.tree_util.tree_unflatten(executable.out_tree, results)


def _is_constant(x: Any) -> bool:
    """Whether an argument leaf of a call inside a program is a constant that the computation takes in its
    code, as `jax.jit` takes one in a trace: a Python scalar (weakly typed) or a NumPy scalar."""
    return isinstance(x, (bool, int, float, complex, np.number, np.bool_))


def jit(fn: Callable | None = None, /, *, slice: Slice, in_specs: Any = None, out_specs: Any = None,
        static_argnums=None, static_argnames=None, donate_argnums=None, donate_argnames=None,
        **jit_options: Any) -> PlacedFunction | Callable[[Callable], PlacedFunction]:
    """Places `fn` on `slice`, sharding its arguments by `in_specs` and results by `out_specs`.

    Specs are `jax.sharding.PartitionSpec`s over the slice's axis names, or
    None for replicated, given as a pytree prefix of the arguments (a tuple
    with one entry per traced positional argument) or of the results; a
    single spec applies to all. A typed PRNG key array is sharded by its own
    shape's spec. Without `fn`, returns a decorator, as `jax.jit` does.

        @pw.jit(slice=s, in_specs=P("data"), out_specs=P("data"))
        def block_a(x):
            return jnp.tanh(x)

    `static_argnums`, `static_argnames`, `donate_argnums` and `donate_argnames`
    are `jax.jit`'s; other `jax.jit` options raise a TypeError saying why.
    """
    check_options("pathways_mlir.jit", jit_options)
    options = dict(slice=slice, in_specs=in_specs, out_specs=out_specs, static_argnums=static_argnums,
                   static_argnames=static_argnames, donate_argnums=donate_argnums,
                   donate_argnames=donate_argnames)
    if fn is None:
        return functools.partial(jit, **options)
    return PlacedFunction(fn, options.pop("slice"), options.pop("in_specs"), options.pop("out_specs"), **options)


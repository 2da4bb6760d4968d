"""The program tracer: a Python function that calls placed functions becomes a pw program.

`program.lower(*example_args)` runs the Python function once on `Value`s
(symbolic global-shape arrays) and records one `pw.compute` per call of a
placed function, in call order, in a `func.func {pw.program}`: the paper's
program tracer (its Figure 2). Values flow between calls as SSA values, also
between slices (`pw-insert-transfers` adds the data movement later). Nothing
runs and no device is needed.

The pw module is assembled as the trace goes: programs are appended as they
are traced; slices and compiled functions, named on first use, are put
before them when the trace ends.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator, Sequence

import jax
import numpy as np
from mlir import ir
from mlir.dialects import func

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.context import make_context
from pathways_mlir.dialect.homes import sharded_on

from .avals import aval_of, check_element_type, format_aval, has_tracers, signature_of, tensor_type
from .errors import PlacementError
from .executables import Executable, compile_function
from .compiled import StageCache, StagedFunction
from .lowered import Lowered
from .provenance import Site, name_of
from .signature import Call, Signature, argument_name, check_options
from .slices import Slice

_TRACING: ContextVar["ProgramBuilder | None"] = ContextVar("pw_tracing", default=None)
_LOWERING: ContextVar[tuple[Site, str] | None] = ContextVar("pw_lowering", default=None)


class Value:
    """An array inside a program trace: a program argument or a result of a placed function.

    It has a global shape and dtype but no data; pass it to placed functions.
    """

    def __init__(self, ir_value: ir.Value, aval: jax.ShapeDtypeStruct, program: "ProgramBuilder",
                 origin: str):
        self.ir_value = ir_value
        self.aval = aval
        self._program = program
        self._origin = origin

    @property
    def shape(self) -> tuple[int, ...]:
        """The global shape."""
        return self.aval.shape

    @property
    def dtype(self):
        """The element type: a numpy dtype, or an extended one (a typed PRNG key's)."""
        return self.aval.dtype

    @property
    def weak_type(self) -> bool:
        """Whether the value is weakly typed (it came from a Python scalar), as in JAX."""
        return self.aval.weak_type

    def __repr__(self) -> str:
        return f"Value({format_aval(self.aval)}, {self._origin} in @{self._program.name})"

    # JAX looks up `__jax_array__` on every object it does not know, so a
    # value that a placed function closes over, instead of taking it as an
    # argument, fails here with the call's name.
    @property
    def __jax_array__(self):
        raise PlacementError(self._not_an_array())

    def __array__(self, *args, **kwargs):
        raise PlacementError(self._not_an_array())

    def __bool__(self):
        raise PlacementError(f"{self!r} has no value while the program is traced, so Python's `if`, `while`, "
                             f"`and`, `or` and `bool()` cannot read it: branch on it with "
                             f"pw.cond(pred, true_fn, false_fn, *operands)")

    def __getattr__(self, name: str):
        # Only for what normal lookup did not find: a JAX array's method or property (`y.sum()`, `y.T`).
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(f"{self!r} has no data while the program is traced, so it has no attribute '{name}' "
                             f"of a JAX array: compute it in a placed function (pw.jit), and pass the value to it")

    def _not_an_array(self) -> str:
        lowering = _LOWERING.get()
        if lowering is None:
            return (f"{self!r} has no data while the program is traced, so a JAX function or transformation "
                    f"(jnp.*, jax.vmap, ...) cannot take it in the program's body: do that work inside a placed "
                    f"function (pw.jit) and pass the value to it, or return the value from the program")
        site, slice_name = lowering
        return (f"{site} uses {self!r} without receiving it as an argument: pass it as an "
                f"argument so that it is sent to slice @{slice_name}")


def _refused_operator(name: str):
    """Returns operator `name` of a traced `Value`, which raises: a program's arithmetic is in placed functions."""
    def refuse(self, *others):
        raise PlacementError(f"{self!r} has no data while the program is traced, so it has no operator "
                             f"{name}: compute it in a placed function (pw.jit), and pass the value to it")
    refuse.__name__ = name
    return refuse


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__", "__matmul__",
              "__rmatmul__", "__lt__", "__le__", "__gt__", "__ge__", "__neg__", "__pos__", "__abs__", "__invert__",
              "__getitem__", "__float__", "__int__", "__index__"):
    setattr(Value, _name, _refused_operator(_name))
del _name


class ModuleBuilder:
    """The pw module that one trace builds: its symbols, slices, compiled functions and labels."""

    def __init__(self):
        self.context = make_context()
        self.module = ir.Module.create(loc=ir.Location.unknown(self.context))
        self._symbols: set[str] = set()
        self._slices: dict[Slice, str] = {}
        self._executables: dict[tuple, Executable] = {}
        self._labels: collections.Counter[str] = collections.Counter()

    def symbol(self, base: str) -> str:
        """Returns a new symbol name: `base`, else `base_1`, `base_2`, ..."""
        name, n = base, 0
        while name in self._symbols:
            n += 1
            name = f"{base}_{n}"
        self._symbols.add(name)
        return name

    def label(self, name: str) -> str:
        """Returns the next stable label of an op named after `name`: `name#0`, `name#1`, ..."""
        count = self._labels[name]
        self._labels[name] += 1
        return f"{name}#{count}"

    def slice_symbol(self, slice_: Slice) -> str:
        """Returns the symbol of a slice, naming it on first use."""
        if slice_ not in self._slices:
            unnamed = sum(1 for s in self._slices if s.name is None)
            self._slices[slice_] = self.symbol(slice_.name or f"slice{unnamed}")
        return self._slices[slice_]

    def executable(self, fn: Callable, in_tree: jax.tree_util.PyTreeDef,
                   in_avals: Sequence[jax.ShapeDtypeStruct], mesh: "jax.sharding.AbstractMesh | None",
                   in_types: tuple = ()) -> Executable:
        """Returns the compiled function `fn` for these arguments, traced under `mesh` with their types sharded
        by `in_types` (see `compile_function`), compiling it once."""
        key = (fn, in_tree, tuple(map(signature_of, in_avals)), mesh, in_types)
        if key not in self._executables:
            self._executables[key] = compile_function(self.symbol(name_of(fn)), fn, in_tree, list(in_avals), mesh,
                                                      in_types)
        return self._executables[key]

    def kept(self) -> tuple:
        """The functions kept in this process that the module's compiled functions name (those that call back
        to the host): its `Lowered` holds them."""
        return tuple(e.kept for e in self._executables.values() if e.kept is not None)

    def finish(self) -> None:
        """Puts the slices and compiled functions before the programs, and verifies the module. An elastic
        slice is declared at the largest shape of its range that divides every value sharded over it."""
        values = sharded_on(self.module.operation) if any(s.elastic for s in self._slices) else {}
        anchor = ir.InsertionPoint(self.module.body.operations[0])
        with anchor:
            for s, name in self._slices.items():
                declared = s.declared(name)
                if s.elastic:
                    declared = _dividing(declared, values.get(name, ()), s.site)
                declared.build(loc=s.site.location() if s.site else None)
        for executable in self._executables.values():
            anchor.insert(executable.op)
        self.module.operation.verify()


def _dividing(declared: ops.VirtualSlice, values: Sequence, site: Site | None) -> ops.VirtualSlice:
    """Returns an elastic slice at the largest shape of its range that divides `values`, its largest shape
    kept as `max_shape`; raises PlacementError at the slice's site if no shape does."""
    shapes = declared.shapes(values)
    if not shapes:
        low, high = declared.shape_range
        raise PlacementError(f"{site or 'virtual_slice'}: no shape of slice @{declared.name} between {list(low)} "
                             f"and {list(high)} divides every value sharded over it")
    if shapes[0] == declared.shape:
        return declared
    return dataclasses.replace(declared, shape=shapes[0],
                               constraints={**declared.constraints, "max_shape": declared.shape})


class ProgramBuilder:
    """One pw program being traced: a `func.func {pw.program}` and the values that belong to it."""

    def __init__(self, module: ModuleBuilder, base_name: str, in_avals: Sequence[jax.ShapeDtypeStruct],
                 site: Site, donated: Sequence[bool] = ()):
        self.module = module
        self.name = module.symbol(base_name)
        self.site = site
        with ir.InsertionPoint(module.module.body), site.location():
            self.func = func.FuncOp(self.name, ir.FunctionType.get([tensor_type(a) for a in in_avals], []))
        ops.set_attr(self.func, ops.PROGRAM, None)
        if any(donated):
            ops.set_attr(self.func, "arg_attrs", [{ops.DONATED: None} if d else {} for d in donated])
        self.block = self.func.add_entry_block()
        self.arguments = self.values(self.block.arguments, in_avals, "argument")

    def values(self, ir_values: Sequence[ir.Value], avals: Sequence[jax.ShapeDtypeStruct],
               origin: str) -> list[Value]:
        """Wraps the results of an op (named `origin` in messages) as values of this program."""
        return [Value(v, a, self, f"{origin} #{i}") for i, (v, a) in enumerate(zip(ir_values, avals))]

    def own(self, x: Any, site: Site, what: str,
            constants: str = "a constant too: compute it in a placed function") -> Value:
        """Returns `x` if it is a value of this program, else raises an error naming `site` (and saying how to
        give `constants`)."""
        if not isinstance(x, Value):
            kind = "a JAX array" if isinstance(x, jax.Array) else "a NumPy array" if isinstance(x, np.ndarray) \
                else f"a {type(x).__name__}"
            raise TypeError(f"{site}: {what} is {kind}, not a program value: pass program arguments or results "
                            f"of placed functions ({constants})")
        if x._program is not self:
            raise PlacementError(
                f"{site}: {what} is {x!r}, a value of another trace than program @{self.name}: "
                f"pass values into a program as arguments, and into cond branches as operands")
        return x

    def trace(self, fn: Callable, in_tree: jax.tree_util.PyTreeDef
              ) -> tuple[jax.tree_util.PyTreeDef, list[jax.ShapeDtypeStruct]]:
        """Runs `fn` on the program's arguments (tree `in_tree` of `(args, kwargs)`), returns its
        result structure and shapes."""
        token = _TRACING.set(self)
        try:
            args, kwargs = jax.tree_util.tree_unflatten(in_tree, self.arguments)
            result = fn(*args, **kwargs)
        finally:
            _TRACING.reset(token)
        leaves, out_tree = jax.tree_util.tree_flatten_with_path(result)
        values = [self.own(x, self.site, f"result{jax.tree_util.keystr(path)}") for path, x in leaves]
        with ir.InsertionPoint(self.block), self.site.location():
            func.ReturnOp([v.ir_value for v in values])
        self.func.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
            [a.type for a in self.block.arguments], [v.ir_value.type for v in values]))
        return out_tree, [v.aval for v in values]


def current_program() -> ProgramBuilder | None:
    """Returns the program being traced, or None outside a trace."""
    return _TRACING.get()


@contextmanager
def lowering(site: Site, slice_name: str) -> Iterator[None]:
    """Marks the call at `site` as being lowered for slice `slice_name` (for error messages)."""
    token = _LOWERING.set((site, slice_name))
    try:
        yield
    finally:
        _LOWERING.reset(token)


def lower(site: Site, fn: Callable, example: Any, donated: tuple[bool, ...] = ()) -> Lowered:
    """Traces `fn(*args, **kwargs)` for `example = (args, kwargs)` into a new pw module whose entry
    program is named `site.name`; `donated` marks the donated leaves of `example`."""
    leaves, in_tree = jax.tree_util.tree_flatten_with_path(example)
    in_avals = []
    for path, x in leaves:
        try:
            aval = aval_of(x)
        except TypeError as e:
            raise TypeError(f"{site}: example {argument_name(path)}: {e}") from None
        check_element_type(aval.dtype, f"{site}: example {argument_name(path)}")
        in_avals.append(aval)
    module = ModuleBuilder()
    with module.context, ir.Location.unknown():
        program = ProgramBuilder(module, site.name, in_avals, site, donated)
        out_tree, out_avals = program.trace(fn, in_tree)
        module.finish()
    return Lowered(module.module, program.name, in_tree, tuple(in_avals), out_tree, tuple(out_avals),
                   donated if any(donated) else (), module.kept())


class Program(StagedFunction):
    """A Python function traced as one pw program; see `program`."""

    def __init__(self, fn: Callable, **options: Any):
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._signature = Signature(fn, f"program {name_of(fn)}", **options)
        self._stages = StageCache(self._lower, self._signature)

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Traces the program for arguments of these shapes (arrays, scalars or `jax.ShapeDtypeStruct`s)
        and these static values."""
        return self._lower(self._signature.split(args, kwargs))

    def _lower(self, call: Call) -> Lowered:
        return lower(Site.of_definition(self._fn), self._signature.bound(call.static), call.tree,
                     self._signature.donated(call))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the program on the cluster (results are handles); inside another trace, inlines it.

        Inside a JAX transformation (`jax.jit`, `jax.grad`, ...), it is its
        Python function, and the placed functions it calls trace as theirs;
        so it is under `jax.disable_jit()`, where they run eagerly.
        """
        if not kwargs and current_program() is None:     # (keywords may be `run`'s options)
            return self._stages.run(args, kwargs, "parallel", traced=self._fn)
        if current_program() is not None or jax.config.jax_disable_jit or has_tracers((args, kwargs)):
            return self._fn(*args, **kwargs)
        return self._call(args, kwargs)


def program(fn: Callable | None = None, /, *, static_argnums=None, static_argnames=None,
            donate_argnums=None, donate_argnames=None, **jit_options: Any) -> Program | Callable:
    """Marks `fn` as a Pathways program: its calls of placed functions trace into one pw program.

        @pathways_mlir.program
        def step(x):
            return block_b(block_a(x))

        step.lower(jax.ShapeDtypeStruct((8, 16), jnp.float32)).as_text()

    Static and donated arguments are named as in `jax.jit` (`static_argnums`,
    `static_argnames`, `donate_argnums`, `donate_argnames`); with them and no
    `fn`, returns a decorator. Keyword arguments are traced like positional ones.
    """
    check_options("pathways_mlir.program", jit_options)
    options = dict(static_argnums=static_argnums, static_argnames=static_argnames,
                   donate_argnums=donate_argnums, donate_argnames=donate_argnames)
    if fn is None:
        return functools.partial(program, **options)
    return Program(fn, **options)

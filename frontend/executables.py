"""Compiled functions: a Python function lowered once for each signature.

A placed function called with global argument shapes becomes one executable,
a nested `module @name attributes {pw.executable, pw.export = "..."}` that
holds the StableHLO of `jax.jit(fn).lower(*global_avals)` (entry `@main`)
and, in `pw.export`, base64 of the `jax.export` serialisation of the same
function. Both are lowered for one device with global shapes: they have
unsharded semantics and do not depend on any slice, so a runtime runs the
export on a mesh of any size as

    exported = jax.export.deserialize(base64.b64decode(blob))
    jax.jit(exported.call, in_shardings=..., out_shardings=...)

The exception is code that names its slice's axes (`jax.shard_map`,
collectives, `with_sharding_constraint(x, P("data"))`): the function is
traced under the slice's abstract mesh (never a mesh the caller set with
`jax.set_mesh` for its own code), so such code lowers to Shardy ops
on that mesh (an `sdy.mesh` in the module), and runs on a mesh of the
slice's shape only (`ops.names_its_mesh`). Code that names no axis lowers
as it would without the mesh.

Executables take and return flat leaves: the export is of `fn` wrapped to
take its arguments' leaves and return its results' leaves, so the operands of
a `pw.compute` are the export's positional arguments in order and its results
the export's results. Typed PRNG keys cross as their key data: the export
wraps key arguments and unwraps key results (see `avals`). The tree structures (optax states, flax structs,
dataclasses, NamedTuples, None) stay on the client, in `Executable.out_tree`
and the program's `Lowered`, and nothing about them is serialised.
"""

from __future__ import annotations

import base64
import contextlib
import sys
import warnings
from dataclasses import dataclass
from typing import Callable

import jax
from jax._src import api_util  # the debug info JAX names a traced function and its arguments by
from jax._src import config as jax_config  # the location option has no public context manager
from mlir import ir

from pathways_mlir.dialect import ops
from pathways_mlir.runtime.executables import InProcessFunction, keep_in_process, without_context_mesh

from .avals import aval_of, check_element_type, is_extended, wire_aval, wrap_keys
from .errors import PlacementError
from .provenance import Site


@dataclass(frozen=True)
class Executable:
    """One compiled function: its nested module and its result signature."""

    symbol: str
    op: ir.Operation  # detached until the pw module is assembled
    out_tree: jax.tree_util.PyTreeDef
    out_avals: tuple[jax.ShapeDtypeStruct, ...]
    result_types: tuple[ir.Type, ...]
    # Per result, the PartitionSpec over the slice's axes that its type gives (Explicit axes) or the function's
    # last op on it constrains it to (`with_sharding_constraint(r, P("data"))`), or None: where it lands unless
    # out_specs says otherwise.
    out_constraints: tuple[jax.sharding.PartitionSpec | None, ...]
    # The function kept in this process that its export names, if it calls back to the host: held by the
    # `Lowered` of the trace (the process keeps it only while something holds it, `keep_in_process`).
    kept: InProcessFunction | None = None


def compile_function(symbol: str, fn: Callable, in_tree: jax.tree_util.PyTreeDef,
                     in_avals: list[jax.ShapeDtypeStruct], mesh: jax.sharding.AbstractMesh | None,
                     in_types: tuple[jax.sharding.PartitionSpec, ...] = ()) -> Executable:
    """Lowers `fn` for global argument shapes into executable `symbol` (needs an active context).

    `in_tree` is the structure of `(args, kwargs)`, as `jax.jit`'s. `fn` is traced under `mesh`, its slice's
    axes (None: no mesh), as `jax.jit` traces under `jax.set_mesh`: code that names the axes
    (`jax.shard_map`, `jax.lax.psum`, `with_sharding_constraint(x, P("data"))`) lowers to Shardy ops on
    that mesh, and code that does not lowers as it would without one. On a mesh with `Explicit` axes,
    `in_types` gives each argument leaf's sharding over them (of its wire value, `explicit_types`): its type
    carries it, as JAX's explicit sharding mode has it, and each result's type gives where it lands
    (`Executable.out_constraints`); the export then names the mesh's devices (`jax.export`'s `nr_devices`),
    so it runs on a mesh of the slice's shape only.
    """
    traced = []          # the result tree and the results' abstract values, as `fn` returns them

    def _result_aval(r, path) -> jax.ShapeDtypeStruct:
        try:
            return aval_of(jax.typeof(r))
        except TypeError:        # (JAX's own message calls it an argument)
            raise TypeError(f"{Site.of_definition(fn)}: result{jax.tree_util.keystr(path)} is a "
                            f"{type(r).__name__}, which is not a valid JAX type: a function returns arrays and "
                            f"scalars, as for jax.jit") from None

    def flat(*wire_leaves):
        leaves = [wrap_keys(x, a.dtype) if is_extended(a.dtype) else x for x, a in zip(wire_leaves, in_avals)]
        args, kwargs = jax.tree_util.tree_unflatten(in_tree, leaves)
        with_paths, out_tree = jax.tree_util.tree_flatten_with_path(fn(*args, **kwargs))
        result_leaves = [r for _, r in with_paths]
        out_avals = tuple(map(_result_aval, result_leaves, [path for path, _ in with_paths]))
        for (path, _), a in zip(with_paths, out_avals):
            check_element_type(a.dtype, f"{Site.of_definition(fn)}: result{jax.tree_util.keystr(path)}")
        if not traced:       # (a function kept in process is traced again where its island compiles it)
            warn_of_lost_changes(fn, leaves, (args, kwargs), result_leaves)
            typed = tuple(jax.typeof(r).sharding.spec if in_types else None for r in result_leaves)
            traced.append((out_tree, out_avals, typed))
        return tuple(jax.random.key_data(r) if is_extended(a.dtype) else r for r, a in zip(result_leaves, out_avals))

    # JAX's messages of a failing trace ("while tracing the function f at f.py:3 for jit ... the argument x")
    # name `fn` and its arguments, as `jax.jit(fn)`'s do, not this wrapper and its leaves.
    flat.__fun_debug_info__ = api_util.debug_info("jit", fn, *jax.tree_util.tree_unflatten(in_tree, in_avals))
    # Unused arguments stay, so the signature is that of the pw.compute. Ops
    # are located at their line in `fn` only, not the whole Python stack of the
    # trace, so the same function exports to the same bytes wherever it is traced.
    jitted = jax.jit(flat, keep_unused=True)
    typed = [jax.sharding.NamedSharding(mesh, spec) for spec in in_types] or [None] * len(in_avals)
    wire = [jax.ShapeDtypeStruct(w.shape, w.dtype, weak_type=a.weak_type, sharding=sharding)
            for w, a, sharding in zip(map(wire_aval, in_avals), in_avals, typed)]
    with jax_config.include_full_tracebacks_in_locations(False), _under(mesh):
        trace = jitted.trace(*wire)
        # (JAX lowers a trace whose types name an abstract mesh only for platforms it is told: the export's)
        platforms = {"lowering_platforms": (jax.default_backend(),)} if in_types else {}
        stablehlo = _calls_inlined_in_manual_computations(
            trace.lower(**platforms).compiler_ir("stablehlo").operation.get_asm(print_generic_op_form=True))
        devices = mesh.size if in_types else 1
        export = _export(fn, jitted, wire, devices)
        kept = None
        if export is None:        # it calls back to the host: kept in this process, its export naming it
            kept = _kept(jitted, mesh, wire, traced[0][1])
            export = keep_in_process(kept)

    parsed = ir.Module.parse(stablehlo)
    op = ir.Operation.create("builtin.module", regions=1, loc=Site.of_definition(fn).location(), ip=False)
    body = op.regions[0].blocks.append()
    for name in parsed.operation.attributes:
        if name != "sym_name":
            op.attributes[name] = parsed.operation.attributes[name]
    op.attributes["sym_name"] = ir.StringAttr.get(symbol)
    ops.set_attr(op, ops.EXECUTABLE, None)
    ops.set_attr(op, ops.EXPORT, export)
    for child in list(parsed.body.operations):
        child.detach_from_parent()
        ir.InsertionPoint(body).insert(child)

    entry = ops.function_type(ops.executable_entry(op))
    if any(str(t) == "!stablehlo.token" for t in entry.inputs):
        raise NotImplementedError(f"{Site.of_definition(fn)} has an ordered effect (io_callback(..., ordered=True)), "
                                  f"which threads a token through its computation: a placed function takes and "
                                  f"returns arrays only; use ordered=False")
    out_tree, out_avals, out_types = traced[0]
    constrained = _constrained(trace.jaxpr.jaxpr, mesh)
    return Executable(symbol, op, out_tree, out_avals, tuple(entry.results),
                      tuple(t if t is not None and any(t) else c for t, c in zip(out_types, constrained)), kept)


def _calls_inlined_in_manual_computations(stablehlo: str) -> str:
    """`stablehlo` (generic form) with every function call inside a `jax.shard_map` body (an
    `sdy.manual_computation`) replaced by the callee's ops. JAX lowers a helper it jits (`jax.nn.relu`,
    `jnp.cumsum`, a user's `jax.jit` function) to a `func.call`; pw's MLIR context does not know the `sdy`
    dialect, so it takes the unregistered op for a symbol table of its own and finds no callee there, and the
    module did not parse. The callees stay, as JAX wrote them; what runs is the export, not this text."""
    if '"sdy.manual_computation"' not in stablehlo or '"func.call"' not in stablehlo:
        return stablehlo
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir import ir as jax_ir

    with jax_mlir.make_ir_context():
        module = jax_ir.Module.parse(stablehlo)
        functions = {jax_ir.StringAttr(op.attributes["sym_name"]).value: op.operation
                     for op in module.body.operations if op.operation.name == "func.func"}

        def manual_calls(op, inside: bool):
            for region in op.regions:
                for block in region.blocks:
                    for child in block.operations:
                        child = child.operation
                        if inside and child.name == "func.call":
                            yield child
                        yield from manual_calls(child, inside or child.name == "sdy.manual_computation")

        while calls := [call for function in functions.values() for call in manual_calls(function, False)]:
            for call in calls:                   # (a callee's own calls are inlined in the next round)
                callee = functions[jax_ir.FlatSymbolRefAttr(call.attributes["callee"]).value]
                copy = callee.clone(ip=jax_ir.InsertionPoint(call))
                block = copy.regions[0].blocks[0]
                for argument, operand in zip(block.arguments, call.operands):
                    argument.replace_all_uses_with(operand)
                *body, ret = [op.operation for op in block.operations]
                for op in body:
                    op.move_before(call)
                for result, value in zip(call.results, ret.operands):
                    result.replace_all_uses_with(value)
                call.erase()
                copy.erase()
        return module.operation.get_asm(print_generic_op_form=True)


@contextlib.contextmanager
def _under(mesh: jax.sharding.AbstractMesh | None):
    """The context a placed function is traced in: no mesh the caller set for its own code, and `mesh`, its
    slice's axes (None: no mesh), as JAX's abstract mesh."""
    with without_context_mesh(), (jax.sharding.use_abstract_mesh(mesh) if mesh is not None else
                                  contextlib.nullcontext()):
        yield


def _constrained(jaxpr, mesh: jax.sharding.AbstractMesh | None) -> tuple[jax.sharding.PartitionSpec | None, ...]:
    """The `PartitionSpec` over `mesh`'s axes that each result of `jaxpr` is made by a sharding constraint with
    (the function's last word on where it lies), or None."""
    made = {id(v): e.params["sharding"] for e in jaxpr.eqns if e.primitive.name == "sharding_constraint"
            for v in e.outvars}
    specs = []
    for v in jaxpr.outvars:
        sharding = made.get(id(v))
        on_slice = isinstance(sharding, jax.sharding.NamedSharding) and mesh is not None and \
            dict(sharding.mesh.shape) == dict(mesh.shape)
        chosen = on_slice and jax.sharding.PartitionSpec.UNCONSTRAINED not in sharding.spec   # (XLA's to choose)
        specs.append(sharding.spec if chosen else None)
    return tuple(specs)


def _export(fn: Callable, jitted, wire: list, devices: int) -> str | None:
    """Returns the `pw.export` of `jitted` (`fn`'s) for `wire`: base64 of its `jax.export` serialisation (for
    `devices` devices: 1, or its slice's when its arguments' types are sharded), or None if it calls back to
    the host (`jax.debug.print`, `jax.debug.callback`, `pure_callback`, `io_callback`), which `jax.export`
    cannot serialise: the caller keeps it in this process (not for sharded types: its island would call it on
    values of its own mesh, whose `Auto` axes its types do not name)."""
    try:
        exported = jax.export.export(jitted)(*wire)
    except NotImplementedError as error:
        if "host_callbacks" not in str(error):
            raise
        if devices != 1:
            raise NotImplementedError(f"{Site.of_definition(fn)} calls back to the host (jax.debug.print, "
                                      f"jax.debug.callback, pure_callback or io_callback) on a slice with Explicit "
                                      f"axes, which is not supported: give that function a slice of Auto axes, or "
                                      f"return the values and print them from the handles") from None
        return None
    if exported.nr_devices != devices:
        raise PlacementError(f"{Site.of_definition(fn)} places values on {exported.nr_devices} devices of its own "
                             f"(a NamedSharding of a concrete Mesh in with_sharding_constraint, or a device_put): "
                             f"inside a placed function, name its slice's axes with a PartitionSpec instead "
                             f"(with_sharding_constraint(x, P('data'))); placement chooses the devices")
    return base64.b64encode(exported.serialize()).decode("ascii")


def _kept(jitted, mesh: jax.sharding.AbstractMesh | None, wire: list, out_avals: tuple) -> InProcessFunction:
    """The function to keep in this process for `jitted` (traced on `wire`, its results `out_avals`), called
    where an embedded island compiles it, under the slice's axes as it was traced."""
    def call(*leaves):
        with _under(mesh):
            return jitted(*leaves)
    return InProcessFunction(call, tuple(wire), tuple(map(wire_aval, out_avals)))


def warn_of_lost_changes(fn: Callable, leaves: list, arguments: tuple, result_leaves: list) -> None:
    """Warns when `fn`, traced on `leaves` unflattened into `arguments` (`(args, kwargs)`), set values of the
    flax NNX objects among its arguments in place that it does not return.

    A flax NNX step written for `nnx.jit` updates its model and optimizer in
    place (`optimizer.update(model, grads)`); under `jax.jit`, and so here,
    those objects are rebuilt inside the trace and the caller's keep their old
    values, so such a step trains nothing. A value changed this way is a leaf
    of an NNX graph node (a `Module`, `Optimizer`, `Rngs`, `Variable`, ...)
    among the arguments after the call that is neither one of `leaves` nor
    among `result_leaves`. A change to a plain pytree (a batch dict, an optax
    state's `hyperparams`) is lost under `nnx.jit` too, as under `jax.jit`,
    and is left alone: code that makes one is correct `jax.jit` code.
    """
    graph = sys.modules.get("flax.nnx.graph")
    if graph is None:            # (no NNX object exists before flax's NNX is imported)
        return
    given, returned = {id(x) for x in leaves}, {id(r) for r in result_leaves}
    changed = [at + path
               for at, node in jax.tree_util.tree_flatten_with_path(arguments, is_leaf=graph.is_graph_node)[0]
               if graph.is_graph_node(node)
               for path, x in jax.tree_util.tree_flatten_with_path(node)[0]
               if id(x) not in given and id(x) not in returned]
    if not changed:
        return
    names = [(f"argument {path[1].idx}" if path[0].idx == 0 else f"keyword argument {path[1].key}")
             + jax.tree_util.keystr(path[2:]) for path in changed]
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    site = Site.of_definition(fn)
    warnings.warn_explicit(f"{site.name} changes its arguments in place without returning them "
                           f"({', '.join(names[:3])}{more}): as under jax.jit, the caller's objects keep their old "
                           f"values; return what it changes (`return model, optimizer, loss`) and use what the "
                           f"call returns", UserWarning, site.file, site.line)

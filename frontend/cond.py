"""Data-dependent steps: the host reads a computed predicate and picks the program to run next."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import jax
from mlir import ir

from pathways_mlir.dialect import ops

from . import tracer
from .avals import format_aval, has_tracers, is_extended
from .provenance import Site, name_of


def cond(pred: tracer.Value, true_fn: Callable, false_fn: Callable, *operands: Any) -> Any:
    """Runs `true_fn(*operands)` if the computed scalar `pred` is true, else `false_fn(*operands)`.

    Use inside a program, like `jax.lax.cond`; `pred` is a boolean, integer
    or float scalar, true when nonzero, as there. Both branches are traced, each
    into its own program (a `func.func {pw.program}` named after the branch
    function), and the call becomes one `pw.cond` op. Branches see only their
    operands: pass every value a branch uses as an operand. Both must return
    the same structure of shapes and dtypes; their weak types may differ: a
    result's is `false_fn`'s, as `jax.lax.cond` gives it.

    This is a host decision: the host must read `pred` back from the devices
    before it can dispatch either branch, so nothing after the `pw.cond` can
    be dispatched ahead of the computation that produces `pred`. Static
    subgraphs end at a cond.

    Inside a JAX transformation of a program (`jax.jit`, `jax.grad`,
    `jax.eval_shape`, ...), where the program is its Python function, it is
    `jax.lax.cond`; so it is under `jax.disable_jit()`, where the program runs
    eagerly and `jax.lax.cond` runs the branch that `pred` picks.
    """
    site = Site.of_call("cond", inspect.currentframe().f_back)
    program = tracer.current_program()
    if program is None and (jax.config.jax_disable_jit or has_tracers((pred, operands))):
        return jax.lax.cond(pred, true_fn, false_fn, *operands)
    if program is None:
        raise RuntimeError(f"{site}: pathways_mlir.cond works only inside a @pathways_mlir.program trace")
    pred = program.own(pred, site, "the predicate")
    if pred.shape != () or is_extended(pred.dtype) or pred.dtype.kind not in "biuf":
        raise TypeError(f"{site}: the predicate must be a scalar boolean or number, not {format_aval(pred.aval)}")
    leaves = jax.tree_util.tree_flatten_with_path(operands)[0]
    in_tree = jax.tree_util.tree_structure((operands, {}))
    inputs = [program.own(x, site, f"operand{jax.tree_util.keystr(path)}") for path, x in leaves]
    in_avals = [v.aval for v in inputs]

    branches = []
    for fn in (true_fn, false_fn):
        branch = tracer.ProgramBuilder(program.module, name_of(fn), in_avals, Site.of_definition(fn))
        branches.append((branch, *branch.trace(fn, in_tree)))
    (then, then_tree, then_avals), (else_, else_tree, else_avals) = branches
    if then_tree != else_tree or [(a.shape, a.dtype) for a in then_avals] != [(a.shape, a.dtype) for a in else_avals]:
        raise TypeError(f"{site}: the branches return different structures or shapes: "
                        f"{name_of(true_fn)} returns {_describe(then_tree, then_avals)} but "
                        f"{name_of(false_fn)} returns {_describe(else_tree, else_avals)}")

    label = program.module.label("cond")
    with ir.InsertionPoint(program.block):
        op = ops.build_cond(pred.ir_value, [v.ir_value for v in inputs],
                            ops.function_type(then.func.operation).results,
                            then.name, else_.name, label, loc=site.location())
    return jax.tree_util.tree_unflatten(then_tree, program.values(op.results, else_avals, f"{label} result"))


def _describe(tree: jax.tree_util.PyTreeDef, avals: list) -> str:
    return str(jax.tree_util.tree_unflatten(tree, [format_aval(a) for a in avals]))

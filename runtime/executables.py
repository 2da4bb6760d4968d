"""Compiled functions, compiled once per device set.

A plan's executables are `jax.export` serialisations of the user's functions
with global (unsharded) semantics, or, for a function that calls back to the
host (`jax.debug.print`, `pure_callback`, ...), which no serialisation can
hold, a token naming the function kept in the process that traced it
(`keep_in_process`): only islands in that process (the embedded backend's)
run it. To run one on a slice, the cache wraps it
in `jax.jit` with the launch's input and output shardings over the slice's
mesh and compiles it ahead of time; the result is kept per (executable,
devices, shardings), so a program run many times compiles each computation
once. A launch calls the compiled executable itself (JAX's `Compiled`, through
its C++ fast path), not the `jax.jit` function, which would trace again for an
argument whose type names no mesh (a NumPy array, an array on the one device of
a slice) where the compiled inputs' types name the slice's, and so compile the
computation a second time, on the island's thread, at its first call. A launch
with a 4-bit input (`SUB_BYTE_TYPES`) calls the `jax.jit` function still:
XLA:CPU packs such an array in its executables but not in `jax.device_put`'s,
which `Compiled` refuses as laid out otherwise. A launch that is the last
reader of a donated input (`memory_plan.donated_at`) is compiled with that
argument donated, as `jax.jit` compiles it: XLA writes a result into its
buffer where one fits, and the array passed is deleted then.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import threading
import uuid
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import jax                 # before jaxlib's own module: imported first, jaxlib leaves XLA's C++ logging printing
import numpy as np         # INFO lines when the backend starts
# JAX's array class (importing it starts no backend): the fast paths check their arguments' type against it,
# where `isinstance(x, jax.Array)` runs Python (about 2 us here).
from jax._src import config as jax_config   # the thread's context mesh: no public reader without a call
from jax._src.export import _export as jax_export_internals      # caches of traced `Exported.call`s
from jax._src.interpreters import partial_eval as jax_partial_eval  # (`_forget_exported_calls`)
from jax._src.interpreters import pxla as jax_pxla   # the executable a `Compiled` runs (`direct_call`)
from jaxlib._jax import ArrayImpl

from pathways_mlir.dialect.element_types import NUMPY_NAMES, SUB_BYTE_TYPES
from pathways_mlir.dialect.plan import ProgramPlan

ARRAY_TYPE = ArrayImpl   # what the fast paths compare `type(x)` with


def without_context_mesh():
    """A context with no mesh set on this thread (`jax.set_mesh(None)`), or nothing to do if none is: the
    runtime's computations run on their slices' meshes on a caller's thread too (inline), where JAX would
    check them against a mesh the caller set for its own code and refuse their devices."""
    return _UNCHANGED if jax.sharding.get_abstract_mesh().empty else jax.set_mesh(None)


# What `jax.sharding.get_abstract_mesh` reads: `CONTEXT_MESH.value` is the mesh set on this thread, or None (then
# the empty one). A fast path looks at it without a call, and calls `without_context_mesh` only if one is set.
CONTEXT_MESH = jax_config.abstract_mesh_context_manager


_UNCHANGED = contextlib.nullcontext()


def keep_64_bit_values() -> None:
    """Turns on JAX's 64-bit types in a process that hosts islands for others (`pw-serve`, a Ray island
    actor). Arrays and executables arrive typed; without it JAX would narrow a client's 64-bit arrays (a
    client with `jax_enable_x64`) to 32 bits, and its executables would refuse them."""
    jax.config.update("jax_enable_x64", True)


class MissingExecutable(ValueError):
    """A plan launches an executable that carries no `jax.export` serialisation."""


# The HLO instructions of collectives among an execution's devices (as the compiled module prints them).
COLLECTIVES = ("all-reduce", "all-reduce-start", "all-gather", "all-gather-start", "reduce-scatter", "all-to-all",
               "ragged-all-to-all", "collective-permute", "collective-permute-start", "collective-broadcast")

IN_PROCESS = "in-process:"    # how a `pw.export` naming a function kept in this process begins (never base64)


@dataclass(frozen=True)
class InProcessFunction:
    """A traced function kept in the process that traced it instead of serialised, because it calls back to
    the host: `call` takes the flat argument leaves and returns the flat result leaves (key data for keys),
    `in_avals` and `out_avals` are theirs, as a `jax.export.Exported`'s."""

    call: Callable
    in_avals: tuple
    out_avals: tuple


# Every such function traced in this process that something still holds: the `Lowered` traced with it and the
# runtime's record of each loaded plan naming it (`kept_by`), so that it goes, with its jitted function and all
# JAX caches on it, once the program and its plans do (about 4 MB each, kept till exit before).
_KEPT: weakref.WeakValueDictionary[str, InProcessFunction] = weakref.WeakValueDictionary()


def keep_in_process(function: InProcessFunction) -> str:
    """Keeps `function` in this process for as long as the caller holds it; returns the `pw.export` naming it."""
    token = IN_PROCESS + uuid.uuid4().hex
    _KEPT[token] = function
    return token


def kept_in_process(blob: str) -> InProcessFunction | None:
    """The function a `pw.export` of `keep_in_process` names, if this process traced it; None if not."""
    return _KEPT.get(blob)


def is_in_process(blob: str) -> bool:
    """Whether a `pw.export` names a function kept in its tracing process rather than serialising one."""
    return blob.startswith(IN_PROCESS)


def kept_by(plan: ProgramPlan) -> tuple[InProcessFunction, ...]:
    """The functions kept in this process that `plan` and its branch plans name (those this process still
    keeps): whoever holds them keeps the plan runnable, its executables compiled again on an island restored."""
    kept = [kept_in_process(blob) for blob in plan.executables.values() if is_in_process(blob)]
    branches = [f for step in plan.host_steps for branch in (step.then_plan, step.else_plan) for f in kept_by(branch)]
    return tuple(f for f in kept if f is not None) + tuple(branches)


@functools.cache                  # a handle's dtype is asked for at every call it is passed to
def numpy_dtype(element_type: str):
    """Returns the NumPy dtype of an MLIR element type name ("f32", "bf16", "i1", ...)."""
    import jax.numpy as jnp

    name = NUMPY_NAMES.get(element_type)
    if name is None:
        raise ValueError(f"element type {element_type} has no NumPy equivalent")
    return jnp.dtype(name)


def native_dtype(dtype):
    """A NumPy `dtype` in this machine's byte order (an extended one as it is): a NumPy array read from a file
    or a socket may be big-endian (`>f4`), which JAX's operations do not take."""
    return dtype if getattr(dtype, "isnative", True) else dtype.newbyteorder("=")


def named_sharding(mesh, sharding: Sequence[Sequence[str]]):
    """Returns the `NamedSharding` of a pw sharding over `mesh`."""
    from jax.sharding import NamedSharding, PartitionSpec

    spec = [None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in sharding]
    return NamedSharding(mesh, PartitionSpec(*spec))


def host_data_array():
    """An empty JAX array made here from host data: it lies where a value a plan keeps on the host (an argument
    returned as it is, a cond's result), or one fetched from another process, lies once read as a JAX array
    (`RunResult.result`: `jnp.asarray`, on the default device, uncommitted)."""
    import jax.numpy as jnp

    return jnp.zeros((0,), np.uint8)


def make_mesh(devices: Sequence, shape: Sequence[int], axes: Sequence[str]):
    """Returns the JAX mesh of a slice's devices in mesh order."""
    from jax.sharding import Mesh

    return Mesh(np.array(devices, dtype=object).reshape(tuple(shape)), tuple(axes))


class ExecutableCache:
    """Compiled executables keyed by (name, mesh: its devices, shape and axes, shardings, shapes), each kept
    while an island program calls it (weakly: a plan unloaded takes the executables only it used along)."""

    def __init__(self):
        self._compiled: weakref.WeakValueDictionary[tuple, Callable] = weakref.WeakValueDictionary()
        self._collective: weakref.WeakSet[Callable] = weakref.WeakSet()
        self._lock = threading.Lock()
        self.compilations = 0

    def collective(self, compiled: Callable) -> bool:
        """Whether a function this cache compiled runs a collective (an all-reduce, all-gather, ...) among its
        devices: XLA:CPU's collectives wait for every device's part of one execution (`IN_FLIGHT`)."""
        return compiled in self._collective

    def get(self, name: str, plan: ProgramPlan, mesh, inputs: Sequence[int], outputs: Sequence[int],
            donate: tuple[int, ...] = ()) -> Callable:
        """Returns the compiled function of a launch of `name` in `plan`, compiling it the first time;
        `donate` lists the positions of the arguments it may overwrite.

        A fused executable (`plan.fused`) compiles to one function that calls
        its parts in order, so XLA optimises across their boundaries; a
        call's `in_shardings` constrain its operands (copies inside it).
        """
        ins = [plan.buffers[b] for b in inputs]
        outs = [plan.buffers[b] for b in outputs]
        fused = plan.fused.get(name)
        parts = [c.callee for c in fused.calls] if fused else [name]
        key = (name, fused, tuple(hash(plan.executables.get(p, "")) for p in parts),
               tuple(d.id for d in mesh.devices.flat), mesh.devices.shape, mesh.axis_names,
               tuple(b.sharding for b in ins), tuple(b.sharding for b in outs),
               tuple((b.shape, b.dtype) for b in ins), donate)
        with self._lock:
            compiled = self._compiled.get(key)
        if compiled is not None:
            return compiled
        compiled, collective = self._compile(name, plan, mesh, ins, outs, donate)
        with self._lock:
            kept = self._compiled.get(key)
            if kept is None:
                self._compiled[key] = kept = compiled
                self.compilations += 1
                if collective:
                    self._collective.add(compiled)
            return kept

    @staticmethod
    def _compile(name: str, plan: ProgramPlan, mesh, inputs, outputs,
                 donate: tuple[int, ...]) -> tuple[Callable, bool]:
        """Returns the launch's function, compiled, and whether it runs a collective."""
        fused = plan.fused.get(name)
        if fused is None:
            body = _exported_call(name, plan.executables.get(name, ""))
        else:
            called = [(_exported_call(c.callee, plan.executables.get(c.callee, "")), c) for c in fused.calls]

            constraints = [tuple(named_sharding(mesh, s) for s in c.in_shardings) for c in fused.calls]

            def body(*leaves):
                values = list(leaves)
                for (call, c), shardings in zip(called, constraints):
                    operands = [values[i] for i in c.operands]
                    if shardings:          # a copy between slices (pw-fuse-island): a sharding constraint
                        operands = [jax.lax.with_sharding_constraint(v, s) for v, s in zip(operands, shardings)]
                    values.extend(call(*operands))
                return tuple(values[i] for i in fused.results)
        in_shardings = tuple(named_sharding(mesh, b.sharding) for b in inputs)
        out_shardings = tuple(named_sharding(mesh, b.sharding) for b in outputs)
        jitted = jax.jit(body, in_shardings=in_shardings, out_shardings=out_shardings, donate_argnums=donate)
        avals = [jax.ShapeDtypeStruct(b.shape, numpy_dtype(b.dtype), sharding=s)
                 for b, s in zip(inputs, in_shardings)]
        compiled = jitted.lower(*avals).compile()       # now: errors surface when the plan is loaded
        _forget_exported_calls()
        collective = any(f" {op}(" in compiled.as_text() for op in COLLECTIVES)
        if any(b.dtype in SUB_BYTE_TYPES for b in inputs):
            return jitted, collective       # it lays such an argument out as compiled; `Compiled` refuses it
        return compiled, collective


def direct_call(compiled: Callable) -> Callable:
    """Returns a function that runs `compiled` (a function `ExecutableCache.get` returned) by XLA's executable
    itself on arguments that lie on the shardings it was compiled for: the arrays go to its execution and
    its results come back through their handlers, as JAX's own call does once it has checked its arguments
    (about 0.4 us a call less than `Compiled`'s C++ call on one device, 3.1 against 3.5 us). It requires arguments
    no other code can reach, a run's own intermediates (`compile_steps`): XLA crashes the process on an array
    deleted while its execution starts. Anything else takes JAX's call: an argument of another type or
    sharding or deleted, debug checks on (`jax_debug_nans`/`infs`), and an executable JAX runs with more than
    its arguments (effects, host callbacks, constants, pruned or mutable arguments, a profiler) or returns
    other than a tuple of its results, which is then returned as it is. Relies on JAX 0.10's private
    `Compiled` internals (pinned); without them, `compiled`."""
    executable = getattr(getattr(compiled, "_executable", None), "unsafe_call", None)
    params = getattr(compiled, "_params", None)
    if type(executable) is not jax_pxla.ExecuteReplicated or params is None or params.const_args or \
            params.is_high or executable.ordered_effects or executable.has_unordered_effects or \
            executable.has_host_callbacks or executable.mut is not None or executable.pgle_profiler is not None \
            or executable.kept_var_idx != set(range(params.in_tree.num_leaves)) or \
            params.out_tree != jax.tree.structure((0,) * len(executable.out_handler.handlers)):
        return compiled          # (the last: results that are not one flat tuple, as the launches' are)
    execute, handlers = executable.xla_executable.execute_sharded, executable.out_handler.handlers
    debug_nans, debug_infs = jax_config.debug_nans, jax_config.debug_infs
    # The executable's own input shardings, not the homes of the buffers a plan passes: a launch may read a
    # buffer of another slice of its island, which JAX's call refuses, and XLA, handed it, crashed the process
    # (other devices) or read its shards as laid out otherwise (the same devices in another mesh order).
    shardings = tuple(executable.in_handler.in_shardings)
    # Per input, the sharding object its arrays were last found on, equal to its own: results of one
    # executable share one, and an identity check costs half an equality's.
    found = list(shardings)

    def on_input(position: int, array) -> bool:
        if type(array) is not ArrayImpl or array.is_deleted():
            return False
        if array.sharding is found[position]:
            return True
        if array.sharding != shardings[position]:
            return False
        found[position] = array.sharding
        return True

    if len(found) == 1:
        def call(array):              # `on_input` inlined for its common case: a launch's one argument
            if (type(array) is ArrayImpl and array.sharding is found[0] and not array.is_deleted()
                    or on_input(0, array)) and not debug_nans.value and not debug_infs.value:
                return execute([array]).consume_with_handlers(handlers)
            return compiled(array)
        return call

    def call(*args):
        if all(on_input(i, array) for i, array in enumerate(args)) and not debug_nans.value and \
                not debug_infs.value:
            return execute(list(args)).consume_with_handlers(handlers)
        return compiled(*args)
    return call


def _forget_exported_calls() -> None:
    """Empties JAX's two caches of result types that hold each traced `Exported.call`'s `Exported` (the whole
    serialised module, constants included; 4096 and 2048 entries): the compiled launch no longer needs them, and
    they outlived the plans, a service keeping every program any client ever loaded (2 MiB each for a program
    with 2 MiB of constants, found by a soak of pw-serve). The next trace of anything computes its result
    types again. The caches are private: a JAX without them has nothing to empty."""
    for cached in (getattr(jax_export_internals, "_call_exported_abstract_eval", None),
                   getattr(jax_partial_eval, "_cached_abstract_eval", None)):
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()


def _exported_call(name: str, export: str) -> Callable:
    """Returns a function of the export's flat argument leaves that returns its flat result leaves."""
    if not export:
        raise MissingExecutable(
            f"executable @{name} has no pw.export: lower it from JAX (pathways_mlir.jit) to run it")
    if is_in_process(export):
        kept = kept_in_process(export)
        if kept is None:
            raise MissingExecutable(f"executable @{name} calls back to the host and was traced in another "
                                    f"process: only the process that traced it runs it")
        return kept.call
    exported = jax.export.deserialize(bytearray(base64.b64decode(export)))

    def call(*leaves):
        args, kwargs = jax.tree.unflatten(exported.in_tree, leaves)
        return tuple(jax.tree.leaves(exported.call(*args, **kwargs)))
    return call

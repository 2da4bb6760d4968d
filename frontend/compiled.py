"""The last stage of the front end: a lowered program, lowered for a cluster and loaded on it.

JAX's stages are traced -> lowered -> compiled; ours are the same:

    lowered = step.lower(x)          # trace: device-agnostic pw IR (frontend/lowered.py)
    compiled = lowered.compile()     # place, insert transfers, emit plans, load them on the islands
    y = compiled(x)                  # one run: a lookup and one message per island

As with `jax.jit`, a program is traced for its arguments' shapes, dtypes
and weak types and for the values of its static arguments; Python scalars
are traced by type, never by value.

A `Compiled` belongs to one runtime. It lowers again, on its next call,
when the runtime's topology has changed since (a device removed or added),
so programs follow the cluster; on a service (`pw.connect`), when the
service refuses a run as lowered for an older topology. Calling a program or placed function
directly uses `StageCache`: one `Compiled` per runtime and call
signature, kept on the function itself (the `STAGE_CACHE_SIZE` most recently
used per runtime, until the runtime closes), so a repeated call never traces,
lowers or parses a plan again.
"""

from __future__ import annotations

import math
import operator
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import jax
import numpy as np
from jax._src.config import trace_context   # what jax.jit keys its cache on besides arguments

from pathways_mlir.runtime.array_reference import Reference
from pathways_mlir.runtime.client import Client, RefusedArgument, default_client, positions_by_identity
from pathways_mlir.runtime.dispatch import check_dtype
from pathways_mlir.runtime.executables import ARRAY_TYPE
from pathways_mlir.runtime.handles import Handle
from pathways_mlir.runtime.resource_manager import TopologyChanged
from pathways_mlir.runtime.runtime import get_runtime, on_close, refuse_forked

from .avals import ARRAYS, aval_of, has_tracers, is_extended, not_an_array, signature_of, trace_state_clean
from .errors import require_bool
from .lowered import Lowered
from .provenance import Site
from .signature import BindsAsMethod, Call, Signature, argument_name
from .wire import WeakHandle, from_wire, to_wire

if TYPE_CHECKING:
    from pathways_mlir.dialect.plan import ProgramPlan
    from pathways_mlir.runtime.interface import ClusterRuntime

_IDENTICAL = 64                      # signatures a stage cache keeps by identity (then it starts again)
STAGE_CACHE_SIZE = 4096              # stages a stage cache keeps per runtime, least recently used evicted (as jax.jit)


TOPOLOGY_TRIES = 8      # lowerings of a call whose cluster keeps changing under it before TopologyChanged is raised


@dataclass(frozen=True)
class MemoryAnalysis:
    """A compiled program's device memory, read from its plan: what admission reserves for one run.

    `peak_bytes` gives a run's static peak on each device of each range it uses ("island0 devices 0-3"),
    intermediates included; `peak_memory_in_bytes` is the largest (as JAX names one device's peak).
    `argument_bytes` and `output_bytes` count whole arrays, not one device's shards.
    """

    argument_bytes: int
    output_bytes: int
    peak_memory_in_bytes: int
    peak_bytes: dict[str, int]


class Compiled:
    """A program's plan on one runtime; calling it runs the program and returns handles.

    Like `jax.jit`'s compiled stage, it gives the lowered stage's `in_tree`,
    `out_tree`, `in_avals`, `args_info`, `out_info`, `donate_argnums` and
    `cost_analysis()`, and its own `as_text()` (the plans, as `pw-opt`
    prints them), `memory_analysis()`, `input_shardings` and
    `output_shardings`.
    """

    def __init__(self, lowered: Lowered, runtime: "ClusterRuntime"):
        self.lowered = lowered
        self.runtime = runtime
        self.plan = None
        self._version = -1
        # Reentrant: lowering again (`_refresh`) asks a service for its topology, which may first lower again a
        # run of this program that the service refused (`RemoteClient._send_again`, `_lowered_again`).
        self._lock = threading.RLock()
        # Whether a call whose arguments are arrays and handles, one leaf each, passes them as they are and
        # returns its handles (no key data to convert, nothing donated): `call_plain` then runs it, unwrapping
        # the `WeakHandle`s given for weakly typed arguments and wrapping the handles of weakly typed results,
        # as `to_wire` and `from_wire` do.
        self.plain = not any(lowered.donated) and \
            not any(is_extended(a.dtype) for a in lowered.in_avals_flat + lowered.out_avals_flat)
        self._weak_arguments = any(a.weak_type for a in lowered.in_avals_flat)
        self._weak_results = tuple(i for i, a in enumerate(lowered.out_avals_flat) if a.weak_type)
        # Whether the program returns one array (not a pytree of them): `()`, `None` and `{}` are leaf tree
        # definitions too, of no leaf.
        self._single = lowered.out_tree.num_leaves == 1 and jax.tree_util.treedef_is_leaf(lowered.out_tree)
        # The keyword arguments it was traced with: one named as a run option is the function's (`__call__`).
        self._keywords = frozenset(lowered.in_tree.unflatten([None] * lowered.in_tree.num_leaves)[1])
        self._refresh()

    def _refresh(self) -> None:
        """Lowers the program for the cluster as it is now and loads its plans, lowering again (up to
        `TOPOLOGY_TRIES` times in all) while the cluster changes between the lowering and the load (an island
        lost or back meanwhile): the first call of a program ran into `TopologyChanged` there, which told its
        caller to lower it again (found by a fault finder; it stopped `pw.ElasticTrainer`)."""
        for attempt in range(TOPOLOGY_TRIES):
            version, topology = self.runtime.resources.snapshot()
            plan = self.lowered.plan_on(topology)
            try:
                self.runtime.load(plan)
            except TopologyChanged:
                if attempt == TOPOLOGY_TRIES - 1:
                    raise
                continue
            self.plan, self._version = plan, version
            return

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the program on `args` and `kwargs` (shaped like the traced ones); returns handles.
        Keywords `client=`, `dispatch=` and `timeout=` (seconds, after which the run is cancelled if it is not
        over: its handles raise) are the run's options, unless the function was traced with a keyword argument
        of that name, as `StagedFunction._call` takes them.

        Static arguments are not passed again: they are part of the program.
        An argument leaf of another dtype or shape than the traced one, or a
        JAX tracer, is refused in one line, as `jax.jit`'s compiled stage
        refuses it. A donated handle is released once the run has taken it;
        using it again raises. A shared object (`SharedRef`) is read-only:
        donating one is refused before anything runs. A handle of another
        client than the run's is refused: other clients pass its owner's
        `owner.share(handle)`.
        """
        options = {name: kwargs.pop(name) for name in RUN_OPTIONS if name in kwargs and name not in self._keywords}
        return self._run(args, kwargs, options.get("client"), options.get("dispatch", "parallel"),
                         options.get("timeout"), matched=False)

    def _run(self, args: tuple, kwargs: dict, client, dispatch: str, timeout: float | None, matched: bool) -> Any:
        """`__call__`, with the function's keyword arguments in a dict of their own: one named `client`,
        `dispatch` or `timeout` is the function's (`StagedFunction._call`). `matched`: the arguments' leaves
        are of the traced signature (`StageCache` found this stage by it), so their avals are not checked."""
        from pathways_mlir.runtime.remote_client import RemoteClient

        client = client or default_client(self.runtime)
        if _runtime_of(client) is not self.runtime:
            raise ValueError("this program was compiled for another runtime than the client's")
        lowered = self.lowered
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        if tree != lowered.in_tree:
            raise TypeError(f"program @{lowered.program} was traced for arguments {lowered.in_tree}, "
                            f"not {tree}")
        if lowered.donated:
            _refuse_bad_donations(lowered, leaves)
        _refuse_unrunnable(lowered, leaves)
        if not matched or any(isinstance(x, jax.core.Tracer) for x in leaves):    # (`.run` inside `jax.jit`)
            _refuse_other_avals(lowered, leaves)
        wire = [to_wire(x, a) for x, a in zip(leaves, lowered.in_avals_flat)]
        # A service's client sends the run without waiting for its reply, and lowers it again if the service refuses
        # it for a topology change (`RemoteClient.run`).
        again = {"refresh": self._lowered_again} if isinstance(client, RemoteClient) else {}
        stale = False
        for attempt in range(TOPOLOGY_TRIES):
            try:
                if stale or self.runtime.resources.version != self._version:
                    with self._lock:
                        if stale or self.runtime.resources.version != self._version:
                            self._refresh()
                handles = client.run(self.plan, wire, dispatch, timeout, **again)
                break
            except RefusedArgument as error:
                raise _named(error, lowered.program, (args, kwargs)) from None
            except TopologyChanged:
                # The cluster changed between the plan's lowering and its load or run (an island lost or back in
                # between; a service's topology changed since this process read it): it is lowered again.
                if attempt == TOPOLOGY_TRIES - 1:
                    raise
                stale = True
        return jax.tree_util.tree_unflatten(lowered.out_tree, map(from_wire, handles, lowered.out_avals_flat))

    in_tree = property(lambda self: self.lowered.in_tree, doc="the traced arguments' structure, `(args, kwargs)`")
    out_tree = property(lambda self: self.lowered.out_tree, doc="the results' structure")
    in_avals = property(lambda self: self.lowered.in_avals, doc="see `Lowered.in_avals`")
    args_info = property(lambda self: self.lowered.args_info, doc="see `Lowered.args_info`")
    out_info = property(lambda self: self.lowered.out_info, doc="see `Lowered.out_info`")
    donate_argnums = property(lambda self: self.lowered.donate_argnums, doc="see `Lowered.donate_argnums`")

    @property
    def input_shardings(self) -> Any:
        """Where the plan puts each argument: a `NamedSharding` over its slice's devices, in the traced arguments'
        structure, as `jax.jit`'s compiled stage gives them (of one the plan keeps on the host, unused or returned
        as it is, where reading it puts it: the default device). Only where the islands run in this process (the
        embedded backend): NotImplementedError elsewhere."""
        return self.lowered.in_tree.unflatten(self._shardings(self.plan.inputs, self.lowered.in_avals_flat))

    @property
    def output_shardings(self) -> Any:
        """Where the plan puts each result, as `input_shardings` says it for arguments."""
        return self.lowered.out_tree.unflatten(self._shardings(self.plan.outputs, self.lowered.out_avals_flat))

    def _shardings(self, buffers, avals) -> list:
        from pathways_mlir.runtime.executables import host_data_array, named_sharding

        islands = getattr(self.runtime, "islands", None)
        if islands is None or not islands.in_process:
            raise NotImplementedError(f"program @{self.lowered.program} runs on devices of another process (a "
                                      f"service's or Ray's), which have no JAX sharding here")
        shardings = []
        for buffer, aval in zip(buffers, avals):
            info = self.plan.buffers[buffer]
            if info.slice is None:       # kept on the host (an argument returned as it is, or unused)
                shardings.append(host_data_array().sharding)
                continue
            mesh = islands[self.plan.island_of(buffer)].mesh(self.plan, info.slice)
            shardings.append(named_sharding(mesh, info.sharding[:len(aval.shape)]))   # (a key's data has one more)
        return shardings

    def cost_analysis(self) -> dict[str, float]:
        """Returns the estimated cost of one run (see `Lowered.cost_analysis`)."""
        return self.lowered.cost_analysis()

    def as_text(self, *, debug_info: bool = False) -> str:
        """Returns the program lowered onto the cluster, as `pw-opt` prints it: placed slices, transfers and
        one plan per island (lowered again from the traced module for the topology of this plan)."""
        from pathways_mlir.passes import lower

        require_bool("Compiled.as_text", "debug_info", debug_info)
        return lower(self.lowered.module, self.plan.topology).operation.get_asm(enable_debug_info=debug_info)

    def memory_analysis(self) -> MemoryAnalysis:
        """Returns the device memory one run needs, from its plan (see `MemoryAnalysis`)."""
        from pathways_mlir.runtime.admission import by_device_range, run_need

        def nbytes(avals) -> int:
            return sum(math.prod(a.shape) * a.dtype.itemsize for a in avals)
        peaks = by_device_range(run_need(self.plan))
        return MemoryAnalysis(nbytes(self.lowered.in_avals_flat), nbytes(self.lowered.out_avals_flat),
                              max(peaks.values(), default=0), peaks)

    def _lowered_again(self) -> ProgramPlan:
        """The plan for the cluster's topology as it is now: lowered again if it changed since this one was."""
        with self._lock:
            if self.runtime.resources.snapshot()[0] != self._version:
                self._refresh()
            return self.plan

    def call_plain(self, args: tuple, leaves: tuple | list, client=None) -> Any:
        """Runs the program on `args`, whose `leaves` are every one a JAX or NumPy array or a handle (or a
        `WeakHandle` of one) of its traced aval (the caller checked: `StageCache.run`), in parallel dispatch
        without a timeout, on a `plain` program: the same as calling it, converting nothing but weak handles."""
        client = client or default_client(self.runtime)
        if type(client) is not Client or self.runtime.resources.version != self._version:
            return self(*args, client=client)
        if client.runtime is not self.runtime:
            raise ValueError("this program was compiled for another runtime than the client's")
        if self._weak_arguments:
            leaves = [x.data if type(x) is WeakHandle else x for x in leaves]
        try:
            run = client.start(self.plan, leaves)
        except TopologyChanged:              # changed since the check above: `__call__` lowers it again
            return self(*args, client=client)
        except RefusedArgument as error:
            raise _named(error, self.lowered.program, (args, {})) from None
        try:
            handles = client.handles(run)
        except BaseException as error:  # noqa: BLE001  (raised again: an interrupt, Ctrl-C)
            client.runtime.abandon(run, error)       # no handle would release its results
            raise
        for i in self._weak_results:
            handles[i] = WeakHandle(handles[i])
        return handles[0] if self._single else jax.tree_util.tree_unflatten(self.lowered.out_tree, handles)


def _runtime_of(client) -> "ClusterRuntime":
    """The runtime `client` runs on; TypeError in one line if it is no client."""
    try:
        return client.runtime
    except AttributeError:
        raise TypeError(f"client= takes a pw.Client (or the connection pw.connect makes), not "
                        f"{type(client).__name__}") from None


def _named(error: RefusedArgument, program: str, call: tuple) -> RefusedArgument:
    """`error`, naming its argument as the front end names argument leaves: by its position and its key path in
    `call`, the call's `(args, kwargs)` (the client has the leaves alone)."""
    path = jax.tree_util.tree_flatten_with_path(call)[0][error.position][0]
    return RefusedArgument(f"argument leaf {error.position} of program @{program} ({argument_name(path)})",
                           error.position, error.why)


def _refuse_bad_donations(lowered: Lowered, leaves: list) -> None:
    """Raises ValueError in one line if a donated argument leaf is a shared object (read-only), or a JAX array
    passed again as another leaf, whose buffer `jax.jit` refuses to donate twice (the run failed on its island
    instead; a handle passed twice is refused by the client, `Client.start`)."""
    from pathways_mlir.runtime.remote_client import RemoteSharedRef
    from pathways_mlir.runtime.shared import SharedRef

    passed_at = positions_by_identity(leaves, ARRAY_TYPE)
    for position, (x, donated) in enumerate(zip(leaves, lowered.donated)):
        if not donated:
            continue
        held = x.owned() if isinstance(x, Reference) else x     # (what a shared key's or weak value's wrapper holds)
        if isinstance(held, (SharedRef, RemoteSharedRef)):
            raise ValueError(f"argument leaf {position} of program @{lowered.program} is a shared object, which is "
                             f"read-only: it cannot be donated (leave it out of donate_argnums/donate_argnames)")
        if type(x) is ARRAY_TYPE:
            again = next((i for i in passed_at[id(x)] if i != position), None)
            if again is not None:
                raise ValueError(f"argument leaf {position} of program @{lowered.program} is donated, but the same "
                                 f"array is passed again as leaf {again}: donate a copy, or neither")


def _refuse_unrunnable(lowered: Lowered, leaves: list) -> None:
    """Raises in one line, as `jax.jit` refuses them, if an argument leaf is a `jax.ShapeDtypeStruct` (TypeError:
    it has no value to run on; its run failed on the island instead) or a NumPy masked array (`_refuse_masked`)."""
    for position, x in enumerate(leaves):
        if isinstance(x, jax.ShapeDtypeStruct):
            raise TypeError(f"argument leaf {position} of program @{lowered.program} is a jax.ShapeDtypeStruct, "
                            f"which has no value to run on: a call takes arrays; trace with abstract values "
                            f"through .lower(...)")
        _refuse_masked(x)


def _refuse_masked(x: Any) -> None:
    """Raises ValueError in one line if `x` is a NumPy masked array, as JAX refuses one: taken as an array, its
    mask would be lost (its run failed on the island with JAX's refusal, or read its data alone)."""
    if isinstance(x, np.ma.MaskedArray):
        raise ValueError("a NumPy masked array is not an argument, as JAX refuses it (its mask would be lost): "
                         "pass arr.filled(value), or its data and mask as two arrays")


def _refuse_other_avals(lowered: Lowered, leaves: list) -> None:
    """Raises TypeError in one line, as `jax.jit`'s compiled stage refuses it, if an argument leaf is a JAX tracer
    (the call is inside a JAX transformation), neither an array nor a scalar, or not of the dtype and shape the
    program was traced for: an array's dtype as `check_dtype` takes it (which the runtime applies to every run's
    arguments too), a scalar's as JAX types it (weak types aside: a float is no int), a typed key's exactly."""
    for position, (x, aval) in enumerate(zip(leaves, lowered.in_avals_flat)):
        kind = type(x)
        if kind is ARRAY_TYPE or kind is np.ndarray:          # (the common case first: a few checks per leaf)
            dtype, shape = x.dtype, x.shape
        elif isinstance(x, jax.core.Tracer):
            raise TypeError(f"argument leaf {position} of program @{lowered.program} is a JAX tracer: a compiled "
                            f"program cannot be called inside a JAX transformation, as jax.jit's compiled stage "
                            f"cannot; call the placed function or program itself there")
        elif isinstance(x, (bool, int, float, complex, np.generic)):
            try:
                dtype, shape = jax.typeof(x).dtype, ()
            except OverflowError as error:     # a Python int out of range, as `jax.jit` refuses it
                raise OverflowError(f"argument leaf {position} of program @{lowered.program}: {error}") from None
        elif isinstance(x, ARRAYS):
            dtype, shape = x.dtype, tuple(x.shape)
        else:
            raise TypeError(f"argument leaf {position} of program @{lowered.program} is a {type(x).__name__}: "
                            f"expected an array or a scalar")
        if dtype != aval.dtype:
            if is_extended(dtype) or is_extended(aval.dtype):
                raise TypeError(f"argument leaf {position} of program @{lowered.program} has dtype {dtype}, but it "
                                f"was compiled for {aval.dtype}{list(aval.shape)}")
            check_dtype(lowered.program, position, dtype, aval.dtype, aval.shape)
        if shape != aval.shape:
            path = jax.tree_util.tree_flatten_with_path(lowered.in_tree.unflatten(leaves))[0][position][0]
            raise TypeError(f"argument leaf {position} of program @{lowered.program} "
                            f"({argument_name(path)}) has shape {shape}, but it was compiled for "
                            f"{aval.dtype}{list(aval.shape)}")


def _has_signature(x: Any) -> bool:
    """Whether `_leaf_signature(x)` returns (does not raise TypeError or OverflowError)."""
    try:
        _leaf_signature(x)
    except (TypeError, OverflowError):
        return False
    return True


def _leaf_signature(x: Any) -> tuple:
    """What `jax.jit` keys a trace on for one argument: its aval's shape, dtype and weak type, a Python scalar's
    too (weakly typed: a Python int and the `WeakHandle` a step returns for `step + 1` are one signature, where
    keying a scalar by its type traced and lowered a `TrainState`'s step again on its second call). Raises
    TypeError for what is neither an array nor a scalar, OverflowError for a Python int out of range."""
    if isinstance(x, (bool, int, float, complex, np.generic)):
        return signature_of(aval_of(x))
    if not isinstance(x, ARRAYS):
        raise not_an_array(x)       # (duck typing let through any object with a shape and a dtype: its run failed)
    _refuse_masked(x)
    return tuple(x.shape), x.dtype, getattr(x, "weak_type", False)


class StageCache:
    """One `Compiled` per runtime and call signature, for one program or placed function.

    The signature is what `jax.jit` would retrace on: the static values (of
    their types), the tree of the traced arguments, each leaf's shape, dtype
    and weak type, and JAX's configuration that tracing reads (its trace
    context: `jax_enable_x64`, with which a float64 NumPy array or a Python
    int traces as another type, `jax.threefry_partitionable`,
    `jax.numpy_rank_promotion`, `jax.disable_jit`, ...).

    It keeps at most `STAGE_CACHE_SIZE` stages per runtime and evicts the least recently used one, as `jax.jit`'s
    caches do: an evicted stage's plan is forgotten on the runtime once nothing else holds it. A runtime's stages
    go when it closes (`forget`): each holds its runtime, which stayed alive for good.
    """

    def __init__(self, lower: Callable[[Call], Lowered], signature: Signature):
        self._lower = lower
        self._signature = signature
        self._unsplit = not signature.static_nums and not signature.static_names   # positional args are the call's
        # runtime -> signature -> (its stage, the signature as kept here), the least recently used first
        self._by_runtime: dict[Any, OrderedDict[tuple, tuple[Compiled, tuple]]] = {}
        self._lock = threading.Lock()
        self._last: tuple = (None, _NO_STAGES)   # the runtime of the latest call and its stages: a fast lookup
        # ids -> (runtime, objects, stage, trace context, the runtime's stages, the stage's signature); see `run`
        self._identical: dict[tuple[int, ...], tuple] = {}
        with _stage_caches_lock:
            _stage_caches.add(self)

    def get(self, call: Call, runtime=None) -> Compiled:
        """Returns the stage for `call` on `runtime` (default: the process's), tracing and lowering
        only the first time."""
        return self._stage(call, runtime)[0]

    def _stage(self, call: Call, runtime) -> tuple[Compiled, OrderedDict, tuple]:
        """`get`'s stage, the runtime's stages that keep it and its signature as they keep it (touched by `run`'s
        identity lookups: an equal signature of another call was compared element by element, 0.45 us a call)."""
        refuse_forked()          # (before JAX lowers: in a forked child its lowering can wait forever)
        if runtime is None:
            runtime = get_runtime()
        leaves, tree = jax.tree_util.tree_flatten(call.tree)
        try:
            key = call.static, tree, tuple(map(_leaf_signature, leaves)), trace_context()
        except (TypeError, OverflowError) as error:   # neither an array nor a scalar, or a Python int out of
            # range (as `jax.jit` refuses it): named as `tracer.lower` names an argument
            position = next(i for i, x in enumerate(leaves) if not _has_signature(x))
            path = jax.tree_util.tree_flatten_with_path(call.tree)[0][position][0]
            raise type(error)(f"{Site.of_definition(self._signature.fn)}: {argument_name(path)}: {error}") from None
        per_runtime = self._last[1] if self._last[0] is runtime else self._by_runtime.get(runtime, _NO_STAGES)
        try:
            per_runtime.move_to_end(key)        # (the most recently used last)
            found, key = per_runtime[key]
        except KeyError:                        # not cached, or evicted meanwhile by another thread's call
            pass
        else:
            self._last = (runtime, per_runtime)
            return found, per_runtime, key
        with self._lock:
            per_runtime = self._by_runtime.setdefault(runtime, OrderedDict())
            if key not in per_runtime:
                avals = jax.tree_util.tree_unflatten(tree, map(aval_of, leaves))
                per_runtime[key] = Compiled(self._lower(Call(*avals, call.static)), runtime), key
                if len(per_runtime) > STAGE_CACHE_SIZE:
                    per_runtime.popitem(last=False)
                    self._identical = {}        # (it may hold the evicted stage, whose plan stayed loaded then)
            found, key = per_runtime[key]
            return found, per_runtime, key

    def forget(self, runtime) -> None:
        """Drops the stages of `runtime`, which closed, and the fast lookups that may hold them."""
        with self._lock:
            if self._by_runtime.pop(runtime, None) is not None:
                self._last = (None, _NO_STAGES)
                self._identical = {}

    def run(self, args: tuple, kwargs: dict, dispatch: str, client=None, timeout: float | None = None,
            traced: Callable | None = None) -> Any:
        """Runs the call of `args` and `kwargs` with `client` (default: the runtime's default client) in a
        dispatch mode, cancelled after `timeout` seconds if it is not over; with `traced`, returns
        `traced(*args, **kwargs)` instead if a leaf of the arguments is a JAX tracer (the call is inside a JAX
        transformation).

        A call of positional arguments only, in parallel dispatch without a timeout, is looked up by identity
        first when its leaves are arrays and handles only: the avals of its arrays, the dtypes of its NumPy
        arrays (with their shapes) and the plan buffers of its handles (or of those its `WeakHandle`s wrap) are
        the very objects of an earlier call (JAX gives the results of one executable one aval object; NumPy one
        dtype object per builtin type; a handle's buffer is its plan's), and the pytree of arguments that are not
        all leaves is the earlier call's (as `jax.jit` looks up a flattened call's signature), so nothing is split
        or built and the leaves go to the run as they are (`Compiled.call_plain`), under the same
        trace context, outside a JAX trace only (inside one, arrays the trace captured are no tracers: the call
        traces as its function, as a nested `jax.jit` does).
        Under `jax.disable_jit()` a call with `traced` runs it, as `jax.jit` runs its function eagerly there."""
        if type(client) is Client:
            runtime = client.runtime             # (`_runtime_of`'s, without its call: most calls pass one)
        else:
            runtime = _runtime_of(client) if client is not None else None
        identity = leaves = None
        if dispatch == "parallel" and timeout is None and not kwargs and self._unsplit:
            leaves = args
            identity = _identity(args)
            if identity is None:
                leaves, tree = jax.tree_util.tree_flatten(args)
                identity = _identity(leaves, tree)
        if identity is not None:
            runtime = runtime or get_runtime()
            found = self._identical.get(identity[0])
            context = trace_context()
            if found is not None and found[0] is runtime and found[3] == context and \
                    all(map(operator.is_, found[1], identity[1])) and trace_state_clean():
                try:
                    found[4].move_to_end(found[5])      # (the most recently used last, as `get` keeps them)
                except KeyError:                        # evicted meanwhile by another thread's call
                    pass
                return found[2].call_plain(args, leaves, client)
        if traced is not None and (jax.config.jax_disable_jit or has_tracers((args, kwargs))):
            return traced(*args, **kwargs)
        call = self._signature.split(args, kwargs)
        compiled, stages, key = self._stage(call, runtime)
        if identity is not None and compiled.plain:
            if len(self._identical) >= _IDENTICAL:
                self._identical.clear()
            self._identical[identity[0]] = (runtime, identity[1], compiled, context, stages, key)
            return compiled.call_plain(args, leaves, client)
        return compiled._run(call.args, call.kwargs, client, dispatch, timeout, matched=True)


_NO_STAGES: OrderedDict = OrderedDict()      # a runtime's stages before its first (never added to)
_stage_caches: "weakref.WeakSet[StageCache]" = weakref.WeakSet()     # every stage cache (`_forget_runtime`)
_stage_caches_lock = threading.Lock()


def _forget_runtime(runtime) -> None:
    """Drops every stage cache's stages of `runtime`, which closed (`on_close`)."""
    with _stage_caches_lock:
        caches = list(_stage_caches)
    for cache in caches:
        cache.forget(runtime)


on_close(_forget_runtime)


RUN_OPTIONS = ("dispatch", "client", "timeout")     # `StagedFunction.run`'s keywords


class StagedFunction(BindsAsMethod):
    """What placed functions and programs share: their calls go through one `StageCache` (`_stages`) and one
    `Signature` (`_signature`), which the subclass makes."""

    _stages: StageCache
    _signature: Signature

    def run(self, *args: Any, dispatch: str = "parallel", client=None, timeout: float | None = None,
            **kwargs: Any) -> Any:
        """Runs the call with a chosen dispatch mode ("parallel" or "sequential") and client; with `timeout`,
        the run is cancelled if it is not over within that many seconds. (A keyword argument of the function
        named `dispatch`, `client` or `timeout` is passed by calling it: see `_call`.)"""
        return self._stages.run(args, kwargs, dispatch, client, timeout)

    def _call(self, args: tuple, kwargs: dict) -> Any:
        """A call with keywords, outside a program trace: `dispatch=`, `client=` and `timeout=` are `run`'s
        options, unless the function takes a keyword of that name: then it is the function's, as `jax.jit`
        passes it (it was taken as an option: `f(x, timeout=5.0)` of `def f(x, timeout=1.0)` ran `f(x)` with
        a 5 s deadline). `kwargs` is the call's own dict."""
        options = {name: kwargs.pop(name) for name in RUN_OPTIONS
                   if name in kwargs and not self._signature.takes_keyword(name)}
        return self._stages.run(args, kwargs, options.get("dispatch", "parallel"), options.get("client"),
                                options.get("timeout"))

    def compiled(self, *args: Any, runtime=None, **kwargs: Any) -> Compiled:
        """Returns the `Compiled` stage a call with these arguments uses on `runtime` (cached)."""
        return self._stages.get(self._signature.split(args, kwargs), runtime)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """Returns the results' `jax.ShapeDtypeStruct`s for these arguments, running nothing (`jax.jit`'s)."""
        return self._signature.eval_shape(args, kwargs)


def _identity(leaves: tuple | list, tree=None) -> tuple[tuple, tuple] | None:
    """Returns the key and objects that identify the signature of argument leaves that are all JAX arrays (their
    aval), handles or `WeakHandle`s of them (their plan buffer) or NumPy arrays (their shape and dtype, all of a
    host array's aval), or None if one is anything else; with `tree`, the leaves' pytree (a `PyTreeDef`) is
    part of the key, and None is returned too if it is not hashable (a node's auxiliary data). The key holds
    the objects' ids, and marks at their positions what the objects alone do not tell: a NumPy array's shape,
    a `WeakHandle` (one list append per leaf, most of the time)."""
    objects, marks = [], []
    for position, a in enumerate(leaves):
        kind = type(a)
        if kind is ARRAY_TYPE:
            objects.append(a.aval)
        elif kind is Handle:
            objects.append(a._run.plan.buffers[a._buffer])
        elif kind is WeakHandle and type(a.data) is Handle:
            objects.append(a.data._run.plan.buffers[a.data._buffer])
            marks.append((position, "weak"))
        elif kind is np.ndarray:
            objects.append(a.dtype)
            marks.append((position, a.shape))
        else:
            return None
    if tree is None:
        return (tuple(map(id, objects)), tuple(marks)), tuple(objects)
    key = tree, tuple(map(id, objects)), tuple(marks)
    try:
        hash(key)
    except TypeError:
        return None
    return key, tuple(objects)

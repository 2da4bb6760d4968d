"""Elastic training: a loop that keeps host snapshots of its state and survives a lost island.

    trainer = ElasticTrainer(train_step, batch, snapshot_every=3, checkpoint_dir="ckpt")
    params = trainer.run(init_params, steps=100)      # handles; trainer.recoveries says what happened

`train_step(state, batch) -> (state, *metrics)` is a `@pw.program` or a
`pw.jit` function and `batch(i)` gives step i's batch, the same every time it
is asked. Every `snapshot_every` steps the state's arrays are copied to host
memory on a background thread while the loop dispatches the next steps (one
copy in flight at most); with `checkpoint_dir` each snapshot is also written
as an Orbax checkpoint (asynchronously, `max_to_keep` kept). When the run
raises `pw.IslandLost` (a call, a result, a snapshot), the loop takes the
latest snapshot and replays the steps since it: its next call lowers the
program onto the islands that remain. `run(state, steps, resume_from=dir)`
starts from the newest checkpoint in `dir` instead (a new process).
Logger `pathways_mlir.elastic` says one line per loss, per recovery and per
resume.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
import numbers
import os
import threading
import time
from typing import Any, Callable

import jax
import numpy as np

from pathways_mlir.runtime.array_reference import ArrayReference, Reference
from pathways_mlir.runtime.island_work import IslandLost
from pathways_mlir.runtime.limits import MAX_SECONDS
from pathways_mlir.runtime.runtime import Runtime, get_runtime

from .avals import is_extended, wrap_keys
from .errors import require_bool
from .slices import Slice

from .checkpoints import Checkpoints, read_checkpoint, shape_dtype

log = logging.getLogger("pathways_mlir.elastic")
SHRINK_MODES = ("split", "batch")   # what a data-parallel step does on fewer devices (see ElasticTrainer)
TOPOLOGY_WAIT = 5.0    # seconds a replay waits for the runtime to take a lost island out


@dataclasses.dataclass
class Recovery:
    """One lost island and what it took to carry on.

    `step`: steps done when the loss was seen; `snapshot_step`: the step of
    the snapshot restored (`replayed` = the difference). `detected_at`:
    `time.monotonic()` when the loss reached the trainer (it cannot know
    when the host died; a test that loses an island can). `restore_s`:
    settling the snapshot copy in flight and taking the latest snapshot.
    `relower_s`: the first call after the loss, which lowers the program
    onto the remaining islands, loads its plans (XLA compiles there unless
    that island compiled them before) and dispatches the first replayed
    step with the snapshot as its input. `recovery_s`: from detection to
    that step dispatched. The last two are None until the call succeeds.
    """

    step: int
    snapshot_step: int
    error: str
    detected_at: float
    restore_s: float
    relower_s: float | None = None
    recovery_s: float | None = None

    @property
    def replayed(self) -> int:
        """How many steps the recovery runs again."""
        return self.step - self.snapshot_step


class _Snapshots:
    """The latest host snapshot of the state, and the copy of the next one (at most one in flight).

    The copy runs on one background thread: it reads the handles of one
    step's state into numpy arrays, dropping each handle once read, then
    makes them the latest snapshot and, with checkpoints, starts writing
    them to disk.
    """

    def __init__(self, step: int, leaves: list[np.ndarray], checkpoints: Checkpoints | None, timeout: float):
        self.step, self.leaves = step, leaves
        self._checkpoints = checkpoints
        self._timeout = timeout
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pw-elastic-snapshot")
        self._pending: tuple[int, concurrent.futures.Future] | None = None
        self._lock = threading.Lock()

    def latest(self) -> tuple[int, list[np.ndarray]]:
        """Returns the step and arrays of the latest complete snapshot."""
        with self._lock:
            return self.step, self.leaves

    def take(self, step: int, handles: list) -> None:
        """Starts copying one step's state to the host; the copy before it must be settled."""
        assert self._pending is None, "settle() the copy in flight first"
        self._pending = step, self._pool.submit(self._copy, step, list(handles))

    def failed(self) -> bool:
        """Returns whether the copy in flight has failed (without waiting)."""
        return self._pending is not None and self._pending[1].done() and self._pending[1].exception() is not None

    def settle(self) -> None:
        """Waits (at most the timeout) for the copy in flight; raises its error."""
        if self._pending is None:
            return
        (step, copy), self._pending = self._pending, None
        try:
            error = copy.exception(self._timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the host snapshot of step {step} was not copied within {self._timeout} s") from None
        if error is not None:
            # Without the copy thread's frames: they hold the handle it was reading.
            raise error.with_traceback(None)

    def close(self) -> None:
        """Stops the copy thread (after the copy in flight)."""
        self._pool.shutdown(wait=True)

    def _copy(self, step: int, handles: list) -> None:
        try:
            arrays = []
            while handles:
                arrays.append(_to_host(handles.pop(0), self._timeout))
        finally:
            handles.clear()          # a failed copy keeps no handle alive through its traceback
        with self._lock:
            self.step, self.leaves = step, arrays
        if self._checkpoints is not None:
            self._checkpoints.save(step, arrays)


class ElasticTrainer:
    """Runs `step` for a number of steps, snapshotting its state, and carries on when an island is lost.

    `step(state, batch) -> (state, *metrics)`: a `@pw.program` or `pw.jit`
    function returning the new state (same structure as `state`) first.
    `batch(i)`: step i's batch, deterministic (replayed steps ask again).
    `snapshot_every`: steps between host snapshots. `checkpoint_dir`: also
    write each snapshot there as an Orbax checkpoint, keeping `max_to_keep`;
    a write that fails logs one line, keeps the host snapshot and training,
    and the next snapshot tries again, unless `strict_checkpoints` (then the
    run stops with a `CheckpointError` naming the checkpoint).
    `on_step(n, metrics)`: called after the n-th step is dispatched (again
    for replayed steps) with its metrics as handles. `max_losses`: how many
    losses in a row, with no newer snapshot between them, it recovers from;
    it gives up at the next.
    `timeout`: seconds any one wait (a result, a snapshot copy) may take.

    Elastic slices (`pw.virtual_slice(("4..8",), ...)`) shrink and grow
    with the cluster: every call lowers again when the topology changed, and
    placement gives each slice the largest shape that fits. `shrink` says
    what a data-parallel step does with fewer devices: `"split"` (default)
    splits the same global batch over fewer shards; `"batch"` shrinks the
    global batch, calling `batch(i, shards)` with the number of devices
    along the elastic axes of `data_slice` that placement gives it now.
    `shapes[i]` is {slice: mesh shape} of the plan step i ran on (the
    latest run of it, for a replayed step); logger `pathways_mlir.elastic`
    says one line each time the shapes change.
    """

    def __init__(self, step, batch: Callable[[int], Any], *, snapshot_every: int, client=None,
                 checkpoint_dir: str | os.PathLike | None = None, max_to_keep: int = 2,
                 on_step: Callable[[int, tuple], None] | None = None, max_losses: int = 3,
                 timeout: float = 60.0, strict_checkpoints: bool = False, shrink: str = "split",
                 data_slice: Slice | None = None):
        if not callable(getattr(step, "run", None)):
            raise TypeError(f"step must be a @pw.program or pw.jit function, not {type(step).__name__}")
        if not callable(batch):
            raise TypeError(f"batch must be a function of the step number, not {type(batch).__name__}")
        for name, value in (("snapshot_every", snapshot_every), ("max_to_keep", max_to_keep),
                            ("max_losses", max_losses)):
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not 0 < timeout < MAX_SECONDS:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r:.40}")
        require_bool("pw.ElasticTrainer", "strict_checkpoints", strict_checkpoints)
        if on_step is not None and not callable(on_step):
            raise TypeError(f"on_step must be a function on_step(step, metrics), not {type(on_step).__name__}")
        if client is not None and not hasattr(client, "runtime"):
            raise TypeError(f"client must be a pw.Client or a pw.connect() connection, not {type(client).__name__}")
        if checkpoint_dir is not None and os.path.exists(checkpoint_dir) and not os.path.isdir(checkpoint_dir):
            raise ValueError(f"checkpoint_dir {os.fspath(checkpoint_dir)} is not a directory")
        if shrink not in SHRINK_MODES:
            raise ValueError(f"shrink must be one of {', '.join(map(repr, SHRINK_MODES))}, not {shrink!r}")
        if (shrink == "batch") != (data_slice is not None):
            raise ValueError("shrink='batch' needs data_slice=, the elastic slice whose shards share the batch, "
                             "and data_slice= is only for shrink='batch'")
        if data_slice is not None and not (isinstance(data_slice, Slice) and data_slice.elastic):
            raise ValueError(f"data_slice must be an elastic pw.virtual_slice (a range of sizes), not {data_slice!r}")
        self.step = step
        self.batch = batch
        self.snapshot_every = int(snapshot_every)
        self.client = client
        self.checkpoint_dir = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        self.max_to_keep = int(max_to_keep)
        self.strict_checkpoints = strict_checkpoints
        self.on_step = on_step
        self.max_losses = int(max_losses)
        self.timeout = timeout
        self.shrink = shrink
        self.data_slice = data_slice
        self.recoveries: list[Recovery] = []
        self.shapes: dict[int, dict[str, tuple[int, ...]]] = {}
        self.start_step = 0
        self._snapshots: _Snapshots | None = None

    @property
    def snapshot_step(self) -> int | None:
        """The step of the latest complete host snapshot of the run under way (None before a run)."""
        return None if self._snapshots is None else self._snapshots.latest()[0]

    def run(self, state, steps: int, resume_from: str | os.PathLike | None = None):
        """Trains from `state` (or from the newest intact checkpoint in `resume_from`, `state` then giving
        the structure, shapes and dtypes; a corrupted newer one is skipped with one line naming it) until
        `steps` steps are done; returns the final state as handles, its device work complete (as host arrays
        when the loss of the final state was recovered from a snapshot of that very step). Raises
        `RuntimeError` after `max_losses` losses in a row."""
        if not isinstance(steps, numbers.Integral) or isinstance(steps, bool) or steps < 0:
            raise ValueError(f"steps must be a non-negative integer, not {steps!r}")
        flat, treedef = jax.tree_util.tree_flatten_with_path(state)
        leaves, paths = [leaf for _, leaf in flat], [jax.tree_util.keystr(path) for path, _ in flat]
        restore = _Restore(treedef, [_key_dtype(leaf) for leaf in leaves], [_weak_scalar(leaf) for leaf in leaves])
        if resume_from is not None:
            start, host = read_checkpoint(os.fspath(resume_from), leaves, paths)
            if start >= steps:
                raise ValueError(f"the checkpoint in {os.fspath(resume_from)} is of step {start}: "
                                 f"nothing is left to run for steps={steps}")
            state = restore(host)
        else:
            start, host = 0, [_to_host(leaf, self.timeout) for leaf in leaves]
        self.start_step, self.recoveries, self.shapes = start, [], {}
        here = resume_from is not None and self.checkpoint_dir is not None and \
            os.path.abspath(os.fspath(resume_from)) == os.path.abspath(self.checkpoint_dir)
        checkpoints = None if self.checkpoint_dir is None else self._checkpoints(start, here, paths)
        self._snapshots = _Snapshots(start, host, checkpoints, self.timeout)
        try:
            return self._loop(state, [shape_dtype(leaf) for leaf in leaves], treedef, restore, start, steps)
        finally:
            self._snapshots.close()
            if checkpoints is not None:
                checkpoints.close()

    def _loop(self, state, specs: list, treedef, restore: "_Restore", done: int, steps: int):
        snapshots, pending, checked, plan = self._snapshots, None, None, None
        runtime = self.client.runtime if self.client is not None else get_runtime()
        while True:
            try:
                if snapshots.failed():
                    snapshots.settle()                       # raises its error
                if done == steps:
                    snapshots.settle()
                    for leaf in jax.tree_util.tree_leaves(state):
                        if isinstance(leaf, Reference):
                            leaf.result(self.timeout).block_until_ready()    # its device work complete
                    return state
                # The state's handles go to the call as they are: on Ray a result stays on its island
                # (a StoreRef); one that lived on a lost island raises IslandLost in the call.
                began, stage = time.perf_counter(), None
                batch = self._batch(done, runtime)
                stage = self.step.compiled(state, batch, runtime=runtime)   # lowers again at the call, if due
                if stage.plan.donated:
                    snapshots.settle()      # the copy in flight reads the state this call donates
                out = self.step.run(state, batch, client=self.client)
                self._placed(done, stage.plan)
                if pending is not None:
                    self._recovered(*pending, began)
                    pending = None
                state, metrics = self._split(out, treedef, None if checked is stage else specs)
                checked, plan = stage, stage.plan    # a state the same stage returned is checked already
                done += 1
                if done % self.snapshot_every == 0:
                    snapshots.settle()                       # at most one copy in flight
                    snapshots.take(done, jax.tree_util.tree_leaves(state))
                if self.on_step is not None:
                    self.on_step(done, metrics)
                del out, metrics
            except IslandLost as error:
                # A call that lowered and loaded the program for the islands left before it found the loss did
                # the replay's lowering (the replay's call finds it done): its time is the recovery's.
                lowered = time.perf_counter() - began if plan is not None and stage is not None and \
                    stage.plan is not plan else 0.0
                pending = self._lost(error, done, lowered)
                if isinstance(runtime, Runtime):         # a service lowers the replay again if it is refused
                    runtime.await_losses(min(self.timeout, TOPOLOGY_WAIT))
                done, leaves = snapshots.latest()
                state = restore(leaves)

    def _batch(self, step: int, runtime) -> Any:
        """Step `step`'s batch: `batch(step)`, or with shrink='batch', `batch(step, shards)`."""
        if self.shrink == "split":
            return self.batch(step)
        from pathways_mlir.passes.place import fitted_shape

        elastic = self.data_slice.declared(self.data_slice.name or "data_slice")
        shape = fitted_shape(elastic, runtime.resources.snapshot()[1]) or elastic.shape
        low, high = elastic.shape_range
        return self.batch(step, math.prod(d for d, lo, hi in zip(shape, low, high) if lo < hi))

    def _placed(self, step: int, plan) -> None:
        """Records the slice shapes of the plan step `step` ran on (one line in the log when they change)."""
        shapes = {name: p.shape for name, p in plan.slices.items()}
        before = self.shapes.get(step - 1)
        if before is not None and before != shapes:
            log.info("step %d runs on slices of shapes %s (the step before: %s)", step, shapes, before)
        self.shapes[step] = shapes

    @staticmethod
    def _split(out, treedef, specs: list | None) -> tuple[Any, tuple]:
        """Splits a step's result into (state, metrics); with `specs`, checks the state's shapes and dtypes
        (a state whose dtype changes after a step would compile twice and not match its checkpoints)."""
        if not isinstance(out, (tuple, list)) or not out:
            raise TypeError(f"step must return (state, *metrics), not {type(out).__name__}")
        state, metrics = out[0], tuple(out[1:])
        if jax.tree_util.tree_structure(state) != treedef:
            raise TypeError(f"step returned a state of structure {jax.tree_util.tree_structure(state)}, "
                            f"not the structure it was given, {treedef}")
        for i, (leaf, (shape, dtype)) in enumerate(zip(jax.tree_util.tree_leaves(state), specs or ())):
            got = shape_dtype(leaf)
            if got != (shape, dtype):
                raise TypeError(f"step returned a state whose array {i} is {got[1]}{list(got[0])}, the state given "
                                f"{dtype}{list(shape)}: give the initial state the dtypes the step returns")
        return state, metrics

    def _lost(self, error: IslandLost, done: int, lowered: float) -> tuple[Recovery, float, float]:
        """Settles the snapshot in flight and starts a recovery from the latest snapshot (or gives up);
        returns the recovery, when it began, and `lowered`: the seconds the call that found the loss took to
        lower the program onto the remaining islands first, if it did (the replay's call then finds it
        lowered)."""
        detected_at, began = time.monotonic(), time.perf_counter()
        try:
            self._snapshots.settle()
        except IslandLost:
            pass                            # that copy read a lost result: the snapshot before it stands
        snapshot_step = self._snapshots.latest()[0]
        in_a_row = 1
        for recovery in reversed(self.recoveries):
            if recovery.snapshot_step != snapshot_step:
                break
            in_a_row += 1
        if in_a_row > self.max_losses:
            raise RuntimeError(f"gave up after {in_a_row} island losses in a row with no newer snapshot than "
                               f"step {snapshot_step}; the last: {error}") from error
        log.warning("lost an island at step %d (%s): restoring the snapshot of step %d", done, str(error),
                    snapshot_step)    # the message, not the error: a kept log record would keep its frames
        recovery = Recovery(done, snapshot_step, str(error), detected_at, time.perf_counter() - began)
        self.recoveries.append(recovery)
        return recovery, began, lowered

    @staticmethod
    def _recovered(recovery: Recovery, began: float, lowered: float, call_began: float) -> None:
        """The first replayed step was dispatched: its call began at `call_began`, the recovery at `began`, and
        the call that found the loss lowered the program for `lowered` seconds before."""
        now = time.perf_counter()
        recovery.relower_s, recovery.recovery_s = now - call_began + lowered, now - began + lowered
        log.info("recovered in %.2f s (lowering %.2f s, restore %.2f s): replaying %d step%s",
                 recovery.recovery_s, recovery.relower_s, recovery.restore_s, recovery.replayed,
                 "" if recovery.replayed == 1 else "s")

    def _checkpoint_manager(self) -> Any:
        """A manager of `checkpoint_dir` (writes asynchronously, keeps `max_to_keep`). It makes a checkpoint's
        directory in `save` (on the snapshot thread): made in the background, a directory that could not be made
        (a file system remounted read-only) or a write refused after it was started left Orbax's threads of that
        write waiting 300 s for a signal, which kept the process from exiting."""
        import orbax.checkpoint as ocp

        return ocp.CheckpointManager(os.path.abspath(self.checkpoint_dir), options=ocp.CheckpointManagerOptions(
            max_to_keep=self.max_to_keep, enable_async_checkpointing=True,
            async_options=ocp.AsyncOptions(create_directories_asynchronously=False)))

    def _checkpoints(self, start: int, resumed_here: bool, paths: list[str]) -> Checkpoints:
        """The run's checkpoints of a state whose leaves are at `paths`; refuses a `checkpoint_dir` holding newer
        ones than `start`, unless the run resumed from it (`resumed_here`): those could not be read, and are
        deleted, to be written again."""
        try:
            os.makedirs(self.checkpoint_dir, exist_ok=True)
        except OSError as error:
            raise ValueError(f"checkpoint_dir {self.checkpoint_dir} cannot be made: {error.strerror}") from None
        manager = self._checkpoint_manager()
        newer = [step for step in manager.all_steps() if step > start]
        if newer and resumed_here:
            for step in newer:
                log.warning("deleting the checkpoint %s, which could not be read: the run writes it again",
                            os.path.join(self.checkpoint_dir, str(step)))
                manager.delete(step)
        elif newer:
            manager.close()
            raise ValueError(f"checkpoint_dir {self.checkpoint_dir} already holds checkpoints up to step "
                             f"{max(newer)}: resume from it (resume_from=) or use an empty directory")
        return Checkpoints(manager, self._checkpoint_manager, os.path.abspath(self.checkpoint_dir),
                           self.strict_checkpoints, paths)


def _to_host(leaf, timeout: float) -> np.ndarray:
    """A copy of one state leaf in host memory (a handle is waited for, at most `timeout` s); typed PRNG keys
    (every flax NNX model's RNG streams) as their key data."""
    if isinstance(leaf, ArrayReference):
        leaf = leaf._host_value(timeout)      # NumPy as fetched (a Ray actor's or a service's): no JAX array made
    elif isinstance(leaf, Reference):
        leaf = leaf.result(timeout)           # typed keys
    if _key_dtype(leaf) is not None:
        leaf = jax.random.key_data(leaf)
    return np.array(leaf, dtype=shape_dtype(leaf)[1], copy=True)


def _key_dtype(leaf) -> Any:
    """The key dtype of a state leaf of typed PRNG keys, else None."""
    dtype = getattr(leaf, "dtype", None)
    return dtype if dtype is not None and is_extended(dtype) else None


def _weak_scalar(leaf) -> bool:
    """Whether a state leaf is a weakly typed scalar: a Python number, or a result JAX types weakly (a learning
    rate a step computes from one)."""
    if isinstance(leaf, (int, float, complex)):
        return not isinstance(leaf, bool)            # (JAX types a Python bool strongly)
    return bool(getattr(leaf, "weak_type", False)) and getattr(leaf, "shape", None) == ()


@dataclasses.dataclass
class _Restore:
    """Makes the state of host leaves (`_to_host`'s, a snapshot's or a checkpoint's) as the state it copies:
    typed keys wrapped again (`keys`: each leaf's key dtype, or None), and a weakly typed scalar (`weak`) a
    Python number again, so the step traces it weak, as it did (a NumPy scalar is strongly typed: bf16
    parameters updated with it would become float32)."""

    treedef: Any
    keys: list
    weak: list[bool]

    def __call__(self, leaves: list[np.ndarray]) -> Any:
        return jax.tree_util.tree_unflatten(self.treedef, [
            wrap_keys(leaf, key) if key is not None else leaf.item() if weak else leaf
            for leaf, key, weak in zip(leaves, self.keys, self.weak)])

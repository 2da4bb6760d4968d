"""Pipeline schedules: a training step built from per-stage forward functions.

`pipeline(stages, slices, loss=..., schedule=..., micro_batches=M)` returns a
`Program` whose trace is one pipelined training step. Stage `s` runs
`stages[s](params[s], x)` on `slices[s]` (or `stages[s](params[s], state[s],
x) -> (y, state)`, with `stateful=True`); the batch is cut into M equal
micro-batches along its first axis. Per micro-batch, stage s runs

- F (forward): `jax.vjp` of the stage; it keeps only the residuals that are
  not its own inputs (those are passed again), so nothing is stored twice;
- B (backward): the stage's vjp applied to the gradient from stage s+1,
  its parameter gradients summed into the stage's running sum. (B traces
  `jax.vjp` once more to rebuild the vjp from the saved residuals; XLA drops
  that recomputation, as nothing reads it.)

The last stage does F, the loss and B at once (its activations need not
wait). The loss is the mean of `loss(y, target)` over micro-batches, which
equals the whole batch's when `loss` is a mean over rows; so loss and
gradients equal the unpipelined step's.

A schedule is the order of F and B on each stage; the program's trace order,
hence every island's order, follows it tick by tick (each tick, every stage
whose next step's inputs exist runs it):

- "gpipe": all forwards, then all backwards. Stage s keeps the residuals of
  all M micro-batches.
- "1f1b": S-1-s warm-up forwards, then one forward, one backward, and the
  remaining backwards. Stage s keeps at most S-s micro-batches' residuals,
  which is what `compiled.plan.peak(island)` shows.
- "interleaved-1f1b" (Megatron-LM's virtual stages): S stages on D slices,
  stage s on slice s % D, each slice running its V = S/D stages' steps in
  the interleaved 1F1B order; M must be a multiple of D. Its ideal bubble is
  V times smaller than 1F1B's, for more micro-batches in flight.
- "zb-h1" (zero bubble, Qi et al. 2023, its memory-neutral H1 variant):
  1F1B's order with each backward of a middle stage (0 < s < S-1) split in
  two executables from the same `jax.vjp` and saved residuals: B, the input
  gradient, which is all that stage s-1 waits for, and W, the weight
  gradient, run right after it in the steady state. In the cool-down (no
  forwards left) a stage runs its Bs back to back and the Ws after them,
  in the time it would otherwise wait for its last input gradients. The
  chain of backwards down the pipeline is then one B per hop instead of a
  whole backward; the first stage's backward needs no input gradient and
  the last stage's fused FB stays. W keeps its micro-batch's residuals and
  output gradient until it runs; no forward runs meanwhile, so no more
  micro-batches are in flight than in 1F1B.
"""

from __future__ import annotations

import numbers
from collections import abc
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from . import schedule_choice, schedule_picture
from .errors import require_bool
from .placed import jit
from .provenance import name_of
from .slices import Slice
from .tracer import Program

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")

Step = tuple[int, str, int]    # (stage, "F" | "B" | "W" | "FB", micro-batch)


def schedule_steps(schedule: str, stages: int, micro_batches: int, slices: int | None = None) -> list[list[Step]]:
    """Returns each worker's steps in order; a worker is a stage, or a slice for "interleaved-1f1b".

    Steps are (stage, kind, micro-batch): kind "F", "B", "W" (a weight
    gradient, "zb-h1" only), or "FB" on the last stage. For
    "interleaved-1f1b", stage s runs on slice s % `slices`.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule '{schedule}' (known: {', '.join(SCHEDULES)}; pw.pipeline "
                         f"also takes 'auto')")
    if schedule == "interleaved-1f1b":
        return _interleaved(stages, micro_batches, slices or stages)
    steps = []
    for s in range(stages):
        forwards = [(s, "F", m) for m in range(micro_batches)]
        backwards = [(s, "B", m) for m in range(micro_batches)]
        warmup = micro_batches if schedule == "gpipe" else min(stages - 1 - s, micro_batches)
        order = _one_forward_one_backward(forwards, backwards, warmup, stages - 1)
        if schedule == "zb-h1" and 0 < s < stages - 1:
            order = _split_backwards(order)
        steps.append(order)
    return steps


def _split_backwards(order: list[Step]) -> list[Step]:
    """ZB-H1's order for a middle stage: a W right after each B while forwards remain (the steady state);
    in the cool-down, once the last forward has run, each W one B later, so that the next B, which the
    stage before waits for, runs first (the last W closes the step)."""
    last_forward = max(i for i, (_, kind, _) in enumerate(order) if kind == "F")
    steady = [w for step in order[:last_forward + 1]
              for w in ([step, (step[0], "W", step[2])] if step[1] == "B" else [step])]
    cooldown, lagging = [], None
    for s, _, m in order[last_forward + 1:]:
        cooldown.append((s, "B", m))
        if lagging is not None:
            cooldown.append(lagging)
        lagging = (s, "W", m)
    return steady + cooldown + ([lagging] if lagging is not None else [])


def _interleaved(stages: int, micro_batches: int, slices: int) -> list[list[Step]]:
    """Megatron-LM's interleaved 1F1B: slice d runs stages d, d + D, ... (V = S / D virtual stages)."""
    if stages % slices or micro_batches % slices:
        raise ValueError(f"interleaved-1f1b needs stages ({stages}) and micro-batches ({micro_batches}) "
                         f"that are multiples of the slices ({slices})")
    virtual = stages // slices
    steps = []
    for d in range(slices):
        def order(kind, chunks):
            return [(v * slices + d, kind, g * slices + i) for g in range(micro_batches // slices)
                    for v in chunks for i in range(slices)]
        forwards, backwards = order("F", range(virtual)), order("B", range(virtual - 1, -1, -1))
        warmup = min(2 * (slices - d - 1) + (virtual - 1) * slices, len(forwards))
        steps.append(_one_forward_one_backward(forwards, backwards, warmup, stages - 1))
    return steps


def _one_forward_one_backward(forwards: list[Step], backwards: list[Step], warmup: int, last: int) -> list[Step]:
    """`warmup` forwards, then one forward and one backward in turn, then the rest of the backwards.

    The last stage's forward becomes its "FB" (forward, loss and backward) and its backward goes.
    """
    order = forwards[:warmup]
    for f, b in zip(forwards[warmup:], backwards):
        order += [f, b]
    order += backwards[len(forwards) - warmup:]
    return [(s, "FB" if s == last else kind, m) for s, kind, m in order if not (s == last and kind == "B")]


def step_needs(step: Step, last: int) -> Step | None:
    """The step whose result `step` reads (None for the first stage's forwards): F(s, m) and
    FB(s, m) read F(s-1, m), B(s, m) reads B or FB(s+1, m), W(s, m) follows B(s, m)."""
    s, kind, m = step
    if kind == "B":
        return s + 1, "FB" if s + 1 == last else "B", m
    if kind == "W":
        return s, "B", m
    return None if s == 0 else (s - 1, "F", m)


def tick_order(steps: list[list[Step]]) -> list[list[Step]]:
    """Returns the ticks of a schedule: each the steps, one per worker at most, that run together.

    A worker runs its next step in a tick when what it reads (`step_needs`)
    was made in an earlier tick.
    """
    last = max(s for order in steps for s, _, _ in order)
    position = [0] * len(steps)
    done: set[Step] = set()
    ticks = []
    while any(p < len(order) for p, order in zip(position, steps)):
        tick = []
        for w, order in enumerate(steps):
            if position[w] == len(order):
                continue
            s, kind, m = order[position[w]]
            needs = step_needs((s, kind, m), last)
            if needs is None or needs in done:
                tick.append((w, (s, kind, m)))
        if not tick:
            raise ValueError(f"pipeline schedule deadlocks after {len(done)} steps")
        for w, step in tick:
            done.add(step)
            position[w] += 1
        ticks.append([step for _, step in tick])
    return ticks


def _inputs(primals: Any) -> set[int]:
    return {id(leaf) for leaf in jax.tree.leaves(primals)}


def _with_state(stage: Callable) -> Callable:
    """A stage without state as one with an empty state: `(params, None, x) -> (y, None)`."""
    def stage_with_state(params, state, x):
        return stage(params, x), state
    stage_with_state.__name__ = name_of(stage)
    return stage_with_state


def _vjp(stage: Callable, params, state, x):
    """`jax.vjp` of a stateful stage in its parameters and input: (y, vjp, new state)."""
    return jax.vjp(lambda p, x: stage(p, state, x), params, x, has_aux=True)


def _forward(stage: Callable) -> Callable:
    def forward(params, state, x):
        y, vjp, new_state = _vjp(stage, params, state, x)
        own = _inputs((params, state, x))
        return y, new_state, [leaf for leaf in jax.tree.leaves(vjp) if id(leaf) not in own]
    forward.__name__ = f"{name_of(stage)}_forward"
    return forward


def _inexact(leaf) -> bool:
    """Whether `leaf` has gradients: a floating or complex array, not integers or booleans (token ids, masks)."""
    return jnp.issubdtype(leaf.dtype, jnp.inexact)


def _cotangent(y: Any, grad_y: Any) -> Any:
    """The cotangent of a stage's output `y` from the gradient its next stage sent: that has None for each
    integer or boolean leaf of `y`, whose cotangent is float0 zeros."""
    return jax.tree.map(lambda a, g: np.zeros(a.shape, jax.dtypes.float0) if g is None else g, y, grad_y)


def _backward(stage: Callable, returns: str, name: str = "backward") -> Callable:
    """The backward of a stage from its saved residuals: it returns the running gradient sum and
    the input gradient ("both"), the sum only ("weights") or the input gradient only ("input";
    XLA then drops the weight gradient's work, and "weights" the input gradient's)."""
    def backward(params, state, x, saved, grad_y, grad_sum):
        y, vjp, _ = _vjp(stage, params, state, x)
        leaves, tree = jax.tree.flatten(vjp)
        own, rest = _inputs((params, state, x)), iter(saved)
        grad_params, grad_x = jax.tree.unflatten(tree, [v if id(v) in own else next(rest) for v in leaves])(
            _cotangent(y, grad_y))
        grad_x = jax.tree.map(lambda g: None if g.dtype == jax.dtypes.float0 else g, grad_x)
        if returns == "input":
            return grad_x
        grad_sum = grad_params if grad_sum is None else jax.tree.map(jnp.add, grad_sum, grad_params)
        return grad_sum if returns == "weights" else (grad_sum, grad_x)
    backward.__name__ = f"{name_of(stage)}_{name}"
    return backward


def _last(stage: Callable, loss: Callable, micro_batches: int) -> Callable:
    def mean_loss(params, x, state, target):
        y, new_state = stage(params, state, x)
        value = loss(y, target)
        if not isinstance(value, (jax.Array, np.ndarray, np.generic, numbers.Number)):
            raise ValueError(f"loss {name_of(loss)!r} returned a {type(value).__name__}, not a scalar: a pipeline's "
                             f"loss is one value, a mean over the rows of the last stage's output (no auxiliary "
                             f"outputs)")
        if jnp.ndim(value) != 0:
            raise ValueError(f"loss {name_of(loss)!r} returned shape {jnp.shape(value)}, not a scalar: a pipeline's "
                             f"loss is a mean over the rows of the last stage's output")
        # Dividing by M would make an integer or boolean loss a float, whose gradients are zeros.
        if not jnp.issubdtype(jnp.result_type(value), jnp.floating):
            raise TypeError(f"loss {name_of(loss)!r} returned {jnp.result_type(value)}, not a floating-point "
                            f"scalar: a pipeline's loss is differentiated, as by jax.grad")
        return value / micro_batches, new_state

    def forward_backward(params, state, x, target, sums):
        # Only the inexact leaves of x have gradients; the others (token ids, masks) get None.
        leaves, tree = jax.tree.flatten(x)
        inexact = [i for i, leaf in enumerate(leaves) if _inexact(leaf)]

        def mean_loss_of(params, floats):
            whole = list(leaves)
            for i, leaf in zip(inexact, floats):
                whole[i] = leaf
            return mean_loss(params, jax.tree.unflatten(tree, whole), state, target)
        (value, new_state), (grad_params, grad_floats) = jax.value_and_grad(
            mean_loss_of, argnums=(0, 1), has_aux=True)(params, [leaves[i] for i in inexact])
        grads = dict(zip(inexact, grad_floats))
        grad_x = jax.tree.unflatten(tree, [grads.get(i) for i in range(len(leaves))])
        if sums is not None:
            value, grad_params = jax.tree.map(jnp.add, (value, grad_params), sums)
        return (value, grad_params), grad_x, new_state
    forward_backward.__name__ = f"{name_of(stage)}_forward_backward"
    return forward_backward


def _split(micro_batches: int, ways: Sequence[int] = (), axis: str | None = None) -> Callable:
    """Returns the function that cuts a batch into `micro_batches`, each of which `axis` (a pipeline's
    `batch_axis`) then splits `ways[s]` ways on stage s (checked for every stage before any stage runs)."""
    def split(batch):
        def cut(a):
            if a.shape[0] % micro_batches:
                raise ValueError(f"a batch of {a.shape[0]} rows does not split into {micro_batches} "
                                 f"micro-batches")
            for s, parts in enumerate(ways):
                if (a.shape[0] // micro_batches) % parts:
                    raise ValueError(f"a micro-batch of {a.shape[0] // micro_batches} rows ({a.shape[0]} rows over "
                                     f"{micro_batches} micro-batches) does not split {parts} ways over batch_axis "
                                     f"'{axis}' (stage {s}'s slice)")
            return a.reshape(micro_batches, a.shape[0] // micro_batches, *a.shape[1:])
        stacked = jax.tree.map(cut, batch)
        return [jax.tree.map(lambda a: a[m], stacked) for m in range(micro_batches)]
    return split


def _update(optimizer) -> Callable:
    def update(params, grads, state):
        updates, state = optimizer.update(grads, state, params)
        return jax.tree.map(lambda p, u: (p + u).astype(p.dtype), params, updates), state
    return update


def _sum(*trees):
    total = trees[0]
    for tree in trees[1:]:
        total = jax.tree.map(jnp.add, total, tree)
    return total


def _sum_once(*trees):
    """The sum of `trees` first, then zeros for every other tree: a tied group's gradients as one
    optimizer over the whole tree should see them, the parameter counted once."""
    return (_sum(*trees), *(jax.tree.map(jnp.zeros_like, tree) for tree in trees[1:]))


def _identity(tree):
    return tree


def _rows_first(forward: Callable, stage: int, batch_axis: str, ways: int, next_ways: int) -> Callable:
    """`forward` checking that each leaf of what stage `stage` passes on has the micro-batch's rows first, in a
    number that `ways` (its slice's size along `batch_axis`) and `next_ways` (the next stage's) divide: with
    `batch_axis` each is split over that axis by its first axis on both stages' slices."""
    def checked(params, state, x):
        out = forward(params, state, x)
        for path, leaf in jax.tree_util.tree_flatten_with_path(out[0])[0]:
            where = f"pipeline stage {stage} passes on y{jax.tree_util.keystr(path)} of shape {tuple(leaf.shape)}"
            if not leaf.shape:
                raise ValueError(f"{where}: with batch_axis={batch_axis!r} every leaf a stage passes on is split "
                                 f"over {batch_axis!r} by its first axis (the micro-batch's rows); pass other "
                                 f"values in the stages' params, or leave batch_axis out")
            for taker, parts in ((stage, ways), (stage + 1, next_ways)):
                if leaf.shape[0] % parts:
                    raise ValueError(f"{where}: with batch_axis={batch_axis!r} its {leaf.shape[0]} rows are split "
                                     f"{parts} ways over {batch_axis!r} on stage {taker}'s slice, which does not "
                                     f"divide them")
        return out
    return checked


def _at(tree: Any, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _replace(tree: Any, path: tuple, sub: Any) -> Any:
    """`tree` with the subtree at `path` (keys through dicts, lists and tuples) replaced by `sub`."""
    if not path:
        return sub
    head, rest = path[0], path[1:]
    if isinstance(tree, dict):
        return {**tree, head: _replace(tree[head], rest, sub)}
    if isinstance(tree, (list, tuple)):
        items = list(tree)
        items[head] = _replace(items[head], rest, sub)
        return type(tree)(items)
    raise TypeError(f"a tied parameter's path goes through dicts, lists and tuples, not {type(tree).__name__}")


def _check_tied(tied: Sequence[Sequence[tuple]], stages: int) -> list[list[tuple[int, tuple]]]:
    """Returns each group of tied parameters as (stage, path) pairs, checking the stages and that no parameter
    is named twice, in one group or two, itself or as part of another (its gradient would be summed twice)."""
    groups, named = [], []
    for group in tied:
        if not isinstance(group, (list, tuple)) or any(not isinstance(e, (list, tuple)) or not e for e in group):
            raise ValueError(f"tied group {group!r} must be a list of (stage, key, ...) tuples, as in "
                             f"tied=[[(0, 'embedding'), (3, 'embedding')]]")
        pairs = [(entry[0], tuple(entry[1:])) for entry in group]
        if len(pairs) < 2 or any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or not 0 <= s < stages
                                 for s, _ in pairs):
            raise ValueError(f"tied group {group!r} must name two or more parameters as (stage, key, ...) "
                             f"with a stage in [0, {stages})")
        pairs = [(int(s), path) for s, path in pairs]
        for s, path in pairs:
            for t, other in named:
                if s == t and path[:len(other)] == other[:len(path)]:
                    raise ValueError(f"tied names {(t, *other)!r} and {(s, *path)!r}, one parameter or one inside "
                                     f"the other: name each parameter once, in one group (one parameter that "
                                     f"several stages share is one group of them all)")
            named.append((s, path))
        groups.append(pairs)
    return groups


def _tied_parameters(params: Sequence, groups: list[list[tuple[int, tuple]]]) -> None:
    """Checks that each tied group names parameters of `params` that have one structure, shape and dtype."""
    for pairs in groups:
        layouts = []
        for s, path in pairs:
            try:
                found = _at(params[s], path)
            except (KeyError, IndexError, TypeError):
                raise ValueError(f"tied parameter {(s, *path)!r}: stage {s}'s params have nothing at "
                                 f"{list(path)}") from None
            leaves = [(tuple(v.shape), str(v.dtype)) for v in jax.tree.leaves(found)]
            layouts.append((jax.tree.structure(found), leaves))
        for (s, path), layout in zip(pairs[1:], layouts[1:]):
            if layout != layouts[0]:
                raise ValueError(f"tied parameters {(pairs[0][0], *pairs[0][1])!r} and {(s, *path)!r} differ "
                                 f"({_describe(layouts[0])} and {_describe(layout)}): tied copies must have "
                                 f"one shape and dtype")


def _describe(layout: tuple) -> str:
    """A tied parameter's shapes and dtypes as text: `float32[8, 8]`, several joined by commas."""
    return ", ".join(f"{dtype}{list(shape)}" for shape, dtype in layout[1]) or "no arrays"


@dataclass(frozen=True)
class StageFunctions:
    """A pipeline's functions: plain JAX functions, or the same placed on the stages' slices."""

    split_batch: Callable          # batch -> one pytree per micro-batch (on the first stage)
    split_targets: Callable        # targets -> one pytree per micro-batch (on the last stage)
    forward: list[Callable]        # per stage but the last: (params, state, x) -> (y, state, saved)
    backward: list[Callable]       # (params, state, x, saved, grad_y, grad_sum) -> grad_sum[, grad_x]
    forward_backward: Callable     # last stage: (params, state, x, target, sums) -> ((loss, grad_sum), grad_x, state)
    input_grad: list[Callable]     # "zb-h1"'s B: (params, state, x, saved, grad_y, None) -> grad_x
    weight_grad: list[Callable]    # "zb-h1"'s W: (params, state, x, saved, grad_y, grad_sum) -> grad_sum

    def map(self, place: Callable[[Callable, int], Callable]) -> "StageFunctions":
        """Returns `place(fn, stage)` of every function."""
        last = len(self.forward)
        return StageFunctions(place(self.split_batch, 0), place(self.split_targets, last),
                              [place(f, s) for s, f in enumerate(self.forward)],
                              [place(f, s) for s, f in enumerate(self.backward)],
                              place(self.forward_backward, last),
                              [place(f, s) for s, f in enumerate(self.input_grad)],
                              [place(f, s) for s, f in enumerate(self.weight_grad)])


def stage_functions(stages: Sequence[Callable], loss: Callable, micro_batches: int,
                    stateful: bool = False) -> StageFunctions:
    """Returns the forward, backward and split functions of a pipeline of `stages` (unplaced).

    Stateful stages are `stage(params, state, x) -> (y, state)`; others
    `stage(params, x) -> y`, run with the state None.
    """
    stages = list(stages) if stateful else [_with_state(f) for f in stages]
    return StageFunctions(_split(micro_batches), _split(micro_batches),
                          [_forward(f) for f in stages[:-1]],
                          [_backward(f, "weights" if s == 0 else "both") for s, f in enumerate(stages[:-1])],
                          _last(stages[-1], loss, micro_batches),
                          [_backward(f, "input", "input_grad") for f in stages[:-1]],
                          [_backward(f, "weights", "weight_grad") for f in stages[:-1]])


def _per_stage(name: str, values: Any, stages: int) -> Sequence:
    """Returns `values`, checking that it is a list or tuple of one entry per stage (`name` in the error)."""
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{name} must be a list of one pytree per stage ({stages} stages), not a "
                         f"{type(values).__name__}")
    if len(values) != stages:
        raise ValueError(f"{name} has {len(values)} entries for {stages} stages")
    return values


def _as_given(given: Sequence, entries: list) -> Sequence:
    """`entries`, one per stage, in the sequence type of `given` (a tuple stays a tuple, as with `jax.grad`)."""
    return jax.tree.unflatten(jax.tree.structure(given, is_leaf=lambda entry: entry is not given), entries)


def _differentiable(params: Sequence) -> None:
    """Checks that every leaf of each stage's params is floating-point or complex, as `jax.grad` needs."""
    for s, stage_params in enumerate(params):
        for path, leaf in jax.tree_util.tree_flatten_with_path(stage_params)[0]:
            dtype = jnp.result_type(leaf)       # (a Python float is a leaf too, under a JAX transformation)
            if not jnp.issubdtype(dtype, jnp.inexact):
                raise TypeError(f"stage {s}'s params{jax.tree_util.keystr(path)} is {dtype}: a stage's params "
                                f"are differentiated, as by jax.grad, so each leaf is floating-point or complex; "
                                f"pass integer and boolean values in what the stage takes, or close over them")


def _check_opt_states(optimizer, scope: str, params: Sequence, opt_states: Any) -> None:
    """Checks that `opt_states` has the structure and shapes of what `optimizer.init` makes for `scope`: one
    state per stage, or one state of the list of all stages' params."""
    def shapes(tree):
        return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(jnp.shape(leaf), jnp.result_type(leaf)), tree)
    if scope == "tree":
        expected = [("opt_states", "optimizer.init(list(params))", list(params), opt_states)]
        usage = "one state, optimizer.init(list(params))"
    else:
        _per_stage("opt_states", opt_states, len(params))
        expected = [(f"opt_states[{s}]", f"optimizer.init(params[{s}])", p, o)
                    for s, (p, o) in enumerate(zip(params, opt_states))]
        usage = "[optimizer.init(p) for p in params]"
    for name, init, stage_params, given in expected:
        want = jax.eval_shape(optimizer.init, shapes(stage_params))
        given_leaves, given_tree = jax.tree_util.tree_flatten_with_path(given)
        want_leaves, want_tree = jax.tree_util.tree_flatten_with_path(want)
        if given_tree != want_tree:
            raise ValueError(f"{name} has another structure than {init}: with optimizer_scope={scope!r}, "
                             f"opt_states is {usage}")
        for (path, leaf), (_, like) in zip(given_leaves, want_leaves):
            if jnp.shape(leaf) != like.shape:
                raise ValueError(f"{name}{jax.tree_util.keystr(path)} has shape {jnp.shape(leaf)}, {init}'s "
                                 f"{like.shape}: with optimizer_scope={scope!r}, opt_states is {usage}")


def _same_rows(batch: Any, targets: Any) -> None:
    """Checks that every leaf of `batch` and `targets` has a first axis (the batch's rows), of one size."""
    first = None
    for name, tree in (("batch", batch), ("targets", targets)):
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            where, shape = f"{name}{jax.tree_util.keystr(path)}", tuple(leaf.shape)
            if not shape:
                raise ValueError(f"{where} is a scalar: every leaf of a pipeline's batch and targets has the "
                                 f"batch's rows on its first axis")
            if first is None:
                first = where, shape[0]
            elif shape[0] != first[1]:
                raise ValueError(f"{where} has {shape[0]} rows and {first[0]} {first[1]}: every leaf of a "
                                 f"pipeline's batch and targets has the batch's rows on its first axis")


def run_schedule(ticks: list, functions: StageFunctions, params: Sequence, batch: Any, targets: Any,
                 states: Sequence | None = None):
    """Calls `functions` tick by tick (see `tick_order`); returns the loss, each stage's gradients
    and each stage's state after its last micro-batch.

    A stage's state goes through its micro-batches in order: the forward of
    micro-batch m reads the state that micro-batch m-1 left, and its backward
    the same state as its forward.
    """
    last = len(functions.forward)
    _per_stage("params", params, last + 1)
    _differentiable(params)
    states = list(_per_stage("states", states, last + 1)) if states is not None else [None] * (last + 1)
    _same_rows(batch, targets)
    inputs = {(0, m): x for m, x in enumerate(functions.split_batch(batch))}
    targets = functions.split_targets(targets)
    saved, grad_in, sums, state_in = {}, {}, [None] * (last + 1), {}
    split = {s for tick in ticks for s, kind, _ in tick if kind == "W"}     # stages whose B is B and W
    for tick in ticks:
        for s, kind, m in tick:
            if kind == "F":
                state_in[s, m] = states[s]
                inputs[s + 1, m], states[s], saved[s, m] = functions.forward[s](params[s], states[s], inputs[s, m])
            elif kind == "FB":
                sums[s], grad_in[s, m], states[s] = functions.forward_backward(
                    params[s], states[s], inputs[s, m], targets[m], sums[s])
            elif kind == "W":
                sums[s] = functions.weight_grad[s](params[s], state_in.pop((s, m)), inputs.pop((s, m)),
                                                   saved.pop((s, m)), grad_in.pop((s + 1, m)), sums[s])
            elif s in split:
                grad_in[s, m] = functions.input_grad[s](params[s], state_in[s, m], inputs[s, m], saved[s, m],
                                                        grad_in[s + 1, m], None)
            else:
                result = functions.backward[s](params[s], state_in.pop((s, m)), inputs.pop((s, m)),
                                               saved.pop((s, m)), grad_in.pop((s + 1, m)), sums[s])
                if s == 0:
                    sums[s] = result
                else:
                    sums[s], grad_in[s, m] = result
    value, sums[last] = sums[last]
    return value, sums, states


def pipeline(stages: Sequence[Callable], slices: Sequence[Slice], *, loss: Callable,
             schedule: str = "1f1b", micro_batches: int, optimizer=None, batch_axis: str | None = None,
             stateful: bool = False, optimizer_scope: str = "stage", tied: Sequence[Sequence[tuple]] = (),
             profile=None, memory_bytes: int | None = None) -> Program:
    """Builds a pipelined training step: stage `s` runs `stages[s](params, x)` on `slices[s]`.

    `loss(y, target)` is a mean over the rows of the last stage's output, one
    floating-point scalar. Without `optimizer` the program is
    `step(params, batch, targets) -> (loss, grads)`; with an optax
    `optimizer` it is `step(params, opt_states, batch, targets) -> (params,
    opt_states, loss)`, one optimizer state per stage
    (`[optimizer.init(p) for p in params]`), each stage updated on its
    slice. `params` is a sequence of one pytree per stage, whose leaves are
    floating-point or complex (gradients, new params and per-stage states
    come back in the type of sequence given, as from `jax.grad`); `batch` and
    `targets` are pytrees whose leaves have the batch on their first axis.
    What a stage takes and returns may hold integer or boolean leaves (token
    ids, masks), which have no gradient. `schedule` is "gpipe", "1f1b", "interleaved-1f1b" (virtual stages:
    slices repeat round-robin, stage s on the (s % D)-th of D slices),
    "zb-h1" (backwards split into input and weight gradients) or "auto"
    (each simulated, the fastest that fits picked: schedule_choice.py).
    With `batch_axis`, an axis every slice has, each stage is data parallel:
    micro-batches, activations and their gradients are split over that axis
    (what a stage passes on by its first axis, which both its slice and the
    next stage's split; saved residuals, parameters, states and gradient
    sums are replicated); without, a stage's steps run replicated over its
    slice.

    With `stateful=True` a stage is `stage(params, state, x) -> (y, state)`:
    its state (BatchNorm statistics, a flax NNX stage's RNG streams: what is
    not differentiated) goes through the micro-batches in order, and the
    backward of micro-batch m sees the state its forward saw. The program
    then takes `states` (one pytree per stage) after `params` (and after
    `opt_states`) and returns them after the gradients (or the optimizer
    states). This equals the unpipelined step that runs the micro-batches
    one after another and sums their gradients (`run_schedule` of plain
    functions does exactly that).

    `optimizer_scope="tree"` applies `optimizer` to the whole parameter
    tree, the list of all stages' params, so that masks, `multi_transform`
    labels, global norms and schedules see every parameter: `opt_states` is
    then one state, `optimizer.init(list(params))`, and the update runs on
    the first stage's slice (every stage's params and gradients travel there
    and back each step, the cost of generality). `"stage"` (the default)
    updates each stage on its own slice.

    `tied` lists groups of parameters that are one parameter used by several
    stages, each named `(stage, key, ...)` into that stage's params, such as
    `[[(0, "embedding"), (3, "embedding")]]`: their gradients are summed (on
    the first-named stage's slice) and every copy gets that sum. With an
    optimizer, the first-named copy's update is computed and every other copy
    is given its new value (on its own stage's slice), so the copies stay
    bit-equal; with `optimizer_scope="tree"` the optimizer sees the sum in the
    first-named copy and zeros in the others, so a global norm counts the
    parameter once, as in the unpipelined step.
    """
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, numbers.Integral) or micro_batches < 1:
        raise ValueError(f"micro_batches must be a positive integer, not {micro_batches!r:.40}")
    require_bool("pw.pipeline", "stateful", stateful)
    if isinstance(stages, str) or not isinstance(stages, abc.Sequence):
        raise TypeError(f"stages must be a list of functions, one per stage, not a {type(stages).__name__}")
    for s, stage in enumerate(stages):
        if not callable(stage):
            raise TypeError(f"stages[{s}] is {stage!r:.40}, not a function")
    if isinstance(slices, str) or not isinstance(slices, abc.Sequence):
        raise TypeError(f"slices must be a list of virtual slices, one per stage, not a {type(slices).__name__}")
    if not callable(loss):
        raise TypeError(f"loss must be a function loss(y, target), not {loss!r:.40}")
    if optimizer is not None and not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
        raise TypeError(f"optimizer must be an optax GradientTransformation (init and update), not {optimizer!r:.40}")
    for s, stage_slice in enumerate(slices):
        if batch_axis is not None and isinstance(stage_slice, Slice) and batch_axis not in stage_slice.axis_sizes:
            raise ValueError(f"batch_axis {batch_axis!r} is not an axis of stage {s}'s slice (axes: "
                             f"{', '.join(stage_slice.axes)}): with batch_axis every slice has that axis")
    if schedule == "auto":
        return schedule_choice.AutoPipeline(lambda s: pipeline(
            stages, slices, loss=loss, schedule=s, micro_batches=micro_batches, optimizer=optimizer,
            batch_axis=batch_axis, stateful=stateful, optimizer_scope=optimizer_scope, tied=tied),
            SCHEDULES, profile, memory_bytes)
    if profile is not None or memory_bytes is not None:
        raise ValueError("profile and memory_bytes are for schedule='auto', which simulates the schedules")
    if optimizer_scope not in ("stage", "tree"):
        raise ValueError(f"optimizer_scope is 'stage' or 'tree', not {optimizer_scope!r}")
    groups = _check_tied(tied, len(stages))
    if len(stages) != len(slices) or not stages:
        raise ValueError(f"a pipeline needs one slice per stage: {len(stages)} stages, {len(slices)} slices"
                         + (" (interleaved-1f1b: repeat D distinct slices, [a, b, ..., a, b, ...])"
                            if schedule == "interleaved-1f1b" else ""))
    distinct = list(dict.fromkeys(slices))
    if schedule == "interleaved-1f1b" and any(s is not distinct[i % len(distinct)] for i, s in enumerate(slices)):
        raise ValueError("interleaved-1f1b places stage s on slice s % D of D distinct slices: pass "
                         "slices as [a, b, ..., a, b, ...]")
    ticks = tick_order(schedule_steps(schedule, len(stages), micro_batches, len(distinct)))
    rows, last = (None if batch_axis is None else PartitionSpec(batch_axis)), len(stages) - 1
    raw = stage_functions(stages, loss, micro_batches, stateful)

    def place(fn, s, in_specs, out_specs):
        return jit(fn, slice=slices[s], in_specs=in_specs, out_specs=out_specs)
    ways = [1 if batch_axis is None else s.axis_sizes[batch_axis] for s in slices]
    placed = StageFunctions(place(_split(micro_batches, ways, batch_axis), 0, rows, rows),
                            place(_split(micro_batches, ways, batch_axis), last, rows, rows),
                            [place(f if batch_axis is None else _rows_first(f, s, batch_axis, ways[s], ways[s + 1]),
                                   s, (None, None, rows), (rows, None, None)) for s, f in enumerate(raw.forward)],
                            [place(f, s, (None, None, rows, None, rows, None), None if s == 0 else (None, rows))
                             for s, f in enumerate(raw.backward)],
                            place(raw.forward_backward, last, (None, None, rows, rows, None), (None, rows, None)),
                            [place(f, s, (None, None, rows, None, rows, None), rows)
                             for s, f in enumerate(raw.input_grad)],
                            [place(f, s, (None, None, rows, None, rows, None), None)
                             for s, f in enumerate(raw.weight_grad)])
    update = None if optimizer is None else (
        [jit(_update(optimizer), slice=s) for s in slices] if optimizer_scope == "stage"
        else jit(_update(optimizer), slice=slices[0]))
    once = optimizer is not None and optimizer_scope == "tree"
    sums = [jit(_sum_once if once else _sum, slice=slices[pairs[0][0]]) for pairs in groups]
    copies = [jit(_identity, slice=s) for s in slices]

    def train(params, opt_states, states, batch, targets):
        value, grads, new_states = run_schedule(ticks, placed, params, batch, targets, states)
        if states is not None:
            new_states = _as_given(states, new_states)
        _tied_parameters(params, groups)
        for pairs, add in zip(groups, sums):
            totals = add(*(_at(grads[s], path) for s, path in pairs))
            for k, (s, path) in enumerate(pairs):
                grads[s] = _replace(grads[s], path, totals[k] if once else totals)
        if optimizer is None:
            return value, _as_given(params, grads), new_states
        _check_opt_states(optimizer, optimizer_scope, params, opt_states)
        if optimizer_scope == "tree":
            new_params, opt_states = update(list(params), grads, opt_states)
        else:
            new = [update[s](params[s], grads[s], opt_states[s]) for s in range(len(stages))]
            new_params, opt_states = [p for p, _ in new], _as_given(opt_states, [o for _, o in new])
        new_params = list(new_params)
        for (first, first_path), *others in groups:
            for s, path in others:
                new_params[s] = _replace(new_params[s], path, copies[s](_at(new_params[first], first_path)))
        return _as_given(params, new_params), opt_states, new_states, value

    if stateful and optimizer is None:
        def step(params, states, batch, targets):
            return train(params, None, states, batch, targets)
    elif stateful:
        def step(params, opt_states, states, batch, targets):
            return train(params, opt_states, states, batch, targets)
    elif optimizer is None:
        def step(params, batch, targets):
            return train(params, None, None, batch, targets)[:2]
    else:
        def step(params, opt_states, batch, targets):
            params, opt_states, _, value = train(params, opt_states, None, batch, targets)
            return params, opt_states, value
    step.__name__ = f"pipeline_{schedule}"
    return PipelineProgram(step, schedule, schedule_steps(schedule, len(stages), micro_batches, len(distinct)),
                           distinct)


class PipelineProgram(Program):
    """A pipeline's training step (a `Program`) that can draw its schedule; see `pipeline`."""

    def __init__(self, fn: Callable, schedule: str, steps: list[list[Step]], slices: list[Slice]):
        super().__init__(fn)
        self.schedule = schedule
        self.steps = steps            # each worker's (stage, kind, micro-batch) steps in order
        self.slices = slices          # worker w runs on slices[w]

    def draw(self, path: str, trace=None) -> float:
        """Writes the schedule as a PNG at `path`: the planned order, or with `trace` (a `Tracer`
        from `Runtime.stop_tracing`, or its events) the measured launches of one run, one row per
        island. Returns the bubble, which the title shows."""
        return schedule_picture.draw_schedule(self.schedule, self.steps, self.slices, path, trace)

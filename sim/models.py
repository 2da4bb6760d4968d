"""The paper's training setups as `@pw.program`s, traced with abstract inputs (never run here).

Each is built so that the cost model counts the flops and bytes of the
model it stands for, and so that the plan holds the model's communication:

- `pipeline_step`: a synchronous pipelined training step, GPipe-style
  (Huang et al., 2019): per micro-batch a forward (F) and a backward (B)
  on each stage, in a schedule's order (`frontend/pipeline.py`'s
  `schedule_steps`/`tick_order`: "gpipe", "1f1b", "interleaved-1f1b"),
  then one optimizer update per stage, so the pipeline flushes every step.
  A stage is data parallel over its slice: activations split by rows,
  weights replicated. B recomputes the stage's forward (GPipe's
  re-materialisation: F keeps only its input) and adds each device's
  weight gradients into a per-device running sum; the update combines
  those once per step (an ICI all-reduce, `dialect/device_time.py`).
- `data_parallel_step`: two model replicas, each sharded over its own slice
  (`islands` 2: one island each; 1: both on one island), that exchange
  their gradients chunk by chunk as the backward pass makes them (over DCN
  across islands, ICI inside one), overlapped with the rest of the backward:
  each chunk is updated with both replicas' gradients one chunk later.

A layer stands for a decoder block by its matrix products: `tanh(x @ w1) @
w2`, with `w1` d x 6d and `w2` 6d x d, 12 d^2 weights and 24 d^2 flops per
token forward (attention's score products, which grow with the sequence,
are left out).
"""

from __future__ import annotations

from typing import Callable


def _spec(dtype, *shape):
    import jax

    return jax.ShapeDtypeStruct(shape, dtype)


def _block(x, w1, w2):
    import jax.numpy as jnp

    return jnp.tanh(x @ w1) @ w2


def _stage_forward(layers: int) -> Callable:
    """Returns (w1s, w2s, x) -> y: `layers` blocks, their weights stacked on a leading axis."""
    import jax

    def forward(w1s, w2s, x):
        return jax.lax.fori_loop(0, layers, lambda i, y: _block(y, w1s[i], w2s[i]), x)
    return forward


def _per_device_grads(forward: Callable, devices: int) -> Callable:
    """Returns (w1s, w2s, x, gy) -> (gw1s, gw2s, gx): each device's weight gradients kept apart on a
    leading axis of `devices` (no reduction across devices), the input gradient by rows."""
    import jax

    def one(w1s, w2s, x, gy):
        _, vjp = jax.vjp(forward, w1s, w2s, x)
        return vjp(gy)

    def grads(w1s, w2s, x, gy):
        parts = lambda a: a.reshape(devices, a.shape[0] // devices, *a.shape[1:])
        gw1, gw2, gx = jax.vmap(one, in_axes=(None, None, 0, 0))(w1s, w2s, parts(x), parts(gy))
        return gw1, gw2, gx.reshape(x.shape)
    return grads


def pipeline_step(stages: int, per_stage: int, islands: int, micro: int, tokens: int, width: int,
                  layers: int, schedule: str = "gpipe", slices: int | None = None):
    """Returns (traced program, abstract args) of one synchronous pipelined training step.

    `stages` stages of `layers / stages` blocks each on slices `stage<d>` of `per_stage` devices
    (`slices` of them, stage s on slice s % slices; default one per stage), slice d on island
    `d * islands // slices`; `micro` micro-batches of `tokens` rows of width `width` (bf16).
    """
    import jax.numpy as jnp
    import pathways_mlir as pw
    from jax.sharding import PartitionSpec as P

    from pathways_mlir.frontend.pipeline import schedule_steps, tick_order

    slices = slices or stages
    per_layer = layers // stages
    rows, dev = P("x"), P("x")
    placed = []
    for d in range(slices):
        placed.append(pw.virtual_slice(per_stage, axes="x", name=f"stage{d}",
                                       island=f"island{d * islands // slices}"))
    forward = _stage_forward(per_layer)
    grads = _per_device_grads(forward, per_stage)

    def backward(w1s, w2s, x, gy, *sums):
        gw1, gw2, gx = grads(w1s, w2s, x, gy)
        return (gw1 + sums[0], gw2 + sums[1], gx) if sums else (gw1, gw2, gx)

    def last(w1s, w2s, x, *sums):            # forward, loss 0.5 |y|^2 (its gradient is y), backward
        return backward(w1s, w2s, x, forward(w1s, w2s, x), *sums)

    def update(w1s, w2s, s1, s2):
        return ((w1s - 1e-3 * s1.sum(0)).astype(w1s.dtype), (w2s - 1e-3 * s2.sum(0)).astype(w2s.dtype))

    def on(s, fn, in_specs, out_specs):
        return pw.jit(fn, slice=placed[s % slices], in_specs=in_specs, out_specs=out_specs)
    fwd = [on(s, forward, (None, None, rows), rows) for s in range(stages)]
    # A stage's first backward starts its gradient sums on the devices; later ones add to them.
    bwd = [[on(s, backward, (None, None, rows, rows, *(dev,) * n), (dev, dev, rows)) for n in (0, 2)]
           for s in range(stages)]
    fb = [on(stages - 1, last, (None, None, rows, *(dev,) * n), (dev, dev, rows)) for n in (0, 2)]
    upd = [on(s, update, (None, None, dev, dev), (None, None)) for s in range(stages)]
    ticks = tick_order(schedule_steps(schedule, stages, micro, slices))

    @pw.program
    def step(w1, w2, xs):
        w1, w2, sums = list(w1), list(w2), [()] * stages
        inputs, grad_in = {(0, m): x for m, x in enumerate(xs)}, {}
        for tick in ticks:
            for s, kind, m in tick:
                if kind == "F":
                    inputs[s + 1, m] = fwd[s](w1[s], w2[s], inputs[s, m])
                elif kind == "FB":
                    *sums[s], grad_in[s, m] = fb[bool(sums[s])](w1[s], w2[s], inputs[s, m], *sums[s])
                else:
                    *sums[s], grad_in[s, m] = bwd[s][bool(sums[s])](
                        w1[s], w2[s], inputs.pop((s, m)), grad_in.pop((s + 1, m)), *sums[s])
        new = [upd[s](w1[s], w2[s], *sums[s]) for s in range(stages)]
        return [w for w, _ in new], [w for _, w in new]

    bf16 = jnp.bfloat16
    args = ([_spec(bf16, per_layer, width, 6 * width)] * stages, [_spec(bf16, per_layer, 6 * width, width)] * stages,
            [_spec(bf16, tokens, width)] * micro)
    return step, args


def data_parallel_step(islands: int, per_replica: int, params: float, tokens: int, grad_bytes: float,
                       chunks: int, width: int = 8192):
    """Returns (traced program, abstract args): two replicas of a `params`-weight model, each sharded
    over `per_replica` devices, each training on `tokens` tokens, exchanging `grad_bytes` of
    gradients per replica in `chunks` chunks as the backward pass makes them.

    A chunk's forward is `tanh(x @ v)` repeated so that its flops are 2 x (params / chunks) x tokens,
    and its backward twice that; its weights and gradients are sharded (fp32, `grad_bytes / chunks`
    bytes per replica). Replica r's slice `replica<r>` is on island `r` (`islands` 2) or island0.
    """
    import jax
    import jax.numpy as jnp
    import pathways_mlir as pw
    from jax.sharding import PartitionSpec as P

    trips = max(1, round(params / chunks / width ** 2))
    grad_elements = int(grad_bytes / chunks / 4) // per_replica * per_replica
    rows = P("x")
    replicas = [pw.virtual_slice(per_replica, axes="x", name=f"replica{r}", island=f"island{r * islands // 2}")
                for r in range(2)]

    def compute(x, v, w, times):
        # `w` rides along for its bytes; the products stand for the chunk's flops.
        y = jax.lax.fori_loop(0, times, lambda i, y: jnp.tanh(y @ v), x)
        return y, w

    def forward(x, v, w):
        return compute(x, v, w, trips)[0]

    def backward(x, v, w, gy):
        y, w = compute(x + gy, v, w, 2 * trips)
        return y, (w.astype(jnp.float32) * y[0, 0].astype(jnp.float32))

    def update(w, mine, theirs):
        return (w - 1e-3 * (mine + theirs)).astype(w.dtype)

    def on(r, fn, in_specs, out_specs):
        return pw.jit(fn, slice=replicas[r], in_specs=in_specs, out_specs=out_specs)
    fwd = [on(r, forward, (rows, None, rows), rows) for r in range(2)]
    bwd = [on(r, backward, (rows, None, rows, rows), (rows, rows)) for r in range(2)]
    upd = [on(r, update, (rows, rows, rows), rows) for r in range(2)]

    @pw.program
    def step(xs, v, ws):
        acts = [[x] for x in xs]
        for c in range(chunks):
            for r in range(2):
                acts[r].append(fwd[r](acts[r][-1], v[r], ws[r][c]))
        grads, new = [[None] * chunks for _ in range(2)], [[None] * chunks for _ in range(2)]
        gy = [a[-1] for a in acts]
        for c in reversed(range(chunks)):
            for r in range(2):
                gy[r], grads[r][c] = bwd[r](acts[r][c], v[r], ws[r][c], gy[r])
            # Chunk c+1's update, which reads the other replica's gradients, comes one chunk late: an
            # island takes its steps in order, so its recv would otherwise hold back this backward.
            if c + 1 < chunks:
                for r in range(2):
                    new[r][c + 1] = upd[r](ws[r][c + 1], grads[r][c + 1], grads[1 - r][c + 1])
        for r in range(2):
            new[r][0] = upd[r](ws[r][0], grads[r][0], grads[1 - r][0])
        return new

    bf16 = jnp.bfloat16
    args = ([_spec(bf16, tokens, width)] * 2, [_spec(bf16, width, width)] * 2,
            [[_spec(bf16, grad_elements)] * chunks] * 2)
    return step, args

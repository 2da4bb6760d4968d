"""`pw.pipeline`: GPipe, 1F1B and interleaved 1F1B steps equal the unpipelined step; 1F1B needs less memory than GPipe."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fetching import fetch

import pathways_mlir as pw
from pathways_mlir.frontend.pipeline import schedule_steps, tick_order

STAGES, MICRO_BATCHES, WIDTH, ROWS = 4, 8, 32, 512


def in_flight(order):
    """The most micro-batches a worker has run forward but not yet backward."""
    live = peak = 0
    for _, kind, _ in order:
        live += {"F": 1, "B": -1, "FB": 0}[kind]
        peak = max(peak, live)
    return peak


def every_step(steps):
    return sorted(step for order in steps for step in order)


@pytest.mark.parametrize("stages,micro_batches", [(1, 3), (2, 2), (4, 8), (3, 7)])
def test_schedules_run_every_step_once_in_dependency_order(stages, micro_batches):
    expected = sorted([(s, "F", m) for s in range(stages - 1) for m in range(micro_batches)]
                      + [(s, "B", m) for s in range(stages - 1) for m in range(micro_batches)]
                      + [(stages - 1, "FB", m) for m in range(micro_batches)])
    for schedule in ("gpipe", "1f1b"):
        steps = schedule_steps(schedule, stages, micro_batches)
        assert every_step(steps) == expected == every_step([[s for tick in tick_order(steps) for s in tick]])
        # 1F1B keeps at most S - s micro-batches on stage s; GPipe all of them.
        assert [in_flight(order) for order in steps[:-1]] == [
            micro_batches if schedule == "gpipe" else min(stages - s, micro_batches) for s in range(stages - 1)]
    # ZB-H1 is 1F1B with each middle stage's backward split into B (input gradient) and W (weights): W right
    # after B while forwards remain, and in the cool-down one B later.
    zero_bubble = schedule_steps("zb-h1", stages, micro_batches)
    weights = [(s, "W", m) for s in range(1, stages - 1) for m in range(micro_batches)]
    assert every_step(zero_bubble) == sorted(expected + weights) == every_step(
        [[s for tick in tick_order(zero_bubble) for s in tick]])
    assert [[step for step in order if step[1] != "W"] for order in zero_bubble] == schedule_steps(
        "1f1b", stages, micro_batches)
    for s in range(1, stages - 1):
        order = zero_bubble[s]
        last_forward = max(i for i, step in enumerate(order) if step[1] == "F")
        cooldown = [m for _, kind, m in order[last_forward:] if kind == "B"]
        assert order[last_forward + 1:] == [(s, "B", cooldown[0])] + [
            step for m, before in zip(cooldown[1:], cooldown) for step in ((s, "B", m), (s, "W", before))] + [
            (s, "W", cooldown[-1])]
        assert all(order[order.index((s, "B", m)) + 1] == (s, "W", m) for _, _, m in weights
                   if m not in cooldown)


@pytest.mark.parametrize("slices,virtual,micro_batches", [(2, 2, 4), (2, 3, 6), (4, 2, 8), (3, 2, 3)])
def test_interleaved_1f1b_runs_every_step_once_on_its_slice(slices, virtual, micro_batches):
    stages = slices * virtual
    steps = schedule_steps("interleaved-1f1b", stages, micro_batches, slices)
    ticks = tick_order(steps)                 # raises if the order deadlocks
    assert every_step(steps) == every_step(schedule_steps("1f1b", stages, micro_batches))
    assert every_step(steps) == every_step([[s for tick in ticks for s in tick]])
    assert all(s % slices == d for d, order in enumerate(steps) for s, _, _ in order)
    # Megatron-LM's bound: slice d keeps at most 2(D-d-1) + (V-1)D + 1 stage steps' residuals.
    assert all(in_flight(order) <= 2 * (slices - d - 1) + (virtual - 1) * slices + 1
               for d, order in enumerate(steps))


def test_unknown_schedules_and_mismatched_slices_are_errors():
    with pytest.raises(ValueError, match="unknown pipeline schedule 'zigzag'"):
        schedule_steps("zigzag", 2, 4)
    with pytest.raises(ValueError, match="one slice per stage: 2 stages, 1 slices$"):
        pw.pipeline([jnp.tanh, jnp.tanh], [pw.virtual_slice(1, axes="x")], loss=jnp.mean, micro_batches=2)
    with pytest.raises(ValueError, match=r"1 slices \(interleaved-1f1b: repeat D distinct slices"):
        pw.pipeline([jnp.tanh, jnp.tanh], [pw.virtual_slice(1, axes="x")], loss=jnp.mean, micro_batches=2,
                    schedule="interleaved-1f1b")
    for count in (0, -1, 2.5, "4", True):
        with pytest.raises(ValueError, match="micro_batches must be a positive integer"):
            pw.pipeline([jnp.tanh], [pw.virtual_slice(1, axes="x")], loss=jnp.mean, micro_batches=count)
    pw.pipeline([jnp.tanh], [pw.virtual_slice(1, axes="x")], loss=jnp.mean, micro_batches=np.int64(2))
    for stateful in ("false", 0, None):     # each read as False before, "false" as True
        with pytest.raises(TypeError, match=rf"^pw.pipeline: stateful must be True or False, not {stateful!r}$"):
            pw.pipeline([jnp.tanh], [pw.virtual_slice(1, axes="x")], loss=jnp.mean, micro_batches=2,
                        stateful=stateful)
    a, b = pw.virtual_slice(1, axes="x"), pw.virtual_slice(1, axes="x")
    with pytest.raises(ValueError, match="stage s on slice s % D"):
        pw.pipeline([jnp.tanh] * 4, [a, a, b, b], loss=jnp.mean, schedule="interleaved-1f1b", micro_batches=2)
    with pytest.raises(ValueError, match=r"micro-batches \(3\) that are multiples of the slices \(2\)"):
        schedule_steps("interleaved-1f1b", 4, 3, 2)


def test_stages_slices_loss_and_optimizer_of_the_wrong_kind_are_one_error_line():
    a, b = pw.virtual_slice(1, axes="x"), pw.virtual_slice(1, axes="x")
    for kwargs, message in (
            (dict(stages=jnp.tanh, slices=[a]), r"^stages must be a list of functions, one per stage, not a "),
            (dict(stages=[jnp.tanh, None], slices=[a, b]), r"^stages\[1\] is None, not a function$"),
            (dict(stages=[jnp.tanh], slices=a), r"^slices must be a list of virtual slices, one per stage, not a "
                                                r"Slice$"),
            (dict(stages=[jnp.tanh], slices=[a], loss="mse"),
             r"^loss must be a function loss\(y, target\), not 'mse'$"),
            (dict(stages=[jnp.tanh], slices=[a], optimizer="adam"),
             r"^optimizer must be an optax GradientTransformation \(init and update\), not 'adam'$")):
        with pytest.raises(TypeError, match=message):
            pw.pipeline(**{"loss": jnp.mean, "micro_batches": 2, **kwargs})


def stage(params, x):
    return jnp.tanh(x @ params["w"] + params["b"])


def mse(y, target):
    return jnp.mean((y - target) ** 2)


def unpipelined(params, x, target):
    def loss(params):
        y = x
        for p in params:
            y = stage(p, y)
        return mse(y, target)
    return jax.value_and_grad(loss)(params)


def test_schedules_equal_the_unpipelined_step_and_1f1b_peaks_below_gpipe(four_islands):
    rng = np.random.default_rng(0)
    params = [{"w": rng.normal(0, WIDTH ** -0.5, (WIDTH, WIDTH)).astype(np.float32),
               "b": rng.normal(0, 0.1, WIDTH).astype(np.float32)} for _ in range(STAGES)]
    x = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    target = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    expected_loss, expected_grads = jax.jit(unpipelined)(params, x, target)
    peaks = {}
    for schedule in ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1"):
        slices = [pw.virtual_slice(2, axes="x", island=f"island{s}") for s in range(STAGES)]
        if schedule == "interleaved-1f1b":          # two virtual stages on each of two slices
            slices = slices[:2] * 2
        step = pw.pipeline([stage] * STAGES, slices, loss=mse, schedule=schedule, micro_batches=MICRO_BATCHES)
        compiled = step.lower(params, x, target).compile(four_islands.runtime)
        loss, grads = fetch(compiled(params, x, target, client=four_islands))
        np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
        for ours, theirs in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads)):
            np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-7)
        peaks[schedule] = [max((b for _, _, b in compiled.plan.peak(f"island{s}")), default=0)
                           for s in range(STAGES)]
    # Stage s keeps S - s micro-batches' residuals under 1F1B, M under GPipe: at
    # least one activation (rows x width floats) each.
    activation = ROWS // MICRO_BATCHES * WIDTH * 4
    for s in range(STAGES - 1):
        assert peaks["gpipe"][s] - peaks["1f1b"][s] >= (MICRO_BATCHES - (STAGES - s)) * activation, peaks
    assert peaks["gpipe"][-1] == peaks["1f1b"][-1]      # the last stage runs F and B together
    # ZB-H1's W runs right after its B, or one B later in the cool-down: no stage's static peak is above 1F1B's.
    assert all(z <= o for z, o in zip(peaks["zb-h1"], peaks["1f1b"])), peaks


def two_stages(seed: int, rows: int):
    """Random params of two stages, a batch and targets of `rows` rows."""
    rng = np.random.default_rng(seed)
    params = [{"w": rng.normal(0, WIDTH ** -0.5, (WIDTH, WIDTH)).astype(np.float32),
               "b": rng.normal(0, 0.1, WIDTH).astype(np.float32)} for _ in range(2)]
    return params, rng.normal(size=(rows, WIDTH)).astype(np.float32), rng.normal(size=(rows, WIDTH)).astype(np.float32)


def test_data_parallel_stages_split_micro_batches_and_equal_the_unpipelined_step(two_islands):
    params, x, target = two_stages(seed=1, rows=64)
    slices = [pw.virtual_slice(2, axes="rows", island=f"island{s}") for s in range(2)]
    step = pw.pipeline([stage, stage], slices, loss=mse, micro_batches=4, batch_axis="rows")
    loss, grads = fetch(step.run(params, x, target, client=two_islands))
    expected_loss, expected_grads = jax.jit(unpipelined)(params, x, target)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    for ours, theirs in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-7)
    plan = step.compiled(params, x, target, runtime=two_islands.runtime).plan
    # Micro-batches and activations are split in two on both islands; residuals saved whole.
    split = {plan.slices[b.slice].island for b in plan.buffers.values()
             if b.slice is not None and b.shape == (16, WIDTH) and b.sharding == (("rows",), ())
             and b.bytes_per_device == 8 * WIDTH * 4}
    assert split == {"island0", "island1"}


def test_micro_batches_the_batch_axis_cannot_split_are_one_error_line():
    params, x, target = two_stages(seed=1, rows=8)
    slices = [pw.virtual_slice(2, axes="rows") for _ in range(2)]
    step = pw.pipeline([stage, stage], slices, loss=mse, micro_batches=8, batch_axis="rows")
    with pytest.raises(ValueError, match=r"^a micro-batch of 1 rows \(8 rows over 8 micro-batches\) does not "
                                         r"split 2 ways over batch_axis 'rows' \(stage 0's slice\)"):
        step.lower(params, x, target)


def test_a_middle_stage_the_micro_batches_cannot_split_over_is_one_error_line():
    """A middle stage wider along `batch_axis` than a micro-batch's rows gave a PlacementError about an internal
    function `checked` and a spec P('rows',) the user never wrote."""
    params, x, target = two_stages(seed=1, rows=8)
    slices = [pw.virtual_slice(n, axes="rows") for n in (1, 4, 1)]
    step = pw.pipeline([stage] * 3, slices, loss=mse, micro_batches=4, batch_axis="rows")
    with pytest.raises(ValueError, match=r"^a micro-batch of 2 rows \(8 rows over 4 micro-batches\) does not "
                                         r"split 4 ways over batch_axis 'rows' \(stage 1's slice\)"):
        step.lower(params + params[:1], x, target)


def test_batch_and_targets_leaves_without_one_number_of_rows_are_one_error_line():
    params, x, target = two_stages(seed=7, rows=8)
    step = pw.pipeline([stage, stage], [pw.virtual_slice(1, axes="x") for _ in range(2)], loss=mse, micro_batches=2)
    # 2 target rows cut into 2 micro-batches are 1 row each, which broadcasts against 4 rows: a wrong loss, silently.
    with pytest.raises(ValueError, match=r"^targets has 2 rows and batch 8: every leaf of a pipeline's batch and "
                                         r"targets has the batch's rows on its first axis$"):
        step.lower(params, x, target[:2])
    with pytest.raises(ValueError, match=r"^batch\['mask'\] is a scalar: every leaf"):
        pw.pipeline([lambda p, b: stage(p, b["x"]), stage], [pw.virtual_slice(1, axes="x") for _ in range(2)],
                    loss=mse, micro_batches=2).lower(params, {"x": x, "mask": np.float32(1)}, target)


def test_a_loss_that_is_not_a_scalar_is_one_error_line():
    params, x, target = two_stages(seed=8, rows=8)

    def squared_errors(y, target):           # no mean: one loss per element
        return (y - target) ** 2
    step = pw.pipeline([stage, stage], [pw.virtual_slice(1, axes="x") for _ in range(2)], loss=squared_errors,
                       micro_batches=2)
    with pytest.raises(ValueError, match=r"^loss 'squared_errors' returned shape \(4, 32\), not a scalar: a "
                                         r"pipeline's loss is a mean over the rows of the last stage's output"):
        step.lower(params, x, target)


def test_a_loss_that_is_not_one_floating_point_scalar_is_one_error_line():
    """An integer or boolean loss became a float when divided by the micro-batches, and its gradients were zeros
    (jax.grad refuses it); a loss returning (value, aux) gave JAX's TracerArrayConversionError."""
    params, x, target = two_stages(seed=8, rows=8)
    slices = [pw.virtual_slice(1, axes="x") for _ in range(2)]

    def count_above(y, target):
        return jnp.sum(y > target)

    def any_above(y, target):
        return jnp.any(y > target)

    def with_aux(y, target):
        return mse(y, target), {"mean": jnp.mean(y)}
    for loss, dtype in ((count_above, "int32"), (any_above, "bool")):
        step = pw.pipeline([stage, stage], slices, loss=loss, micro_batches=2)
        with pytest.raises(TypeError, match=rf"^loss '{loss.__name__}' returned {dtype}, not a floating-point "
                                            r"scalar: a pipeline's loss is differentiated, as by jax.grad"):
            step.lower(params, x, target)
    step = pw.pipeline([stage, stage], slices, loss=with_aux, micro_batches=2)
    with pytest.raises(ValueError, match=r"^loss 'with_aux' returned a tuple, not a scalar: a pipeline's loss is "
                                         r"one value"):
        step.lower(params, x, target)


def test_an_optax_transformation_over_the_whole_parameter_tree(two_islands):
    import optax

    params, x, target = two_stages(seed=2, rows=32)
    # Weight decay on the weights only, a different rate per stage, and a global-norm clip: none is per stage.
    labels = [{"w": "first", "b": "bias"}, {"w": "second", "b": "bias"}]
    tx = optax.chain(optax.clip_by_global_norm(0.1), optax.multi_transform(
        {"first": optax.adamw(1e-2, weight_decay=0.1), "second": optax.adamw(3e-2, weight_decay=0.1),
         "bias": optax.sgd(optax.linear_schedule(0.1, 0.0, 3))}, labels))
    slices = [pw.virtual_slice(2, axes="x", island=f"island{s}") for s in range(2)]
    step = pw.pipeline([stage, stage], slices, loss=mse, micro_batches=4, optimizer=tx, optimizer_scope="tree")

    @jax.jit
    def plain(params, opt_state):
        loss, grads = unpipelined(params, x, target)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    ours, theirs = (params, tx.init(params)), (params, tx.init(params))
    for _ in range(3):
        *ours, loss = step.run(*ours, x, target, client=two_islands)
        *theirs, expected_loss = plain(*theirs)
        np.testing.assert_allclose(fetch(loss), expected_loss, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(fetch(ours[0])), jax.tree.leaves(theirs[0])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_tuples_of_params_opt_states_and_states_come_back_as_tuples(two_islands):
    """Tuple params gave a list of gradients (jax.value_and_grad gives a tuple), so `jax.tree.map(f, params,
    grads)` failed; an optimizer's new params and states and a stateful step's states were lists too."""
    import optax

    params, x, target = two_stages(seed=2, rows=16)
    params = tuple(params)
    slices = [pw.virtual_slice(1, axes="x", island=f"island{s}") for s in range(2)]
    step = pw.pipeline([stage, stage], slices, loss=mse, micro_batches=2)
    expected_loss, expected_grads = jax.jit(unpipelined)(params, x, target)
    loss, grads = fetch(step.run(params, x, target, client=two_islands))
    assert type(grads) is tuple
    assert step.eval_shape(params, x, target) == jax.eval_shape(jax.value_and_grad(
        lambda p: unpipelined(p, x, target)[0]), params)
    for ours, theirs in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-7)
    tx = optax.adam(1e-2)
    step = pw.pipeline([stage, stage], slices, loss=mse, micro_batches=2, optimizer=tx)
    new_params, opt_states, _ = step.run(params, tuple(tx.init(p) for p in params), x, target, client=two_islands)
    assert type(new_params) is tuple and type(opt_states) is tuple

    def counting(params, count, x):
        return stage(params, x), count + 1
    step = pw.pipeline([counting, counting], slices, loss=mse, micro_batches=2, stateful=True)
    _, grads, counts = fetch(step.run(params, (np.int32(0), np.int32(0)), x, target, client=two_islands))
    assert type(grads) is tuple and type(counts) is tuple and counts == (2, 2)


def embed(params, tokens):
    return params["embedding"][tokens]


def unembed(params, hidden):
    return jnp.tanh(hidden) @ params["embedding"].T


def cross_entropy(logits, tokens):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, None], axis=1))


@pytest.mark.parametrize("scope, optimizer, devices", [("stage", "adam", 2), ("stage", "adam", 1),
                                                       ("tree", "clipped sgd", 1)])
def test_a_tied_embedding_gets_one_update_and_its_copies_stay_bit_equal(two_islands, scope, optimizer, devices):
    """Every copy of a tied parameter was given the summed gradient before the optimizer ran: under
    `optimizer_scope="tree"` a global norm counted the parameter once per copy, so a clipped update was
    1/sqrt(2) of the unpipelined step's; under "stage" each copy's own update drifted from the others by
    rounding (6e-8 after 5 adam steps). The first-named copy's update is now computed once (the others' gradients
    zeros in what a tree optimizer sees) and every other copy is given its new value, on its own stage's slice."""
    import optax

    rng = np.random.default_rng(3)
    embedding = rng.normal(0, 0.5, (16, 8)).astype(np.float32)
    tokens = rng.integers(0, 16, 32).astype(np.int32)
    targets = rng.integers(0, 16, 32).astype(np.int32)
    tx = optax.adam(1e-2) if optimizer == "adam" else optax.chain(optax.clip_by_global_norm(0.05), optax.sgd(1.0))
    slices = [pw.virtual_slice(devices, axes="x", island=f"island{s}") for s in range(2)]
    step = pw.pipeline([embed, unembed], slices, loss=cross_entropy, micro_batches=2, optimizer=tx,
                       optimizer_scope=scope, tied=[[(0, "embedding"), (1, "embedding")]])

    @jax.jit
    def plain(embedding, opt_state):         # one embedding, used twice
        loss, grad = jax.value_and_grad(lambda e: cross_entropy(unembed({"embedding": e},
                                                                        embed({"embedding": e}, tokens)),
                                                                targets))(embedding)
        updates, opt_state = tx.update(grad, opt_state, embedding)
        return optax.apply_updates(embedding, updates), opt_state, loss

    params = [{"embedding": embedding}, {"embedding": embedding}]
    opt_states = tx.init(params) if scope == "tree" else [tx.init(p) for p in params]
    want, want_state = embedding, tx.init(embedding)
    for _ in range(5):
        params, opt_states, loss = step.run(params, opt_states, tokens, targets, client=two_islands)
        want, want_state, expected_loss = plain(want, want_state)
        np.testing.assert_allclose(fetch(loss), expected_loss, rtol=1e-5)
    first, second = (fetch(p["embedding"]) for p in params)
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first, want, rtol=1e-5, atol=1e-6)
    homes = [p["embedding"].devices() for p in params]      # each copy on its own stage's slice
    assert homes[0] != homes[1] and all(len(h) == devices for h in homes)
    with pytest.raises(ValueError, match=r"tied group \[\(0, 'embedding'\)\] must name two or more"):
        pw.pipeline([embed, unembed], slices, loss=cross_entropy, micro_batches=2, tied=[[(0, "embedding")]])


def test_a_stage_passing_on_a_value_without_rows_under_batch_axis_is_one_error_line():
    """With `batch_axis`, every leaf a stage passes on is split over that axis by its first axis; a scalar (an
    auxiliary loss passed along) failed with a PlacementError about a spec `P('r',)` the user never wrote."""
    def first(params, x):
        h = jnp.tanh(x @ params["w"])
        return h, jnp.mean(h ** 2)

    def second(params, y):
        h, aux = y
        return jnp.tanh(h @ params["w"]) + aux

    params = [{"w": np.eye(4, dtype=np.float32)} for _ in range(2)]
    x = np.ones((8, 4), np.float32)
    slices = [pw.virtual_slice(2, axes="r", island=f"island{s}") for s in range(2)]
    step = pw.pipeline([first, second], slices, loss=mse, micro_batches=2, batch_axis="r")
    with pytest.raises(ValueError, match=r"^pipeline stage 0 passes on y\[1\] of shape \(\): with batch_axis='r' "
                                         r"every leaf a stage passes on is split over 'r' by its first axis"):
        step.lower(params, x, x)
    loss, _ = pw.pipeline([first, second], slices, loss=mse, micro_batches=2)(params, x, x)
    assert np.isfinite(float(loss))


def test_a_batch_axis_that_a_slice_lacks_is_one_error_line():
    """It gave a PlacementError about an internal function (`split`, `checked`) and a spec P('rows',) the user
    never wrote."""
    with_rows, without = pw.virtual_slice(2, axes="rows"), pw.virtual_slice(2, axes="q")
    for slices, s in (([with_rows, without], 1), ([with_rows, without, with_rows], 1), ([without, with_rows], 0)):
        with pytest.raises(ValueError, match=rf"^batch_axis 'rows' is not an axis of stage {s}'s slice \(axes: q\): "
                                             r"with batch_axis every slice has that axis$"):
            pw.pipeline([stage] * len(slices), slices, loss=mse, micro_batches=2, batch_axis="rows")


def test_rows_a_stage_passes_on_that_the_next_stage_cannot_split_are_one_error_line():
    """What stage s passed on was checked against stage s's slice only: a stage halving the rows on a 2-way slice
    passed, then the next, 4-way, stage failed with a PlacementError about `<stage>_forward_backward`."""
    def halve(params, x):
        return stage(params, x)[::2]

    params, x, _ = two_stages(seed=1, rows=8)
    slices = [pw.virtual_slice(2, axes="rows"), pw.virtual_slice(4, axes="rows")]
    step = pw.pipeline([halve, stage], slices, loss=lambda y, t: jnp.mean(y ** 2), micro_batches=2,
                       batch_axis="rows")
    with pytest.raises(ValueError, match=r"^pipeline stage 0 passes on y of shape \(2, 32\): with "
                                         r"batch_axis='rows' its 2 rows are split 4 ways over 'rows' on stage 1's "
                                         r"slice, which does not divide them"):
        step.lower(params, x, None)


def test_params_and_opt_states_that_are_not_one_per_stage_are_one_error_line():
    import optax

    params, x, target = two_stages(seed=6, rows=8)
    slices = [pw.virtual_slice(1, axes="x") for _ in range(2)]
    step = pw.pipeline([stage, stage], slices, loss=mse, micro_batches=2)
    with pytest.raises(ValueError, match=r"^params must be a list of one pytree per stage \(2 stages\), not a dict$"):
        step.lower(params[0], x, target)          # one stage's params, not the list
    with pytest.raises(ValueError, match=r"^params has 1 entries for 2 stages$"):
        step.lower(params[:1], x, target)
    tx = optax.sgd(0.1)
    step = pw.pipeline([stage, stage], slices, loss=mse, micro_batches=2, optimizer=tx)
    with pytest.raises(ValueError, match=r"^opt_states has 1 entries for 2 stages$"):
        step.lower(params, [tx.init(params[0])], x, target)
    with pytest.raises(ValueError, match=r"^opt_states must be a list of one pytree per stage \(2 stages\), not a "
                                         r"dict$"):
        step.lower(params, {"stage0": tx.init(params[0]), "stage1": tx.init(params[1])}, x, target)


def test_opt_states_of_the_other_optimizer_scope_or_other_params_are_one_error_line():
    """The tree scope's state of a chain of two is a tuple of two, which passed the one-per-stage check of two
    stages; optax then failed inside ('The number of updates and states has to be the same in chain!'), as it did
    the other way round ("'tuple' object has no attribute 'mu'")."""
    import optax

    params, x, target = two_stages(seed=6, rows=8)
    slices = [pw.virtual_slice(1, axes="x") for _ in range(2)]
    tx = optax.adam(1e-2)
    step = pw.pipeline([stage, stage], slices, loss=mse, micro_batches=2, optimizer=tx)
    with pytest.raises(ValueError, match=r"^opt_states\[0\] has another structure than optimizer.init\(params\[0\]\): "
                                         r"with optimizer_scope='stage', opt_states is \[optimizer.init\(p\) for p "
                                         r"in params\]$"):
        step.lower(params, tx.init(params), x, target)
    small = {"w": np.zeros((4, WIDTH), np.float32), "b": params[1]["b"]}
    with pytest.raises(ValueError, match=r"^opt_states\[1\]\[0\].mu\['w'\] has shape \(4, 32\), "
                                         r"optimizer.init\(params\[1\]\)'s \(32, 32\): with optimizer_scope='stage'"):
        step.lower(params, [tx.init(params[0]), tx.init(small)], x, target)
    step = pw.pipeline([stage, stage], slices, loss=mse, micro_batches=2, optimizer=tx, optimizer_scope="tree")
    with pytest.raises(ValueError, match=r"^opt_states has another structure than optimizer.init\(list\(params\)\): "
                                         r"with optimizer_scope='tree', opt_states is one state, "
                                         r"optimizer.init\(list\(params\)\)$"):
        step.lower(params, [tx.init(p) for p in params], x, target)


def test_tied_parameters_must_exist_and_match_in_shape():
    params, x, target = two_stages(seed=5, rows=8)
    slices = [pw.virtual_slice(1, axes="x") for _ in range(2)]

    def lower(tied):
        pw.pipeline([stage, stage], slices, loss=mse, micro_batches=2, tied=tied).lower(params, x, target)
    # A weight tied to a bias would get the sum broadcast to the weight's shape as the bias's gradient.
    with pytest.raises(ValueError, match=r"^tied parameters \(0, 'w'\) and \(1, 'b'\) differ \(float32\[32, 32\] "
                                         r"and float32\[32\]\): tied copies must have one shape and dtype$"):
        lower([[(0, "w"), (1, "b")]])
    with pytest.raises(ValueError, match=r"^tied parameter \(0, 'kernel'\): stage 0's params have nothing at "
                                         r"\['kernel'\]$"):
        lower([[(0, "kernel"), (1, "w")]])
    with pytest.raises(ValueError, match=r"^tied group \(0, 'w'\) must be a list of \(stage, key, ...\) tuples"):
        lower([(0, "w"), (1, "w")])


@pytest.mark.parametrize("tied, named", [
    ([[(0, "w"), (0, "w")]], r"\(0, 'w'\) and \(0, 'w'\)"),                            # twice in one group
    ([[(0, "w"), (1, "w")], [(1, "w"), (2, "w")]], r"\(1, 'w'\) and \(1, 'w'\)"),      # in two groups
    ([[(0, "w"), (1, "w")], [(2,), (1,)]], r"\(1, 'w'\) and \(1,\)"),                  # inside another
])
def test_a_tied_parameter_named_twice_is_one_error_line(tied, named):
    """Each was taken, and gave wrong gradients: the first doubled stage 0's, the second summed stage 2's into
    copies 1 and 2 but not into copy 0, so the tied copies drifted apart."""
    slices = [pw.virtual_slice(1, axes="x") for _ in range(3)]
    with pytest.raises(ValueError, match=rf"^tied names {named}, one parameter or one inside the other: name each "
                                         r"parameter once, in one group \(one parameter that several stages share "
                                         r"is one group of them all\)$"):
        pw.pipeline([stage] * 3, slices, loss=mse, micro_batches=2, tied=tied)


def test_numpy_integers_are_integers_and_booleans_are_not(two_islands):
    """NumPy integers were refused ('with a stage in [0, 2)', 'not np.int64(1073741824)'), and True was stage 1."""
    slices = [pw.virtual_slice(1, axes="x") for _ in range(2)]
    params, x, target = two_stages(seed=5, rows=8)
    step = pw.pipeline([stage, stage], slices, loss=mse, micro_batches=np.int64(2), tied=[[(np.int64(0), "b"),
                                                                                          (np.int64(1), "b")]])
    _, grads = fetch(step.run(params, x, target, client=two_islands))
    np.testing.assert_array_equal(grads[0]["b"], grads[1]["b"])
    pw.pipeline([stage, stage], slices, loss=mse, micro_batches=2, schedule="auto", memory_bytes=np.int64(2 ** 30))
    with pytest.raises(ValueError, match=r"^tied group \[\(True, 'b'\), \(0, 'b'\)\] must name two or more "
                                         r"parameters as \(stage, key, ...\) with a stage in \[0, 2\)$"):
        pw.pipeline([stage, stage], slices, loss=mse, micro_batches=2, tied=[[(True, "b"), (0, "b")]])


def embed_with_mask(params, tokens):
    return params["embedding"][tokens], tokens > 3


def masked_block(params, x):
    hidden, mask = x
    return jnp.tanh(hidden @ params["w"]) * mask[:, None], mask


def masked_head(params, x):
    hidden, mask = x
    return jnp.where(mask[:, None], hidden @ params["w"], 0.0)


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_integer_and_boolean_activations_pass_between_stages_without_gradients(two_islands, schedule):
    rng = np.random.default_rng(9)
    stages = [embed_with_mask, masked_block, masked_block, masked_head]
    params = [{"embedding": rng.normal(0, 0.5, (16, 8)).astype(np.float32)}] + [
        {"w": rng.normal(0, 0.3, (8, 8)).astype(np.float32)} for _ in range(3)]
    tokens = rng.integers(0, 16, 16).astype(np.int32)
    target = rng.normal(size=(16, 8)).astype(np.float32)

    def unpipelined(params):
        x = tokens
        for fn, p in zip(stages, params):
            x = fn(p, x)
        return mse(x, target)
    expected_loss, expected_grads = jax.value_and_grad(unpipelined)(params)
    # The mask (bool) goes from stage 0 through the middle stages to the last; tokens (int32) are the
    # only stage's input in a one-stage pipeline. Neither has a gradient.
    slices = [pw.virtual_slice(1, axes="x", island=f"island{s % 2}") for s in range(4)]
    step = pw.pipeline(stages, slices, loss=mse, schedule=schedule, micro_batches=4)
    loss, grads = fetch(step.run(params, tokens, target, client=two_islands))
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    for ours, theirs in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-7)
    step = pw.pipeline([embed], slices[:1], loss=mse, schedule=schedule, micro_batches=4)
    loss, grads = fetch(step.run(params[:1], tokens, target, client=two_islands))
    np.testing.assert_allclose(loss, mse(embed(params[0], tokens), target), rtol=1e-5)
    assert grads[0]["embedding"].shape == (16, 8)


@pytest.mark.parametrize("where", [0, 1])
def test_an_integer_leaf_in_a_stage_s_params_is_one_error_line(where):
    """On a first or middle stage it was a TypeError about float0 naming pw's internal `<stage>_backward` in
    frontend/pipeline.py; on the last stage JAX's own message: now one TypeError, before tracing a stage."""
    def scaled(params, x):
        return stage(params, x) * params["n"]

    params, x, target = two_stages(seed=3, rows=8)
    params[where]["n"] = np.int32(2)
    stages = [scaled if s == where else stage for s in range(2)]
    step = pw.pipeline(stages, [pw.virtual_slice(1, axes="x") for _ in range(2)], loss=mse, micro_batches=2)
    with pytest.raises(TypeError, match=rf"^stage {where}'s params\['n'\] is int32: a stage's params are "
                                        r"differentiated, as by jax.grad, so each leaf is floating-point or complex"):
        step.lower(params, x, target)


def test_schedule_pictures_planned_and_measured_from_a_trace(two_islands, tmp_path):
    slices = [pw.virtual_slice(2, axes="x", island=f"island{s}") for s in range(2)]
    params, x, _ = two_stages(seed=4, rows=32)
    for schedule in ("1f1b", "zb-h1"):
        step = pw.pipeline([stage] * 2, slices, loss=mse, schedule=schedule, micro_batches=4)
        # Two stages, nominal costs: 1F1B's bubble is the textbook (S-1)/(M+S-1) (no middle stage to split).
        assert step.draw(str(tmp_path / f"{schedule}.png")) == pytest.approx(1 / 5)
        step.run(params, x, x, client=two_islands)           # compiled before tracing
        runtime = two_islands.runtime
        runtime.start_tracing()
        fetch(step.run(params, x, x, client=two_islands))
        measured = step.draw(str(tmp_path / f"{schedule}-measured.png"), runtime.stop_tracing())
        assert 0.0 <= measured < 1.0
        assert (tmp_path / f"{schedule}-measured.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    four = [pw.virtual_slice(1, axes="x", island=f"island{s % 2}") for s in range(4)]
    with pytest.raises(ValueError, match=r"each stage's slice on its own island"):
        pw.pipeline([stage] * 4, [four[0], four[1], four[2], four[1]], loss=mse, micro_batches=4).draw(
            str(tmp_path / "x.png"), [])
    # ZB-H1 splits the middle stages' backwards: its planned bubble is below 1F1B's on 4 stages.
    four = [pw.virtual_slice(1, axes="x") for _ in range(4)]
    bubbles = {s: pw.pipeline([stage] * 4, four, loss=mse, schedule=s, micro_batches=8).draw(str(tmp_path / f"{s}4.png"))
               for s in ("1f1b", "zb-h1")}
    assert bubbles["1f1b"] == pytest.approx(3 / 11) and bubbles["zb-h1"] < bubbles["1f1b"]


def test_a_one_row_schedule_picture_has_room_for_its_title_axis_and_legend(tmp_path):
    import warnings

    # One stage, or all stages interleaved on one slice: one row, where matplotlib's tight layout gave up (a
    # UserWarning, and a picture with its title and legend cut off).
    one = pw.virtual_slice(1, axes="x")
    for stages, schedule in ((1, "1f1b"), (3, "interleaved-1f1b")):
        step = pw.pipeline([stage] * stages, [one] * stages, loss=mse, schedule=schedule, micro_batches=2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert step.draw(str(tmp_path / f"{schedule}.png")) == 0.0
        assert (tmp_path / f"{schedule}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_schedule_picture_is_written_at_the_path_given(tmp_path):
    """Without a .png suffix it was written at the path plus '.png' (matplotlib's format from the name)."""
    step = pw.pipeline([stage] * 2, [pw.virtual_slice(1, axes="x") for _ in range(2)], loss=mse, micro_batches=2)
    step.draw(str(tmp_path / "schedule"))
    assert [p.name for p in tmp_path.iterdir()] == ["schedule"]
    assert (tmp_path / "schedule").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

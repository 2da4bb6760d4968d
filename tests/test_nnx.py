"""flax NNX through pw programs, against nnx.jit: a small CNN with BatchNorm and Dropout (its RNG
streams are typed keys), trained data-parallel on one slice and pipelined over two islands."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw

STEPS, BATCH, MICRO_BATCHES = 3, 8, 2


class Features(nnx.Module):
    """Convolution, BatchNorm, ReLU and Dropout: the first half of the CNN."""

    def __init__(self, rngs: nnx.Rngs):
        self.conv = nnx.Conv(1, 4, kernel_size=(3, 3), use_bias=False, rngs=rngs)
        self.norm = nnx.BatchNorm(4, rngs=rngs)
        self.dropout = nnx.Dropout(0.25, rngs=rngs)

    def __call__(self, x):
        return self.dropout(nnx.relu(self.norm(self.conv(x))))


class Head(nnx.Module):
    """Dropout and a linear classifier: the second half."""

    def __init__(self, rngs: nnx.Rngs):
        self.dropout = nnx.Dropout(0.1, rngs=rngs)
        self.linear = nnx.Linear(4 * 6 * 6, 5, rngs=rngs)

    def __call__(self, x):
        return self.linear(self.dropout(x.reshape(x.shape[0], -1)))


class CNN(nnx.Module):
    def __init__(self, seed: int):
        self.features = Features(nnx.Rngs(seed, dropout=seed + 1))
        self.head = Head(nnx.Rngs(seed + 2, dropout=seed + 3))

    def __call__(self, x):
        return self.head(self.features(x))


def cross_entropy(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def batches():
    rng = np.random.default_rng(0)
    return [(jnp.asarray(rng.normal(size=(BATCH, 6, 6, 1)), jnp.float32), jnp.asarray(rng.integers(0, 5, BATCH)))
            for _ in range(STEPS)]


def fetched(tree):
    """`tree` with its handles read back as arrays (typed keys as key arrays)."""
    return jax.tree.map(lambda h: h.result() if hasattr(h, "result") else h, tree)


def assert_same_state(got: nnx.Module, want: nnx.Module, tolerance: float = 1e-6):
    """Every parameter, BatchNorm statistic and RNG key of `got` equals `want`'s."""
    got_leaves, want_leaves = jax.tree.leaves(nnx.state(got)), jax.tree.leaves(nnx.state(want))
    assert len(got_leaves) == len(want_leaves)
    for a, b in zip(fetched(got_leaves), want_leaves):
        if jax.dtypes.issubdtype(b.dtype, jax.dtypes.extended):
            np.testing.assert_array_equal(jax.random.key_data(a), jax.random.key_data(b))
        else:
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tolerance, atol=tolerance)


def train_step(model, optimizer, metrics, x, labels):
    """One step in the style of flax's NNX examples: grads, optimizer.update, metrics.update."""
    def loss_fn(model):
        logits = model(x)
        return cross_entropy(logits, labels), logits

    (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    metrics.update(loss=loss, logits=logits, labels=labels)
    return loss


def new_training(seed: int = 0):
    model = CNN(seed)
    return (model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param),
            nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss")))


def test_nnx_objects_train_data_parallel_as_with_nnx_jit():
    data = pw.virtual_slice(2, axes="data")

    def step(model, optimizer, metrics, x, labels):          # NNX objects in, NNX objects out
        loss = train_step(model, optimizer, metrics, x, labels)
        return model, optimizer, metrics, loss

    placed = pw.jit(step, slice=data, in_specs=(None, None, None, P("data"), P("data")))

    @pw.program
    def program_step(model, optimizer, metrics, x, labels):
        return placed(model, optimizer, metrics, x, labels)

    model, optimizer, metrics = new_training()
    want_model, want_optimizer, want_metrics = new_training()
    reference = nnx.jit(train_step)
    for x, labels in batches():
        want_loss = reference(want_model, want_optimizer, want_metrics, x, labels)
        model, optimizer, metrics, loss = program_step(model, optimizer, metrics, x, labels)
        np.testing.assert_allclose(np.asarray(loss), want_loss, rtol=1e-6)
    assert_same_state(model, want_model)
    computed = fetched(metrics).compute()
    for name, value in want_metrics.compute().items():
        np.testing.assert_allclose(computed[name], value, rtol=1e-6)

    # The returned model (handles and key handles) runs outside pw: eagerly in eval mode, under nnx.jit in
    # train mode (its Dropout draws from the returned RNG keys and counts on), and eagerly in train mode,
    # fetched or not: NNX counts an RNG stream on by a new value of its count, a handle being a jax.Array.
    x = batches()[0][0]
    model.eval(), want_model.eval()
    np.testing.assert_allclose(np.asarray(model(x)), np.asarray(want_model(x)), rtol=1e-5, atol=1e-6)
    model.train(), want_model.train()
    forward = nnx.jit(lambda m, x: m(x))
    np.testing.assert_allclose(np.asarray(forward(model, x)), np.asarray(forward(want_model, x)), rtol=1e-5,
                               atol=1e-6)
    assert_same_state(model, want_model)
    model, _, _, _ = program_step(model, optimizer, metrics, x, batches()[0][1])
    reference(want_model, want_optimizer, want_metrics, x, batches()[0][1])
    np.testing.assert_allclose(np.asarray(fetched(model)(x)), np.asarray(want_model(x)), rtol=1e-5, atol=1e-6)
    model, _, _, _ = program_step(model, optimizer, metrics, x, batches()[0][1])
    values = fetched(model)
    np.testing.assert_allclose(np.asarray(model(x)), np.asarray(values(x)), rtol=1e-5, atol=1e-6)
    assert_same_state(model, values)                  # both counted their RNG streams on


def test_a_step_that_updates_nnx_objects_in_place_without_returning_them_warns_once():
    """Written for nnx.jit (no return of the objects): the update is lost, as under jax.jit, so the trace warns,
    naming the Variables it changed; the step that returns its objects does not."""
    data = pw.virtual_slice(2, axes="data")
    placed = pw.jit(train_step, slice=data, in_specs=(None, None, None, P("data"), P("data")))
    model, optimizer, metrics = new_training()
    (x, labels), = batches()[:1]
    with pytest.warns(UserWarning, match=r"train_step changes its arguments in place without returning them "
                                         r"\(argument 0\.features\.[\w.]+\.value, .* more\): as under jax\.jit"):
        first = np.asarray(placed(model, optimizer, metrics, x, labels))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(np.asarray(placed(model, optimizer, metrics, x, labels)), first)   # no update
        returned = pw.jit(lambda *a: (*a[:3], train_step(*a)), slice=data,
                          in_specs=(None, None, None, P("data"), P("data")))
        returned(model, optimizer, metrics, x, labels)


def test_correct_jax_jit_steps_that_change_plain_pytrees_in_place_do_not_warn():
    """Changing a plain pytree argument in place is correct `jax.jit` code, lost under `nnx.jit` too: optax's
    documented `opt_state.hyperparams['learning_rate'] = ...` before `tx.update` (whose new state the step
    returns), and a batch dict preprocessed in place. Only an NNX object's change warns."""
    one = pw.virtual_slice(1, axes="x")
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)

    def set_learning_rate(params, opt_state, lr):
        opt_state.hyperparams["learning_rate"] = lr * 0.5
        updates, opt_state = tx.update(jax.tree.map(jnp.ones_like, params), opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def preprocess(w, batch):
        batch["image"] = batch["image"].astype(jnp.float32) / 255.0
        return w - 0.1 * (batch["image"].mean() - w)

    params = {"w": jnp.ones(3)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, state = pw.jit(set_learning_rate, slice=one)(params, tx.init(params), 0.2)
        want, want_state = jax.jit(set_learning_rate)(params, tx.init(params), 0.2)
        np.testing.assert_allclose(np.asarray(got["w"]), want["w"])
        np.testing.assert_allclose(np.asarray(state.hyperparams["learning_rate"]),
                                   want_state.hyperparams["learning_rate"])
        batch = {"image": np.full((2, 4), 128, np.uint8)}
        np.testing.assert_allclose(np.asarray(pw.jit(preprocess, slice=one)(jnp.float32(1.0), batch)),
                                   jax.jit(preprocess)(jnp.float32(1.0), batch))


def test_nnx_split_and_merge_code_runs_in_a_placed_function():
    s = pw.virtual_slice(2, axes="data")
    model = CNN(4)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def logits(params, rest, x):
        model = nnx.merge(graphdef, params, rest)
        model.eval()
        return model(x)

    x = batches()[0][0]
    np.testing.assert_allclose(np.asarray(pw.jit(logits, slice=s)(params, rest, x)),
                               jax.jit(logits)(params, rest, x), rtol=1e-6)


class TwoDots(nnx.Module):
    """The NNX "scale up" tutorial's model: parameters annotated with the mesh axes they are split over."""

    def __init__(self, depth: int, rngs: nnx.Rngs):
        init = nnx.initializers.lecun_normal()
        self.dot1 = nnx.Linear(depth, depth, kernel_init=nnx.with_partitioning(init, (None, "model")),
                               use_bias=False, rngs=rngs)
        self.w2 = nnx.Param(init(rngs.params(), (depth, depth)), out_sharding=("model", None))

    def __call__(self, x):
        y = jax.lax.with_sharding_constraint(nnx.relu(self.dot1(x)), P("data", "model"))
        return y @ self.w2[...]


def test_a_model_created_sharded_by_its_annotations_stays_sharded_and_trains_as_under_jax_set_mesh():
    """The NNX tutorial's sharded creation (`with_sharding_constraint(state, nnx.get_partition_spec(state))` in
    the creating function, no out_specs) returns each parameter split as annotated, and a step on it computes
    what `jax.jit` under `jax.set_mesh` does."""
    s = pw.virtual_slice((2, 2), axes=("data", "model"))

    def create():
        model = TwoDots(16, rngs=nnx.Rngs(0))
        state = nnx.state(model)
        nnx.update(model, jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))
        return model

    model = pw.jit(create, slice=s)()
    assert model.dot1.kernel.get_value().result().sharding.spec == P(None, "model")
    assert model.w2.get_value().result().sharding.spec == P("model", None)

    def loss(model, x):
        return jnp.mean(model(x) ** 2)

    x = np.linspace(-1, 1, 8 * 16, dtype=np.float32).reshape(8, 16)
    with jax.set_mesh(jax.make_mesh((2, 2), ("data", "model"), devices=jax.devices()[:4],
                                    axis_types=(jax.sharding.AxisType.Auto,) * 2)):
        want = jax.jit(loss)(jax.jit(create)(), x)
    np.testing.assert_allclose(float(pw.jit(loss, slice=s)(model, x)), float(want), rtol=1e-6)


def test_specs_of_a_modules_state_for_the_module_are_refused_in_one_line_that_says_what_to_pass():
    """flax's sharding tutorial makes specs from `nnx.state(model)`, an `nnx.State`; for a step that takes the
    Module they do not match: the error names the argument and the two types (it was the State's repr and
    the Module's PyTreeDef, 10 lines), and the specs it says to pass, in the Module's structure, place it."""
    s = pw.virtual_slice((2, 2), axes=("data", "model"))
    model = nnx.Linear(4, 8, rngs=nnx.Rngs(0))

    def spec(a):
        return P(None, "model") if a.ndim == 2 else P("model")

    x = np.ones((4, 4), np.float32)
    wrong = pw.jit(lambda m, x: m(x).sum(), slice=s, in_specs=(jax.tree.map(spec, nnx.state(model)), P("data")))
    with pytest.raises(pw.PlacementError) as error:
        wrong.lower(model, x)
    assert "\n" not in str(error.value)
    assert re.search(r"test_nnx.py:\d+: in_specs\[0\] is a State, but argument 0 is a Linear: give a pytree prefix "
                     r"of the arguments .*jax\.tree\.map\(lambda a: P\(\.\.\.\), argument\)", str(error.value))
    right = pw.jit(lambda m, x: m(x).sum(), slice=s, in_specs=(jax.tree.map(spec, model), P("data")))
    assert '[[], ["model"]]' in right.lower(model, x).as_text()       # the kernel split over "model"


def as_stage(graphdef):
    """An NNX module as a stateful pipeline stage: (params, state, x) -> (y, state).

    It merges with copy=True: the stage runs inside jax.vjp, and NNX mutates
    only Variables made inside the transformation.
    """
    def stage(params, state, x):
        module = nnx.merge(graphdef, params, state, copy=True)
        return module(x), nnx.state(module, nnx.Not(nnx.Param))
    return stage


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_cnn_pipelined_over_two_islands_equals_nnx_jit(schedule):
    first, second = pw.virtual_slice(2, axes="data"), pw.virtual_slice(2, axes="data", island="island1")
    model = CNN(0)
    parts = [nnx.split(m, nnx.Param, ...) for m in (model.features, model.head)]
    tx = optax.adam(1e-2)
    step = pw.pipeline([as_stage(g) for g, _, _ in parts], [first, second], loss=cross_entropy,
                       schedule=schedule, micro_batches=MICRO_BATCHES, optimizer=tx, stateful=True,
                       batch_axis="data")
    params, states = [p for _, p, _ in parts], [s for _, _, s in parts]
    opt_states = [tx.init(p) for p in params]

    # The unpipelined step: the micro-batches one after another, their gradients summed.
    want = CNN(0)
    want_optimizer = nnx.Optimizer(want, tx, wrt=nnx.Param)

    @nnx.jit
    def reference(model, optimizer, x, labels):
        total, grads = 0.0, None
        for xm, lm in zip(jnp.split(x, MICRO_BATCHES), jnp.split(labels, MICRO_BATCHES)):
            loss, g = nnx.value_and_grad(lambda m: cross_entropy(m(xm), lm) / MICRO_BATCHES)(model)
            total, grads = total + loss, g if grads is None else jax.tree.map(jnp.add, grads, g)
        optimizer.update(model, grads)
        return total

    for x, labels in batches():
        want_loss = reference(want, want_optimizer, x, labels)
        params, opt_states, states, loss = step(params, opt_states, states, x, labels)
        np.testing.assert_allclose(np.asarray(loss), want_loss, rtol=1e-6)
    got = CNN(0)
    for module, (graphdef, _, _), p, s in zip((got.features, got.head), parts, params, states):
        nnx.update(module, *fetched((p, s)))
    assert_same_state(got, want)


def test_nnx_state_holds_a_handle_an_object_keeps_as_a_plain_attribute():
    """NNX counts `jax.Array`s and NumPy arrays as state leaves; a handle was neither, so `nnx.state` left out
    one that a step assigned as a plain attribute (optax's `inject_hyperparams` learning rate): a handle is a
    `jax.Array` now, and the state holds it, as it holds the JAX array `jax.jit` returns."""
    s = pw.virtual_slice(2, axes="data")
    schedule = pw.jit(lambda step: 0.1 / (1.0 + step), slice=s)
    reference = jax.jit(lambda step: 0.1 / (1.0 + step))
    states = []
    for rate in (schedule, reference):
        optimizer = nnx.Optimizer(nnx.Linear(2, 2, rngs=nnx.Rngs(0)),
                                  optax.inject_hyperparams(optax.sgd)(learning_rate=0.1), wrt=nnx.Param)
        optimizer.opt_state.hyperparams["learning_rate"] = rate(jnp.float32(3.0))
        states.append(nnx.state(optimizer))
    ours, theirs = (jax.tree.leaves(state) for state in states)
    assert len(ours) == len(theirs) and isinstance(states[0]["opt_state"]["hyperparams"]["learning_rate"], jax.Array)
    jax.tree.map(np.testing.assert_array_equal, ours, theirs)

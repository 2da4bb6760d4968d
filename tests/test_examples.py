"""The bundled workload examples compute what plain JAX computes."""

import jax
import numpy as np
import pytest
from fetching import fetch

from pathways_mlir.benchmarks.examples import load_example as example
from pathways_mlir.runtime.client import Client


def test_rl_loop_equals_sequential_plain_jax_with_the_same_staleness(three_islands):
    rl = example("rl_loop")
    policy, reward_model = rl.init()
    functions = rl.placed()
    final, history = rl.loop(functions, policy, reward_model, steps=6, client=three_islands)
    expected_final, expected = rl.reference_loop(policy, reward_model, steps=6)
    np.testing.assert_allclose(history, expected, rtol=1e-4, atol=1e-6)
    for ours, theirs in zip(jax.tree.leaves(fetch(final)), jax.tree.leaves(expected_final)):
        np.testing.assert_allclose(ours, np.asarray(theirs), rtol=1e-4, atol=1e-6)
    assert history[-1] > history[0] + 0.1                  # the policy learns
    # Each of the three programs runs on its own island.
    rollout = rl.sample(policy, np.int32(0))
    examples = [(policy, np.int32(0)), (reward_model, *rollout),
                (policy, rl.OPTIMIZER.init(policy), *rollout, rl.score(reward_model, *rollout))]
    plans = [f.compiled(*args, runtime=three_islands.runtime).plan for f, args in zip(functions, examples)]
    assert [set(plan.islands) for plan in plans] == [{"island0"}, {"island1"}, {"island2"}]


def test_moe_layer_equals_dense_jax_for_kept_tokens_and_moves_only_buckets(two_islands):
    moe = example("moe")
    router, experts = moe.init()
    tokens = np.random.default_rng(1).normal(size=(moe.TOKENS, moe.WIDTH)).astype(np.float32)
    expected, choice = jax.jit(moe.dense_reference)(router, experts, tokens)
    kept = moe.kept_tokens(choice)
    assert 0 < (~kept).sum() < moe.TOKENS // 4                # some tokens overflow their expert
    layer = moe.layer()
    outputs, dropped = fetch(layer.run(router, experts, tokens, client=two_islands))
    np.testing.assert_allclose(outputs[kept], np.asarray(expected)[kept], rtol=1e-5, atol=1e-6)
    assert not outputs[~kept].any() and int(dropped) == (~kept).sum()
    plan = layer.compiled(router, experts, tokens, runtime=two_islands.runtime).plan
    # Between slices only buckets move: each expert's there and back, over DCN to island1's.
    moves = [s for steps in plan.islands.values() for s in steps if type(s).__name__ in ("Copy", "Send")]
    assert sorted(s.bytes for s in moves) == [moe.CAPACITY * moe.WIDTH * 4] * 2 * moe.EXPERTS
    assert {plan.slices[f"expert{e}"].island for e in range(moe.EXPERTS)} == {"island0", "island1"}


TRANSFORMER_STEPS = 3


@pytest.fixture(scope="module")
def transformer_in_plain_jax():
    """The transformer example's parameters and losses after TRANSFORMER_STEPS steps of plain JAX: what every
    schedule must compute (worked out once, not once per schedule: its compile takes seconds)."""
    lm = example("transformer_pipeline")
    reference = lm.reference_step(TRANSFORMER_STEPS)
    expected, opt_state, expected_losses = lm.init(), lm.optimizer(TRANSFORMER_STEPS).init(lm.init()), []
    data = lm.batches(lm.corpus())
    for _ in range(TRANSFORMER_STEPS):
        expected, opt_state, loss = reference(expected, opt_state, *next(data))
        expected_losses.append(float(loss))
    return expected, expected_losses


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1"])
def test_transformer_pipeline_trains_like_plain_jax_in_each_schedule(two_islands, transformer_in_plain_jax, schedule):
    lm = example("transformer_pipeline")
    params, losses = lm.train(TRANSFORMER_STEPS, schedule, client=two_islands)
    expected, expected_losses = transformer_in_plain_jax
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-4)
    for ours, theirs in zip(jax.tree.leaves(fetch(params)), jax.tree.leaves(expected)):
        np.testing.assert_allclose(ours, np.asarray(theirs), rtol=1e-3, atol=1e-5)
    assert losses[-1] < losses[0]


def test_shared_base_finetune_trains_like_plain_jax_jobs_and_holds_the_base_once(two_islands):
    ft = example("shared_base_finetune")
    runtime = two_islands.runtime
    base_values = ft.init_base()
    data = ft.batches(ft.CLIENTS, 4, base_values)
    place, step = ft.placed()
    clients = [Client(runtime) for _ in range(ft.CLIENTS)]
    try:
        before = sum(runtime.usage().values())
        _, shared = ft.share_base(place, clients[0], base_values)
        ours = ft.finetune(step, [shared] * ft.CLIENTS, clients, data)
        expected = ft.plain_jax_jobs(base_values, data)
        for (head, opt_state, losses), (want_head, want_state, want_losses) in zip(ours, expected):
            np.testing.assert_allclose(losses, want_losses, rtol=1e-4, atol=1e-5)
            for a, b in zip(jax.tree.leaves((head, opt_state)), jax.tree.leaves((want_head, want_state))):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
        assert ours[0][2][-1] < ours[0][2][0]                     # the heads learn
        base_bytes = sum(a.nbytes for a in jax.tree.leaves(base_values))
        head_bytes = sum(np.asarray(a).nbytes for a in jax.tree.leaves(expected[0][:2]))
        assert ft.held_bytes(runtime) - before == base_bytes + ft.CLIENTS * head_bytes    # the base once
    finally:
        for c in clients:
            c.close()

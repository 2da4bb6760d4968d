"""An RL post-training loop: sampler, reward model and trainer, each its own program on its own slice.

The policy is a small network choosing one of ACTIONS answers to each prompt
(a feature vector); a fixed reward model scores each (prompt, answer); the
trainer takes one REINFORCE step (mean-reward baseline, optax adam) and sends
the new weights to the sampler every step. The sampler's step k+1 overlaps
the trainer's step k: it samples with the weights of step k, while step k
computes those of step k+1. So training step k learns from rollouts of the
weights one step old (one step of staleness), as in asynchronous RL
post-training. `reference_loop` is the same loop in plain JAX, run
sequentially with the same staleness; the numbers are equal.

    pw-run examples/rl_loop.py        # 3 islands x 2 CPU devices, emulated DCN
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.frontend.placed import PlacedFunction

PROMPTS, FEATURES, HIDDEN, ACTIONS = 256, 16, 64, 8
SEED = 0
OPTIMIZER = optax.adam(3e-2)


def init(seed: int = SEED):
    """Returns the policy's and the reward model's parameters."""
    rng = np.random.default_rng(seed)
    policy = {"w1": rng.normal(0, FEATURES ** -0.5, (FEATURES, HIDDEN)).astype(np.float32),
              "w2": np.zeros((HIDDEN, ACTIONS), np.float32)}
    reward_model = {"w": rng.normal(0, FEATURES ** -0.5, (FEATURES, ACTIONS)).astype(np.float32)}
    return policy, reward_model


def logits(policy, prompts):
    """The policy's scores of each answer to each prompt."""
    return jnp.tanh(prompts @ policy["w1"]) @ policy["w2"]


def sample(policy, step):
    """Sampler: draws this step's prompts and one answer per prompt from the policy."""
    prompt_key, answer_key = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(SEED), step))
    prompts = jax.random.normal(prompt_key, (PROMPTS, FEATURES))
    return prompts, jax.random.categorical(answer_key, logits(policy, prompts)).astype(jnp.int32)


def score(reward_model, prompts, answers):
    """Reward model: a fixed network's score of each (prompt, answer)."""
    return jnp.take_along_axis(jnp.tanh(prompts @ reward_model["w"]), answers[:, None], 1)[:, 0]


def train(policy, opt_state, prompts, answers, rewards):
    """Trainer: one REINFORCE step with a mean-reward baseline; returns the mean reward too."""
    def loss(policy):
        log_probs = jax.nn.log_softmax(logits(policy, prompts))
        chosen = jnp.take_along_axis(log_probs, answers[:, None], 1)[:, 0]
        return -jnp.mean((rewards - rewards.mean()) * chosen)

    grads = jax.grad(loss)(policy)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, policy)
    return optax.apply_updates(policy, updates), opt_state, rewards.mean()


def placed(islands=("island0", "island1", "island2")):
    """Returns the sampler, reward model and trainer, each placed on a 2-device slice of its own island."""
    sampler, scorer, trainer = (pw.virtual_slice(2, axes="data", island=i) for i in islands)
    return (pw.jit(sample, slice=sampler, in_specs=None, out_specs=P("data")),
            pw.jit(score, slice=scorer, in_specs=(None, P("data"), P("data")), out_specs=P("data")),
            pw.jit(train, slice=trainer, in_specs=(None, None, P("data"), P("data"), P("data")),
                   out_specs=None))


def loop(functions, policy, reward_model, steps: int, overlap: bool = True, client=None):
    """Runs `steps` training steps; returns the final policy and each step's mean reward.

    `functions` are the sampler, reward model and trainer: placed functions
    (each call one program run whose results are handles) or plain
    `jax.jit`s. With `overlap` nothing waits, so the sampler's step k+1 runs
    while the trainer's step k does; without, every call waits for its
    results (the sequential baseline, same numbers).
    """
    sampler, scorer, trainer = (_caller(f, client, wait=not overlap) for f in functions)
    opt_state = OPTIMIZER.init(policy)
    rollout = sampler(policy, np.int32(0))
    rewards = scorer(reward_model, *rollout)
    history = []
    for k in range(steps):
        next_rollout = sampler(policy, np.int32(k + 1))     # the weights of step k ...
        policy, opt_state, mean_reward = trainer(policy, opt_state, *rollout, rewards)  # ... train step k
        rollout, rewards = next_rollout, scorer(reward_model, *next_rollout)
        history.append(mean_reward)
    return policy, [float(np.asarray(r)) for r in history]


def reference_loop(policy, reward_model, steps: int):
    """The same loop in plain JAX, one device, sequential, with the same one step of staleness."""
    return loop((jax.jit(sample), jax.jit(score), jax.jit(train)), policy, reward_model, steps, overlap=False)


def _caller(function, client, wait: bool):
    def call(*args):
        if isinstance(function, PlacedFunction):
            results = function.run(*args, client=client)
        else:
            results = function(*args)
        if wait:
            jax.tree.map(lambda r: r.block_until_ready(), results)
        return results
    return call


if __name__ == "__main__":
    import time

    pw.configure(islands=3, per_island=2, emulate_dcn=True)
    policy, reward_model = init()
    steps = 30
    functions = placed()
    loop(functions, policy, reward_model, 2)                   # compile everything once
    start = time.perf_counter()
    final, history = loop(functions, policy, reward_model, steps)
    jax.tree.map(lambda r: r.block_until_ready(), final)
    ours = time.perf_counter() - start
    reference_loop(policy, reward_model, 2)
    start = time.perf_counter()
    expected_final, expected = reference_loop(policy, reward_model, steps)
    plain = time.perf_counter() - start
    for k in range(0, steps, 5):
        print(f"step {k:3d}  mean reward {history[k]:+.4f}")
    print(f"mean reward {history[0]:+.4f} -> {history[-1]:+.4f} over {steps} steps")
    print("matches plain JAX:", np.allclose(history, expected, rtol=1e-4, atol=1e-5) and all(
        np.allclose(np.asarray(a), b, rtol=1e-4, atol=1e-5)
        for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(expected_final))))
    print(f"{steps} steps: {ours:.3f} s on 3 islands, {plain:.3f} s plain JAX on one device "
          f"({plain / ours:.2f}x plain JAX's speed)")

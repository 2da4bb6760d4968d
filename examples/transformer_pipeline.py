"""A small flax transformer language model trained with `pw.pipeline` across two islands.

The text is generated here (no downloads): sentences of a tiny grammar,
read character by character. Stage 0 (island0) embeds characters and runs
the first transformer block; stage 1 (island1) runs the second block and
predicts the next character. Each step is a 1F1B pipeline of MICRO_BATCHES
micro-batches with optax adamw (warm-up and cosine decay). It prints a
progress bar and the loss, writes the loss curve to transformer_loss.png,
and tests/test_examples.py checks its steps against plain JAX training the same model.

    pw-run examples/transformer_pipeline.py
"""

import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import pathways_mlir as pw

CONTEXT, WIDTH, HEADS, BATCH, MICRO_BATCHES = 32, 64, 4, 32, 4
SUBJECTS = ["the cat", "a dog", "my friend", "the old man", "every bird", "the river"]
VERBS = ["sees", "likes", "follows", "finds", "remembers", "carries"]
OBJECTS = ["the moon", "a red ball", "the small house", "some bread", "the green tree", "a song"]
ALPHABET = sorted(set(". " + "".join(SUBJECTS + VERBS + OBJECTS)))
VOCAB = len(ALPHABET)


def corpus(sentences: int = 4000, seed: int = 0) -> np.ndarray:
    """Returns the text of `sentences` random sentences of the grammar, as character ids."""
    rng = np.random.default_rng(seed)
    text = " ".join(f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}." for _ in range(sentences))
    index = {c: i for i, c in enumerate(ALPHABET)}
    return np.array([index[c] for c in text], np.int32)


def batches(text: np.ndarray, seed: int = 1):
    """Yields (inputs, next characters) windows of CONTEXT characters, BATCH at a time."""
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(text) - CONTEXT - 1, BATCH)
        windows = np.stack([text[s:s + CONTEXT + 1] for s in starts])
        yield windows[:, :-1], windows[:, 1:]


class Block(nn.Module):
    """A pre-norm causal transformer block (attention without biases: a key bias's gradient is zero)."""

    @nn.compact
    def __call__(self, x):
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
        x = x + nn.MultiHeadDotProductAttention(num_heads=HEADS, use_bias=False)(nn.LayerNorm()(x), mask=mask)
        return x + nn.Dense(WIDTH)(nn.gelu(nn.Dense(4 * WIDTH)(nn.LayerNorm()(x))))


class Embed(nn.Module):
    """Stage 0: character and position embeddings, then a block."""

    @nn.compact
    def __call__(self, ids):
        positions = self.param("positions", nn.initializers.normal(0.02), (CONTEXT, WIDTH))
        return Block()(nn.Embed(VOCAB, WIDTH)(ids) + positions)


class Head(nn.Module):
    """Stage 1: a block, then the next character's logits."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(VOCAB)(nn.LayerNorm()(Block()(x)))


def cross_entropy(logits, targets):
    """The mean next-character cross-entropy."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def optimizer(steps: int):
    """adamw with a warm-up and cosine decay over `steps`."""
    return optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 3e-3, max(1, steps // 10), steps), weight_decay=1e-2)


def init(seed: int = 0):
    """Returns the two stages' parameters."""
    ids = jnp.zeros((1, CONTEXT), jnp.int32)
    embed = Embed().init(jax.random.key(seed), ids)
    return [embed, Head().init(jax.random.key(seed + 1), Embed().apply(embed, ids))]


def pipelined_step(steps: int, islands=("island0", "island1")):
    """The training step: 1F1B over two stages, one 2-device slice on each island, each stage data parallel."""
    slices = [pw.virtual_slice(2, axes="batch", island=island) for island in islands]
    return pw.pipeline([Embed().apply, Head().apply], slices, loss=cross_entropy, schedule="1f1b",
                       micro_batches=MICRO_BATCHES, optimizer=optimizer(steps), batch_axis="batch")


def reference_step(steps: int):
    """The same training step in plain JAX: the whole model, the whole batch, one optax state."""
    opt = optimizer(steps)

    def step(params, opt_state, inputs, targets):
        def loss(params):
            return cross_entropy(Head().apply(params[1], Embed().apply(params[0], inputs)), targets)
        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value
    return jax.jit(step)


def train(steps: int, step=None, client=None, progress: bool = False):
    """Trains for `steps` steps with the pipelined step; returns the parameters and each step's loss."""
    step = step or pipelined_step(steps)
    params = init()
    opt_states = [optimizer(steps).init(p) for p in params]
    data, losses = batches(corpus()), []
    for k in range(steps):
        params, opt_states, loss = step.run(params, opt_states, *next(data), client=client)
        losses.append(float(np.asarray(loss)))
        if progress:
            done = (k + 1) * 30 // steps
            sys.stdout.write(f"\r[{'#' * done}{'.' * (30 - done)}] step {k + 1}/{steps}  loss {losses[-1]:.3f}")
            sys.stdout.flush()
    if progress:
        sys.stdout.write("\n")
    return params, losses


if __name__ == "__main__":
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = 150
    _, losses = train(steps, progress=True)
    print(f"loss {losses[0]:.3f} -> {np.mean(losses[-10:]):.3f} (last 10 steps); uniform guess {np.log(VOCAB):.3f}")
    figure, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(losses)
    ax.set(xlabel="step", ylabel="cross-entropy", title="Transformer LM, 1F1B pipeline over 2 islands")
    figure.tight_layout()
    figure.savefig("transformer_loss.png", dpi=100)
    print("wrote transformer_loss.png")

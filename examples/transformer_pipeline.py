"""A small flax transformer language model trained with `pw.pipeline` across two islands.

The text is generated here (no downloads): sentences of a tiny grammar,
read character by character. Four stages: character and position
embeddings, two transformer blocks, and the next character's logits. Each
step is a pipeline of MICRO_BATCHES micro-batches with optax adamw (warm-up
and cosine decay), in any of `pw.pipeline`'s schedules: "gpipe", "1f1b"
and "zb-h1" put one stage on each of four 2-device slices, two per island;
"interleaved-1f1b" puts the four stages round-robin on one slice per
island (two virtual stages each). It prints a progress bar and the loss,
writes the loss curves to transformer_loss.png, and tests/test_examples.py
checks every schedule's steps against plain JAX training the same model.

    pw-run examples/transformer_pipeline.py                  # 1F1B
    python examples/transformer_pipeline.py all              # each schedule, one curve each
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
    """Stage 0: character and position embeddings."""

    @nn.compact
    def __call__(self, ids):
        positions = self.param("positions", nn.initializers.normal(0.02), (CONTEXT, WIDTH))
        return nn.Embed(VOCAB, WIDTH)(ids) + positions


class Head(nn.Module):
    """Stage 3: the next character's logits."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(VOCAB)(nn.LayerNorm()(x))


STAGES = (Embed(), Block(), Block(), Head())


def forward(params, ids):
    """The whole model on one device: the stages in order."""
    x = ids
    for stage, p in zip(STAGES, params):
        x = stage.apply(p, x)
    return x


def cross_entropy(logits, targets):
    """The mean next-character cross-entropy."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def optimizer(steps: int):
    """adamw with a warm-up and cosine decay over `steps`."""
    return optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 3e-3, max(1, steps // 10), steps), weight_decay=1e-2)


def init(seed: int = 0):
    """Returns the four stages' parameters."""
    x, params = jnp.zeros((1, CONTEXT), jnp.int32), []
    for s, stage in enumerate(STAGES):
        params.append(stage.init(jax.random.key(seed + s), x))
        x = stage.apply(params[-1], x)
    return params


def pipelined_step(steps: int, schedule: str = "1f1b", islands=("island0", "island1")):
    """The training step in `schedule`, each stage data parallel over its 2-device slice: one slice per stage,
    two per island, or for "interleaved-1f1b" one per island, holding stages round-robin."""
    if schedule == "interleaved-1f1b":
        per_island = [pw.virtual_slice(2, axes="batch", island=island) for island in islands]
        slices = [per_island[s % len(islands)] for s in range(len(STAGES))]
    else:
        slices = [pw.virtual_slice(2, axes="batch", island=islands[s * len(islands) // len(STAGES)])
                  for s in range(len(STAGES))]
    return pw.pipeline([stage.apply for stage in STAGES], slices, loss=cross_entropy, schedule=schedule,
                       micro_batches=MICRO_BATCHES, optimizer=optimizer(steps), batch_axis="batch")


def reference_step(steps: int):
    """The same training step in plain JAX: the whole model, the whole batch, one optax state."""
    opt = optimizer(steps)

    def step(params, opt_state, inputs, targets):
        def loss(params):
            return cross_entropy(forward(params, inputs), targets)
        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value
    return jax.jit(step)


def train(steps: int, schedule: str = "1f1b", client=None, progress: bool = False):
    """Trains for `steps` steps with the pipelined step in `schedule`; returns the parameters and each step's
    loss."""
    step = pipelined_step(steps, schedule)
    params = init()
    opt_states = [optimizer(steps).init(p) for p in params]
    data, losses = batches(corpus()), []
    for k in range(steps):
        params, opt_states, loss = step.run(params, opt_states, *next(data), client=client)
        losses.append(float(np.asarray(loss)))
        if progress:
            done = (k + 1) * 30 // steps
            sys.stdout.write(f"\r{schedule:>16} [{'#' * done}{'.' * (30 - done)}] step {k + 1}/{steps}  "
                             f"loss {losses[-1]:.3f}")
            sys.stdout.flush()
    if progress:
        sys.stdout.write("\n")
    return params, losses


if __name__ == "__main__":
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pathways_mlir.frontend.pipeline import SCHEDULES

    chosen = sys.argv[1:] or ["1f1b"]
    chosen = list(SCHEDULES) if chosen == ["all"] else chosen
    unknown = [s for s in chosen if s not in (*SCHEDULES, "auto")]
    if unknown:
        sys.exit(f"transformer_pipeline.py: error: unknown schedule {unknown[0]!r} (choose from "
                 f"{', '.join(SCHEDULES)}, auto or all)")
    steps = 150
    figure, ax = plt.subplots(figsize=(6, 3.5))
    for schedule in chosen:
        _, losses = train(steps, schedule, progress=True)
        print(f"{schedule}: loss {losses[0]:.3f} -> {np.mean(losses[-10:]):.3f} (last 10 steps); "
              f"uniform guess {np.log(VOCAB):.3f}")
        ax.plot(losses, label=schedule)
    ax.legend()
    ax.set(xlabel="step", ylabel="cross-entropy", title="Transformer LM, 4-stage pipeline over 2 islands")
    figure.tight_layout()
    figure.savefig("transformer_loss.png", dpi=100)
    print("wrote transformer_loss.png")

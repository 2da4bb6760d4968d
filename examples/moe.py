"""A mixture-of-experts layer with sparse, data-dependent routing across slices and islands.

A router on its own slice picks one expert per token (top-1 of a learned
gate) and packs the tokens of each expert into a bucket of CAPACITY rows, in
token order; tokens past an expert's capacity are dropped, and counted. Each
expert is a feed-forward block on its own slice, experts 0 and 1 on island0,
2 and 3 on island1: only its bucket (CAPACITY of the TOKENS rows) crosses to
it, and only its bucket comes back. The router's slice then puts each kept
token's expert output, scaled by its gate, back in place (a dropped token's
output is zero).

`dense_reference` runs every expert on every token in plain JAX and picks
each token's expert: it equals the layer for every token not dropped.

    pw-run examples/moe.py
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw

TOKENS, WIDTH, HIDDEN, EXPERTS = 512, 64, 128, 4
CAPACITY = 128      # rows per expert bucket: an even share of the tokens, so busy experts drop some


def init(seed: int = 0):
    """Returns the router's weights and each expert's feed-forward weights."""
    rng = np.random.default_rng(seed)
    router = rng.normal(0, WIDTH ** -0.5, (WIDTH, EXPERTS)).astype(np.float32)
    experts = [{"w_in": rng.normal(0, WIDTH ** -0.5, (WIDTH, HIDDEN)).astype(np.float32),
                "w_out": rng.normal(0, HIDDEN ** -0.5, (HIDDEN, WIDTH)).astype(np.float32)}
               for _ in range(EXPERTS)]
    return router, experts


def gate(router, tokens):
    """Each token's expert (top-1) and its gate probability."""
    probabilities = jax.nn.softmax(tokens @ router)
    choice = jnp.argmax(probabilities, axis=-1)
    return choice, jnp.take_along_axis(probabilities, choice[:, None], 1)[:, 0]


def route(router, tokens):
    """Router: one bucket of CAPACITY rows per expert, each kept token's row and gate, the drop count."""
    choice, probability = gate(router, tokens)
    position = jnp.take_along_axis(jnp.cumsum(jax.nn.one_hot(choice, EXPERTS, dtype=jnp.int32), 0),
                                   choice[:, None], 1)[:, 0] - 1     # the token's place in its bucket
    kept = position < CAPACITY
    row = jnp.where(kept, choice * CAPACITY + position, EXPERTS * CAPACITY)
    buckets = jnp.zeros((EXPERTS * CAPACITY, WIDTH), tokens.dtype).at[row].set(tokens, mode="drop")
    buckets = buckets.reshape(EXPERTS, CAPACITY, WIDTH)
    return [buckets[e] for e in range(EXPERTS)], (jnp.where(kept, row, 0), jnp.where(kept, probability, 0.0)), \
        jnp.sum(~kept).astype(jnp.int32)


def expert(params, bucket):
    """One expert: a feed-forward block applied to the rows of its bucket."""
    return jax.nn.gelu(bucket @ params["w_in"]) @ params["w_out"]


def combine(placement, outputs):
    """Router: each kept token's expert output scaled by its gate, in token order; zero if dropped."""
    row, weight = placement
    return jnp.concatenate(outputs)[row] * weight[:, None]


def layer(islands=("island0", "island0", "island1", "island1")):
    """Returns the MoE layer as a program `moe(router, experts, tokens) -> (outputs, dropped)`."""
    router_slice = pw.virtual_slice(2, axes="tokens", island="island0", name="router")
    routing = pw.jit(route, slice=router_slice, in_specs=None, out_specs=None)
    combining = pw.jit(combine, slice=router_slice, in_specs=None, out_specs=P("tokens"))
    experts = [pw.jit(expert, slice=pw.virtual_slice(1, axes="rows", island=island, name=f"expert{e}"))
               for e, island in enumerate(islands)]

    @pw.program
    def moe(router, expert_params, tokens):
        buckets, placement, dropped = routing(router, tokens)
        outputs = [run(params, bucket) for run, params, bucket in zip(experts, expert_params, buckets)]
        return combining(placement, outputs), dropped
    return moe


def dense_reference(router, experts, tokens):
    """Plain JAX: every expert on every token; each token keeps its chosen expert's output times its gate."""
    choice, probability = gate(router, tokens)
    every = jnp.stack([expert(params, tokens) for params in experts], axis=1)   # [tokens, experts, width]
    return jnp.take_along_axis(every, choice[:, None, None], 1)[:, 0] * probability[:, None], choice


def kept_tokens(choice):
    """Which tokens fit their expert's capacity (token order), recomputed in NumPy."""
    seen = np.zeros(EXPERTS, np.int64)
    kept = np.zeros(len(choice), bool)
    for t, e in enumerate(np.asarray(choice)):
        kept[t] = seen[e] < CAPACITY
        seen[e] += 1
    return kept


if __name__ == "__main__":
    router, experts = init()
    tokens = np.random.default_rng(1).normal(size=(TOKENS, WIDTH)).astype(np.float32)
    moe = layer()
    outputs, dropped = moe(router, experts, tokens)
    expected, choice = jax.jit(dense_reference)(router, experts, tokens)
    kept = kept_tokens(choice)
    outputs = np.asarray(outputs)
    print(f"{TOKENS} tokens, {EXPERTS} experts of capacity {CAPACITY}: tokens per expert "
          f"{np.bincount(np.asarray(choice), minlength=EXPERTS).tolist()}, {int(np.asarray(dropped))} dropped")
    print("kept tokens match the dense JAX reference:",
          np.allclose(outputs[kept], np.asarray(expected)[kept], rtol=1e-5, atol=1e-6),
          "| dropped tokens are zero:", not outputs[~kept].any())

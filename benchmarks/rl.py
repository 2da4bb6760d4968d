"""The RL post-training loop of `examples/rl_loop.py`: overlapped against sequential, ours and plain JAX.

Sampler, reward model and trainer are each a program on a 2-device slice of
its own island (3 islands, emulated DCN). The loop runs at PROMPTS = 4096
prompts and a hidden width of 256 (16x and 4x the example's, set on this
benchmark's own copy of the module), so that each program's work outweighs
its host cost. `overlap`: nothing waits, so sampling step k+1 runs while
training step k does (one step of staleness); `sequential`: the same
programs, each call waiting for its results. `plain JAX overlap` and `plain
JAX sequential`: the same loop with the functions jitted on one device of
each island's devices, `device_put` between them, relying on JAX's
asynchronous dispatch to overlap. All compute the same numbers. Headline:
our sequential time over our overlapped time (the issue's target: 1.5), and
plain JAX's overlapped time over ours.
"""

from __future__ import annotations

import jax
import numpy as np

from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

from . import harness
from .examples import load_example

NAME = "rl"
HEADLINE = ("rl_overlap_over_sequential", "rl_over_plain_jax")
PROMPTS, HIDDEN = 4096, 256


def plain_jax(rl, devices: list) -> tuple:
    """The sampler, reward model and trainer jitted on one device each, inputs moved there first."""
    def place(fn, device):
        jitted = jax.jit(fn)
        return lambda *args: jitted(*jax.device_put(args, device))
    return tuple(place(fn, d) for fn, d in zip((rl.sample, rl.score, rl.train), devices))


def run(quick: bool) -> dict:
    """Times our overlapped and sequential loops beside plain JAX's, interleaved."""
    steps, repetitions = (5, 3) if quick else (20, 9)
    rl = load_example("rl_loop")
    rl.PROMPTS, rl.HIDDEN = PROMPTS, HIDDEN
    policy, reward_model = rl.init()
    runtime = Runtime(embedded_device_map(3, 2), emulate_dcn=True)
    client = Client(runtime)
    placed = rl.placed()
    plain = plain_jax(rl, jax.devices()[0:6:2])

    def case(functions, overlap, client=None):
        def loop():
            final, _ = rl.loop(functions, policy, reward_model, steps, overlap=overlap, client=client)
            jax.tree.map(np.asarray, final)          # waits for the last step, ours or plain JAX's
        return loop

    try:
        times = harness.measure({"overlap": case(placed, True, client), "sequential": case(placed, False, client),
                                 "plain JAX overlap": case(plain, True), "plain JAX sequential": case(plain, False)},
                                repetitions)
    finally:
        client.close()
        runtime.close()
    per_step = {name: harness.median(t) / steps for name, t in times.items()}
    rows = [{"variant": name, "step_ms": per_step[name] * 1e3, "over_overlap": per_step[name] / per_step["overlap"],
             "spread": harness.spread(times[name])} for name in times]
    headline = {"rl_overlap_over_sequential": per_step["sequential"] / per_step["overlap"],
                "rl_over_plain_jax": per_step["plain JAX overlap"] / per_step["overlap"]}
    return harness.record(NAME, {"islands": 3, "devices_per_island": 2, "emulated_dcn": True, "steps": steps,
                                 "prompts": PROMPTS, "hidden": HIDDEN, "repetitions": repetitions}, rows, headline)


def plot(record: dict, ax) -> None:
    """Milliseconds per RL step of each variant."""
    rows = record["rows"]
    ax.bar([r["variant"] for r in rows], [r["step_ms"] for r in rows])
    ax.set(ylabel="ms per step", title="RL loop: sampler, reward model, trainer on 3 islands")
    ax.tick_params(axis="x", labelrotation=15, labelsize="small")

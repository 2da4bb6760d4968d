"""Placement strategies against each other: the model's estimate and the measured step (issue 16).

Four programs whose slices name no island, on the embedded cluster of 2
islands x 4 CPU devices with emulated DCN (100 us + bytes at 25 Gb/s), each
lowered with `strategy=auto`, `spread` and `pack`:

- three blocks: `examples/three_blocks.py` (slices of 2, 2x2 and 2 devices);
- 4-stage pipeline: 4 slices of 2 devices, each 2 tanh layers of width 256,
  4 micro-batches of 64 flowing forward through them;
- RL-shaped: the sampler, reward model and trainer of `examples/rl_loop.py`
  as 3 computations of one program, each on a 2-device slice of its own
  (the frontend exports one program per module, so the 3 programs of the
  loop are its 3 stages here);
- large activation: a 4-device slice makes a 64x128x256 float activation
  (8 MiB) that a second 4-device slice reduces.

Each placement runs the same steps, with the same warm-up and repetitions,
interleaved with the others (`harness.measure`), and all placements of a
program are checked to compute the same numbers. Per program and placement:
the model's estimated step (`pw.placement_cost` step_ns from
`pw-place{explain=true}`), the measured step (median), and the bytes that
cross the DCN per step (the full size of every value a `Send` moves).
Headlines: `auto_over_spread`, the worst over programs of the measured
spread step over the auto step (above 1: auto is faster), and
`model_rank_agreement`, the fraction of pairs of placements of one program
that the model orders as the measurement does (pairs the model ties, such
as two strategies choosing the same placement, are skipped and counted).
"""

from __future__ import annotations

import itertools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.dialect import ops
from pathways_mlir.dialect.plan_steps import Send
from pathways_mlir.passes import lower, program_plans
from pathways_mlir.passes.place import Strategy
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

from . import harness
from .examples import load_example
from .pipeline import forward, init_params

NAME = "placement"
HEADLINE = ("auto_over_spread", "model_rank_agreement")
ISLANDS, PER_ISLAND = 2, 4
STRATEGIES = tuple(Strategy)            # auto, spread, pack


def three_blocks():
    """The README's three-block program and its input."""
    example = load_example("three_blocks")
    x = np.random.default_rng(0).normal(size=(8, 16)).astype(np.float32)
    return example.three_blocks, (x,)


def pipeline4():
    """A forward pass through 4 stages of 2 layers each, micro-batch by micro-batch, and its inputs."""
    slices = [pw.virtual_slice(2, axes="data", name=f"stage{s}") for s in range(4)]
    stages = [pw.jit(lambda params, x: forward(params, x)[-1], slice=s, in_specs=(None, P("data")),
                     out_specs=P("data")) for s in slices]

    def step(params, xs):
        outputs = []
        for x in xs:
            for s, stage in enumerate(stages):
                x = stage(params[2 * s:2 * s + 2], x)
            outputs.append(x)
        return outputs
    xs = list(np.random.default_rng(1).normal(size=(4, 64, 256)).astype(np.float32))
    return pw.program(step), (init_params(), xs)


def rl_shaped():
    """One step of `examples/rl_loop.py` (sample, score, train) on 3 slices without islands, and its inputs."""
    rl = load_example("rl_loop")
    sampler, scorer, trainer = (pw.virtual_slice(2, axes="data", name=n) for n in ("sampler", "scorer", "trainer"))
    sample = pw.jit(rl.sample, slice=sampler, in_specs=None, out_specs=P("data"))
    score = pw.jit(rl.score, slice=scorer, in_specs=(None, P("data"), P("data")), out_specs=P("data"))
    train = pw.jit(rl.train, slice=trainer, in_specs=(None, None, P("data"), P("data"), P("data")), out_specs=None)

    def step(policy, opt_state, reward_model, k):
        prompts, answers = sample(policy, k)
        return train(policy, opt_state, prompts, answers, score(reward_model, prompts, answers))
    policy, reward_model = rl.init()
    opt_state = jax.tree.map(np.asarray, rl.OPTIMIZER.init(policy))
    return pw.program(step), (policy, opt_state, reward_model, np.int32(0))


def large_activation():
    """Two 4-device stages with an 8 MiB activation between them, and its inputs."""
    make = pw.jit(lambda x, w: jnp.tanh(x[:, None, :] * w[None, :, None]),
                  slice=pw.virtual_slice(4, axes="data", name="make"), in_specs=(P("data"), None),
                  out_specs=P("data"))
    reduce = pw.jit(lambda a: a.sum(axis=1), slice=pw.virtual_slice(4, axes="data", name="reduce"),
                    in_specs=P("data"), out_specs=P("data"))
    rng = np.random.default_rng(2)
    x, w = rng.normal(size=(64, 256)).astype(np.float32), rng.normal(size=128).astype(np.float32)
    return pw.program(lambda x, w: reduce(make(x, w))), (x, w)


PROGRAMS = {"three blocks": three_blocks, "4-stage pipeline": pipeline4, "RL-shaped": rl_shaped,
            "large activation": large_activation}


def value_bytes(shape, dtype: str) -> int:
    """The bytes of a whole value of MLIR element type `dtype` ("f32", "bf16", "i1", ...)."""
    return math.prod(shape) * max(1, int(re.sub(r"\D", "", dtype)) // 8)


def compile_placed(program, args, topology, strategy: str):
    """Lowers `program` with `strategy`; returns (run(client) -> output leaves, estimated step in s,
    DCN bytes per step)."""
    lowered = program.lower(*jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), args))
    module = lower(lowered.module, topology, strategy=strategy, explain=True)
    step_ns = {ops.attr(op, ops.PLACEMENT_COST)["step_ns"] for op in ops.top_level_ops(module)
               if op.name == "pw.virtual_slice"}
    assert len(step_ns) == 1, step_ns               # every slice records the same estimated step
    plan = program_plans(module)[lowered.program]
    dcn = sum(value_bytes(plan.buffers[s.src_buffer].shape, plan.buffers[s.src_buffer].dtype)
              for steps in plan.islands.values() for s in steps if isinstance(s, Send))
    leaves = jax.tree.leaves(args)
    return (lambda client: client.run(plan, leaves)), step_ns.pop() * 1e-9, dcn


def rank_agreement(rows) -> tuple[int, int, int]:
    """Counts pairs of placements of one program: (ordered as measured, ordered otherwise, tied by the model)."""
    agree = disagree = ties = 0
    for a, b in itertools.combinations(rows, 2):
        model, measured = a["estimated_ms"] - b["estimated_ms"], a["measured_ms"] - b["measured_ms"]
        if model == 0:
            ties += 1
        elif (model > 0) == (measured > 0):
            agree += 1
        else:
            disagree += 1
    return agree, disagree, ties


def run(quick: bool) -> dict:
    """Measures each program's step under each placement, interleaved; compares with the model."""
    steps, repetitions = (2, 3) if quick else (10, 11)
    runtime = Runtime(embedded_device_map(ISLANDS, PER_ISLAND), emulate_dcn=True)
    client = Client(runtime)
    topology = runtime.resources.snapshot()[1]
    compiled = {}
    for name, make in PROGRAMS.items():
        program, args = make()
        for strategy in STRATEGIES:
            compiled[name, strategy] = compile_placed(program, args, topology, strategy)

    def case(fn):
        def steps_of():
            for _ in range(steps):
                for leaf in fn(client):
                    leaf.block_until_ready()
        return steps_of

    try:
        times = harness.measure({key: case(fn) for key, (fn, _, _) in compiled.items()}, repetitions)
        same = all(harness.same_results(compiled[name, "auto"][0](client), compiled[name, s][0](client))
                   for name in PROGRAMS for s in STRATEGIES[1:])
    finally:
        client.close()
        runtime.close()
    rows = [{"program": name, "placement": strategy, "estimated_ms": compiled[name, strategy][1] * 1e3,
             "measured_ms": harness.median(times[name, strategy]) / steps * 1e3,
             "dcn_bytes": compiled[name, strategy][2], "spread": harness.spread(times[name, strategy])}
            for name in PROGRAMS for strategy in STRATEGIES]
    by_program = {name: [r for r in rows if r["program"] == name] for name in PROGRAMS}
    for name, program_rows in by_program.items():
        auto = next(r for r in program_rows if r["placement"] == "auto")
        for r in program_rows:
            r["auto_speedup"] = r["measured_ms"] / auto["measured_ms"]
    agree, disagree, ties = map(sum, zip(*(rank_agreement(r) for r in by_program.values())))
    headline = {"auto_over_spread": harness.worst(r["auto_speedup"] for r in rows if r["placement"] == "spread"),
                "model_rank_agreement": agree / (agree + disagree) if agree + disagree else None}
    return harness.record(NAME, {"cluster": f"{ISLANDS} islands x {PER_ISLAND} devices, emulated DCN",
                                 "steps_per_case": steps, "repetitions": repetitions,
                                 "placements_compute_the_same": same, "pairs_ordered_as_measured": agree,
                                 "pairs_ordered_otherwise": disagree, "pairs_tied_by_model": ties}, rows, headline)


def plot(record: dict, ax) -> None:
    """Estimated against measured step time, log-log: one marker per placement, one colour per program."""
    markers = {"auto": "o", "spread": "s", "pack": "^"}
    programs = list(dict.fromkeys(r["program"] for r in record["rows"]))
    for colour, program in zip(("tab:blue", "tab:orange", "tab:green", "tab:red"), programs):
        for r in (r for r in record["rows"] if r["program"] == program):
            ax.scatter(r["estimated_ms"], r["measured_ms"], marker=markers[r["placement"]], color=colour,
                       label=f"{program}, {r['placement']}")
    ax.set(xscale="log", yscale="log", xlabel="estimated step (ms)", ylabel="measured step (ms)",
           title="Placement: the model's estimate against measurement")
    ax.legend(fontsize="x-small", ncol=2)

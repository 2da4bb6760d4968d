"""Pipeline schedules from `pw.pipeline`: GPipe, 1F1B, interleaved 1F1B and ZB-H1, each against plain JAX.

The model is S = 4 stages of 2 tanh layers (width 128), a batch of 512 rows
in M = 8 micro-batches, an MSE loss. GPipe and 1F1B put one stage on each
island of a 4 x 1 cluster; interleaved 1F1B puts the 4 stages on D = 2
slices (island0 and island1), two virtual stages each. Stage hops between
islands cross the emulated DCN. (`pw.pipeline` runs a stage's steps
replicated over its slice, so with one device a slice no work is doubled.)
Per schedule:

- `step_ms`: one training step (loss and gradients) of our program;
  `plain_jax_step_ms`: plain JAX running the same schedule, the same
  functions (`pw.pipeline`'s forward and backward steps) jitted on the same
  devices, called in the same order with `device_put` between slices;
  `over_plain_jax` is plain JAX's time over ours (above 1: we are faster).
- `bubble`: the idle fraction of the slices, measured: 1 - W / (D x step),
  where W is the sum over stages of the time each stage's steps take run
  alone (plain JAX, one stage at a time). `textbook_bubble` is
  (D-1)/(V M + D-1) with V = S/D stages a slice: (S-1)/(M+S-1) for GPipe
  and 1F1B. On a machine with fewer cores than slices, slices cannot run at
  the same time, so the measured bubble is mostly that contention.
  `trace_bubble`: the idle fraction of the islands in the trace of one
  step (`Runtime.start_tracing`), between its first and last stage launch;
  `planned_bubble`: the same of the schedule timed with nominal costs (F 1,
  backward 2, ZB-H1's B and W 1 each). A full run through `pw-bench` also
  draws the planned and measured schedules of 1F1B and ZB-H1 (`FIGURES`)
  into `plots/` beside its record (the package's `plots/` for its records).
- `stage0_peak_bytes`: the static peak per device of island0 from the plan
  (`compiled.plan.peak`); `in_flight`: the most stage steps whose residuals
  the first slice keeps at once in the schedule's order (M for GPipe, S for
  1F1B, 2(D-1) + (V-1)D + 1 for interleaved 1F1B).
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

import pathways_mlir as pw
from pathways_mlir.frontend import schedule_picture
from pathways_mlir.frontend.pipeline import run_schedule, schedule_steps, stage_functions, tick_order
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

from . import harness

NAME = "pipeline-schedules"
HEADLINE = ("onef1b_peak_over_gpipe_stage0", "gpipe_over_plain_jax", "onef1b_over_plain_jax",
            "zbh1_over_plain_jax", "zbh1_step_over_onef1b", "zbh1_trace_bubble_over_onef1b")
# Headlines that read lower is better (times, bytes, errors; `pw-bench report` marks them).
LOWER_IS_BETTER = ("onef1b_peak_over_gpipe_stage0", "zbh1_step_over_onef1b", "zbh1_trace_bubble_over_onef1b")
STAGES, DEVICES_PER_STAGE, LAYERS, WIDTH, ROWS, MICRO_BATCHES = 4, 1, 2, 128, 512, 8
SCHEDULES = {"gpipe": STAGES, "1f1b": STAGES, "interleaved-1f1b": 2, "zb-h1": STAGES}   # schedule -> slices (D)
# The figures a full run draws: the schedules of 1F1B and ZB-H1, measured and planned.
FIGURES = {schedule: (f"schedule-{schedule}-measured.png", f"schedule-{schedule}-planned.png")
           for schedule in ("1f1b", "zb-h1")}


def stage(params, x):
    """One stage: LAYERS tanh layers."""
    for w, b in params:
        x = jnp.tanh(x @ w + b)
    return x


def mse(y, target):
    """The mean squared error."""
    return jnp.mean((y - target) ** 2)


def plain_jax(schedule: str, devices: list) -> callable:
    """Returns plain JAX running `schedule`: each stage's functions jitted on its slice's devices."""
    slices = SCHEDULES[schedule]
    ticks = tick_order(schedule_steps(schedule, STAGES, MICRO_BATCHES, slices))
    shardings = [NamedSharding(jax.sharding.Mesh(np.array(devices[d * DEVICES_PER_STAGE:(d + 1) * DEVICES_PER_STAGE]),
                                                 ("x",)), PartitionSpec()) for d in range(slices)]

    def place(fn, s):
        jitted = jax.jit(fn, out_shardings=shardings[s % slices])
        return lambda *args: jitted(*jax.device_put(args, shardings[s % slices]))
    functions = stage_functions([stage] * STAGES, mse, MICRO_BATCHES).map(place)
    return lambda params, x, target: run_schedule(ticks, functions, params, x, target)[:2]


def in_flight(schedule: str) -> int:
    """The most stage steps whose residuals the first slice keeps at once, from the schedule's order."""
    live = peak = 0
    for _, kind, _ in schedule_steps(schedule, STAGES, MICRO_BATCHES, SCHEDULES[schedule])[0]:
        live += {"F": 1, "B": -1, "FB": 0}[kind]
        peak = max(peak, live)
    return peak


def stage_alone_seconds(functions, params, x, target, repetitions: int) -> float:
    """W: the sum over stages of the median time of each stage's M forward and M backward steps alone."""
    inputs = functions.split_batch(x)
    targets = functions.split_targets(target)
    total = 0.0
    for s in range(STAGES):
        def steps():
            sums = None
            for m, micro in enumerate(inputs):
                if s == STAGES - 1:
                    sums, _, _ = functions.forward_backward(params[s], None, micro, targets[m], sums)
                else:
                    y, _, saved = functions.forward[s](params[s], None, micro)
                    result = functions.backward[s](params[s], None, micro, saved, y, sums)
                    sums = result if s == 0 else result[0]
            jax.block_until_ready(sums)
        total += harness.median(harness.measure({"stage": steps}, repetitions)["stage"])
    return total


def run(quick: bool, plots: pathlib.Path | None = None) -> dict:
    """Measures each schedule's step time, bubble and static peak beside plain JAX; a full run given `plots`
    draws `FIGURES` there."""
    repetitions = 3 if quick else 11
    rng = np.random.default_rng(0)
    params = [[(rng.normal(0, WIDTH ** -0.5, (WIDTH, WIDTH)).astype(np.float32), np.zeros(WIDTH, np.float32))
               for _ in range(LAYERS)] for _ in range(STAGES)]
    x = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    target = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    runtime = Runtime(embedded_device_map(STAGES, DEVICES_PER_STAGE), emulate_dcn=True)
    client = Client(runtime)
    try:
        compiled, cases, programs = {}, {}, {}
        for schedule, count in SCHEDULES.items():
            slices = [pw.virtual_slice(DEVICES_PER_STAGE, axes="x", island=f"island{d}") for d in range(count)]
            step = pw.pipeline([stage] * STAGES, [slices[s % count] for s in range(STAGES)], loss=mse,
                               schedule=schedule, micro_batches=MICRO_BATCHES)
            compiled[schedule] = step.lower(params, x, target).compile(runtime)
            programs[schedule] = step
            cases[schedule] = (lambda c: lambda: jax.block_until_ready(
                [h.result() for h in jax.tree.leaves(c(params, x, target, client=client))]))(compiled[schedule])
            plain = plain_jax(schedule, jax.devices()[:STAGES * DEVICES_PER_STAGE])
            cases[f"plain JAX {schedule}"] = (lambda p: lambda: jax.block_until_ready(p(params, x, target)))(plain)
        times = harness.measure(cases, repetitions)
        traced = {}
        for schedule, count in SCHEDULES.items():          # one traced step each, after the timing
            runtime.start_tracing()
            cases[schedule]()
            tracer = runtime.stop_tracing()
            islands = [f"island{d}" for d in range(count)]
            traced[schedule] = schedule_picture.bubble(schedule_picture.measured(tracer, islands))
            if plots is not None and not quick and schedule in FIGURES:
                measured, planned = FIGURES[schedule]
                plots.mkdir(parents=True, exist_ok=True)
                programs[schedule].draw(str(plots / measured), tracer)
                programs[schedule].draw(str(plots / planned))
        work = stage_alone_seconds(stage_functions([stage] * STAGES, mse, MICRO_BATCHES).map(
            lambda f, s: jax.jit(f)), params, x, target, repetitions)   # on one device, as a stage
    finally:
        client.close()
        runtime.close()
    step = {name: harness.median(t) for name, t in times.items()}
    rows = []
    for schedule, slices in SCHEDULES.items():
        virtual = STAGES // slices
        rows.append({"schedule": schedule, "stages": STAGES, "slices": slices, "micro_batches": MICRO_BATCHES,
                     "step_ms": step[schedule] * 1e3, "plain_jax_step_ms": step[f"plain JAX {schedule}"] * 1e3,
                     "over_plain_jax": step[f"plain JAX {schedule}"] / step[schedule],
                     "bubble": 1 - work / (slices * step[schedule]),
                     "textbook_bubble": (slices - 1) / (virtual * MICRO_BATCHES + slices - 1),
                     "trace_bubble": traced[schedule],
                     "planned_bubble": schedule_picture.bubble(schedule_picture.planned(programs[schedule].steps)),
                     "stage0_peak_bytes": max(b for _, _, b in compiled[schedule].plan.peak("island0")),
                     "in_flight": in_flight(schedule), "spread": harness.spread(times[schedule])})
    peak = {r["schedule"]: r["stage0_peak_bytes"] for r in rows}
    by = {r["schedule"]: r for r in rows}
    headline = {"onef1b_peak_over_gpipe_stage0": peak["1f1b"] / peak["gpipe"],
                "gpipe_over_plain_jax": by["gpipe"]["over_plain_jax"],
                "onef1b_over_plain_jax": by["1f1b"]["over_plain_jax"],
                "zbh1_over_plain_jax": by["zb-h1"]["over_plain_jax"],
                "zbh1_step_over_onef1b": by["zb-h1"]["step_ms"] / by["1f1b"]["step_ms"],
                "zbh1_trace_bubble_over_onef1b": by["zb-h1"]["trace_bubble"] / by["1f1b"]["trace_bubble"]}
    return harness.record(NAME, {"stages": STAGES, "devices_per_stage": DEVICES_PER_STAGE, "layers_per_stage": LAYERS,
                                 "width": WIDTH, "rows": ROWS, "micro_batches": MICRO_BATCHES,
                                 "repetitions": repetitions}, rows, headline)


def plot(record: dict, ax) -> None:
    """Per schedule: stage 0's static peak memory and the measured bubble, beside the textbook's."""
    rows = record["rows"]
    names = [r["schedule"] for r in rows]
    positions = np.arange(len(rows))
    ax.bar(positions - 0.2, [r["bubble"] for r in rows], 0.4, label="measured bubble")
    ax.bar(positions + 0.2, [r["textbook_bubble"] for r in rows], 0.4, label="textbook (D-1)/(VM+D-1)")
    ax.set_xticks(positions, [f"{n}\npeak {r['stage0_peak_bytes'] / 1024:.0f} KiB" for n, r in zip(names, rows)])
    ax.set(ylabel="idle fraction of the slices", title=f"Pipeline schedules (S={STAGES}, M={MICRO_BATCHES})")
    ax.legend(fontsize="small")

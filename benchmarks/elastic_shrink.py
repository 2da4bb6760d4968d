"""Elastic shrink and grow: training throughput on all of a slice's devices, on half, and on all again.

The MLP of `elastic` (256-512-512-1, SGD, a batch of 128) trains with
`pw.ElasticTrainer` on an elastic slice of 4 to 8 devices
(`pw.virtual_slice("4..8", ...)`) of one island of 8 CPU devices. A third of
the way in, 4 of the island's devices are taken out of service
(`ResourceManager.remove_device`, as a preemption would); two thirds of the
way in they come back. The trainer's next call after each change lowers the
step again, and placement gives the slice 4 devices, then 8: the same global
batch is split over fewer shards, then more. Each phase's steps/s is timed
from its `warm`-th step (past the re-lowering and XLA compiling for the new
mesh) to its last, the loop catching up with its device work at both marks.

Beside it, interleaved: the same run with no device taken out
(`unchanged`), whose last third over its first says how much the phases
differ by themselves; and plain JAX running the same step (`jax.jit` with the
batch split over a mesh of 8 devices, and of 4) for as many steps: its
4-over-8 ratio is what this machine's devices give when half of them go. On
a machine whose CPU devices share fewer cores than there are devices (2 here)
that ratio is near 1, not 0.5: the devices are threads on the same cores.
Headline: `shrunk_throughput_over_full` (median over repetitions of shrunk
steps/s over full steps/s, target 0.4-0.6 on devices that compute in
parallel), `regrown_over_full` (median over repetitions of regrown steps/s
over full, target >= 0.95), `jax_4_over_8` (plain JAX's own ratio, median)
and `shrunk_over_jax_shrunk`, the median over repetitions of the
shrunk-over-full ratio over plain JAX's 4-over-8 ratio of the same
repetition: what shrinking costs beyond what the devices give (1.0:
nothing). Each is a median of per-repetition ratios, as every throughput
ratio of `elastic` is: a phase times about 95 steps, which on this machine
swing by up to 30% from one phase to the next with nothing changed (the
unchanged run's last third over its first, in the record), so the worst
repetition measures the load more than the trainer. The worst and best
repetition of each are in the record's parameters.
"""

from __future__ import annotations

import logging
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

from . import harness
from .elastic import WAIT, batch, init, sgd_step

NAME = "elastic-shrink"
HEADLINE = ("shrunk_throughput_over_full", "regrown_over_full", "jax_4_over_8", "shrunk_over_jax_shrunk")
DEVICES, REMOVED = 8, (4, 5, 6, 7)
SLICE = "elastic_shrink"
train_step = pw.program(pw.jit(sgd_step, slice=pw.virtual_slice(f"{DEVICES // 2}..{DEVICES}", axes="x", name=SLICE),
                               in_specs=(None, (P("x"), P("x"))), out_specs=None))


def cycle(runtime, steps: int, warm: int, removed: tuple[int, ...] = REMOVED) -> dict:
    """Trains `steps` steps, taking `removed` out after a third and back after two thirds; returns the row."""
    shrink_at, grow_at = steps // 3, 2 * steps // 3
    phases = {"full": (0, shrink_at), "shrunk": (shrink_at, grow_at), "regrown": (grow_at, steps)}
    marks = {}

    def on_step(n, metrics):
        if any(n in (begin + warm, end) for begin, end in phases.values()):
            np.asarray(metrics[0].result(WAIT))         # the loop catches up with its device work
            marks[n] = time.perf_counter()
        if n == shrink_at:
            for device in removed:
                runtime.resources.remove_device("island0", device)
        if n == grow_at:
            for device in removed:
                runtime.resources.add_device("island0", device)

    with Client(runtime) as client:
        trainer = pw.ElasticTrainer(train_step, batch, snapshot_every=steps, client=client, on_step=on_step,
                                    timeout=WAIT)
        trainer.run(init(), steps)
    row = {f"{name}_steps_per_s": (end - begin - warm) / (marks[end] - marks[begin + warm])
           for name, (begin, end) in phases.items()}
    row.update({f"{name}_devices": trainer.shapes[end - 1][SLICE][0] for name, (_, end) in phases.items()})
    return row


def jax_loop(devices: int, steps: int):
    """Plain JAX: `steps` steps of the same SGD step, the batch split over a mesh of `devices` devices."""
    mesh = Mesh(np.array(jax.devices()[:devices]), ("x",))
    split, whole = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())
    step = jax.jit(sgd_step, in_shardings=(whole, (split, split)), out_shardings=whole)
    batches = [jax.device_put(batch(i), split) for i in range(steps)]

    def loop():
        params = jax.device_put(init(), whole)
        for b in batches:
            params, loss = step(params, b)
        loss.block_until_ready()
    return loop


def run(quick: bool) -> dict:
    """Measures the three phases' throughput beside plain JAX on 8 and on 4 devices, interleaved."""
    steps, warm, repetitions = (24, 2, 2) if quick else (300, 5, 9)
    runtime = Runtime(embedded_device_map(1, DEVICES))
    rows = []
    phase = steps // 3 - warm                              # the steps each phase times
    unchanged = []
    cases = {"elastic": lambda: rows.append(cycle(runtime, steps, warm)),
             "unchanged": lambda: unchanged.append(cycle(runtime, steps, warm, removed=())),
             "jax 8 devices": jax_loop(DEVICES, phase), "jax 4 devices": jax_loop(DEVICES // 2, phase)}
    trainer_log = logging.getLogger("pathways_mlir.elastic")
    level, _ = trainer_log.level, trainer_log.setLevel(logging.ERROR)    # a line per resize: the rows say it
    try:
        times = harness.measure(cases, repetitions)
    finally:
        trainer_log.setLevel(level)
        runtime.close()
    measured, control = rows[1:], unchanged[1:]            # without the warm-ups
    shrunk = [r["shrunk_steps_per_s"] / r["full_steps_per_s"] for r in measured]
    regrown = [r["regrown_steps_per_s"] / r["full_steps_per_s"] for r in measured]
    jax_ratio = [eight / four for eight, four in zip(times["jax 8 devices"], times["jax 4 devices"])]
    table = [{"case": "elastic", "rep": i, **row, "shrunk_over_full": s, "regrown_over_full": g}
             for i, (row, s, g) in enumerate(zip(measured, shrunk, regrown))]
    table += [{"case": "unchanged", "rep": i, **row,
               "last_over_first": row["regrown_steps_per_s"] / row["full_steps_per_s"]}
              for i, row in enumerate(control)]
    table += [{"case": case, "steps_per_s": phase / harness.median(times[case]), "spread": harness.spread(times[case])}
              for case in ("jax 8 devices", "jax 4 devices")]
    beyond_jax = [ours / theirs for ours, theirs in zip(shrunk, jax_ratio)]
    headline = {"shrunk_throughput_over_full": harness.median(shrunk), "regrown_over_full": harness.median(regrown),
                "jax_4_over_8": harness.median(jax_ratio), "shrunk_over_jax_shrunk": harness.median(beyond_jax)}
    return harness.record(NAME, {
        "devices": DEVICES, "removed": list(REMOVED), "steps": steps, "warm": warm, "repetitions": repetitions,
        "shrunk_over_full_range": [min(shrunk), max(shrunk)], "jax_4_over_8_range": [min(jax_ratio), max(jax_ratio)],
        "regrown_over_full_range": [min(regrown), max(regrown)],
        "shrunk_over_jax_shrunk_range": [min(beyond_jax), max(beyond_jax)],
        "unchanged_last_over_first": [r["regrown_steps_per_s"] / r["full_steps_per_s"] for r in control],
        "sizes_as_placed": all((r["full_devices"], r["shrunk_devices"], r["regrown_devices"]) == (8, 4, 8)
                               for r in measured)}, table, headline)


def plot(record: dict, ax) -> None:
    """Median steps/s of each phase, beside plain JAX on 8 and 4 devices."""
    rows = [r for r in record["rows"] if r["case"] == "elastic"]
    names = ["full", "shrunk", "regrown"]
    ours = [harness.median([r[f"{name}_steps_per_s"] for r in rows]) for name in names]
    jax_rows = {r["case"]: r["steps_per_s"] for r in record["rows"] if r["case"].startswith("jax")}
    ax.bar(names, ours, label="pw.ElasticTrainer (8, 4, 8 devices)")
    ax.bar(["jax 8", "jax 4"], [jax_rows["jax 8 devices"], jax_rows["jax 4 devices"]], label="plain JAX")
    ax.set(ylabel="steps/s", title="Shrinking onto half the devices and growing back (1 island x 8 CPU devices)")
    ax.legend()

"""Elastic training: the time to recover from a lost island, and the throughput before and after.

An MLP (256-512-512-1, SGD, a batch of 128 split over a 4-device slice)
trains with `pw.ElasticTrainer` (a host snapshot every 5 steps) on the
embedded cluster, 2 islands of 4 CPU devices. At a middle step the island it
runs on is lost (`Runtime.lose_island`, after the loop has caught up with its
device work); the trainer restores the latest snapshot and replays on the
other island. `recompiled`: a fresh runtime every repetition, so the
surviving island compiles the step (XLA) during the recovery; `cached`: one
runtime throughout (the lost island restored after each repetition), so from
the second repetition on the surviving island reuses the executable it
compiled before and only pw's lowering runs again; each row counts the
executables compiled during its recovery. `ray, actor killed` (where Ray is
installed): the same on the Ray backend (one local Ray node), the training
island's actor killed by its name with `ray.kill`, so the runtime's monitor
has to notice the death; each repetition restores the island by hand
afterwards (a fresh actor). The surviving actor keeps its compile cache, so
from the second repetition on the step it takes over is already compiled
there. `uninterrupted` (the trainer, no
loss) and `plain loop` (the step called in a loop, no snapshots) give the
cost of snapshotting. Headline: `recovery_s`, the worst over repetitions
(recompiled, embedded and Ray) of the time from the loss to the first replayed step
dispatched (detection, restore, re-lowering with compilation; target: under
5 s), `recovery_s_cached` the same with executables reused, the median of
steps/s after the loss over steps/s before, and the uninterrupted trainer's
steps/s over the plain loop's. Where Ray is installed,
`ray_elastic_trainer_over_embedded`: the trainer's steps/s before the loss on
the Ray backend over the embedded backend's (`cached`), the median over
repetitions of the ratio of each pair from the same interleaved repetition
(as every throughput ratio here; the worst and best pairs are in the record's
parameters): each side times about 20 steps, which on a loaded machine swing
by 30-50% from one repetition to the next, so the worst pair measured the
load more than the backend.
"""

from __future__ import annotations

import importlib.util
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

from . import harness

NAME = "elastic"
HEADLINE = ("recovery_s", "recovery_s_cached", "elastic_after_over_before", "trainer_over_plain_loop",
            "ray_elastic_trainer_over_embedded")
# Headlines that read lower is better (times, bytes, errors; `pw-bench report` marks them).
LOWER_IS_BETTER = ("recovery_s", "recovery_s_cached")
BATCH, WIDTHS = 128, (256, 512, 512, 1)
SNAPSHOT_EVERY = 5
WAIT = 120.0          # seconds any one wait may take


def loss(params, x, y):
    for w, b in params[:-1]:
        x = jnp.tanh(x @ w + b)
    w, b = params[-1]
    return jnp.mean((x @ w + b - y) ** 2)


def sgd_step(params, batch):
    value, grads = jax.value_and_grad(loss)(params, *batch)
    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads), value


sgd = pw.jit(sgd_step, slice=pw.virtual_slice(4, axes="data", name="mlp"), in_specs=(None, (P("data"), P("data"))),
             out_specs=None)


@pw.program
def train_step(params, batch):
    return sgd(params, batch)


def batch(step: int):
    x = np.random.default_rng(step).normal(size=(BATCH, WIDTHS[0])).astype(np.float32)
    return x, np.sin(x[:, :8].sum(axis=1, keepdims=True))


def init():
    rng = np.random.default_rng(0)
    return [((rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32), np.zeros(b, np.float32))
            for a, b in zip(WIDTHS[:-1], WIDTHS[1:])]


def training_island(runtime) -> str:
    """The island the training step is placed on now."""
    return train_step.compiled(init(), batch(0), runtime=runtime).plan.slices["mlp"].island


def kill_actor(runtime, island: str) -> None:
    """Kills an island's Ray actor by its name, as an operator or a dying host would (not through the
    runtime: its monitor has to notice), and returns once the runtime has taken the island out.

    The wait makes the loss as final as `Runtime.lose_island` is on the embedded backend: the results
    that lived on the island raise `IslandLost` from then on. Without it, a result read just before
    the kill (the step's metrics, which bring the state back with them) stays readable on the driver,
    and when the monitor takes the island out before the next step starts, that step runs on the
    other island from the driver's copy: nothing is lost and no recovery is recorded.
    """
    import ray

    from pathways_mlir.runtime.ray_backend import NAMESPACE, island_name

    ray.kill(ray.get_actor(island_name(island), namespace=NAMESPACE))
    _wait_lost(runtime, island)


def elastic_run(runtime, steps: int, lose_at: int, warm: int, lose=None) -> dict:
    """Trains `steps` steps losing the training island after step `lose_at` (by `lose(runtime, island)`,
    default `Runtime.lose_island`); returns the row."""
    marks, loss_info = {}, {}

    def on_step(n, metrics):
        lost = "at" in loss_info
        if n in (warm, lose_at, steps) or (lost and n == lose_at + warm):
            np.asarray(metrics[0])                    # the loop catches up with its device work
            marks["before" if not lost else "after", n] = time.perf_counter()
        if n == lose_at and not lost:
            loss_info.update(island=training_island(runtime),
                             compilations={name: island.compilations() for name, island in runtime.islands.items()})
            loss_info["at"] = time.monotonic()
            (lose or (lambda rt, island: rt.lose_island(island)))(runtime, loss_info["island"])

    with Client(runtime) as client:
        trainer = pw.ElasticTrainer(train_step, batch, snapshot_every=SNAPSHOT_EVERY, client=client,
                                    on_step=on_step, timeout=WAIT)
        final = trainer.run(init(), steps)
        [recovery] = trainer.recoveries
        moved_to = training_island(runtime)
        compiled = runtime.islands[moved_to].compilations() - loss_info["compilations"][moved_to]
        del final
    _wait_lost(runtime, loss_info["island"])
    runtime.restore_island(loss_info["island"])
    detection = recovery.detected_at - loss_info["at"]
    return {"detection_ms": detection * 1e3, "restore_ms": recovery.restore_s * 1e3,
            "relower_ms": recovery.relower_s * 1e3, "recovery_s": detection + recovery.recovery_s,
            "steps_replayed": recovery.replayed, "compilations": compiled,
            "lost": loss_info["island"], "moved_to": moved_to,
            "before_steps_per_s": (lose_at - warm) / (marks["before", lose_at] - marks["before", warm]),
            "after_steps_per_s": (steps - lose_at - warm) / (marks["after", steps] - marks["after", lose_at + warm])}


def _wait_lost(runtime, island: str) -> None:
    """Waits (at most WAIT seconds) until the runtime has taken the island out."""
    deadline = time.monotonic() + WAIT
    while runtime.islands[island].lost is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"island {island} was not taken out within {WAIT} s")
        time.sleep(0.01)


def run(quick: bool) -> dict:
    """Measures recovery (recompiled and cached) and throughput beside an uninterrupted run and a plain
    loop, interleaved."""
    steps, repetitions = (24, 2) if quick else (40, 5)
    lose_at = steps // (2 * SNAPSHOT_EVERY) * SNAPSHOT_EVERY + 2      # 2 steps after a snapshot: 2 to replay
    warm = 3
    cached_runtime, steady_runtime = Runtime(embedded_device_map(2, 4)), Runtime(embedded_device_map(2, 4))
    rows: dict[str, list[dict]] = {"recompiled": [], "cached": []}

    def recompiled():
        runtime = Runtime(embedded_device_map(2, 4))
        try:
            rows["recompiled"].append(elastic_run(runtime, steps, lose_at, warm))
        finally:
            runtime.close()

    def cached():
        rows["cached"].append(elastic_run(cached_runtime, steps, lose_at, warm))

    steady = Client(steady_runtime)
    cases = {"recompiled": recompiled, "cached": cached}
    if importlib.util.find_spec("ray") is None:
        ray_runtime = None
    else:
        ray_runtime = Runtime(backend="ray", islands=2, per_island=4)
        rows["ray, actor killed"] = []
        cases["ray, actor killed"] = lambda: rows["ray, actor killed"].append(
            elastic_run(ray_runtime, steps, lose_at, warm, kill_actor))

    def uninterrupted():
        trainer = pw.ElasticTrainer(train_step, batch, snapshot_every=SNAPSHOT_EVERY, client=steady, timeout=WAIT)
        trainer.run(init(), steps)

    def plain_loop():
        params = init()
        for i in range(steps):
            params = train_step.run(params, batch(i), client=steady)[0]
        jax.tree_util.tree_map(np.asarray, params)

    trainer_log = logging.getLogger("pathways_mlir.elastic")
    level, _ = trainer_log.level, trainer_log.setLevel(logging.ERROR)     # its lines, once per run: the rows say it
    try:
        times = harness.measure({**cases, "uninterrupted": uninterrupted, "plain loop": plain_loop}, repetitions)
    finally:
        trainer_log.setLevel(level)
        steady.close()
        cached_runtime.close()
        steady_runtime.close()
        if ray_runtime is not None:
            ray_runtime.close()
    elastic = {case: found[1:] for case, found in rows.items()}       # without the warm-up's
    table = [{"case": case, "rep": i, **row} for case, found in elastic.items() for i, row in enumerate(found)]
    per_s = {case: steps / harness.median(times[case]) for case in ("uninterrupted", "plain loop")}
    table += [{"case": case, "steps_per_s": value, "spread": harness.spread(times[case])}
              for case, value in per_s.items()]
    everything = [row for found in elastic.values() for row in found]
    headline = {
        "recovery_s": max(row["recovery_s"] for case, found in elastic.items() if case != "cached" for row in found),
        "recovery_s_cached": max(row["recovery_s"] for row in elastic["cached"]),
        "elastic_after_over_before": harness.median([r["after_steps_per_s"] / r["before_steps_per_s"]
                                                     for r in everything]),
        "trainer_over_plain_loop": per_s["uninterrupted"] / per_s["plain loop"]}
    ray_pairs = [] if ray_runtime is None else [ray["before_steps_per_s"] / embedded["before_steps_per_s"]
                                                for ray, embedded in zip(elastic["ray, actor killed"], elastic["cached"])]
    headline["ray_elastic_trainer_over_embedded"] = harness.median(ray_pairs) if ray_pairs else None
    return harness.record(NAME, {
        "islands": 2, "devices_per_island": 4, "widths": list(WIDTHS), "batch": BATCH, "steps": steps,
        "lose_at": lose_at, "snapshot_every": SNAPSHOT_EVERY, "repetitions": repetitions,
        "recompiled_recompiles": all(r["compilations"] > 0 for r in elastic["recompiled"]),
        "cached_reuses_executables": all(r["compilations"] == 0 for r in elastic["cached"]),
        "ray": ray_runtime is not None,
        "ray_elastic_trainer_over_embedded_range": [min(ray_pairs), max(ray_pairs)] if ray_pairs else None,
        "jax_persistent_cache": jax.config.jax_compilation_cache_dir}, table, headline)


def plot(record: dict, ax) -> None:
    """The median parts of a recovery, recompiled and with cached executables."""
    cases = list(dict.fromkeys(r["case"] for r in record["rows"] if "detection_ms" in r))
    parts = ["detection_ms", "restore_ms", "relower_ms"]
    bottom = np.zeros(len(cases))
    for part in parts:
        heights = np.array([harness.median([r[part] for r in record["rows"] if r["case"] == case])
                            for case in cases])
        ax.bar(cases, heights, bottom=bottom, label=part.removesuffix("_ms"))
        bottom += heights
    ax.set(ylabel="ms from the loss to the first replayed step",
           title="Recovering from a lost island (2 islands x 4 CPU devices)")
    ax.legend()

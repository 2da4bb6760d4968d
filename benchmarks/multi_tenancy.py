"""Several clients on the same devices (the paper's Figures 8 and 9).

Every client runs one-computation programs on the same 4-device slice of one
island; the computation is a loop of elementwise work sized so that `jax.jit`
takes about 0.05, 0.5 or 2 ms for it on those devices (its measured duration
is reported). Aggregate throughput: P programs split evenly over 1, 2, 4 or
8 clients, each client a thread that starts its programs back to back and
then waits for them; programs per second relative to one client doing all
P alone. Beside it, interleaved, plain JAX does the same with 1, 2, 4 or 8
threads calling the `jax.jit` of the same computation: what a user sharing
the devices without us would get (`aggregate_4clients_over_jax_4threads`),
and how much more threads give plain JAX (`jax_4threads_over_1`): XLA:CPU
overlaps computations that threads launch at once on the same devices,
which an island, running its runs in one order, does not. So plain JAX's
threads also run with a lock around each launch, one computation at a time
(`jax_4threads_in_order_over_1`): JAX's own floor for clients that share
one in-order stream of work. Shares: with the `share` scheduling policy, 4
clients weighted 1:1:1:1 or 1:2:4:8 run programs of different lengths
(2, 0.5, 2 and 0.5 ms), each queueing, before the scheduler starts, a number
of programs proportional to its weight over its program's length (equal work
per unit of weight). A client's achieved share is its part of the device
time while every client still had work queued, in the device time the
island measured for each of its runs (`runtime/device_clock.py`); its error
is the relative difference from its weight's share, and the headline is the
worst client over the repetitions. Beside it: the share in programs
delivered, the share in the programs' isolated `jax.jit` times measured
before the runs (`error_isolated`), and the island's clock against plain
JAX running each program back to back right after (`clock_over_jax`).
Islands on their own: on two islands, client B's latency for a 0.05 or
0.5 ms program on island0 while client A's long computation (about
`LOAD_MS`, on one device) keeps island1 busy, over B's latency with island1
idle, in interleaved rounds (`other_island_latency_under_load`: the worst
size); plain JAX doing the same beside it.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

from . import harness

NAME = "multi-tenancy"
HEADLINE = ("aggregate_4clients_over_1", "aggregate_4clients_over_1_worst", "jax_4threads_over_1_worst",
            "aggregate_4clients_over_jax_4threads_worst", "jax_4threads_in_order_over_1_worst", "share_error_1111",
            "share_error_1248", "other_island_latency_under_load")
# Headlines that read lower is better (times, bytes, errors; `pw-bench report` marks them).
LOWER_IS_BETTER = ("share_error_1111", "share_error_1248", "other_island_latency_under_load")
DEVICES = 4
WIDTH = 1024                       # floats per device
DURATIONS_MS = (0.05, 0.5, 2.0)
CLIENTS = (1, 2, 4, 8)
WEIGHTS = ((1, 1, 1, 1), (1, 2, 4, 8))
SHARE_PROGRAM_MS = (2.0, 0.5, 2.0, 0.5)          # each client's program length in the share runs
LOAD_MS = 400.0                                  # client A's computation on the other island
LATENCY_MS = (0.05, 0.5)                         # client B's programs


def work(iterations: int):
    """Returns a computation of `iterations` elementwise steps."""
    return lambda x: jax.lax.fori_loop(0, iterations, lambda _, y: jnp.sin(y) * 0.5 + 0.25, x)


def sized_programs(x, sharding, durations=DURATIONS_MS, island=None,
                   devices=DEVICES) -> dict[float, tuple[object, float]]:
    """Returns, per target duration, a one-computation program on a slice of `devices` (on `island`, if
    given) and `jax.jit`'s median ms for it at `sharding`."""
    def jax_ms(iterations):
        fn = jax.jit(work(iterations), out_shardings=sharding)
        times = harness.measure({"jax": lambda: fn(x).block_until_ready()}, repetitions=20, warmup=3)
        return harness.median(times["jax"]) * 1e3

    base, reference = jax_ms(1), jax_ms(1025)
    per_iteration = max((reference - base) / 1024, 1e-6)
    s = pw.virtual_slice(devices, axes="x", **({} if island is None else {"island": island}))
    programs = {}
    for target in durations:
        iterations = max(1, round((target - base) / per_iteration))
        programs[target] = (pw.jit(work(iterations), slice=s, in_specs=P("x"), out_specs=P("x")),
                            jax_ms(iterations))
    return programs


def other_island_latency(x, sharding, rounds: int, samples: int = 20) -> list[dict]:
    """B's program latency on island0, with island1 idle and while A's long computation runs there; the same
    for plain JAX on the same devices (its work on island0's devices while A's `jax.jit` runs on island1's).

    A's computation takes one device: on these CPU machines a computation on several devices fills XLA's
    shared thread pool, which stops every other computation in the process, plain JAX's too (XLA's floor,
    not an island's)."""
    runtime = Runtime(embedded_device_map(2, DEVICES))
    a, b = Client(runtime), Client(runtime)
    load_device = jax.devices()[DEVICES]                      # island1's first device
    load_x = jax.device_put(np.zeros(WIDTH, np.float32), load_device)
    try:
        small = sized_programs(x, sharding, LATENCY_MS, island="island0")
        [(load, _)] = sized_programs(load_x, SingleDeviceSharding(load_device), (LOAD_MS,), island="island1",
                                     devices=1).values()
        jax_load = jax.jit(load.fn, out_shardings=SingleDeviceSharding(load_device))
        jax_small = {ms: jax.jit(small[ms][0].fn, out_shardings=sharding) for ms in LATENCY_MS}
        load.run(load_x, client=a).block_until_ready()
        jax_load(load_x).block_until_ready()
        times: dict[tuple, list[float]] = {(side, ms, loaded): [] for side in ("ours", "jax")
                                           for ms in LATENCY_MS for loaded in (0, 1)}

        def sample(side, ms, loaded):
            if side == "ours":
                call, busy_call, done = (lambda: small[ms][0].run(x, client=b).block_until_ready(),
                                         lambda: load.run(load_x, client=a), lambda h: runtime.run_done(h._run))
            else:
                call, busy_call, done = (lambda: jax_small[ms](x).block_until_ready(), lambda: jax_load(load_x),
                                         lambda h: h.is_ready())
            busy = busy_call() if loaded else None
            for _ in range(samples):
                under_load = busy is not None and not done(busy)     # started while A still computes
                began = time.perf_counter()
                call()
                elapsed = time.perf_counter() - began
                if busy is None or under_load:
                    times[side, ms, loaded].append(elapsed)
            if busy is not None:
                busy.block_until_ready()
        for ms in LATENCY_MS:
            small[ms][0].run(x, client=b).block_until_ready()
            jax_small[ms](x).block_until_ready()
        for _ in range(rounds):
            for side in ("ours", "jax"):
                for ms in LATENCY_MS:
                    for loaded in (0, 1):
                        sample(side, ms, loaded)
    finally:
        a.close()
        b.close()
        runtime.close()
    rows = []
    for ms in LATENCY_MS:
        row = {"latency_program_ms": ms, "load_ms": LOAD_MS}
        for side in ("ours", "jax"):
            idle, loaded = times[side, ms, 0], times[side, ms, 1]
            row.update({f"{side}_idle_ms": harness.median(idle) * 1e3,
                        f"{side}_under_load_ms": harness.median(loaded) * 1e3 if loaded else None,
                        f"{side}_samples_under_load": len(loaded),
                        f"{side}_under_load_over_idle":
                            harness.median(loaded) / harness.median(idle) if loaded else None,
                        f"{side}_spread_idle": harness.spread(idle),
                        f"{side}_spread_under_load": harness.spread(loaded) if loaded else None})
        rows.append(row)
    return rows


def threads_case(calls: list, total: int):
    """Returns a case: each of `calls` (one per client or thread), in its own thread, is called
    total/len(calls) times back to back, then its results are waited for."""
    def one_thread(call):
        results = [call() for _ in range(total // len(calls))]
        for r in results:
            r.block_until_ready()

    def case():
        threads = [threading.Thread(target=one_thread, args=(call,)) for call in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return case


def _in_order(fn, x, lock: threading.Lock):
    """Calls `fn(x)` holding `lock`: threads sharing the lock launch one computation at a time, in one order,
    as an island does (plain JAX's threads otherwise launch at once, and XLA:CPU overlaps their
    computations on the same devices)."""
    with lock:
        return fn(x)


def jax_back_to_back_ms(program, x, sharding, calls: int = 20, repetitions: int = 5) -> float:
    """Returns plain JAX's median ms per call of `program`'s computation, `calls` calls back to back (the
    time the devices take per call when they are kept busy, as the share runs keep them)."""
    fn = jax.jit(program.fn, out_shardings=sharding)

    def burst():
        for _ in range(calls):
            y = fn(x)
        y.block_until_ready()
    return harness.median(harness.measure({"jax": burst}, repetitions, warmup=1)["jax"]) / calls * 1e3


def with_untimed_filled(seconds: list[float | None], neighbours: int = 10) -> list[float]:
    """Returns a client's runs' measured seconds with each untimed run (None) given the median of the
    `neighbours` timed runs nearest it in the client's sequence (robust to a run that absorbed one-time work,
    and following the machine's speed as it drifts)."""
    timed = [i for i, s in enumerate(seconds) if s is not None]
    return [s if s is not None else
            harness.median([seconds[j] for j in sorted(timed, key=lambda j: abs(j - i))[:neighbours]])
            for i, s in enumerate(seconds)]


def check_timed(measured: list[list[float | None]], weights: tuple[int, ...]) -> None:
    """Raises RuntimeError if the island timed none of a client's runs (`measured`: each client's runs' device
    seconds, None where untimed), as a loaded machine may leave them: that client's device time is unknown."""
    for n, seconds in enumerate(measured):
        if all(s is None for s in seconds):
            raise RuntimeError(f"share run {':'.join(map(str, weights))}: the island timed none of client {n}'s "
                               f"{len(seconds)} runs (see runtime/device_clock.py), so its device time is unknown")


def shares(programs: dict[float, tuple[object, float]], x, sharding, weights: tuple[int, ...],
           base: int) -> list[dict]:
    """Queues each client's programs under the share policy; returns each client's device-time share.

    A client's device time is the sum of what the island measured for each of its runs delivered while every
    client was backlogged (a run whose time the island could not tell counts its neighbours' median). The
    island's clock is checked against plain JAX beside it: each program's median measured time per device
    over plain JAX's back-to-back time for it (`clock_over_jax`). The share in the programs' isolated
    `jax.jit` times, as measured before the runs, is reported too (`error_isolated`)."""
    runtime = Runtime(embedded_device_map(1, DEVICES), policy="share")
    clients = [Client(runtime, weight=w) for w in weights]
    queued = [round(base * w * max(SHARE_PROGRAM_MS) / ms) for w, ms in zip(weights, SHARE_PROGRAM_MS)]
    try:
        runtime.scheduler.hold()
        handles: list[list] = [[] for _ in clients]
        for i in range(max(queued)):
            for n, (c, q, ms) in enumerate(zip(clients, queued, SHARE_PROGRAM_MS)):
                if i < q:
                    handles[n].append(programs[ms][0].run(x, client=c))
        runtime.scheduler.release()
        for h in itertools.chain.from_iterable(handles):
            h.block_until_ready()
        runtime.usage()                           # retires every run: each has its measured device time
        order = [client_id for _, client_id in runtime.scheduler.delivered]
        ids = [c.id for c in clients]
        # Every client has work queued up to the delivery that empties the first queue.
        backlogged = next(i for i in range(len(order))
                          if order[:i + 1].count(order[i]) == queued[ids.index(order[i])]) + 1
        counts = [order[:backlogged].count(i) for i in ids]
        measured = [[h._run.device_seconds for h in client_handles] for client_handles in handles]
    finally:
        for c in clients:
            c.close()
        runtime.close()
    check_timed(measured, weights)
    known = {ms: [s for n, m in enumerate(SHARE_PROGRAM_MS) if m == ms for s in measured[n] if s is not None]
             for ms in set(SHARE_PROGRAM_MS)}
    typical = {ms: harness.median(seconds) for ms, seconds in known.items()}
    jax_ms = {ms: jax_back_to_back_ms(programs[ms][0], x, sharding) for ms in sorted(typical)}
    device_s = [sum(with_untimed_filled(seconds)[:count]) for seconds, count in zip(measured, counts)]
    isolated_ms = [count * programs[ms][1] for count, ms in zip(counts, SHARE_PROGRAM_MS)]
    rows = []
    for n, (w, ms, count) in enumerate(zip(weights, SHARE_PROGRAM_MS, counts)):
        expected, achieved = w / sum(weights), device_s[n] / sum(device_s)
        isolated = isolated_ms[n] / sum(isolated_ms)
        rows.append({"weights": ":".join(map(str, weights)), "client": n, "weight": w, "program_ms": ms,
                     "queued": queued[n], "expected_share": expected, "achieved_share": achieved,
                     "error": abs(achieved - expected) / expected, "delivered_share": count / backlogged,
                     "runs_timed": sum(s is not None for s in measured[n]) / len(measured[n]),
                     "measured_ms_per_device": typical[ms] / DEVICES * 1e3, "jax_back_to_back_ms": jax_ms[ms],
                     "clock_over_jax": typical[ms] / DEVICES * 1e3 / jax_ms[ms],
                     "error_isolated": abs(isolated - expected) / expected})
    return rows


def run(quick: bool) -> dict:
    """Measures aggregate throughput for each client count and size, then the weighted shares."""
    total, base, repetitions = (16, 24, 3) if quick else (48, 192, 11)
    share_repetitions = 1 if quick else 3
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:DEVICES]), ("x",)), P("x"))
    x = jax.device_put(np.zeros(DEVICES * WIDTH, np.float32), sharding)
    programs = sized_programs(x, sharding)
    runtime = Runtime(embedded_device_map(1, DEVICES))
    clients = [Client(runtime) for _ in range(max(CLIENTS))]
    cases = {}
    for d in DURATIONS_MS:
        program = programs[d][0]
        jitted = jax.jit(program.fn, out_shardings=sharding)
        for n in CLIENTS:
            cases["ours", d, n] = threads_case([functools.partial(program.run, x, client=c) for c in clients[:n]],
                                               total)
            cases["jax", d, n] = threads_case([functools.partial(jitted, x)] * n, total)
            cases["jax in order", d, n] = threads_case([functools.partial(_in_order, jitted, x, threading.Lock())] * n,
                                                       total)
    try:
        times = harness.measure(cases, repetitions)
    finally:
        for c in clients:
            c.close()
        runtime.close()
    rows = []
    for d in DURATIONS_MS:
        for n in CLIENTS:
            ours, jax_time = harness.median(times["ours", d, n]), harness.median(times["jax", d, n])
            in_order, jax_one = harness.median(times["jax in order", d, n]), harness.median(times["jax", d, 1])
            rows.append({"program_ms": d, "jax_ms": programs[d][1], "clients": n, "programs_per_s": total / ours,
                         "over_one_client": harness.median(times["ours", d, 1]) / ours,
                         "spread": harness.spread(times["ours", d, n]), "jax_threads_programs_per_s": total / jax_time,
                         "jax_over_one_thread": jax_one / jax_time,
                         "jax_spread": harness.spread(times["jax", d, n]), "over_jax_threads": jax_time / ours,
                         "jax_in_order_over_one_thread": jax_one / in_order,
                         "over_jax_in_order_threads": in_order / ours})
    share_rows = [dict(row, repetition=r) for r in range(share_repetitions) for w in WEIGHTS
                  for row in shares(programs, x, sharding, w, base)]
    latency_rows = other_island_latency(x, sharding, 2 if quick else 5)
    four = {r["program_ms"]: r for r in rows if r["clients"] == 4}
    headline = {"aggregate_4clients_over_1": four[0.5]["over_one_client"],
                "aggregate_4clients_over_1_worst": harness.worst(four[d]["over_one_client"] for d in DURATIONS_MS),
                "jax_4threads_over_1_worst": harness.worst(four[d]["jax_over_one_thread"] for d in DURATIONS_MS),
                "aggregate_4clients_over_jax_4threads_worst": harness.worst(four[d]["over_jax_threads"]
                                                                            for d in DURATIONS_MS),
                "jax_4threads_in_order_over_1_worst": harness.worst(four[d]["jax_in_order_over_one_thread"]
                                                                    for d in DURATIONS_MS),
                "share_error_1111": max(r["error"] for r in share_rows if r["weights"] == "1:1:1:1"),
                "share_error_1248": max(r["error"] for r in share_rows if r["weights"] == "1:2:4:8"),
                "other_island_latency_under_load": max(r["ours_under_load_over_idle"] for r in latency_rows)}
    return harness.record(NAME, {"devices": DEVICES, "programs_per_case": total,
                                 "queued_per_unit_weight_of_2ms": base, "repetitions": repetitions,
                                 "share_repetitions": share_repetitions,
                                 "headline_program_ms": 0.5, "share_program_ms": SHARE_PROGRAM_MS},
                          rows + share_rows + latency_rows, headline)


def plot(record: dict, ax) -> None:
    """Figure 8: aggregate throughput over one client's, against the number of clients."""
    for d in DURATIONS_MS:
        points = [(r["clients"], r["over_one_client"]) for r in record["rows"]
                  if r.get("program_ms") == d and "clients" in r]
        ax.plot(*zip(*points), marker="o", label=f"{d:g} ms programs")
    errors = ", ".join(f"{w}: {max(r['error'] for r in record['rows'] if r.get('weights') == w):.0%}"
                       for w in ("1:1:1:1", "1:2:4:8"))
    ax.axhline(1.0, color="grey", linestyle=":")
    ax.set(xscale="log", xlabel="clients", ylabel="aggregate throughput / one client's",
           title=f"Clients sharing {DEVICES} devices\n(largest device-time share error {errors})")
    ax.set_xticks(CLIENTS, [str(n) for n in CLIENTS])
    ax.legend(fontsize="small")

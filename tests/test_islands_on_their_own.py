"""Islands that run on their own: an executor per island, admission that never holds others back, shares on
device time, cancellation, deadlines and wedged islands, failed runs that keep nothing.

Every wait here has a timeout; every runtime made here is closed. Long computations are sized by a short
calibration run first, so that the checks are about order (one island's run finished while another's was
still computing), never about how fast this machine is.
"""

import gc
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fetching import until
from test_fast_lane import run_failing_on_the_island
from test_admission_and_lifetimes import X, cross_island, tanh2

from pathways_mlir.dialect.memory_plan import with_memory_plan
from pathways_mlir.runtime import island_executor
from pathways_mlir.runtime import runtime as runtime_module
from pathways_mlir.runtime.admission import OutOfDeviceMemory
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.island_work import FAILED_HISTORY, IslandWedged, RunFailed
from pathways_mlir.runtime.runtime import RunCancelled, Runtime

LONG_S = 3.0            # how long the long computations are sized to run
V = np.ones(1024, np.float32)


def spin(x, n):
    return jax.lax.fori_loop(0, n, lambda _, y: jnp.sin(y) * 0.5 + 0.25, x)


def spin_plan(plan_builder, topology, island="island1"):
    """A one-launch plan whose computation runs `n` (an argument) loop trips on one device of `island`."""
    p = plan_builder(topology, program="spin")
    v = p.slice("v", (1,), ("x",), island, (0, 1))
    out = p.launch(spin, [p.input((1024,), v), p.input((), v, dtype="i32")], v, [()])
    return p.build([out])


def small_plan(plan_builder, topology, island="island0", shape=(8, 16)):
    p = plan_builder(topology, program="small")
    v = p.slice("v", (1,), ("x",), island, (0, 1))
    return p.build([p.launch(tanh2, [p.input(shape, v)], v, [(), ()])])


def trips_for(client, plan, seconds):
    """Returns the loop trips that make `spin` run about `seconds` here, or longer (a calibration, not a
    check): timed by the fastest of three runs, as one slowed by a loaded machine sized the long run too
    short (a wedge timeout of 0.5 s did not see it)."""
    trips = 20_000
    client.run(plan, [V, np.int32(1)])[0].result(timeout=60).block_until_ready()      # compiled first
    fastest = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        client.run(plan, [V, np.int32(trips)])[0].result(timeout=60).block_until_ready()
        fastest = min(fastest, time.perf_counter() - began)
    return int(trips * seconds / max(fastest, 1e-4))


def test_another_islands_runs_complete_while_one_island_computes(device_map, plan_builder):
    rt = Runtime(device_map)
    try:
        long_plan, small = spin_plan(plan_builder, device_map.topology), small_plan(plan_builder, device_map.topology)
        with Client(rt) as a, Client(rt) as b:
            trips = trips_for(a, long_plan, LONG_S)
            b.run(small, [X])[0].result(timeout=60)                       # loaded and compiled before
            [long_result] = a.run(long_plan, [V, np.int32(trips)])
            long_run = long_result._run
            for _ in range(20):
                np.testing.assert_array_equal(np.asarray(b.run(small, [X])[0].result(timeout=60)),
                                              np.asarray(jax.jit(tanh2)(X)))
            assert not rt.run_done(long_run)          # all 20 came back while island1 still computed
            busy = rt.status()["islands"]["island1"]["busy"]
            assert busy["run"] == long_run.id and busy["program"] == "spin" and busy["seconds"] > 0
            assert f"busy with run {long_run.id} (spin): its device work, for" in str(rt.status())
            long_result.result(timeout=120).block_until_ready()
    finally:
        rt.close()


def heavy(x):
    for i in range(150):                      # many distinct matrix products: a compile of a few seconds
        x = jnp.sin(x @ x.T * (1.0 + i * 1e-3))
    return x


def test_runs_complete_while_another_plan_compiles(device_map, plan_builder):
    rt = Runtime(device_map)
    try:
        p = plan_builder(device_map.topology, program="heavy")
        v = p.slice("v", (1,), ("x",), "island1", (0, 1))
        heavy_plan = p.build([p.launch(heavy, [p.input((16, 16), v)], v, [(), ()])])
        on0, on1 = small_plan(plan_builder, device_map.topology), small_plan(plan_builder, device_map.topology,
                                                                              "island1")
        with Client(rt) as client:
            for plan in (on0, on1):
                client.run(plan, [X])[0].result(timeout=60)
            compiling = threading.Thread(target=rt.load, args=(heavy_plan,))
            compiling.start()
            done = 0
            while done < 10:
                for plan in (on0, on1):                           # both islands, the compiling plan's too
                    client.run(plan, [X])[0].result(timeout=60)
                done += 1
            assert compiling.is_alive()               # ten runs on each island came back during the compile
            compiling.join(300)
            assert not compiling.is_alive()
            out = client.run(heavy_plan, [np.eye(16, dtype=np.float32)])[0].result(timeout=60)
            np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(heavy)(np.eye(16, dtype=np.float32))),
                                       rtol=1e-5)
    finally:
        rt.close()


def step_plan(plan_builder, topology):
    """`state = step(state)`: one launch whose result has the shape of its argument."""
    p = plan_builder(topology, program="step")
    v = p.slice("v", (1,), ("x",), "island0", (0, 1))
    return p.build([p.launch(lambda s: s * 0.5 + 1.0, [p.input((8, 16), v)], v, [(), ()], name="step")])


def test_a_state_loop_at_a_tight_capacity_runs_on(device_map, plan_builder):
    state_bytes = 8 * 16 * 4
    rt = Runtime(device_map, device_memory_bytes=state_bytes + 2 * state_bytes)   # one state + the step's peak
    try:
        plan = step_plan(plan_builder, device_map.topology)
        with Client(rt) as client:
            state = client.run(plan, [X])[0]
            want = X * 0.5 + 1.0
            for _ in range(200):
                state = client.run(plan, [state])[0]
                want = want * 0.5 + 1.0
            np.testing.assert_allclose(np.asarray(state.result(timeout=60)), want, rtol=1e-6)
    finally:
        rt.close()


def test_a_run_waiting_for_memory_does_not_hold_back_another_clients(device_map, plan_builder):
    rt = Runtime(device_map, device_memory_bytes=2 * 8 * 16 * 4 + 511)    # the parked run, or one more run
    try:
        parked_plan, _ = cross_island(plan_builder, device_map.topology)
        wide = small_plan(plan_builder, device_map.topology, "island1")
        narrow = small_plan(plan_builder, device_map.topology, "island1", shape=(2, 2))
        rt.islands["island0"].close()                  # on purpose: island0 never sends, the run parks
        with Client(rt) as a, Client(rt) as b:
            [parked] = a.run(parked_plan, [X])
            waiting = a.start(wide, [X])              # waits for the parked run's memory
            [queued] = rt.status()["scheduler"]["queued"]
            assert queued["run"] == waiting.id and queued["waits_for"].startswith("memory: 1024 bytes on device 0")
            for _ in range(3):                        # another client's run that fits goes past it
                np.testing.assert_allclose(np.asarray(b.run(narrow, [np.ones((2, 2), np.float32)])[0]
                                                      .result(timeout=60)), np.tanh(np.ones((2, 2))) * 2, rtol=1e-6)
            assert [q["run"] for q in rt.status()["scheduler"]["queued"]] == [waiting.id]
            a.cancel(parked)                          # its memory comes back: the waiting run goes
            np.testing.assert_array_equal(np.asarray(a.handles(waiting)[0].result(timeout=60)),
                                          np.asarray(jax.jit(tanh2)(X)))
    finally:
        rt.close()


def test_a_second_result_that_cannot_fit_beside_the_first_fails_at_once(device_map, plan_builder):
    one_result = 8 * 16 * 4
    rt = Runtime(device_map, device_memory_bytes=2 * one_result + one_result // 2)   # a run, not a run + a result
    try:
        plan = small_plan(plan_builder, device_map.topology)
        elsewhere = small_plan(plan_builder, device_map.topology, "island1")
        with Client(rt) as client, Client(rt) as other:
            a = client.run(plan, [X])[0]
            done = threading.Event()
            errors = []

            def second():
                try:
                    client.run(plan, [X])
                except OutOfDeviceMemory as error:
                    errors.append(error)
                done.set()
            threading.Thread(target=second).start()
            assert done.wait(10.0) and errors, "the second call neither failed nor returned in time"
            assert f"client {client.id} holds 1 object(s), {one_result} bytes" in str(errors[0])
            np.testing.assert_array_equal(np.asarray(other.run(elsewhere, [X])[0].result(timeout=60)),
                                          np.asarray(jax.jit(tanh2)(X)))     # meanwhile another client runs
            a.delete()
    finally:
        rt.close()


def test_a_run_queued_behind_an_islands_work_reads_a_numpy_argument_as_it_was_at_the_call(device_map, plan_builder,
                                                                                         monkeypatch):
    """Client a's second run waits, on its caller's thread, for its first's computation (one run in flight), so
    client b's run goes to the island's executor, behind it, and is placed later: it computes on b's buffer as
    it was at the call, not on what b wrote into it after."""
    monkeypatch.setattr(island_executor, "IN_FLIGHT", 1)
    rt = Runtime(device_map)
    try:
        long_plan, small = spin_plan(plan_builder, device_map.topology), small_plan(plan_builder, device_map.topology,
                                                                                   "island1")
        island = rt.islands["island1"]
        with Client(rt) as a, Client(rt) as b:
            trips = trips_for(a, long_plan, LONG_S)
            b.run(small, [X])[0].result(timeout=60)                       # loaded and compiled before
            [first] = a.run(long_plan, [V, np.int32(trips)])
            second = threading.Thread(target=a.run, args=(long_plan, [V, np.int32(1)]))
            second.start()
            until(lambda: island._pending == 1, "client a's second run waiting on its thread", 30)
            buffer = X.copy()
            [out] = b.run(small, [buffer])
            buffer[...] = np.nan
            assert not rt.run_done(first._run)       # b's run was queued behind a's, not placed at the call
            np.testing.assert_array_equal(np.asarray(out.result(timeout=60)), np.asarray(jax.jit(tanh2)(X)))
            second.join(60)
            assert not second.is_alive()
    finally:
        rt.close()


def add(x, y):
    return x + y


def test_a_run_parked_at_a_recv_reads_a_numpy_argument_as_it_was_at_the_call(device_map, plan_builder):
    """Island1's launch reads a NumPy argument and what island0 computes for about LONG_S and sends (emulated DCN:
    the send waits for the value): the run parks at its recv, the call returns, and the caller writes into the
    argument, which the launch must not see (its launch places it, so it stayed in its slot)."""
    rt = Runtime(device_map, emulate_dcn=True)
    try:
        p = plan_builder(device_map.topology, program="parked")
        v0, v1 = p.slice("v0", (1,), ("x",), "island0", (0, 1)), p.slice("v1", (1,), ("x",), "island1", (0, 1))
        spun = p.launch(spin, [p.input((1024,), v0), p.input((), v0, dtype="i32")], v0, [()])
        plan = p.build([p.launch(add, [p.dcn(spun, v1, [()]), p.input((1024,), v1)], v1, [()])])
        with Client(rt) as client:
            trips = trips_for(client, spin_plan(plan_builder, device_map.topology, "island0"), LONG_S)
            client.run(plan, [V, np.int32(1), V])[0].result(timeout=60)          # loaded and compiled before
            until(lambda: all(i._pending == 0 for i in rt.islands.values()), "the islands idle", 30)   # inline next
            y = V.copy()
            [out] = client.run(plan, [V, np.int32(trips), y])
            y[...] = np.nan
            assert not rt.run_done(out._run)       # still parked at its recv when the argument was written
            np.testing.assert_allclose(np.asarray(out.result(timeout=120)),
                                       np.asarray(jax.jit(spin)(V, trips)) + V, rtol=1e-6)
    finally:
        rt.close()


def test_a_thousand_failed_runs_keep_no_arrays(device_map, plan_builder):
    rt = Runtime(device_map)
    try:
        plan = small_plan(plan_builder, device_map.topology, shape=(256, 1024))      # 1 MiB arguments
        with Client(rt) as client:
            client.run(plan, [np.ones((256, 1024), np.float32)])[0].result(timeout=60)
            gc.collect()
            before = len(jax.live_arrays())
            for _ in range(1000):                     # each taken by the fast lane, failing on the island
                h = run_failing_on_the_island(client, plan, rt.islands["island0"], jnp.ones((256, 1024), jnp.float32))
                with pytest.raises(RunFailed):
                    h.result(timeout=60)
                del h
            gc.collect()
            assert len(jax.live_arrays()) <= before
            assert len(rt.islands["island0"]._failed) <= FAILED_HISTORY
            assert sum(rt.usage().values()) == 0 and rt.object_count() == 0
    finally:
        rt.close()


def test_a_cancelled_or_late_run_frees_its_memory(device_map, plan_builder):
    rt = Runtime(device_map)
    try:
        parked_plan, _ = cross_island(plan_builder, device_map.topology)
        rt.islands["island0"].close()                  # runs of this plan park on island1 for ever
        with Client(rt) as client:
            [cancelled] = client.run(parked_plan, [X])
            assert sum(rt.usage().values()) > 0
            assert client.cancel(cancelled)
            with pytest.raises(RunCancelled, match="was cancelled by client"):
                cancelled.result(timeout=60)
            [late] = client.run(parked_plan, [X], timeout=0.3)
            with pytest.raises(RunCancelled, match="did not finish within its deadline"):
                late.result(timeout=60)
            deadline = time.monotonic() + 30
            while sum(rt.usage().values()) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert sum(rt.usage().values()) == 0
            assert not client.cancel(late)             # already over
    finally:
        rt.close()


def test_a_wedged_island_fails_its_runs_and_the_others_go_on(device_map, plan_builder):
    # The watchdog (it reads `wedge_timeout` at each look) watches only while the stuck run is the one thing
    # under way: on a loaded machine a first run, compiling, or a small one kept an island busy for more than
    # 0.5 s too, and that island was wedged instead.
    rt = Runtime(device_map)
    try:
        long_plan, small = spin_plan(plan_builder, device_map.topology), small_plan(plan_builder, device_map.topology)
        small1 = small_plan(plan_builder, device_map.topology, "island1")
        with Client(rt) as client:
            trips = trips_for(client, long_plan, LONG_S)
            for plan in (small1, small):                      # compiled first
                client.run(plan, [X])[0].result(timeout=60)
            rt.wedge_timeout = 0.5
            [stuck] = client.run(long_plan, [V, np.int32(trips)])
            until(lambda: rt.islands["island1"].wedged is not None, "island1 wedged", 60)
            rt.wedge_timeout = None
            with pytest.raises(IslandWedged, match=rf"island island1 is wedged since .*: run {stuck._run.id} of spin "
                                                   r"has been busy with .* for more than 0.5 s"):
                stuck.result(timeout=60)
            assert "wedged since" in rt.status()["islands"]["island1"]["wedged"]
            with pytest.raises(IslandWedged, match="was not started"):
                client.run(small1, [X])[0].result(timeout=60)
            np.testing.assert_array_equal(np.asarray(client.run(small, [X])[0].result(timeout=60)),
                                          np.asarray(jax.jit(tanh2)(X)))     # island0 goes on
            deadline = time.monotonic() + 120
            while rt.islands["island1"].wedged is not None and time.monotonic() < deadline:
                time.sleep(0.05)                       # the computation ends: the island serves again
            np.testing.assert_array_equal(np.asarray(client.run(small1, [X])[0].result(timeout=60)),
                                          np.asarray(jax.jit(tanh2)(X)))
    finally:
        rt.close()


def test_closing_is_bounded_while_an_island_computes(device_map, plan_builder):
    rt = Runtime(device_map)
    long_plan = spin_plan(plan_builder, device_map.topology)
    client = Client(rt)
    trips = trips_for(client, long_plan, LONG_S)
    [result] = client.run(long_plan, [V, np.int32(trips)])
    closer = threading.Thread(target=rt.close)
    closer.start()
    closer.join(5)
    assert not closer.is_alive()
    with pytest.raises(RunFailed):
        result.result(timeout=10)


def reference_share_order(costs: dict[int, float], weights: dict[int, float], queued: dict[int, int]) -> list[int]:
    """Start-time fair queueing, written plainly: the client of least virtual time goes next (ties: lower id),
    and its virtual time grows by its run's device time over its weight."""
    virtual = {c: 0.0 for c in queued}
    left = dict(queued)
    order = []
    while any(left.values()):
        client = min((c for c in left if left[c]), key=lambda c: (virtual[c], c))
        order.append(client)
        virtual[client] += costs[client] / weights[client]
        left[client] -= 1
    return order


def test_share_delivers_in_device_time_order_with_injected_durations(device_map, plan_builder):
    rt = Runtime(device_map, policy="share", window=10_000)     # every run admitted at release, in one pass
    try:
        plans = [small_plan(plan_builder, device_map.topology) for _ in range(4)]
        clients = [Client(rt, weight=w) for w in (1, 2, 4, 8)]
        seconds = (2.0, 0.5, 2.0, 0.5)               # each client's program length, injected as measured
        for plan, s in zip(plans, seconds):
            rt.scheduler.record_device_seconds(rt.load(plan).key, s)
        queued = {c.id: int(8 * c.weight / s) for c, s in zip(clients, seconds)}
        rt.scheduler.hold()
        runs = []
        for i in range(max(queued.values())):
            for client, plan in zip(clients, plans):
                if i < queued[client.id]:
                    runs.append(client.start(plan, [X]))
        rt.scheduler.release()
        for run in runs:
            rt.wait(run, timeout=120)
        order = [c for _, c in list(rt.scheduler.delivered)[-len(runs):]]
        assert order == reference_share_order({c.id: s for c, s in zip(clients, seconds)},
                                              {c.id: c.weight for c in clients}, queued)
        for c in clients:
            c.close()
    finally:
        rt.close()


def test_measured_device_time_replaces_the_estimate(device_map, plan_builder):
    rt = Runtime(device_map)
    try:
        plan = spin_plan(plan_builder, device_map.topology)
        with Client(rt) as client:
            estimate = rt.load(plan).cost
            for _ in range(3):
                client.wait(client.start(plan, [V, np.int32(20_000)]), timeout=60)
            rt.usage()                                    # retires the runs: their device time is recorded
            run = client.start(plan, [V, np.int32(1)])
            client.wait(run, timeout=60)
            measured = rt.scheduler.device_seconds(run)
            assert measured > 0 and measured != estimate
    finally:
        rt.close()


def test_the_tracker_looks_seldom_far_from_a_runs_expected_end(device_map, plan_builder):
    # An island keeps the time its plans' runs took on its devices; while a run computes, the completion
    # tracker pauses half the time left until the run's expected end (at most AWAIT_PAUSE), and near that end
    # (or for a plan not timed yet) a twentieth of the time waited, as before.
    rt = Runtime(device_map)
    try:
        plan = spin_plan(plan_builder, device_map.topology)
        island = rt.islands["island1"]
        with Client(rt) as client:
            key = rt.load(plan).key

            def timed():
                client.wait(client.start(plan, [V, np.int32(20_000)]), timeout=60)
                rt.usage()                                # retires the run: its time is recorded
                return island._durations.measured(key) is not None
            until(timed, "a run of the plan timed on its island", 60)
        expected = island._durations.measured(key)
        assert expected > 0
        lowest, highest = island_executor._AWAIT_PAUSE_MIN, island_executor.AWAIT_PAUSE
        assert island._pause(key, 100.0, 100.0) == pytest.approx(min(max(expected / 2, lowest), highest))
        assert island._pause(key, 100.0, 100.0 + expected) == pytest.approx(min(max(expected / 20, lowest), highest))
        assert island._pause(key, 100.0, 100.0 + 2 * expected) == pytest.approx(min(max(expected / 10, lowest),
                                                                                     highest))
        assert island._pause(-1, 100.0, 100.01) == pytest.approx(0.01 / 20)      # a plan not timed here
        assert island._pause(-1, 100.0, 200.0) == highest
    finally:
        rt.close()


def test_an_idle_islands_tracker_sleeps_until_a_run_wakes_it(device_map, plan_builder, monkeypatch):
    # With nothing to retire for IDLE_SLEEP, an island's completion tracker sleeps until woken (an idle island
    # costs no wake-ups); the next run's dispatch wakes it, whether its computation is still under way or XLA
    # ran it inline, and the tracker alone retires that run (nothing here looks for completions: a missed
    # wake-up leaves the run unretired); close() stops it while it sleeps. The watchdog, which retires runs that
    # are over, is kept from looking: it would retire the run itself (and take its time out of `_seconds`,
    # where this test looks for it, before the test sees it there on a busy machine).
    monkeypatch.setattr(runtime_module, "_WATCH_PERIOD", 3600.0)
    rt = Runtime(device_map)
    island = rt.islands["island1"]
    try:
        plan = spin_plan(plan_builder, device_map.topology)
        with Client(rt) as client:
            rt.load(plan)
            for n in (2_000, 1):
                until(lambda: island._tracker_asleep, "the idle island's tracker asleep", 30)
                run = client.start(plan, [V, np.int32(n)])
                until(lambda: run.id in island._seconds, f"run {run.id} retired by the tracker", 30)
            until(lambda: island._tracker_asleep, "the tracker asleep again", 30)
    finally:
        rt.close()
    assert not island._tracker.is_alive()


def test_a_program_whose_branch_cannot_fit_beside_it_fails_at_once(device_map, plan_builder):
    # A cond program reserves its largest branch's peak with its own: one that does not fit fails at its call,
    # instead of its branch run waiting (or failing) once the predicate is read.
    topo = device_map.topology
    b = plan_builder(topo, "plus")
    w = b.slice("w", (2,), ("x",), "island0", (0, 2))
    then_plan = b.build([b.launch(lambda x: x + 100.0, [b.input((8, 16), w, [("x",), ()])], w, [("x",), ()],
                                  name="plus")])
    p = plan_builder(topo)
    v = p.slice("v", (2,), ("x",), "island0", (0, 2))
    x = p.input((8, 16), v, [("x",), ()])
    pred = p.launch(lambda x: jnp.sum(x) > 0, [x], v, [], name="positive", out_dtype="i1", out_shape=())
    [chosen] = p.cond(pred, [x], then_plan, then_plan, [(8, 16)])
    plan = p.build([chosen])
    parent_peak = max(n for (_, _, n) in with_memory_plan(plan).peak("island0"))
    rt = Runtime(device_map, device_memory_bytes=parent_peak + 511)      # the branch needs 512 beside it
    try:
        with Client(rt) as client:
            with pytest.raises(OutOfDeviceMemory, match=f"program main needs {parent_peak + 512} bytes on device 0 "
                                                        f"of island0, which has only {parent_peak + 511}"):
                client.run(plan, [np.abs(X)])
            assert rt.status()["scheduler"]["queued"] == []
    finally:
        rt.close()


def test_a_placed_function_takes_a_deadline_and_pw_cancel(device_map):
    import pathways_mlir as pw
    from jax.sharding import PartitionSpec as P

    rt = Runtime(device_map)
    try:
        placed = pw.jit(spin, slice=pw.virtual_slice(1, axes="x", island="island1"), in_specs=(P(), P()),
                        out_specs=P())
        with Client(rt) as client:
            placed.run(V, np.int32(1), client=client).result(timeout=60)
            began = time.perf_counter()
            placed.run(V, np.int32(20_000), client=client).result(timeout=60).block_until_ready()
            trips = int(20_000 * LONG_S / max(time.perf_counter() - began, 1e-4))
            late = placed.run(V, np.int32(trips), client=client, timeout=0.3)
            deadline = time.monotonic() + 60
            while late._run.error is None and time.monotonic() < deadline:
                time.sleep(0.02)
            with pytest.raises(RunCancelled, match="did not finish within its deadline"):
                late.result(timeout=60)
            cancelled = placed.run(V, np.int32(trips), client=client)
            assert pw.cancel(cancelled)
            with pytest.raises(RunCancelled, match="was cancelled by client"):
                cancelled.result(timeout=60)
    finally:
        rt.close()


def _interrupted(call, after: float = 0.1, timeout: float = 30) -> str:
    """Runs `call()` on this (the main) thread while it is interrupted `after` seconds in, as Ctrl-C does; says
    where the KeyboardInterrupt went: "raised by the call", "after the call" (it ended first), or "lost". Python
    raises it only where SIGINT has its default handler, which a process started in the background lacks (the
    shell ignores SIGINT there): the handler is set for the call. An interrupt that CPython itself drops, raised
    where exceptions cannot propagate (JAX's gc callback, a `__del__`: "Exception ignored in ..."), is pressed
    again, as a user would; one lost in any other way stays lost."""
    import _thread
    import signal

    def press_again_if_dropped(unraisable):
        if isinstance(unraisable.exc_value, KeyboardInterrupt):    # pressed from a thread: raised here, it is dropped
            threading.Timer(0.01, _thread.interrupt_main).start()
        else:
            hook(unraisable)

    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    hook, sys.unraisablehook = sys.unraisablehook, press_again_if_dropped
    timer = threading.Timer(after, _thread.interrupt_main)
    try:
        timer.start()
        try:
            call()
        except KeyboardInterrupt:
            return "raised by the call"
        try:
            timer.join(timeout)
            time.sleep(1.0)                      # a pending interrupt is raised here
        except KeyboardInterrupt:
            return "after the call"
        return "lost"
    finally:
        sys.unraisablehook = hook
        signal.signal(signal.SIGINT, handler)


@pytest.mark.parametrize("path", ["fast lane", "general path across islands", "general path, other way"])
def test_ctrl_c_during_a_run_the_caller_executes_raises_keyboard_interrupt(device_map, plan_builder, path):
    """A run the caller's thread executes (an idle island's work, a fast lane's run) failed with the caller's
    KeyboardInterrupt as its error: Ctrl-C did not stop a training loop, whose next call raised RunFailed,
    or nothing at all. The run fails, the interrupt reaches the caller, and every island goes on."""
    rt = Runtime(device_map)
    try:
        with Client(rt) as client:
            first, then = ("island1", "island0") if path.endswith("other way") else ("island0", "island1")
            trips = trips_for(client, spin_plan(plan_builder, rt.resources.topology, island=first), LONG_S)
            # The call waits for the result: the interrupt comes while the caller executes the run or waits for it.
            p = plan_builder(rt.resources.topology, program="spin_on_two")
            v0 = p.slice("v0", (2,), ("x",), first, (0, 2))
            spun = p.launch(spin, [p.input((1024,), v0, [("x",)]), p.input((), v0, dtype="i32")], v0, [("x",)])
            if path == "fast lane":
                spinning = p.build([spun])
                args = [jnp.asarray(V), jnp.asarray(np.int32(trips))]      # arrays: the lane takes them
                assert rt.lane(spinning) is not None
            else:
                v1 = p.slice("v1", (1,), ("x",), then, (0, 1))
                spinning = p.build([p.launch(jnp.tanh, [p.dcn(spun, v1, [()])], v1, [()])])
                args = [V, np.int32(trips)]
            rt.load(spinning)                    # compiled before: the interrupt comes while it computes
            where = _interrupted(lambda: client.run(spinning, args)[0].result(timeout=60).block_until_ready())
            assert where == "raised by the call"
            assert not any(island._inline for island in rt.islands.values())     # every caller's turn ended
            for island in ("island0", "island1"):
                small = small_plan(plan_builder, rt.resources.topology, island=island)
                [h] = client.run(small, [X])
                np.testing.assert_allclose(np.asarray(h.result(timeout=60)), np.asarray(tanh2(X)), rtol=1e-6)
    finally:
        rt.close()


def test_a_run_cancelled_inside_its_launch_keeps_its_memory_until_the_launch_returns(device_map):
    """A cancel failed the run on its island at once; when the island's thread was inside the run's launch
    (XLA:CPU runs a computation that calls the host on the launching thread), the run was over (`run_done`),
    and its reservation given back, while its computation still ran. It is now over once the launch returns."""
    import pathways_mlir as pw

    entered, release = threading.Event(), threading.Event()

    def hold(v):
        entered.set()
        release.wait(60)
        return v

    rt = Runtime(device_map)
    try:
        s = pw.virtual_slice(1, axes="x", island="island1")

        @pw.jit(slice=s)
        def blocked(x):
            return jax.pure_callback(hold, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

        client, results = Client(rt), []
        caller = threading.Thread(target=lambda: results.append(blocked.run(X, client=client)), daemon=True)
        caller.start()
        assert entered.wait(60)
        [run] = rt.scheduler._in_flight.values()
        assert rt.cancel(run)
        assert not rt.run_done(run) and sum(rt.usage().values()) > 0
        release.set()
        caller.join(60)
        until(lambda: rt.run_done(run) and sum(rt.usage().values()) == 0, "the run over once its launch returned",
              60)
        with pytest.raises(RunCancelled):
            np.asarray(results[0])
    finally:
        release.set()
        rt.close()


def test_runs_cancelled_while_they_wait_for_the_in_flight_bound_never_execute(device_map, monkeypatch):
    """A run waiting for fewer than `IN_FLIGHT` runs to be computing on its island (on the caller's thread, when
    it ran inline) was executed after its cancel: 40 calls with `timeout=0.05` of a 0.08 s computation all
    ran, blocking the caller 2 s and a later run of the island 2 s more. The caller no longer runs a run inline
    while the island has `IN_FLIGHT` runs computing, and a run cancelled while it waited is dropped. The island
    sees no computation over until every run is cancelled (`computed` is gated), so the bound holds the runs
    beyond the first `IN_FLIGHT` however slowly this thread submits and cancels them."""
    import pathways_mlir as pw

    started = []
    advance = island_executor.IslandExecutor._advance
    monkeypatch.setattr(island_executor.IslandExecutor, "_advance",
                        lambda self, run: started.append(run.id) or advance(self, run))
    cancelled = threading.Event()
    opener = threading.Timer(60, cancelled.set)
    computed = island_executor.computed
    rt = Runtime(device_map)
    try:
        s = pw.virtual_slice(1, axes="x", island="island0")

        @pw.jit(slice=s)
        def slow(x, n):
            return jax.lax.fori_loop(0, n, lambda i, a: jnp.tanh(a @ a), x)

        client = Client(rt)
        x, n = np.eye(256, dtype=np.float32) * 0.5, np.int32(300)
        np.asarray(slow.run(x, n, client=client))
        until(lambda: not rt.islands["island0"]._completions, "the first run retired", 60)
        started.clear()
        monkeypatch.setattr(island_executor, "computed", lambda array: cancelled.is_set() and computed(array))
        opener.start()                           # (a caller blocked behind the gate would wait for it for good)
        handles = [slow.run(x, n, client=client, timeout=600) for _ in range(40)]   # (the general path)
        until(lambda: len(started) == island_executor.IN_FLIGHT, "the island's first runs under way", 60)
        for h in handles:
            client.cancel(h)
        cancelled.set()
        for h in handles:
            try:
                np.asarray(h.result(timeout=60))
            except RunCancelled:
                pass
        assert len(started) == island_executor.IN_FLIGHT, len(started)
        del handles, h
        until(lambda: sum(rt.usage().values()) == 0, "every reservation given back", 60)
    finally:
        opener.cancel()
        rt.close()


@pytest.mark.parametrize("path", ["fast lane", "general"])
def test_a_run_cancelled_while_its_arguments_are_placed_never_executes(device_map, monkeypatch, path):
    """A cancel that landed while the island placed a run's arguments (after the island's last look at whether
    the run was cancelled) let the run's first step execute all the same, on its own: the run was already over
    for the scheduler, which had given its memory back (found by a review; a large NumPy argument and a
    deadline hit it with no help). The island looks again once the arguments are placed."""
    import pathways_mlir as pw
    from pathways_mlir.runtime import island_program

    launched = []
    execute = island_program.LaunchInstruction.execute
    monkeypatch.setattr(island_program.LaunchInstruction, "execute",
                        lambda self, island, run: launched.append(run.id) or execute(self, island, run))
    rt = Runtime(device_map)
    try:
        s = pw.virtual_slice(1, axes="x", island="island0")
        plus = pw.jit(lambda x: x + 1.0, slice=s)
        client = Client(rt)
        x = np.ones((8,), np.float32)
        options = {"timeout": 600} if path == "general" else {}          # a timeout takes the general path
        np.asarray(plus.run(x, client=client, **options))                 # compiled
        launched.clear()
        place, cancelled = island_executor.IslandExecutor._place, []

        def placed_then_cancelled(run, *args):
            place(run, *args)
            cancelled.append(rt.cancel(rt.scheduler._in_flight[run.id]))   # lands as the placing ends

        monkeypatch.setattr(island_executor.IslandExecutor, "_place", staticmethod(placed_then_cancelled))
        handle = plus.run(x, client=client, **options)
        with pytest.raises(RunCancelled):
            np.asarray(handle.result(timeout=60))
        assert cancelled == [True] and launched == []
        del handle
        until(lambda: sum(rt.usage().values()) == 0, "every reservation given back", 60)
    finally:
        rt.close()


def test_a_cond_program_cancelled_while_its_branch_computes_keeps_its_reservation_until_the_branch_is_over(
        device_map):
    """A branch run needs nothing of its own (its parent's reservation holds its memory): a parent cancelled
    while its branch computed was retired at once (nothing of it left on its islands), its memory given back
    under the computing branch, and a run needing the whole device was admitted beside it (found by a review).
    It stays in flight until its branch is retired."""
    import pathways_mlir as pw

    rt = Runtime(device_map)
    try:
        s = pw.virtual_slice(2, axes="x", island="island0")
        spin = pw.jit(lambda x: jax.lax.fori_loop(0, 4_000_000, lambda i, y: jnp.cos(y), x), slice=s)
        rest = pw.jit(lambda x: x, slice=s)
        positive = pw.jit(lambda x: jnp.sum(x) > 0, slice=s)
        slow_route = pw.program(lambda x: pw.cond(positive(x), spin, rest, x))
        with Client(rt) as client:
            made = slow_route.run(np.ones((8, 16), np.float32), client=client)
            parent = made._run
            until(lambda: any(r.parent is parent for r in list(rt.scheduler._in_flight.values())),
                  "the branch admitted", 60)
            [branch] = [r for r in list(rt.scheduler._in_flight.values()) if r.parent is parent]
            assert client.cancel(made)
            deadline = time.monotonic() + 60
            while branch.id in rt.scheduler._in_flight:
                used = sum(rt.usage().values())
                assert used > 0 or branch.id not in rt.scheduler._in_flight, "memory given back under the branch"
                assert time.monotonic() < deadline, "the branch over within 60 s"
                time.sleep(0.01)
            with pytest.raises(RunCancelled):
                np.asarray(made.result(60))
            del made, branch
        until(lambda: sum(rt.usage().values()) == 0, "every reservation given back", 60)
    finally:
        rt.close()


def doubling_route():
    """A program whose cond doubles its argument if it sums to more than 0, else returns it, on island0."""
    import pathways_mlir as pw

    s = pw.virtual_slice(2, axes="x", island="island0")
    twice = pw.jit(lambda x: x * 2, slice=s)
    rest = pw.jit(lambda x: x, slice=s)
    positive = pw.jit(lambda x: jnp.sum(x) > 0, slice=s)
    return pw.program(lambda x: pw.cond(positive(x), twice, rest, x))


@pytest.mark.parametrize("held", [False, True], ids=["admitted-at-once", "queued-while-admission-held"])
def test_a_conds_branch_whose_parent_failed_before_it_started_is_never_admitted(device_map, monkeypatch, held):
    """A branch run needs nothing of its own: its parent's reservation holds its memory. A parent cancelled after
    its predicate was read, and retired (its reservation given back) before its branch was submitted, had the
    branch admitted anyway, computing on memory nobody reserved (found by a review). The branch now fails with
    its parent's error, whether it would have been admitted at once or was queued while admission was held."""
    from pathways_mlir.runtime.scheduler import GangScheduler

    rt = Runtime(device_map)
    submitted = []
    original = GangScheduler.submit

    def parent_retired_first(self, run, works, inline=True):
        if run.parent is None:
            return original(self, run, works, inline)
        rt.cancel(run.parent)
        until(lambda: run.parent.retired, "the cancelled parent retired", 60)
        if held:
            self.hold()
        try:
            original(self, run, works, inline)
        except BaseException as error:
            submitted.append(error)
            raise
        finally:
            if held:
                self.release()
        submitted.append(run)

    monkeypatch.setattr(GangScheduler, "submit", parent_retired_first)
    try:
        route = doubling_route()
        with Client(rt) as client:
            made = route.run(np.ones((8, 16), np.float32), client=client)
            with pytest.raises(RunCancelled):
                np.asarray(made.result(60))
            until(lambda: submitted, "the branch submitted", 60)
            [outcome] = submitted
            if isinstance(outcome, BaseException):
                assert isinstance(outcome, RunCancelled)     # refused at its submission
            else:                                            # queued: refused once admission goes on
                until(lambda: outcome.admitted, "the queued branch taken from its queue", 60)
                assert isinstance(outcome.error, RunCancelled), "a branch admitted on memory nobody reserved"
            del made
        until(lambda: sum(rt.usage().values()) == 0, "every reservation given back", 60)
        assert not rt.scheduler._in_flight
    finally:
        rt.close()


def test_a_conds_branch_cancelled_in_its_queue_lets_its_parent_retire(device_map):
    """A branch run queues only while admission is held; cancelled there (`_cancel`), it was marked admitted
    but never retired, so its parent, over only once its branch is, stayed in flight for good, its reservation
    with it (found by a review)."""
    rt = Runtime(device_map)
    try:
        route = doubling_route()
        with Client(rt) as client:
            np.asarray(route.run(np.ones((8, 16), np.float32), client=client).result(60))   # compiled
            until(lambda: not rt.scheduler._in_flight, "the first run retired", 60)
            admitted = rt.scheduler.wait_admitted

            def held_once_admitted(run, timeout=None):        # the cond's thread, before it starts the branch
                answer = admitted(run, timeout)
                rt.scheduler.hold()
                return answer

            rt.scheduler.wait_admitted = held_once_admitted
            made = route.run(np.ones((8, 16), np.float32), client=client)
            try:
                until(lambda: rt.scheduler.status()["queued"], "the branch queued", 60)
                branch = made._run.branch
                assert [q["run"] for q in rt.scheduler.status()["queued"]] == [branch.id]
                assert rt.cancel(branch)
            finally:
                rt.scheduler.release()
            with pytest.raises(RunCancelled):
                np.asarray(made.result(60))
            del made
        until(lambda: not rt.scheduler._in_flight, "the parent retired", 60)
        until(lambda: sum(rt.usage().values()) == 0, "every reservation given back", 60)
    finally:
        rt.close()


def test_a_run_that_failed_on_its_island_keeps_no_bytes_for_its_handles(device_map):
    """A run that fails on its island (a launch raising: here it finds its argument deleted, as one under
    `jax_debug_nans` finds a NaN) never has results, but the scheduler learnt nothing of the failure and kept
    their bytes reserved for as long as their handles lived: the next run was refused with
    `OutOfDeviceMemory`, "held by live handles" (found by a README walk-through). A run cancelled by the
    client gave them back; one failed by its island now does too."""
    import pathways_mlir as pw

    rt = Runtime(device_map, device_memory_bytes=600_000)     # one run of `log` (argument and result) fits
    try:
        log = pw.jit(jnp.log, slice=pw.virtual_slice(1, axes="x", island="island0"))
        x = np.ones((256, 256), np.float32)
        with Client(rt) as client:
            plan = log.compiled(x, runtime=rt).plan
            np.asarray(client.run(plan, [x])[0].result(60))
            failed = run_failing_on_the_island(client, plan, rt.islands["island0"], jnp.asarray(x))
            with pytest.raises(RunFailed):
                np.asarray(failed.result(60))
            run = failed._run
            until(lambda: run.retired, "the failed run retired", 60)
            assert sum(rt.usage().values()) == 0, "a failed run's handle holds bytes"
            np.testing.assert_allclose(np.asarray(client.run(plan, [x])[0].result(60)), 0.0)
            del failed
    finally:
        rt.close()


def test_a_run_failed_before_it_executed_is_never_retired_as_a_success(device_map, monkeypatch):
    """An island failing a run that was neither executing nor computing took it out of its runs in flight (so
    `run_done` said it was over) before it recorded the failure (what `failure` reads), both read without the
    island's lock: a scheduler's poll between the two retired the run as a success and kept its results' bytes
    for its live handle (found by a review). Here the run fails while its argument is placed (the caller
    deleted it), and the scheduler polls inside `_fail`."""
    import pathways_mlir as pw

    rt = Runtime(device_map)
    try:
        s = pw.virtual_slice(2, axes="x", island="island0")
        slow = pw.jit(lambda v: v @ v @ v @ v, slice=s)
        inc = pw.jit(lambda v: v + 1, slice=s)
        big, x = np.ones((1024, 1024), np.float32), np.ones((64, 64), np.float32)
        slow_plan, inc_plan = slow.compiled(big, runtime=rt).plan, inc.compiled(x, runtime=rt).plan
        with Client(rt) as client:
            for handle in client.run(slow_plan, [big]) + client.run(inc_plan, [x]):
                np.asarray(handle.result(60))                                # compiled
            until(lambda: not rt.scheduler._in_flight, "the first runs retired", 60)
            kept = without_traceback = island_executor.without_traceback
            in_fail, polled = threading.Event(), threading.Event()

            def poll_inside_fail(error):                     # `_fail` calls it, holding the island's lock
                if not in_fail.is_set():
                    in_fail.set()
                    polled.wait(5)                           # (bounded: a poll that needs the lock waits for it)
                return kept(error)

            monkeypatch.setattr(island_executor, "without_traceback", poll_inside_fail)
            busy = client.run(slow_plan, [big], timeout=600, inline=False)      # island0's executor is busy
            arg = jax.device_put(x, jax.devices()[-1])                          # placed by the executor
            run = client.start(inc_plan, [arg], timeout=600, inline=False)      # behind `busy`
            [handle] = client.handles(run)
            arg.delete()                                                        # gone before it is placed
            assert in_fail.wait(60), "the run failed within 60 s"
            rt.scheduler.retire_over()
            polled.set()
            monkeypatch.setattr(island_executor, "without_traceback", without_traceback)
            with pytest.raises(RunFailed):
                np.asarray(handle.result(60))
            del busy
            until(lambda: not rt.scheduler._in_flight, "every run retired", 60)
            assert run.error is not None and sum(rt.usage().values()) == 0, "a failed run's handle holds bytes"
            del handle
    finally:
        rt.close()

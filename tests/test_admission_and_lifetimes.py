"""Per-run admission and object lifetimes: nothing leaks, nothing deadlocks, a bad run fails alone.

Every wait here has a timeout: a run that would hang fails the test instead.
"""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pathways_mlir.dialect.plan import PlanError, ProgramPlan
from pathways_mlir.dialect.plan_steps import Launch
from pathways_mlir.runtime.admission import OutOfDeviceMemory
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.runtime import Runtime

X = np.random.default_rng(1).normal(size=(8, 16)).astype(np.float32)
ONE_RUN = 2 * 8 * 16 * 4     # a one-device run's peak: its argument and its result


def tanh2(x):
    return jnp.tanh(x) * 2.0


def one_step(plan_builder, topology):
    p = plan_builder(topology)
    v = p.slice("v", (1,), ("x",), "island0", (0, 1))
    out = p.launch(tanh2, [p.input((8, 16), v)], v, [(), ()])
    return p.build([out]), np.asarray(jax.jit(tanh2)(X))


def cross_island(plan_builder, topology):
    p = plan_builder(topology)
    v0 = p.slice("v0", (2,), ("x",), "island0", (0, 2))
    v1 = p.slice("v1", (2,), ("x",), "island1", (0, 2))
    a = p.launch(tanh2, [p.input((8, 16), v0, [("x",), ()])], v0, [("x",), ()])
    b = p.launch(tanh2, [p.dcn(a, v1, [("x",), ()])], v1, [("x",), ()])
    return p.build([b]), np.asarray(jax.jit(tanh2)(jax.jit(tanh2)(X)))


def settle(runtime, runs, client):
    for run in runs:
        client.wait(run, timeout=60)
    return sum(runtime.usage().values()), runtime.object_count()


def test_results_dropped_at_once_leave_nothing(runtime, plan_builder):
    plan, _ = cross_island(plan_builder, runtime.resources.topology)
    with Client(runtime) as client:
        runs = []
        for _ in range(20):
            run = client.start(plan, [X])
            for h in client.handles(run):
                h.delete()               # before the result exists, most of the time
            runs.append(run)
        assert settle(runtime, runs, client) == (0, 0)


def test_a_result_returned_twice_is_one_handle_that_lives_while_either_name_does(device_map):
    """A program that returns one value twice (`return y, y`) gets the same handle in
    both places: dropping one name keeps the result for the other, the ledger holds its bytes once (not
    twice, with one given back), and dropping both leaves nothing. Two handles of one result released it
    with the first one dropped, and reading the other waited for ever."""
    import gc

    import pathways_mlir as pw

    double = pw.jit(lambda x: x * 2, slice=pw.virtual_slice(1, axes="x"))

    @pw.program
    def twice(x):
        y = double(x)
        return y, y

    rt = Runtime(device_map, device_memory_bytes=3 * 8 * 16 * 4)   # three results of (8, 16) floats per device
    try:
        with Client(rt) as client:
            for _ in range(4):           # a result counted twice would fill the devices within two runs
                first, second = twice.run(X, client=client)
                assert first is second
                client.wait(first._run, timeout=60)
                assert sum(rt.usage().values()) == 8 * 16 * 4 and rt.object_count() == 1
                del first
                gc.collect()
                np.testing.assert_allclose(np.asarray(second.result(timeout=60)), X * 2)
                del second
                gc.collect()
                assert sum(rt.usage().values()) == 0 and rt.object_count() == 0
    finally:
        rt.close()


def test_a_released_handle_raises_instead_of_returning_data(runtime, plan_builder):
    plan, want = one_step(plan_builder, runtime.resources.topology)
    client = Client(runtime)
    [h] = client.run(plan, [X])
    np.testing.assert_array_equal(np.asarray(h), want)
    h.delete()
    with pytest.raises(ValueError, match="released"):
        np.asarray(h)
    [kept] = client.run(plan, [X])
    kept.block_until_ready()
    client.close()
    with pytest.raises(ValueError, match="closed client"):
        np.asarray(kept)


def read_on_a_thread(runtime, read):
    """Runs `read()` on a daemon thread; returns what it raised (None if nothing). A read still waiting after 30 s
    fails the test, once closing the runtime has ended it (its island wakes every waiting thread)."""
    outcome = []

    def reader():
        try:
            read()
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001  (the test looks at it)
            outcome.append(error)
    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    thread.join(30)
    if thread.is_alive():
        runtime.close()
        thread.join(30)
        pytest.fail("the read waited for ever")
    return outcome[0]


@pytest.mark.parametrize("release", ["delete", "close"])
@pytest.mark.parametrize("read", ["asarray", "block_until_ready", "device_get", "client.fetch"])
def test_a_result_released_while_it_is_read_raises_instead_of_waiting_for_ever(runtime, plan_builder, release, read):
    """A reader past its handle's check, whose result was then released (by another thread that deleted the
    handle, or closed its client) once its run was over, waited for ever: its island cannot tell a result
    released from one whose run has not started there. The island now has the reader check its handle again
    before it waits. Here the release comes between the handle's check and the fetch from its island."""
    plan, _ = one_step(plan_builder, runtime.resources.topology)
    client = Client(runtime)
    [h] = client.run(plan, [X])
    client.wait(h._run, timeout=60)              # the run is over on its island, its result in the store
    fetch = client._dispatcher.fetch

    def released_first(*args):
        h.delete() if release == "delete" else client.close()
        return fetch(*args)
    client._dispatcher.fetch = released_first
    reads = {"asarray": lambda: np.asarray(h), "block_until_ready": h.block_until_ready,
             "device_get": lambda: jax.device_get({"h": h}), "client.fetch": lambda: client.fetch(h._run, h._buffer)}
    error = read_on_a_thread(runtime, reads[read])
    what = "handle to buffer" if read != "client.fetch" else "buffer"
    why = "was released" if release == "delete" else f"belongs to closed client {client.id}: its result was released"
    assert isinstance(error, ValueError) and str(error) == f"{what} {h._buffer} of run {h._run.id} {why}", repr(error)


def test_a_read_waiting_for_a_queued_run_raises_once_its_handle_is_deleted(runtime, plan_builder):
    """A read waiting on the island for a result of a run still queued went on waiting after its handle was
    deleted, until the run was over there. The release now wakes it, and it raises at once."""
    plan, _ = one_step(plan_builder, runtime.resources.topology)
    with Client(runtime) as client:
        client.run(plan, [X])[0].result(timeout=60)          # compiled
        runtime.scheduler.hold()
        try:
            [h] = client.run(plan, [X])
            island = runtime.islands["island0"]

            def delete_once_waiting():
                deadline = time.monotonic() + 60
                while h._run.id not in island._waiters and time.monotonic() < deadline:
                    time.sleep(0.001)
                h.delete()
            deleter = threading.Thread(target=delete_once_waiting, daemon=True)
            deleter.start()
            error = read_on_a_thread(runtime, h.block_until_ready)
            deleter.join(60)
            assert isinstance(error, ValueError) and "was released" in str(error), repr(error)
        finally:
            runtime.scheduler.release()


@pytest.mark.parametrize("release", ["delete", "close"])
@pytest.mark.parametrize("read", ["block_until_ready", "client.fetch"])
def test_a_read_of_a_run_with_a_deadline_raises_once_its_result_is_released(runtime, plan_builder, release, read):
    """A read of a result of a run started with `timeout=` waits until the run is over before it asks the island
    (`Dispatcher.fetch`); a release (the handle deleted, or its client closed, by another thread) did not end
    that wait, so the read raised only once the whole run was over. It now raises as soon as it looks again.
    Here the run's launch waits (a callback) until the read is over."""
    from pathways_mlir.runtime.executables import InProcessFunction, keep_in_process

    read_over = threading.Event()

    def held(x):                                   # the launch: under way until the read is over (past the join below)
        waited = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return (jax.pure_callback(lambda value: (read_over.wait(300), value)[1], waited, x),)

    p = plan_builder(runtime.resources.topology, program="waits")
    v = p.slice("v", (1,), ("x",), "island0", (0, 1))
    aval = jax.ShapeDtypeStruct((8,), jnp.float32)
    kept = InProcessFunction(held, (aval,), (aval,))     # (kept in the process while held: here, by the test)
    p.executables["held"] = keep_in_process(kept)                               # (launch keeps it)
    plan = p.build([p.launch(lambda x: x, [p.input((8,), v)], v, [()], name="held")])
    client = Client(runtime)
    closing = threading.Thread(target=client.close, daemon=True)
    try:
        [h] = client.run(plan, [np.arange(8, dtype=np.float32)], timeout=600, inline=False)
        run, buffer = h._run, h._buffer
        reads = {"block_until_ready": h.block_until_ready, "client.fetch": lambda: client.fetch(run, buffer)}
        outcome = []

        def reader():
            try:
                reads[read]()
            except BaseException as error:  # noqa: BLE001  (the test looks at it)
                outcome.append(error)
        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        h.delete() if release == "delete" else closing.start()     # (close waits for the run under way)
        thread.join(60)
        assert not thread.is_alive(), "the read went on waiting for the run after its result was released"
        what = "handle to buffer" if read != "client.fetch" else "buffer"
        why = "was released" if release == "delete" else f"belongs to closed client {client.id}: its result was " \
                                                          f"released"
        error = outcome[0]
        assert isinstance(error, ValueError) and str(error) == f"{what} {buffer} of run {run.id} {why}", repr(error)
    finally:
        read_over.set()
        if closing.is_alive():
            closing.join(60)
        client.close()


@pytest.mark.parametrize("capacity", [ONE_RUN, ONE_RUN + ONE_RUN // 2, 4 * ONE_RUN])
def test_runs_complete_or_fail_clearly_under_any_capacity(device_map, capacity, plan_builder):
    """Room for one run, for one and a half, or for several: back-to-back runs all complete, each
    submitted while the one before may still be in flight (a result held would keep the next run out:
    that fails at once, see below)."""
    rt = Runtime(device_map, device_memory_bytes=capacity)
    try:
        plan, want = one_step(plan_builder, rt.resources.topology)
        with Client(rt) as client:
            results = []
            for _ in range(6):
                [h] = client.run(plan, [X * 1.0])
                results.append(h.result(timeout=60))
                h.delete()
            for r in results:
                np.testing.assert_array_equal(np.asarray(r), want)
        with Client(rt) as other:          # another client still runs afterwards
            np.testing.assert_array_equal(np.asarray(other.run(plan, [X])[0].result(timeout=60)), want)
    finally:
        rt.close()


def test_a_run_that_can_never_fit_fails_at_once_and_others_go_on(device_map, plan_builder):
    rt = Runtime(device_map, device_memory_bytes=ONE_RUN - 1)
    try:
        plan, _ = one_step(plan_builder, rt.resources.topology)
        with Client(rt) as client:
            with pytest.raises(OutOfDeviceMemory, match=f"needs {ONE_RUN} bytes on device 0 of island0, which "
                                                        f"has only {ONE_RUN - 1} bytes"):
                client.run(plan, [X])
        small = plan_builder(rt.resources.topology)
        v = small.slice("v", (1,), ("x",), "island1", (0, 1))
        out = small.launch(tanh2, [small.input((2, 2), v)], v, [(), ()])
        with Client(rt) as other:
            [h] = other.run(small.build([out]), [np.ones((2, 2), np.float32)])
            np.testing.assert_allclose(np.asarray(h.result(timeout=60)), np.tanh(np.ones((2, 2))) * 2, rtol=1e-6)
    finally:
        rt.close()


def test_whether_a_need_can_ever_fit_is_never_taken_from_a_need_gone_before_it(device_map):
    """The ledger cached each need's verdict by the need's id alone: a need made after another was dropped
    (a plan forgotten, a cond's branch run over) could take its address, and with it its verdict, and the
    cache kept one entry per need it ever saw (one per branch run)."""
    from pathways_mlir.runtime.admission import MemoryLedger

    ledger = MemoryLedger(device_map.topology, device_memory_bytes=ONE_RUN)
    for _ in range(2000):
        fits = {"island0": ((0, 1, ONE_RUN),)}
        assert ledger.never_fits(fits) is None
        del fits
        never = {"island0": ((0, 1, ONE_RUN + 1),)}
        assert ledger.never_fits(never) == (f"needs {ONE_RUN + 1} bytes on device 0 of island0, which has only "
                                            f"{ONE_RUN} bytes: it can never fit")
        del never
    assert len(ledger._never) < 2000


@pytest.mark.parametrize("on_device", [False, True])
def test_a_run_behind_memory_only_handles_hold_fails_at_once_naming_the_holder(device_map, plan_builder, on_device):
    # Both take the fast lane: the first run's credit goes back to the ledger, since it no longer fits beside the
    # result `first` holds, so the second run takes the general path, which refuses it.
    rt = Runtime(device_map, device_memory_bytes=ONE_RUN + 8 * 16 * 4 - 1)   # not one run beside a held result
    x = jnp.asarray(X) if on_device else X
    try:
        plan, want = one_step(plan_builder, rt.resources.topology)
        with Client(rt) as client:
            first = client.run(plan, [x])[0]              # `a, b = f(x), f(x)`: `a` is still held
            with pytest.raises(OutOfDeviceMemory, match=(
                    f"program main needs {ONE_RUN} bytes on device 0 of island0, which has {ONE_RUN + 8 * 16 * 4 - 1} "
                    f"bytes, {8 * 16 * 4} of them held by live handles that nothing in flight will free "
                    rf"\(client {client.id} holds 1 object\(s\), {8 * 16 * 4} bytes\)")):
                client.run(plan, [x])
            assert rt.status()["scheduler"]["queued"] == []
            np.testing.assert_array_equal(np.asarray(first.result(timeout=60)), want)
            first.delete()
            np.testing.assert_array_equal(np.asarray(client.run(plan, [x])[0].result(timeout=60)), want)
    finally:
        rt.close()


def test_a_result_awaited_while_its_run_queues_raises_the_runs_own_error(device_map, plan_builder):
    # The run queues (admission held), a thread waits for its result on the island, then the run fails in
    # the queue with OutOfDeviceMemory: the waiter gets that error, as a fetch after the failure does, not
    # the island's RunFailed wrapping it.
    rt = Runtime(device_map, device_memory_bytes=ONE_RUN + 8 * 16 * 4 - 1)   # not one run beside a held result
    try:
        plan, want = one_step(plan_builder, rt.resources.topology)
        with Client(rt) as client:
            first = client.run(plan, [X])[0]
            np.testing.assert_array_equal(np.asarray(first.result(timeout=60)), want)
            rt.scheduler.hold()
            [queued] = client.run(plan, [X])
            raised = []

            def wait_for_it():
                try:
                    queued.result(timeout=60)
                except BaseException as error:  # noqa: BLE001  (the test looks at it)
                    raised.append(error)
            waiter = threading.Thread(target=wait_for_it)
            waiter.start()
            island = rt.islands["island0"]
            deadline = time.monotonic() + 60
            while queued._run.id not in island._waiters and waiter.is_alive():
                assert time.monotonic() < deadline, "the waiter never waited on the island"
                time.sleep(0.001)
            rt.scheduler.release()
            waiter.join(60)
            assert not waiter.is_alive()
            [error] = raised
            assert isinstance(error, OutOfDeviceMemory), repr(error)
            assert f"program main needs {ONE_RUN} bytes on device 0 of island0" in str(error)
    finally:
        rt.close()


def test_a_plan_reading_a_buffer_nothing_writes_is_rejected_when_loaded(runtime, plan_builder):
    plan, want = one_step(plan_builder, runtime.resources.topology)
    bad = plan.to_python()
    bad["islands"]["island0"][0]["inputs"] = [7]
    bad["buffers"].append({**bad["buffers"][0], "id": 7})
    with pytest.raises(PlanError, match="step 0 \\(launch\\) reads buffer 7, which nothing writes"):
        ProgramPlan.from_python(bad)


def test_a_bad_run_of_one_client_does_not_stop_another(runtime, plan_builder):
    """A recv whose send never comes parks its run; other clients' runs still complete."""
    p = plan_builder(runtime.resources.topology)
    v0 = p.slice("v0", (1,), ("x",), "island0", (0, 1))
    v1 = p.slice("v1", (1,), ("x",), "island1", (0, 1))
    moved = p.dcn(p.launch(tanh2, [p.input((8, 16), v0)], v0, [(), ()]), v1, [(), ()])
    out = p.launch(tanh2, [moved], v1, [(), ()])
    stuck = p.build([out])
    # Only island1's half is started: its recv waits for a send that is never made.
    island1 = {"island1": stuck.islands["island1"]}
    stuck = ProgramPlan(stuck.program, stuck.topology, stuck.slices, stuck.buffers, stuck.executables, (),
                        stuck.outputs, island1)
    good, want = cross_island(plan_builder, runtime.resources.topology)
    bad_client, good_client = Client(runtime), Client(runtime)
    with pytest.raises(PlanError):
        bad_client.start(stuck, [])             # its recv has no send: rejected before any work
    [h] = good_client.run(good, [X])
    np.testing.assert_allclose(np.asarray(h.result(timeout=60)), want, rtol=1e-6)
    bad_client.close()
    good_client.close()


def test_a_failing_launch_fails_its_run_alone(runtime, plan_builder):
    plan, want = cross_island(plan_builder, runtime.resources.topology)
    broken = plan.to_python()
    broken["executables"]["tanh2"] = "AAAA"                    # not a jax.export serialisation
    with Client(runtime) as client:
        with pytest.raises(Exception):
            client.run(ProgramPlan.from_python(broken), [X])[0].result(timeout=60)
        np.testing.assert_allclose(np.asarray(client.run(plan, [X])[0].result(timeout=60)), want, rtol=1e-6)


def test_close_racing_start_leaves_nothing(runtime, plan_builder):
    plan, _ = cross_island(plan_builder, runtime.resources.topology)
    for _ in range(5):
        client = Client(runtime)
        started = threading.Event()

        def spin():
            started.set()
            try:
                while True:
                    client.start(plan, [X])
            except RuntimeError:
                pass                                    # the client closed under it

        thread = threading.Thread(target=spin)
        thread.start()
        started.wait(10)
        client.close()
        thread.join(60)
        assert not thread.is_alive()
    deadline_usage = sum(runtime.usage().values())
    assert (deadline_usage, runtime.object_count()) == (0, 0)


def test_closing_a_client_cancels_its_queued_runs_instead_of_waiting_a_minute_for_each(runtime, plan_builder):
    """`close` waited up to a minute for each of the client's runs, one after the other, so a client with
    three runs queued (behind admission here; behind another client's long runs in use) took three
    minutes to close, and then their results were released unread. Its queued runs now fail at once, as a
    service's client's do when it disconnects, and the runs under way share one bound."""
    from pathways_mlir.runtime.runtime import RunCancelled

    plan, _ = one_step(plan_builder, runtime.resources.topology)
    client = Client(runtime)
    client.run(plan, [X])[0].result(timeout=60)               # compiled, and its run over
    runtime.scheduler.hold()
    try:
        queued = [client.start(plan, [X]) for _ in range(3)]
        closing = threading.Thread(target=client.close, daemon=True)
        closing.start()
        closing.join(30)
        assert not closing.is_alive(), "close() returned within 30 s"
    finally:
        runtime.scheduler.release()
    for run in queued:
        assert isinstance(run.error, RunCancelled) and "queued when client" in str(run.error)
    assert all(run.retired and run.id not in runtime.scheduler._in_flight for run in queued)
    assert (sum(runtime.usage().values()), runtime.object_count()) == (0, 0)


def test_closing_the_runtime_with_a_stuck_run_is_bounded(device_map, plan_builder):
    rt = Runtime(device_map, device_memory_bytes=ONE_RUN + 300)    # one run, or the parked run and its result
    parked_plan, _ = cross_island(plan_builder, rt.resources.topology)
    p = plan_builder(rt.resources.topology)
    v = p.slice("v", (1,), ("x",), "island1", (0, 1))
    plan = p.build([p.launch(tanh2, [p.input((8, 16), v)], v, [(), ()])])
    client = Client(rt)
    rt.islands["island0"].close()             # on purpose: the run parks on island1 for ever
    client.start(parked_plan, [X])
    queued = client.start(plan, [X])          # can never be admitted while the parked run is in flight
    closer = threading.Thread(target=rt.close)
    closer.start()
    closer.join(30)
    assert not closer.is_alive()
    with pytest.raises(Exception, match="closed"):
        client.fetch(queued, plan.outputs[0], timeout=10)


def test_launch_steps_are_a_tagged_union(runtime, plan_builder):
    plan, _ = one_step(plan_builder, runtime.resources.topology)
    [launch] = [s for s in plan.islands["island0"] if isinstance(s, Launch)]
    assert launch.consumed() == plan.inputs and launch.produced() == plan.outputs


def _cond_programs():
    """A program that returns a pw.cond's result as it is (the host keeps it: no device computation uses it), on
    device 0 of island1, and one whose branch returns its operand as it is (a copy on island0)."""
    import pathways_mlir as pw

    on1 = pw.virtual_slice(1, axes="x", island="island1")
    on0 = pw.virtual_slice(1, axes="x", island="island0")
    grow = pw.jit(lambda x: jnp.tile(x, (4, 1)) * 2.0, slice=on1)      # (32, 16) f32: 2048 bytes
    bump = pw.jit(lambda y: y + 1.0, slice=on1)
    keep = pw.jit(lambda y: y * 1.0, slice=on1)
    positive = pw.jit(lambda x: x.sum() > 0, slice=on1)
    twice0 = pw.jit(lambda x: jnp.tile(x, (4, 1)) * 2.0, slice=on0)

    @pw.program
    def computed(x):
        return pw.cond(positive(x), bump, keep, grow(x))

    @pw.program
    def passed_through(x):
        return pw.cond(positive(x), lambda y: y, lambda y: y, twice0(x))

    return {"computed": (computed, ("island1", 0), np.tile(X, (4, 1)) * 2.0 + (X.sum() > 0)),
            "passed_through": (passed_through, ("island0", 0), np.tile(X, (4, 1)) * 2.0)}


RESULT = 32 * 16 * 4                 # one result of the cond programs: bytes on its device


def _all_retired(rt, timeout=60):
    """Waits until the scheduler has retired every run (a cond's parent only once its branch is, which may be
    a look later), so the ledger holds results' bytes alone."""
    deadline = time.monotonic() + timeout
    while rt.usage() is not None and rt.status()["scheduler"]["admitted_count"]:
        assert time.monotonic() < deadline, "runs were not retired within 60 s"
        time.sleep(0.01)


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
@pytest.mark.parametrize("kind", ["computed", "passed_through"])
def test_a_cond_result_returned_as_it_is_is_held_by_its_handle_until_released(device_map, dispatch, kind):
    """A pw.cond's result that a program returns as it is stays on the devices its branch left it on: like
    any result, the ledger holds its bytes there while its handle lives (`usage`, `status().reserved`), its
    client owns it (`objects`, `status().clients`), and a release gives both back and frees its devices
    at once (the host lets go of the array, though the released handle lives on). Before, the ledger and
    the client counted none of it, and the host held the array while its run lived."""
    import gc
    import weakref

    program, device, want = _cond_programs()[kind]
    rt = Runtime(device_map)
    try:
        with Client(rt) as client:
            h = program.run(X, client=client, dispatch=dispatch)
            np.testing.assert_allclose(np.asarray(h), want)
            client.wait(h._run, timeout=60)
            _all_retired(rt)
            np.testing.assert_allclose(np.asarray(h.result(timeout=60)), want)   # read once its run is over
            assert {k: v for k, v in rt.usage().items() if v} == {device: RESULT}
            assert len(client.objects()) == 1 and rt.object_count() == 1
            status = rt.status()
            assert status["reserved"][device[0]][device[1]] == RESULT
            assert status["clients"] == {client.id: {"objects": 1, "bytes": RESULT}}
            array = weakref.ref(h.result())
            sharding = h.sharding
            h.delete()
            gc.collect()
            assert array() is None
            assert h.sharding == sharding         # as a deleted JAX array says it
            assert sum(rt.usage().values()) == 0 and client.objects() == [] and rt.object_count() == 0
    finally:
        rt.close()


def test_live_cond_results_that_fill_the_devices_refuse_the_next_run(device_map):
    """Admission counts the cond results that live handles hold, as it counts other results: at a capacity a
    byte short of a run's peak beside three results, the fourth run while three results live fails with
    OutOfDeviceMemory naming them, and one runs again once one is released. Before, any number ran, holding
    more than the device has."""
    program, _, want = _cond_programs()["computed"]
    probe = Runtime(device_map)
    try:
        peak = program.lower(X).compile(runtime=probe).memory_analysis().peak_memory_in_bytes   # a run's need
    finally:
        probe.close()
    rt = Runtime(device_map, device_memory_bytes=peak + 3 * RESULT - 1)
    try:
        with Client(rt) as client:
            held = []
            for _ in range(3):
                held.append(program.run(X, client=client))
                np.testing.assert_allclose(np.asarray(held[-1].result(timeout=60)), want)
            for h in held:
                client.wait(h._run, timeout=60)
            _all_retired(rt)
            with pytest.raises(OutOfDeviceMemory, match=f"client {client.id} holds 3 object"):
                program.run(X, client=client).result(timeout=60)
            held.pop().delete()
            np.testing.assert_allclose(np.asarray(program.run(X, client=client).result(timeout=60)), want)
    finally:
        rt.close()


def test_closing_a_client_gives_back_the_cond_results_it_held(device_map):
    """Closing a client releases its cond results as its other results: their bytes, its objects, and the
    arrays themselves, though its handles live on."""
    import gc
    import weakref

    program, _, want = _cond_programs()["computed"]
    rt = Runtime(device_map)
    try:
        client = Client(rt)
        handles = [program.run(X, client=client) for _ in range(3)]
        arrays = [weakref.ref(h.result(timeout=60)) for h in handles]
        for h in handles:
            client.wait(h._run, timeout=60)
        _all_retired(rt)
        assert sum(rt.usage().values()) == 3 * RESULT and rt.object_count() == 3
        client.close()
        gc.collect()
        assert sum(rt.usage().values()) == 0 and rt.object_count() == 0
        assert [a() for a in arrays] == [None] * 3
        with pytest.raises(ValueError, match="closed"):
            np.asarray(handles[0])
    finally:
        rt.close()

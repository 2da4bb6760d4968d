"""The fast lane (`runtime/fast_lane.py`): which runs take it, which fall back to the general path, and that
either way the results are JAX's, the tickets keep one order and nothing is left behind.

Every wait here has a timeout; every runtime made here is closed.
"""

import contextlib
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from test_admission_and_lifetimes import ONE_RUN, X, cross_island, tanh2

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.fast_lane import CREDITS
from pathways_mlir.runtime.island_executor import IN_FLIGHT
from pathways_mlir.runtime.island_work import RunFailed
from pathways_mlir.runtime.runtime import Runtime

CHAIN = 3 * CREDITS      # more runs than a lane holds credits for before it retires its runs that are over
# The chains below wait for their latest run now and then, so that credits come back however slow the devices.


def small(plan_builder, topology, shape=(8, 16)):
    p = plan_builder(topology, program="small")
    v = p.slice("v", (1,), ("x",), "island0", (0, 1))
    return p.build([p.launch(tanh2, [p.input(shape, v)], v, [(), ()])])


def chained_tanh2(x, n):
    for _ in range(n):
        x = jax.jit(tanh2)(x)
    return np.asarray(x)


@contextlib.contextmanager
def running_inline(island):
    """Holds `island` as if a caller ran work inline on it: the executor, and any new run, wait their turn."""
    with island.lock:
        island._pending += 1
        island._inline = True
    try:
        yield
    finally:
        island._inline_over()


def run_failing_on_the_island(client, plan, island, array):
    """Starts a run of `plan` on `array` that fails on `island`: queued there while the island is held, it finds
    its argument deleted when it launches (a deleted array is refused at the call). Returns its handle."""
    with running_inline(island):
        [handle] = client.run(plan, [array])
        array.delete()
    return handle


def assert_nothing_left(rt: Runtime) -> None:
    """The scheduler's ledger is back to zero and the islands keep no objects."""
    assert set(rt.usage().values()) == {0}
    assert rt.object_count() == 0


def test_a_chain_of_runs_takes_the_lane_equals_jax_and_leaves_nothing(runtime, plan_builder):
    plan = small(plan_builder, runtime.resources.topology)
    lane = runtime.lane(plan)
    with Client(runtime) as client:
        y = jnp.asarray(X)
        for i in range(CHAIN):
            [y] = client.run(plan, [y])          # a handle passed on: its array, on its home sharding
            if i % (CREDITS // 2) == 0:
                client.wait(y._run, timeout=60)  # so that credits are free again, however slow the devices
        np.testing.assert_allclose(np.asarray(y), chained_tanh2(X, CHAIN), rtol=1e-6)
        assert lane.runs == CHAIN
        client.wait(y._run, timeout=60)
        del y
    assert_nothing_left(runtime)
    assert not runtime.scheduler._in_flight


def test_a_placed_function_called_op_by_op_takes_the_lane(runtime):
    s = pw.virtual_slice(1, axes="x")
    step = pw.jit(tanh2, slice=s, in_specs=P(), out_specs=P())
    with Client(runtime) as client:
        y = step.run(jnp.asarray(X), client=client)
        for i in range(CHAIN - 1):
            y = step.run(y, client=client)
            if i % (CREDITS // 2) == 0:
                client.wait(y._run, timeout=60)
        np.testing.assert_allclose(np.asarray(y), chained_tanh2(X, CHAIN), rtol=1e-6)
        lane = runtime.lane(step.compiled(jnp.asarray(X), runtime=runtime).plan)
        assert lane.runs == CHAIN
        z = step.run(np.asarray(X), client=client)   # a host array: the lane too, its launch places it
        np.testing.assert_allclose(np.asarray(z), np.asarray(jax.jit(tanh2)(X)), rtol=1e-6)
        assert lane.runs == CHAIN + 1
        other = step.run(jnp.ones((4, 16)), client=client)     # another signature: another stage
        assert other.shape == (4, 16)
        np.testing.assert_allclose(np.asarray(other), np.asarray(jax.jit(tanh2)(jnp.ones((4, 16)))), rtol=1e-6)
        del y, z, other
    assert_nothing_left(runtime)


def test_a_host_array_call_is_looked_up_by_identity_and_takes_the_lane(runtime, monkeypatch):
    from pathways_mlir.frontend.signature import Signature

    s = pw.virtual_slice(1, axes="x")
    step = pw.jit(tanh2, slice=s, in_specs=P(), out_specs=P())
    with Client(runtime) as client:
        first = step.run(X, client=client)
        lane = runtime.lane(step.compiled(X, runtime=runtime).plan)
        split = Signature.split
        splits = []
        monkeypatch.setattr(Signature, "split", lambda self, *a: splits.append(a) or split(self, *a))
        again = step.run(X.copy(), client=client)           # another host array of that shape and dtype
        assert splits == []                                 # nothing split or flattened: found by identity
        other = step.run(np.ones((4, 16), np.float32), client=client)   # another shape: another stage
        assert len(splits) == 1
        for result, x in ((first, X), (again, X), (other, np.ones((4, 16), np.float32))):
            np.testing.assert_allclose(np.asarray(result), np.asarray(jax.jit(tanh2)(x)), rtol=1e-6)
        assert lane.runs == 2
        del first, again, other
    assert_nothing_left(runtime)


def test_a_pytree_call_is_looked_up_by_identity_of_its_tree_and_leaves(runtime, monkeypatch):
    from pathways_mlir.frontend.signature import Signature

    def update(state, x):
        return {k: jnp.tanh(v * 2) + x for k, v in state.items()}

    s = pw.virtual_slice(1, axes="x")
    step = pw.jit(update, slice=s, in_specs=P(), out_specs=P())
    want = jax.jit(update)
    x = jnp.float32(0.5)
    with Client(runtime) as client:
        state = {"a": jnp.asarray(X), "b": jnp.ones((4, 16))}
        ours = step.run(step.run(state, x, client=client), x, client=client)
        split = Signature.split
        splits = []
        monkeypatch.setattr(Signature, "split", lambda self, *a: splits.append(a) or split(self, *a))
        ours = step.run(ours, x, client=client)              # handles passed back: found by their tree and buffers
        assert splits == []
        state = want(want(want(state, x), x), x)
        renamed = {"a": ours["a"], "c": ours["b"]}            # the same leaves in another tree: another stage
        again = step.run(renamed, x, client=client)
        assert len(splits) == 1 and set(again) == {"a", "c"}
        for key in state:
            np.testing.assert_allclose(np.asarray(ours[key]), np.asarray(state[key]), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(again["c"]), np.asarray(want(state, x)["b"]), rtol=1e-6)
        del ours, renamed, again
    assert_nothing_left(runtime)


def test_plans_and_calls_the_lane_does_not_take(runtime, plan_builder):
    topology = runtime.resources.topology
    two_islands, want = cross_island(plan_builder, topology)
    assert runtime.lane(two_islands) is None                     # several islands
    s = pw.virtual_slice(1, axes="x")
    positive = pw.jit(lambda x: jnp.sum(x) > 0, slice=s, in_specs=P(), out_specs=P())
    square = pw.jit(lambda x: x * x, slice=s, in_specs=P(), out_specs=P())

    @pw.program
    def route(x):
        return pw.cond(positive(x), square, square, x)

    assert runtime.lane(route.compiled(X, runtime=runtime).plan) is None          # a host cond
    donating = pw.jit(lambda x, y: x + y, slice=s, in_specs=(P(), P()), out_specs=P(), donate_argnums=0)
    assert runtime.lane(donating.compiled(X, X, runtime=runtime).plan) is None    # a donated input
    plan = small(plan_builder, topology)
    lane = runtime.lane(plan)
    with Client(runtime) as client:
        [h] = client.run(plan, [jnp.asarray(X)], timeout=60)                       # a timeout
        [g] = client.run(plan, [jnp.asarray(X)], dispatch="sequential")            # sequential dispatch
        with Client(runtime) as other:
            shared = client.share(h, timeout=60)
            [r] = other.run(plan, [shared])                                         # a shared object
            np.testing.assert_allclose(np.asarray(r), chained_tanh2(X, 2), rtol=1e-6)
            del r
        np.testing.assert_allclose(np.asarray(g), chained_tanh2(X, 1), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(client.run(two_islands, [X])[0]), want, rtol=1e-6)
        assert lane.runs == 0
        del h, g, shared
    assert_nothing_left(runtime)


def test_other_policies_get_no_lane(device_map, plan_builder):
    for policy in ("share", "sjf", "deadline"):
        rt = Runtime(device_map, policy=policy)
        try:
            plan = small(plan_builder, device_map.topology)
            assert rt.lane(plan) is None
            with Client(rt) as client:
                np.testing.assert_allclose(np.asarray(client.run(plan, [jnp.asarray(X)])[0]),
                                           chained_tanh2(X, 1), rtol=1e-6)
            assert_nothing_left(rt)
        finally:
            rt.close()


def test_a_held_admission_or_a_queued_run_sends_the_next_run_the_general_way_in_ticket_order(runtime,
                                                                                            plan_builder):
    plan = small(plan_builder, runtime.resources.topology)
    lane = runtime.lane(plan)
    island = runtime.islands["island0"]
    with Client(runtime) as client, Client(runtime) as other:
        [first] = client.run(plan, [jnp.asarray(X)])
        runtime.scheduler.hold()
        queued = other.start(plan, [jnp.asarray(X)])           # queued: admission is held
        behind = client.start(plan, [jnp.asarray(X)])          # the queue is not empty: the general path
        assert lane.runs == 1 and not queued.admitted and not behind.admitted
        runtime.scheduler.release()
        after = client.start(plan, [jnp.asarray(X)])
        for run in (queued, behind, after):
            client.wait(run, timeout=60) if run.client_id == client.id else other.wait(run, timeout=60)
        order = [run_id for _, run_id, _ in island.executed]
        tickets = [ticket for ticket, _, _ in island.executed]
        assert order[-4:] == [first._run.id, queued.id, behind.id, after.id]
        assert tickets == sorted(tickets)
        for run in (queued, behind, after):
            runtime.release_results(run)
        del first
    assert_nothing_left(runtime)


def test_lane_and_general_runs_of_two_threads_keep_one_ticket_order(runtime, plan_builder):
    plan = small(plan_builder, runtime.resources.topology)
    lane = runtime.lane(plan)
    island = runtime.islands["island0"]
    errors = []

    def loop(client, general):
        try:
            y = jnp.asarray(X)
            for _ in range(CHAIN):
                [y] = client.run(plan, [y], timeout=60) if general else client.run(plan, [y])  # a timeout: general
            np.testing.assert_allclose(np.asarray(y), chained_tanh2(X, CHAIN), rtol=1e-5)
        except BaseException as error:  # noqa: BLE001  (reported by the test)
            errors.append(error)

    with Client(runtime) as a, Client(runtime) as b:
        threads = [threading.Thread(target=loop, args=(a, False)), threading.Thread(target=loop, args=(b, True))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads) and not errors
    tickets = [ticket for ticket, _, _ in island.executed]
    assert tickets == sorted(tickets) and len(tickets) == 2 * CHAIN
    assert 0 < lane.runs <= CHAIN
    assert_nothing_left(runtime)


def test_a_busy_island_queues_the_lane_run_behind_its_work(runtime, plan_builder):
    plan = small(plan_builder, runtime.resources.topology)
    lane = runtime.lane(plan)
    island = runtime.islands["island0"]
    with Client(runtime) as client:
        with running_inline(island):
            run = client.start(plan, [jnp.asarray(X)])
            assert lane.runs == 1
            with island.lock:
                assert run.id in island._runs    # queued for the executor, not executed by this thread
        client.wait(run, timeout=60)
        np.testing.assert_allclose(np.asarray(client.handles(run)[0]), chained_tanh2(X, 1), rtol=1e-6)
    assert_nothing_left(runtime)


@contextlib.contextmanager
def on_for_every_thread(nans: bool):
    """`jax_debug_nans` set for every thread (`jax.config.update`) in the block, if `nans`."""
    if not nans:
        yield
        return
    jax.config.update("jax_debug_nans", True)
    try:
        yield
    finally:
        jax.config.update("jax_debug_nans", False)


def below_ten_log(x):
    return jnp.log(x - 10.0)          # NaN for X


@pytest.mark.parametrize("path", ["fast lane", "general path"])
@pytest.mark.parametrize("read", ["an input", "an intermediate"])
def test_a_run_its_islands_executor_launches_checks_for_nans_as_its_call_said(runtime, plan_builder, path, read):
    """`with jax.debug_nans(True)` turns the check on for the calling thread alone, and JAX checks a launch's
    results under the flags of the thread that launches it: a run queued behind its island's work, launched by
    the island's executor, returned its NaN silently where `jax.jit` raises (a test of the inline case failed
    now and then in the full suite). A run now takes the flags of its call, on both paths; a run called
    without them is not checked. The launch that makes the NaN reads an input of the island, or an
    intermediate of its own run (which it hands to XLA's executable directly, `direct_call`)."""
    p = plan_builder(runtime.resources.topology, program="log")
    v0 = p.slice("v0", (1,), ("x",), "island0", (0, 1))
    if path == "fast lane":
        read_here, v = p.input((8, 16), v0), v0
    else:                              # two islands: never the lane
        v = p.slice("v1", (1,), ("x",), "island1", (0, 1))
        read_here = p.dcn(p.launch(tanh2, [p.input((8, 16), v0)], v0, [(), ()]), v, [(), ()])
    if read == "an intermediate":
        read_here = p.launch(tanh2, [read_here], v, [(), ()])
    plan = p.build([p.launch(below_ten_log, [read_here], v, [(), ()])])
    island = runtime.islands["island0" if path == "fast lane" else "island1"]
    with Client(runtime) as client:
        np.asarray(client.run(plan, [X])[0].result(60))                  # compiled; NaN, not checked
        for checked in (True, False):
            lane = runtime.lane(plan)            # (none for two islands)
            before = lane.runs if lane else 0
            with running_inline(island), jax.debug_nans(checked):
                run = client.start(plan, [X])
                with island.lock:
                    assert run.id in island._runs or run.id in island._failed   # the executor launches it
                assert (lane.runs if lane else 0) == before + (path == "fast lane")
            if checked:
                with pytest.raises(RunFailed, match=r"FloatingPointError: invalid value \(nan\) encountered in "):
                    client.wait(run, timeout=60)
            else:
                assert np.isnan(np.asarray(client.handles(run)[0].result(60))).all()
            del run
    assert_nothing_left(runtime)


def test_a_run_whose_call_turned_off_a_check_on_for_every_thread_is_not_checked(device_map, plan_builder):
    """`jax_debug_nans` on for every thread (`jax.config.update`) and turned off for the caller's (`with
    jax.debug_nans(False)`): `jax.jit` returns the NaN there, but a run queued behind its island's work was
    checked by the executor, under the global flag (found by a review). The runtime is made here: a thread
    that once ran under JAX's `debug_nans` context no longer sees the global flag in its launches (JAX's own
    behaviour), which would hide the fault."""
    with on_for_every_thread(True):
        rt = Runtime(device_map)
        try:
            p = plan_builder(rt.resources.topology, program="log")
            v = p.slice("v", (1,), ("x",), "island0", (0, 1))
            plan = p.build([p.launch(below_ten_log, [p.input((8, 16), v)], v, [(), ()])])
            with Client(rt) as client, jax.debug_nans(False):
                assert np.isnan(jax.jit(below_ten_log)(X)).all()
                with running_inline(rt.islands["island0"]):
                    [handle] = client.run(plan, [X])         # queued: the island's executor launches it
                assert np.isnan(np.asarray(handle.result(60))).all()
                del handle
            assert_nothing_left(rt)
        finally:
            rt.close()


def test_a_burst_beyond_the_credits_on_a_busy_island_keeps_the_lane_while_it_fits(device_map, plan_builder):
    """Two clients queue more runs than `CREDITS` behind a busy island: the lane reserves more while the
    ledger has room (none of its runs is over to give one back), and the first run that does not fit takes
    the general path, queued for admission until memory comes back. Threads fetching results meanwhile wait
    on their own runs (a run's end wakes only its waiters) and leave nothing behind."""
    fits = CREDITS + 8
    rt = Runtime(device_map, device_memory_bytes=fits * ONE_RUN)
    try:
        plan = small(plan_builder, device_map.topology)
        lane = rt.lane(plan)
        island = rt.islands["island0"]
        with Client(rt) as a, Client(rt) as b:
            with running_inline(island):             # every lane run queues behind it
                runs = [(a if i % 2 else b).start(plan, [jnp.asarray(X)]) for i in range(fits)]
                assert lane.runs == fits and all(run.admitted for run in runs)
                beyond = a.start(plan, [jnp.asarray(X)])
                assert lane.runs == fits and not beyond.admitted     # the general path: it waits for memory
                fetched = {}
                [result] = plan.outputs

                def fetch(run):
                    fetched[run.id] = island.fetch(run.id, result, timeout=60)
                fetchers = [threading.Thread(target=fetch, args=(run,)) for run in (runs[0], runs[-1])]
                for t in fetchers:
                    t.start()
                deadline = time.monotonic() + 60
                while len(island._waiters) < 2 and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert set(island._waiters) == {runs[0].id, runs[-1].id}    # each waits on its own run
            for t in fetchers:
                t.join(timeout=60)
            assert len(fetched) == 2 and not island._waiters                # woken, and nothing left behind
            for run in (*runs, beyond):
                (a if run.client_id == a.id else b).wait(run, timeout=60)
            want = chained_tanh2(X, 1)
            for run in (*runs, beyond):
                client = a if run.client_id == a.id else b
                np.testing.assert_allclose(np.asarray(client.handles(run)[0]), want, rtol=1e-6)
                rt.release_results(run)
        assert_nothing_left(rt)
    finally:
        rt.close()


def test_credits_go_back_when_the_scheduler_needs_the_memory(device_map, plan_builder):
    rt = Runtime(device_map, device_memory_bytes=3 * ONE_RUN)
    try:
        plan = small(plan_builder, device_map.topology)
        big = small(plan_builder, device_map.topology, shape=(8, 48))    # its peak is the whole device
        lane = rt.lane(plan)
        with Client(rt) as client:
            y = jnp.asarray(X)
            for _ in range(CHAIN):
                [y] = client.run(plan, [y])
            client.wait(y._run, timeout=60)
            del y
            rt.scheduler.retire_over()
            assert lane.free > 0                 # reserved for the lane's next runs
            rt.scheduler.hold()                  # runs will queue: the credits go back to the ledger
            assert lane.free == 0 and set(rt.scheduler.ledger.usage().values()) == {0}
            rt.scheduler.release()
            [y] = client.run(plan, [jnp.asarray(X)])
            client.wait(y._run, timeout=60)
            del y
            rt.scheduler.retire_over()
            assert lane.free > 0
            [h] = client.run(big, [np.ones((8, 48), np.float32)])      # fits only once they are back
            np.testing.assert_allclose(np.asarray(h), np.asarray(jax.jit(tanh2)(np.ones((8, 48)))), rtol=1e-6)
            assert lane.free == 0
            del h
        assert_nothing_left(rt)
    finally:
        rt.close()


def test_a_failing_lane_run_fails_alone_and_keeps_nothing(runtime, plan_builder):
    plan = small(plan_builder, runtime.resources.topology)
    lane = runtime.lane(plan)
    with Client(runtime) as client:
        bad = run_failing_on_the_island(client, plan, lane.island, jnp.asarray(X))
        with pytest.raises(RunFailed, match="deleted"):
            bad.result(timeout=60)
        [good] = client.run(plan, [jnp.asarray(X)])
        np.testing.assert_allclose(np.asarray(good), chained_tanh2(X, 1), rtol=1e-6)
        assert lane.runs == 2
        del bad, good
    assert_nothing_left(runtime)


def test_a_handle_the_lane_cannot_read_at_once_sends_the_run_the_general_way(runtime, plan_builder):
    plan = small(plan_builder, runtime.resources.topology)
    lane = runtime.lane(plan)
    with Client(runtime) as client:
        [timed] = client.run(plan, [jnp.asarray(X)], timeout=60)   # a deadline: read once its run is over
        [y] = client.run(plan, [timed])
        np.testing.assert_allclose(np.asarray(y), chained_tanh2(X, 2), rtol=1e-6)
        assert lane.runs == 0
        [kept] = client.run(plan, [y])                               # kept on the lane's island: read in place
        assert lane.runs == 1
        kept.delete()
        with pytest.raises(ValueError, match="was released"):
            client.run(plan, [kept])                                 # the general path says what is wrong
        assert lane.runs == 1
        del timed, y
    assert_nothing_left(runtime)


@pytest.mark.parametrize("how", ["donated to a jax.jit", "deleted through result()"])
def test_a_handle_whose_array_was_deleted_outside_the_runtime_is_refused_at_the_call_on_either_path(
        runtime, plan_builder, how):
    """`result()` is the store's own array: a `jax.jit` it was donated to, or its `delete()`, deleted it behind
    the handle, which still said `is_deleted()` False; the lane read the deleted array from the store and its run
    failed on the island (RunFailed: 'Array has been deleted'; found by a fault finder). Now the handle says it is
    deleted, and reading it or passing it raises one line at the call, through the lane's plan (which leaves the
    run to the general path) or the general path (a call with a timeout). Its bytes stay counted until the handle
    is released, once."""
    plan = small(plan_builder, runtime.resources.topology)
    lane = runtime.lane(plan)
    with Client(runtime) as client:
        [y] = client.run(plan, [jnp.asarray(X)])
        client.wait(y._run, timeout=60)                              # kept on the lane's island: read in place
        assert lane.runs == 1 and not y.is_deleted()
        if how == "donated to a jax.jit":
            jax.jit(lambda v: v + 1.0, donate_argnums=0)(y).block_until_ready()
        else:
            y.result().delete()
        assert y.is_deleted()
        line = (rf"^handle to buffer {y._buffer} of run {y._run.id}: its array was deleted outside pathways-mlir "
                r"\(donated to a jax.jit, or deleted through result\(\)\)$")
        for call in (lambda: np.asarray(y), lambda: y.is_ready(), lambda: client.run(plan, [y]),
                     lambda: client.run(plan, [y], timeout=60)):
            with pytest.raises(ValueError, match=line):
                call()
        assert lane.runs == 1
        y.delete()
    assert_nothing_left(runtime)


def test_another_clients_handle_takes_the_general_path_which_refuses_it(runtime, plan_builder):
    """The lane read a handle of any client from its island's store: another client's run took the owner's result
    as it is (found by a fault finder; other clients read it through `owner.share`). Now the general path takes
    that run, and refuses the handle in one line; the owner's own run still reads it in place, through the lane."""
    plan = small(plan_builder, runtime.resources.topology)
    lane = runtime.lane(plan)
    with Client(runtime) as owner, Client(runtime) as other:
        [y] = owner.run(plan, [jnp.asarray(X)])
        owner.wait(y._run, timeout=60)                               # kept on the lane's island: readable at once
        assert lane.runs == 1
        with pytest.raises(ValueError, match=rf"^argument 0 of program @small is a handle of client {owner.id}, "
                                             rf"not of client {other.id}, which runs it: pass its owner's"):
            other.run(plan, [y])
        assert lane.runs == 1 and other.objects() == []
        [z] = owner.run(plan, [y])
        assert lane.runs == 2
        np.testing.assert_allclose(np.asarray(z), chained_tanh2(X, 2), rtol=1e-6)
        del y, z
    assert_nothing_left(runtime)


def test_an_array_of_another_dtype_is_refused_at_the_call_as_the_general_path_refuses_it(runtime, plan_builder):
    """The lane checked an array argument's shape, not its dtype: an int32 array for a float32 input was run,
    and failed later on the island (RunFailed), where a NumPy array (the general path) is refused at the call."""
    plan = small(plan_builder, runtime.resources.topology)
    lane = runtime.lane(plan)
    with Client(runtime) as client:
        for wrong in (jnp.asarray(X.astype(np.int32)), X.astype(np.int32)):
            with pytest.raises(TypeError, match=r"argument leaf 0 of program @small has dtype int32, but it was "
                                                r"compiled for float32\[8, 16\]"):
                client.run(plan, [wrong])
        np.testing.assert_allclose(np.asarray(client.run(plan, [jnp.asarray(X)])[0]), chained_tanh2(X, 1),
                                   rtol=1e-6)
        assert lane.runs == 1
    assert_nothing_left(runtime)


def test_a_step_over_hundreds_of_leaves_keeps_counts_and_releases_each_leaf_on_drop(runtime):
    leaves = 300

    def update(params, batch):
        return jax.tree.map(lambda w: w - 0.01 * batch.mean(), params)

    step = pw.jit(update, slice=pw.virtual_slice(1, axes="x"))
    want = jax.jit(update)
    batch = jnp.arange(4.0)
    params = {f"w{i}": jnp.full((16,), float(i)) for i in range(leaves)}
    island = runtime.islands["island0"]
    with Client(runtime) as client:
        ours, theirs = params, params
        for _ in range(CHAIN):
            ours, theirs = step.run(ours, batch, client=client), want(theirs, batch)
            with island.lock:         # a run in flight keeps one of its results to see its end, not all of them
                assert all(len(tracked) == 1 for tracked in island._in_flight.values())
        assert runtime.object_count() == len(client.objects()) == leaves
        assert runtime.status()["clients"][client.id] == {"objects": leaves, "bytes": leaves * 16 * 4}
        for key in list(ours)[: leaves // 2]:
            np.testing.assert_allclose(np.asarray(ours[key]), np.asarray(theirs[key]), rtol=1e-6)
            del ours[key]             # each leaf dropped is released at once, its siblings kept
        assert runtime.object_count() == leaves - leaves // 2
        for key in ours:
            np.testing.assert_allclose(np.asarray(ours[key]), np.asarray(theirs[key]), rtol=1e-6)
        del ours
    assert_nothing_left(runtime)


def test_a_lane_loop_of_all_reduce_steps_keeps_at_most_in_flight_runs_computing(runtime):
    """`w = step(w, x)` with nothing read, each step an all-reduce over 4 devices, through the lane: the island
    keeps at most `IN_FLIGHT` runs computing, as the general path does. The lane once let its credits' worth
    (33) compute at once, and XLA:CPU aborted the process in the all-reduce's rendezvous ('expected 8 threads
    to join the rendezvous, but only 6 of them arrived') in `pw-bench elastic-shrink` on a loaded machine."""
    @pw.jit(slice=pw.virtual_slice(4, axes="x"), in_specs=(P(), P("x")), out_specs=P())
    def descend(w, x):
        return w - 1e-3 * (x.T @ (x @ w)) / x.shape[0]

    rng = np.random.default_rng(5)
    w0 = rng.normal(size=(256, 256)).astype(np.float32) / 16
    x = rng.normal(size=(512, 256)).astype(np.float32)
    plan = descend.compiled(w0, x, runtime=runtime).plan
    island = runtime.islands[next(iter(plan.islands))]
    want, step = w0, jax.jit(descend.fn)
    with Client(runtime) as client:
        w, most = descend.run(w0, x, client=client), 0
        for _ in range(3 * IN_FLIGHT):
            want = step(want, x)
            w = descend.run(w, x, client=client)
            most = max(most, len(island._completions))
        assert runtime.lane(plan).runs >= 3 * IN_FLIGHT
        assert [i.collective for i in runtime.lane(plan).program] == [True]     # read from the compiled HLO
        elementwise = pw.jit(jnp.tanh, slice=pw.virtual_slice(4, axes="x"), in_specs=P("x"), out_specs=P("x"))
        elementwise.run(x, client=client).result(60)
        lane = runtime.lane(elementwise.compiled(x, runtime=runtime).plan)
        assert [i.collective for i in lane.program] == [False]       # its runs keep to their credits only
        np.testing.assert_allclose(np.asarray(w.result(120)), np.asarray(step(want, x)), rtol=1e-4, atol=1e-5)
    assert most <= IN_FLIGHT

"""The Ray backend on a local Ray instance: each island a Ray actor with its own JAX devices.

The same programs and plans as the embedded backend; arrays cross between
islands actor to actor; start messages and fetches go over the driver's TCP
connection to each actor. Skipped where Ray is not installed.
"""

import contextlib
import gc
import os
import signal
import socket
import threading
import time
import weakref
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.authentication import AuthenticationError, client_handshake
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.island_work import RunCancelled, RunFailed
from pathways_mlir.runtime.runtime import Runtime
from pathways_mlir.runtime.wire import send_message

ray = pytest.importorskip("ray")

from pathways_mlir.runtime.ray_backend import NAMESPACE, cluster_status, connection, island_name  # noqa: E402
from pathways_mlir.runtime.ray_backend.connection import IslandConnection  # noqa: E402
from pathways_mlir.runtime.ray_backend.start_channel import PENDING  # noqa: E402

from across_islands import across, bend, expected, grow, left  # noqa: E402
from fetching import stop_process, until  # noqa: E402
from wire_ranks import check_ranks_cross  # noqa: E402

X = np.random.default_rng(3).normal(size=(8, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def ray_runtime():
    rt = Runtime(backend="ray", islands=2, per_island=4)
    yield rt
    rt.close()


def test_a_second_owner_of_the_islands_is_one_clear_error(ray_runtime):
    with pytest.raises(ValueError, match=r"^the Ray cluster already has the actor of island island0 \(pw-island-"
                                         r"island0\): another process .* owns its islands"):
        Runtime(backend="ray", islands=2, per_island=2)


def test_start_messages_are_one_per_island_per_run_and_results_one_request(ray_runtime):
    before = {name: dict(island.calls) for name, island in ray_runtime.islands.items()}
    with Client(ray_runtime) as client:
        outs = [across.run(X, client=client) for _ in range(5)]
        for out in outs:
            np.testing.assert_array_equal(np.asarray(out), expected(X))
        assert {name: island.calls["start"] - before[name].get("start", 0)
                for name, island in ray_runtime.islands.items()} == {"island0": 5, "island1": 5}
        assert sum(island.calls["fetch"] - before[name].get("fetch", 0)
                   for name, island in ray_runtime.islands.items()) == 5


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_program_across_island_actors_matches_jax(ray_runtime, dispatch):
    with Client(ray_runtime) as client:
        plan = across.compiled(X, runtime=ray_runtime).plan
        assert {s.kind for steps in plan.islands.values() for s in steps} >= {"send", "recv"}
        out = across.run(X, dispatch=dispatch, client=client)
        np.testing.assert_array_equal(np.asarray(out), expected(X))


def test_island_actors_keep_64_bit_values_and_the_driver_narrows_as_its_jax_does(ray_runtime):
    """With `jax_enable_x64` in the driver, float64 and int64 arrays stay 64-bit on the actors (they once
    narrowed them, and the executables refused them); without it, the driver narrows a float64 NumPy
    argument to the float32 it was traced for, as `jax.jit` does, before an actor gets it."""
    def scale():
        return pw.jit(lambda a, b: a * b, slice=pw.virtual_slice(2, axes="x", island="island1"))

    with Client(ray_runtime) as client:
        narrowed = scale().run(np.arange(4.0), 2.0, client=client).result()
        assert narrowed.dtype == np.float32 and np.asarray(narrowed).tolist() == [0.0, 2.0, 4.0, 6.0]
        with jax.enable_x64(True):
            floats = scale().run(np.arange(4.0), 2.0, client=client).result()
            ints = scale().run(np.arange(4), 3, client=client).result()
    assert (floats.dtype, ints.dtype) == (np.float64, np.int64)
    assert np.asarray(floats).tolist() == [0.0, 2.0, 4.0, 6.0] and np.asarray(ints).tolist() == [0, 3, 6, 9]


def test_a_host_callback_is_refused_on_island_actors_in_one_line(ray_runtime):
    """A placed function that calls back to the host (jax.debug.print) stays in the driver's process, which the
    island actors are not: its plan is refused in one line when it is loaded, before an actor sees it."""
    def printing(v):
        jax.debug.print("v={v}", v=v)
        return v + 1

    placed = pw.jit(printing, slice=pw.virtual_slice(2, axes="x"))
    with Client(ray_runtime) as client, \
            pytest.raises(NotImplementedError, match=r"^executable @printing\w* calls back to the host \(jax.debug."
                                                     r"print, .*\), which only islands in the process that traced it "
                                                     r"can run, and this runtime's islands are Ray actors: run it on "
                                                     r"the embedded backend"):
        placed.run(np.ones(2, np.float32), client=client)


def test_the_driver_connection_refuses_a_peer_without_the_key_and_drops_a_malformed_frame(ray_runtime):
    """Hostile input on an island actor's listener: a peer that does not hold the key is refused (and the
    listener still takes the one that does); a frame that breaks the protocol drops that connection only; the
    runtime's own connection goes on."""
    actor = ray_runtime.islands["island0"]._actor
    key = bytes(range(32))
    host, port = ray.get(actor.open_connection.remote(key.hex()), timeout=60)
    with socket.create_connection((host, port), timeout=30) as stranger:
        with pytest.raises(AuthenticationError):
            client_handshake(stranger, bytes(32))
    with socket.create_connection((host, port), timeout=30) as keyed:
        client_handshake(keyed, key)
        send_message(keyed, {"number": "one", "work": None, "releases": [], "lends": []})
        assert keyed.recv(1) == b""                      # dropped: closed without a reply
    with Client(ray_runtime) as client:
        np.testing.assert_array_equal(np.asarray(across.run(X, client=client)), expected(X))


def test_an_island_actor_the_driver_cannot_reach_is_one_clear_error(ray_runtime):
    """An actor whose listener the driver cannot reach (a node that accepts no TCP from the driver) is an error
    naming the address and what is needed; the runtime would otherwise take the island as lost."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]              # nothing listens there once it is closed

    @ray.remote(num_cpus=0)
    class Unreachable:
        def open_connection(self, key_hex):
            return "127.0.0.1", closed_port

    actor = Unreachable.remote()
    try:
        with pytest.raises(ConnectionError, match=rf"^cannot reach the island actor at 127.0.0.1:{closed_port} "
                                                  rf"\(.*\): the driver must reach each island actor's node"):
            IslandConnection.open(actor, bytes(32))
    finally:
        ray.kill(actor)


def test_arrays_of_zero_size_cross_between_island_actors(ray_runtime):
    """The transfer server never completes a pull of a zero-size array (JAX 0.10.2): such a move goes by actor
    call, and such a handle argument through the driver."""
    empty = np.ones((4, 0), np.float32)
    with Client(ray_runtime) as client:
        assert np.asarray(across.run(empty, client=client).result(60)).shape == (4, 0)
        kept = on_left.run(empty, client=client)
        assert np.asarray(on_right.run(kept, client=client).result(60)).shape == (4, 0)


def test_arrays_of_up_to_64_dimensions_reach_the_actors_and_more_fail_only_their_call(ray_runtime):
    """An argument or result of rank over 32 (the wire's old limit; NumPy takes 64) broke the driver's connection
    to its actor: the island was lost, and every later run with it (found by a fault finder). The wire takes
    NumPy's 64 now. A JAX array may have more, which no frame carries: such an argument or result fails its own
    call in one line naming it, and the island goes on."""
    with Client(ray_runtime) as client:
        check_ranks_cross(pw.virtual_slice(2, axes="x", island="island1"), client, ValueError,
                          r"^result buffer \d+ of run \d+ has 65 dimensions, over the limit of 64 of an array sent")
    assert set(ray_runtime.islands) == {"island0", "island1"}


def test_many_runs_in_flight_keep_their_order_and_values(ray_runtime):
    with Client(ray_runtime) as client:
        outs = [across.run(X * k, client=client) for k in range(6)]
        for k, out in enumerate(outs):
            np.testing.assert_array_equal(np.asarray(out), expected(X * k))


def test_the_start_channel_keeps_the_replies_of_at_most_pending_messages_unread(ray_runtime):
    """Runs whose results are read, never waited for: the start channel once kept the replies of such a run's
    start calls (object references) until HISTORY (100,000) later runs, about 1.4 KB each in the driver."""
    starts = ray_runtime.islands._starts
    with Client(ray_runtime) as client:
        for _ in range(3 * PENDING):
            np.testing.assert_array_equal(np.asarray(across.run(X, client=client)), expected(X))
    assert len(starts._pending) <= PENDING


def test_data_dependent_branch_on_actors(ray_runtime):
    positive = pw.jit(lambda x: jnp.sum(x) > 0, slice=left, in_specs=P("x"), out_specs=P())

    @pw.program
    def route(x):
        return pw.cond(positive(x), grow, bend, x)

    with Client(ray_runtime) as client:
        for data, branch in ((np.abs(X), grow), (-np.abs(X), bend)):
            np.testing.assert_array_equal(np.asarray(route.run(data, client=client)),
                                          np.asarray(jax.jit(branch.fn)(data)))


def test_objects_are_reclaimed_on_the_actors_when_the_client_closes(ray_runtime):
    client = Client(ray_runtime)
    handles = [across.run(X, client=client) for _ in range(3)]
    for h in handles:
        np.asarray(h)
    assert len(client.objects()) == 3
    assert sum(ray_runtime.usage().values()) > 0
    client.close()
    assert sum(ray_runtime.usage().values()) == 0 and ray_runtime.object_count() == 0


def test_the_driver_forgets_a_plans_results_and_reads_with_the_plan(ray_runtime):
    """The driver kept, per plan ever run, its results' sizes (`RayCluster._results`) and the results read of
    its runs on each island (`RayIsland._read`) after the runtime forgot the plan: one entry each per program
    traced (a notebook's re-run cells, new shapes), for the driver's life. They go with the plan now."""
    compiled = pw.jit(lambda x: x * 3.0, slice=pw.virtual_slice(1, axes="d")).lower(X).compile(ray_runtime)
    key = ray_runtime.load(compiled.plan).key
    with Client(ray_runtime) as client:
        np.testing.assert_array_equal(np.asarray(compiled(X, client=client)), X * 3.0)
    assert key in ray_runtime.islands._results
    assert any(key in island._read for island in ray_runtime.islands.values())
    del compiled
    gc.collect()

    def forgotten():          # (the runs over retire, then the watchdog forgets the plan nothing holds)
        ray_runtime.usage()
        return key not in ray_runtime.islands._results and \
            not any(key in island._read for island in ray_runtime.islands.values())
    until(forgotten, "the driver forgets the plan's results and reads", 60)


def test_the_scheduler_charges_the_device_time_the_actors_measured(ray_runtime):
    plan = across.compiled(X, runtime=ray_runtime).plan
    key = ray_runtime.load(plan).key
    with Client(ray_runtime) as client:
        deadline = time.monotonic() + 60
        while ray_runtime.scheduler.estimates.measured(key) is None:     # a run's end may be learnt before it is timed
            assert time.monotonic() < deadline, "a run's measured device time reaches the scheduler within 60 s"
            run = client.start(plan, [X])
            while run.id in ray_runtime.scheduler._in_flight and time.monotonic() < deadline:
                ray_runtime.usage()                         # retires the run once the actors say it is over
                time.sleep(0.01)
        assert 0 < ray_runtime.scheduler.estimates.measured(key) < 60


@pytest.mark.parametrize("learnt_by", ["the scheduler's poll", "the client's wait"])
def test_a_run_that_failed_inside_its_actor_keeps_no_bytes_for_its_handles(ray_runtime, learnt_by):
    """A run that fails inside its island's actor (a launch raising there; here the actor's own island is told
    so, behind a long run) never has results, but the driver learnt of the failure only once a result was read:
    the scheduler kept its results' bytes for as long as their handles lived, so the next run on full memory
    was refused with `OutOfDeviceMemory`, "held by live handles". The actor now says what a run failed with
    when it says that the run is over, to the scheduler's poll (`runs_done`) and to a client's `wait`."""
    spin = pw.jit(lambda x: jax.lax.fori_loop(0, 2_000_000, lambda i, y: jnp.cos(y), x), slice=left,
                  in_specs=P("x"), out_specs=P("x"))
    inc = pw.jit(lambda x: x + 1, slice=left, in_specs=P("x"), out_specs=P("x"))
    actor = ray.get_actor(island_name("island0"), namespace=NAMESPACE)
    with Client(ray_runtime) as client:
        spin.compiled(X, runtime=ray_runtime), inc.compiled(X, runtime=ray_runtime)
        busy = spin.run(X, client=client)            # island0 computes for a while
        made = inc.run(X, client=client)             # behind it on island0
        run = made._run
        ray.get(actor.fail_run.remote(run.id, "a launch raised", "failed"), timeout=60)
        np.asarray(busy.result(120))
        del busy
        if learnt_by == "the client's wait":
            with pytest.raises(RunFailed, match=r"^a launch raised$"):
                client.wait(run, timeout=60)
        until(lambda: ray_runtime.usage() is not None and run.retired, "the failed run retired", 60)
        assert sum(ray_runtime.usage().values()) == 0, "a run that failed in its actor holds bytes for its handle"
        assert isinstance(run.error, RunFailed) and str(run.error) == "a launch raised"
        with pytest.raises(RunFailed, match=r"^a launch raised$"):
            np.asarray(made)


@partial(pw.jit, slice=left, in_specs=P("x"), out_specs=(P("x"), P("x")))
def two_on_left(x):
    return x * 2.0, x * 3.0


@pw.program
def two_then_long_across(x):
    a, b = two_on_left(x)
    return a, b, grow(spin_on_right(a))


@partial(pw.jit, slice=pw.virtual_slice(2, axes="x", name="right", island="island1"), in_specs=P("x"),
         out_specs=P("x"))
def spin_on_right(x):
    return jax.lax.fori_loop(0, 5_000_000, lambda i, y: jnp.cos(y), x)     # seconds


def test_a_failed_runs_values_fetched_with_a_sibling_go_when_its_handles_do(ray_runtime):
    """Reading a result brings back the run's other small results already produced (siblings), kept in the
    driver until read or released. Once the driver learnt of a run's failure from its actor, a release of such
    a result returned before it dropped the kept value: it stayed for as long as the client lived (found by a
    review)."""
    proxy = ray_runtime.islands["island0"]
    with Client(ray_runtime) as client:
        [np.asarray(h) for h in two_then_long_across.run(X, client=client)]    # read both: siblings from now on
        made = two_then_long_across.run(X, client=client)
        run = made[0]._run
        np.asarray(made[0])                      # made[1] comes back with it, while island1 computes
        assert (run.id, made[1]._buffer) in proxy._fetched
        assert client.cancel(made[0])
        until(lambda: ray_runtime.usage() is not None and run.retired and run.id in proxy._failed,
              "the cancelled run retired, its failure known", 120)
        del made
        gc.collect()
        ray_runtime.usage()                      # (handles dropped in a cycle are released with the next call)
        assert [key for key in proxy._fetched if key[0] == run.id] == []


def test_handles_passed_to_later_runs_stay_on_their_island(ray_runtime):
    """A chain of runs each taking the last one's handle: the value never comes to the driver (no fetch
    until the end), even with each handle released right after the call that takes it."""
    fetches = {name: island.calls["fetch"] for name, island in ray_runtime.islands.items()}
    with Client(ray_runtime) as client:
        y, want = across.run(X, client=client), expected(X)
        for _ in range(4):
            nxt = across.run(y, client=client)
            y.delete()                                  # released at once: it travels after the start
            y, want = nxt, expected(want)
        assert {n: i.calls["fetch"] - fetches[n] for n, i in ray_runtime.islands.items()} == \
            {"island0": 0, "island1": 0}
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-6)
        assert client.objects() and ray_runtime.object_count() == 1


def test_a_run_waits_on_its_island_for_an_argument_not_produced_yet(ray_runtime):
    """The argument's run is still parked at a recv from the other island (which computes for a while) when
    the next run, on the island that will hold the argument, takes it: that run waits there, then goes on."""
    far = pw.virtual_slice(2, axes="x", name="far", island="island1")
    late = pw.jit(lambda x: jax.lax.fori_loop(0, 200_000, lambda i, y: jnp.cos(y), x), slice=far,
                  in_specs=P("x"), out_specs=P("x"))

    @pw.program
    def produce(x):
        return grow(late(x))            # late on island1, then over DCN to grow on island0

    @pw.program
    def again(x):
        return grow(x)                  # on island0, where produce's result lives: a reference

    with Client(ray_runtime) as client:
        produce.compiled(X, runtime=ray_runtime), again.compiled(X, runtime=ray_runtime)   # compiled first
        out = again.run(produce.run(X, client=client), client=client)
        g = jax.jit(grow.fn)
        np.testing.assert_allclose(np.asarray(out), g(g(jax.jit(late.fn)(X))), rtol=1e-5)


def test_a_run_taking_a_failed_runs_result_fails_naming_it(ray_runtime):
    spin = pw.jit(lambda x: jax.lax.fori_loop(0, 2_000_000, lambda i, y: jnp.cos(y), x), slice=left,
                  in_specs=P("x"), out_specs=P("x"))
    with Client(ray_runtime) as client:
        spin.compiled(X, runtime=ray_runtime)
        made = spin.run(X, client=client)
        assert client.cancel(made)     # its work here may be over, and an island may hold the result still
        with pytest.raises(RunFailed, match=r"takes a result of run \d+, which failed: run \d+ of .* was "
                                             r"cancelled by client"):
            np.asarray(across.run(made, client=client))


@pw.program
def on_left(x):
    return grow(x)          # island0


@pw.program
def on_right(x):
    return bend(x)          # island1


@pw.program
def twice_across(x):
    y = bend(grow(x))       # island0, then island1
    return y, grow(x), y


def test_a_result_returned_twice_is_one_handle_on_the_island_actors(ray_runtime):
    """`return y, y` across island actors: one handle in both places, kept on its island while either name
    holds it, and nothing left once both are dropped."""
    import gc

    with Client(ray_runtime) as client:
        first, other, second = twice_across.run(X, client=client)
        assert first is second
        del first
        gc.collect()
        np.testing.assert_allclose(np.asarray(second.result(60)), np.asarray(jax.jit(bend.fn)(jax.jit(grow.fn)(X))),
                                   rtol=1e-5)
        del second, other
        gc.collect()
        assert ray_runtime.object_count() == 0


def fetches(runtime) -> dict:
    """The driver's fetch messages so far, per island."""
    return {name: island.calls["fetch"] for name, island in runtime.islands.items()}


def test_a_handle_goes_island_to_island_for_an_input_on_another_island(ray_runtime):
    """A result kept on island0, passed to a program on island1 and released right after the call: island1
    pulls it from island0's transfer server; the driver never fetches it."""
    with Client(ray_runtime) as client:
        y = across.run(X, client=client)
        before, fetched = moves(ray_runtime), fetches(ray_runtime)
        out = on_right.run(y, client=client)
        y.delete()
        np.testing.assert_allclose(np.asarray(out.result(60)), np.asarray(jax.jit(bend.fn)(expected(X))), rtol=1e-5)
        after = moves(ray_runtime)
        assert fetches(ray_runtime)["island0"] == fetched["island0"]
        assert moved(before, after, "island1", "island0", "arguments_pulled") == 1
        assert moved(before, after, "island0", "island1", "arguments_offered") == 1
        assert "arguments pulled " in str(ray_runtime.status())
        assert ray_runtime.object_count() == 1


def test_a_chain_across_islands_passes_handles_island_to_island(ray_runtime):
    """x = on_right(on_left(x)), four times, each handle released once passed on: every value goes from one
    island to the other directly, and only the last is fetched."""
    g, b = jax.jit(grow.fn), jax.jit(bend.fn)
    with Client(ray_runtime) as client:
        on_left.compiled(X, runtime=ray_runtime), on_right.compiled(X, runtime=ray_runtime)
        before, fetched = moves(ray_runtime), fetches(ray_runtime)
        x, want = on_left.run(X, client=client), g(X)
        for i in range(4):
            nxt = on_right.run(x, client=client)
            x.delete()
            want = b(want)
            if i < 3:
                x = on_left.run(nxt, client=client)
                nxt.delete()
                want = g(want)
            else:
                x = nxt
        assert fetches(ray_runtime) == fetched
        np.testing.assert_allclose(np.asarray(x.result(60)), np.asarray(want), rtol=1e-5)
        after = moves(ray_runtime)
        assert moved(before, after, "island1", "island0", "arguments_pulled") == 4
        assert moved(before, after, "island0", "island1", "arguments_pulled") == 3
        assert ray_runtime.object_count() == 1


@contextlib.contextmanager
def admission_held(runtime):
    """Runs submitted in the block wait for admission until it ends."""
    runtime.scheduler.hold()
    try:
        yield
    finally:
        runtime.scheduler.release()


def produced(program, client):
    """`program(X)`'s handle, once its run is over."""
    handle = program.run(X, client=client)
    handle.result(60)
    return handle


def actor_process(island: str) -> int:
    """The process id of island `island`'s actor."""
    actor = ray.get_actor(island_name(island), namespace=NAMESPACE)
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60)


def actor_objects(island: str) -> int:
    """The results island `island`'s actor keeps, asked of the actor itself: no release queued in the driver
    goes with the question, as it does with `Runtime.object_count`."""
    return ray.get(ray.get_actor(island_name(island), namespace=NAMESPACE).object_count.remote(), timeout=60)


@pytest.mark.parametrize("program", ["same island", "other island"])
def test_a_release_while_the_run_waits_for_admission_waits_for_its_start(ray_runtime, program):
    """The handle is released while the run that takes it is queued (admission held): the release waits for
    that run's start, so the run still reads the result, which is gone once the run took it. Released again
    while a run taking it is queued, and that run cancelled: its start will never be sent, so the release
    leaves at once, with no further call."""
    taking = across if program == "same island" else on_right
    with Client(ray_runtime) as client:
        taking.compiled(X, runtime=ray_runtime)
        y = produced(across, client)
        with admission_held(ray_runtime):
            out = taking.run(y, client=client)
            y.delete()
            assert ray_runtime.object_count() == 1       # y, held back while its reader is queued
        fn = expected if taking is across else (lambda v: np.asarray(jax.jit(bend.fn)(v)))
        np.testing.assert_allclose(np.asarray(out.result(60)), fn(expected(X)), rtol=1e-5)
        assert ray_runtime.object_count() == 1          # out alone
        holder = out.island
        with admission_held(ray_runtime):
            queued = on_right.run(out, client=client)
            out.delete()
            assert actor_objects(holder) == 1           # held back while its reader is queued
            assert client.cancel(queued)                # never started: its pin goes, and out's release
        until(lambda: actor_objects(holder) == 0, f"the held-back release reaches {holder}", 60)


def test_a_lent_result_whose_run_fails_fails_its_reader_naming_it(ray_runtime):
    """The result is passed to island1 while its run is still parked on island0 (waiting for island1's long
    computation); cancelling that run makes island0 offer an error in its place, and the reader fails with
    it, leaving no pull under way. Island0 learns of the cancel from the driver or, first, from island1's
    error in place of the array it waits for (then its error names island1)."""
    far = pw.virtual_slice(2, axes="x", name="far", island="island1")
    late = pw.jit(lambda x: jax.lax.fori_loop(0, 20_000_000, lambda i, y: jnp.cos(y), x), slice=far,
                  in_specs=P("x"), out_specs=P("x"))

    @pw.program
    def produce(x):
        return grow(late(x))            # late on island1, then grow on island0, where the result stays

    with Client(ray_runtime) as client:
        produce.compiled(X, runtime=ray_runtime), on_right.compiled(X, runtime=ray_runtime)
        before = moves(ray_runtime)
        made = produce.run(X, client=client)
        out = on_right.run(made, client=client)             # a PeerRef: island0 lends what made will be
        assert client.cancel(made)
        with pytest.raises(RunFailed, match=r"takes a result of run \d+, which failed: (run \d+ failed on island1: )?"
                                             r"run \d+ of produce was cancelled by client"):
            out.result(120)
        assert moved(before, moves(ray_runtime), "island0", "island1", "arguments_offered") == 1
        deadline = time.monotonic() + 120
        while any(state["under_way"] != {"pulls": 0, "offers": 0}
                  for peers in moves(ray_runtime).values() for state in peers.values() if "under_way" in state):
            assert time.monotonic() < deadline, f"moves still under way: {moves(ray_runtime)}"
            time.sleep(0.05)
        # island1 runs its work in order: once a later run there is over, `late` is too, and the cancelled
        # run's send after it was made. Its peer was offered an error in its place, so it is dropped: it
        # once went by actor call, counted as a move of whatever the next test ran.
        after_late = pw.jit(lambda x: x + 1, slice=far)
        np.testing.assert_array_equal(np.asarray(after_late.run(X, client=client).result(120)), X + 1)
        assert moved(before, moves(ray_runtime), "island1", "island0", "by_actor_call") == 0


def moves(runtime) -> dict:
    """Per island, per peer: how its moves went (`transfers` in the island's status)."""
    return {name: island.status()["transfers"] for name, island in runtime.islands.items()}


def moved(before: dict, after: dict, island: str, peer: str, what: str) -> int:
    return after[island][peer].get(what, 0) - before[island].get(peer, {}).get(what, 0)


def test_moves_between_island_actors_go_over_the_transfer_server(ray_runtime):
    """`across` moves a 2-way sharded buffer to island1 and a replicated one back: both are pulled from the
    sender's transfer server (the replicated one as one copy), none goes by actor call."""
    before = moves(ray_runtime)
    with Client(ray_runtime) as client:
        np.testing.assert_array_equal(np.asarray(across.run(X, client=client)), expected(X))
    after = moves(ray_runtime)
    for island, peer in (("island0", "island1"), ("island1", "island0")):
        assert after[island][peer]["path"] == "transfer server"
        assert moved(before, after, island, peer, "pulled") == 1 and moved(before, after, island, peer, "offered") == 1
        assert moved(before, after, island, peer, "by_actor_call") == 0
        assert after[island][peer]["under_way"] == {"pulls": 0, "offers": 0}
    assert "moves with island1: transfer server; pulled " in str(ray_runtime.status())


wide = pw.virtual_slice(4, axes="w", name="wide", island="island1")
spread = pw.jit(lambda x: jnp.cos(x), slice=wide, in_specs=P("w"), out_specs=P("w"))
square = pw.virtual_slice((2, 2), axes=("a", "b"), name="square", island="island1")
tile = pw.jit(lambda x: jnp.sin(x), slice=square, in_specs=P("a", "b"), out_specs=P("a", "b"))


@pw.program
def spread_alone(x):
    return spread(x)


@pw.program
def tiled_alone(x):
    return tile(x)


@pw.program
def narrow_after_wide(x):
    return grow(spread(x))


def test_shards_that_outnumber_the_receivers_devices_travel_gathered_over_the_transfer_server(ray_runtime):
    """Four distinct shards for a 2-device slice on the other island, sent by the plan (one mesh axis of 4)
    and as handles (that one, and a (2, 2) tiling): the sender gathers them into 2 and the receiver pulls
    them. Nothing goes by actor call or through the driver."""
    g = jax.jit(grow.fn)
    with Client(ray_runtime) as client:
        for program in (narrow_after_wide, spread_alone, tiled_alone, on_left):
            program.compiled(X, runtime=ray_runtime)
        before, fetched = moves(ray_runtime), fetches(ray_runtime)
        out = narrow_after_wide.run(X, client=client)
        np.testing.assert_allclose(np.asarray(out), np.asarray(g(jnp.cos(X))), rtol=1e-6)
        handles = [spread_alone.run(X, client=client), tiled_alone.run(X, client=client)]
        outs = [on_left.run(h, client=client) for h in handles]
        fetched_now = fetches(ray_runtime)
        for out, want in zip(outs, (jnp.cos(X), jnp.sin(X))):
            np.testing.assert_allclose(np.asarray(out.result(60)), np.asarray(g(want)), rtol=1e-6)
    after = moves(ray_runtime)
    assert fetched_now["island1"] == fetched["island1"]
    assert moved(before, after, "island1", "island0", "by_actor_call") == 0
    assert moved(before, after, "island1", "island0", "offered") == 1
    assert moved(before, after, "island0", "island1", "pulled") == 1
    assert moved(before, after, "island0", "island1", "arguments_pulled") == 2
    assert moved(before, after, "island1", "island0", "arguments_offered") == 2


def test_a_run_failing_before_its_send_ends_the_peers_pull(ray_runtime):
    """A run cancelled while its sender computes: the sender offers an error in place of the buffer, the
    receiver's pull ends, and nothing is left under way on either island."""
    spin = pw.jit(lambda x: jax.lax.fori_loop(0, 20_000_000, lambda i, y: jnp.cos(y), x), slice=left,
                  in_specs=P("x"), out_specs=P("x"))

    @pw.program
    def spin_then_bend(x):
        return bend(spin(x))

    with Client(ray_runtime) as client:
        spin_then_bend.compiled(X, runtime=ray_runtime)
        out = spin_then_bend.run(X, client=client)
        assert client.cancel(out)
        with pytest.raises(RunFailed):
            out.result(timeout=120)
        deadline = time.monotonic() + 120
        while any(state["under_way"] != {"pulls": 0, "offers": 0}
                  for peers in moves(ray_runtime).values() for state in peers.values() if "under_way" in state):
            assert time.monotonic() < deadline, f"moves still under way: {moves(ray_runtime)}"
            time.sleep(0.05)
        np.testing.assert_array_equal(np.asarray(across.run(X, client=client)), expected(X))


def test_a_handle_lent_to_another_island_then_donated_waits_for_the_pull(ray_runtime):
    """y is passed to a run on island1, then donated to a run on island0 that overwrites it, while island1's
    process is stopped: island0 offers y, and the donating run waits there until island1 has pulled it, as the
    embedded backend's donation waits for an earlier reader; once island1 goes on, both see y's value."""
    twice = pw.jit(lambda x: x * 2.0, slice=left, in_specs=P("x"), out_specs=P("x"), donate_argnums=0)
    g = np.asarray(jax.jit(grow.fn)(X))
    island0 = ray.get_actor(island_name("island0"), namespace=NAMESPACE)

    def waiting(run_id: int) -> bool:             # asked of the actor: the driver may wait for island1
        runs = ray.get(island0.status.remote(), timeout=60)["runs"]
        return any(r["run"] == run_id and "donates" in r["waits_for"] for r in runs)

    with Client(ray_runtime) as client:
        on_right.compiled(X, runtime=ray_runtime), twice.compiled(X, runtime=ray_runtime)
        y = produced(on_left, client)
        pid = actor_process("island1")
        try:
            stop_process(pid, 60)
            out = on_right.run(y, client=client)
            doubled = twice.run(y, client=client)
            until(lambda: waiting(doubled._run.id), "the donating run waits on island0 for island1's pull", 60)
        finally:
            os.kill(pid, signal.SIGCONT)
        np.testing.assert_allclose(np.asarray(out.result(60)), np.asarray(jax.jit(bend.fn)(g)), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(doubled.result(60)), g * 2, rtol=1e-6)
        until(lambda: offers(ray_runtime, "island0", "island1") == 0, "island0's offer to island1 is pulled", 60)


def offers(runtime, island: str, peer: str) -> int:
    """What `island` offers `peer` on its transfer server that `peer` has not pulled."""
    return runtime.islands[island].status()["transfers"].get(peer, {}).get("under_way", {}).get("offers", 0)


def test_offers_to_a_lost_reader_are_withdrawn(ray_runtime):
    """island1's process is stopped when a run there takes a result kept on island0: island0 offers it for a
    pull that never comes. Once island1 is killed and taken out, island0 withdraws the offer (its array would
    stay on the transfer server for good), and the run fails with `IslandLost`."""
    with Client(ray_runtime) as client:
        on_right.compiled(X, runtime=ray_runtime)
        y = produced(on_left, client)
        withdrawn = moves(ray_runtime)["island0"].get("island1", {}).get("offers_withdrawn", 0)
        pid = actor_process("island1")
        version = ray_runtime.resources.version
        try:
            stop_process(pid, 60)
            out = on_right.run(y, client=client)
            until(lambda: offers(ray_runtime, "island0", "island1") == 1, "island0 offers y to island1", 60)
        finally:
            os.kill(pid, signal.SIGKILL)
        until(lambda: ray_runtime.resources.version != version, "the monitor takes island1 out", 60)
        until(lambda: offers(ray_runtime, "island0", "island1") == 0, "island0 withdraws its offer", 60)
        assert ray_runtime.islands["island0"].status()["transfers"]["island1"]["offers_withdrawn"] == withdrawn + 1
        with pytest.raises(pw.IslandLost, match="island island1 was lost"):
            out.result(60)
        ray_runtime.restore_island("island1")
        np.testing.assert_array_equal(np.asarray(across.run(X, client=client).result(60)), expected(X))


def within(seconds: float, call):
    """`call()`'s result (or what it raised), failing if it has not returned within `seconds`: a wait that
    would otherwise never end is left to a daemon thread."""
    outcome, done = [], threading.Event()

    def run():
        try:
            outcome.append((True, call()))
        except BaseException as error:  # noqa: BLE001  (raised again in the test's thread)
            outcome.append((False, error))
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(seconds), f"{call} returned within {seconds} s"
    returned, value = outcome[0]
    if not returned:
        raise value
    return value


def test_an_island_actor_that_stalls_bounds_status_close_and_deadlines(ray_runtime):
    """island1's actor stalls with its connections open (its process stopped, as on a hung host). Found by a
    fault finder: `status()` took about 130 s (the releases sent before each island's question waited for every
    island's acknowledgement, up to 120 s), and reported island0 unreachable too; closing a client never
    returned (its objects' release asked island1 with no timeout); a run started with `timeout=3` on island1
    raised `RunCancelled` only after about 30 s (each look at whether it was over waited 10 s). Now island1
    alone is reported, within `STATUS_TIMEOUT`; the close and the cancel are bounded. A run whose argument is
    larger than the sockets hold, started on island1 then, held the scheduler's lock in its send for up to 120 s
    (found by a review): it now returns at once, and fails with `IslandLost` once the island is taken out."""
    large = np.ones(8 << 20, np.float32)                    # 32 MiB
    add_one = pw.program(pw.jit(lambda x: x + 1.0, slice=pw.virtual_slice(2, axes="x", name="r", island="island1"),
                                in_specs=P("x"), out_specs=P("x")))
    with Client(ray_runtime) as client:
        on_right.compiled(X, runtime=ray_runtime), on_left.compiled(X, runtime=ray_runtime)
        add_one.compiled(large, runtime=ray_runtime)
        leaving = Client(ray_runtime)
        kept = produced(on_right, leaving)           # on island1: closing `leaving` releases it there
        run = kept._run
        until(lambda: ray_runtime.usage() is not None and run.retired, "its run known to be over", 60)
        np.asarray(produced(on_right, client))       # dropped: a release queued for island1
        pid = actor_process("island1")
        version = ray_runtime.resources.version
        try:
            stop_process(pid, 60)
            sent = within(30, lambda: add_one.run(large, client=client))
            report = within(60, ray_runtime.status)["islands"]
            assert report["island1"] == {"unreachable": "TimeoutError: island island1 did not answer within 10 s"}
            assert "unreachable" not in report["island0"], report["island0"]
            # pw-serve --status --address: every island asked at once, within what is left of its --timeout.
            address = ray.get_runtime_context().gcs_address
            report = within(30, lambda: cluster_status(address, time.time() + 3))["islands"]
            assert report["island1"] == {"unreachable": "TimeoutError: the island actor did not answer before the "
                                                  "report's deadline"}
            assert "unreachable" not in report["island0"], report["island0"]
            late = on_right.run(X, client=client, timeout=3)
            with pytest.raises(RunCancelled, match=r"did not finish within its deadline"):
                within(25, lambda: np.asarray(late))
            del kept
            within(60, leaving.close)
        finally:
            os.kill(pid, signal.SIGKILL)
        until(lambda: ray_runtime.resources.version != version, "the monitor takes island1 out", 60)
        with pytest.raises(pw.IslandLost):
            sent.result(60)
        ray_runtime.restore_island("island1")
        np.testing.assert_array_equal(np.asarray(across.run(X, client=client).result(60)), expected(X))


def test_starts_to_a_stalled_actor_hold_up_no_one_and_the_monitor_takes_it_out(ray_runtime, monkeypatch):
    """island1's actor stalls (its process stopped) and runs keep coming for it. The start channel read the
    acknowledgement of the message `PENDING` sends back before each send, under the scheduler's lock: the
    33rd run waited for it up to `REPLY_TIMEOUT` (120 s), and every client on every island with it (left open by
    session 66, found by a fixer). Sends never wait now; the island monitor finds the actor that acknowledged
    nothing for `REPLY_TIMEOUT` (shortened here, once the sends are made) and takes the island out."""
    with Client(ray_runtime) as client, Client(ray_runtime) as other:
        on_right.compiled(X, runtime=ray_runtime), on_left.compiled(X, runtime=ray_runtime)
        np.asarray(produced(on_right, client))
        pid = actor_process("island1")
        version = ray_runtime.resources.version
        try:
            stop_process(pid, 60)
            sent = within(30, lambda: [on_right.run(X, client=client) for _ in range(PENDING + 8)])
            np.testing.assert_allclose(within(30, lambda: np.asarray(on_left.run(X, client=other).result(30))),
                                       np.asarray(jax.jit(grow.fn)(X)), rtol=1e-6)
            monkeypatch.setattr(connection, "REPLY_TIMEOUT", 2.0)
            until(lambda: ray_runtime.resources.version != version, "the monitor takes island1 out", 60)
        finally:
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(pw.IslandLost, match="island island1 was lost"):
            sent[-1].result(60)
        del sent
        ray_runtime.restore_island("island1")
        np.testing.assert_array_equal(np.asarray(across.run(X, client=client).result(60)), expected(X))


def test_a_run_over_before_its_deadline_is_kept_though_its_actor_answers_late(ray_runtime):
    """The run is over on island1's actor well before its deadline, and the actor stalls from before the
    deadline until 5 s after it. A look that had no answer within 2 s said "not over", and the watchdog
    cancelled the run, losing its result (found by a review); a look before a cancel waits `STATUS_TIMEOUT`."""
    with Client(ray_runtime) as client:
        on_right.compiled(X, runtime=ray_runtime)
        late = on_right.run(X, client=client, timeout=3)
        actor = ray.get_actor(island_name("island1"), namespace=NAMESPACE)
        until(lambda: ray.get(actor.runs_done.remote([late._run.id]), timeout=60), "the run over on the actor", 60)
        pid = actor_process("island1")
        try:
            stop_process(pid, 60)
            time.sleep(max(0.0, late._run.deadline + 5 - time.monotonic()))
        finally:
            os.kill(pid, signal.SIGCONT)
        np.testing.assert_allclose(np.asarray(late.result(60)), np.asarray(jax.jit(bend.fn)(X)), rtol=1e-6)


@pytest.mark.parametrize("cancelled_by", ["its client", "admission"])
def test_a_queued_run_cancelled_while_its_arguments_island_stalls_holds_up_no_one(ray_runtime, cancelled_by):
    """y, kept on island1, is released while a run taking it waits for admission (its release held back for
    that run's start), and island1's actor stalls (its process stopped); then the run is cancelled: by its
    client, or by admission, under the scheduler's lock, as one that can never fit beside a handle held there
    (`OutOfDeviceMemory`; island1's memory made just too small for it). The cancel waited until island1 took
    y's release, up to 120 s, then took island1 out (found by a review): the cancelling client waited, and
    under the lock so did every client on every island. Now the release leaves without waiting: another
    client's run on island0 goes on, and island1 drops y once it resumes."""
    ledger = ray_runtime.scheduler.ledger
    capacity = dict(ledger.capacity)
    with Client(ray_runtime) as client, Client(ray_runtime) as other:
        on_left.compiled(X, runtime=ray_runtime), on_right.compiled(X, runtime=ray_runtime)
        y = produced(on_right, client)                      # kept on island1
        held = produced(on_right, client)                   # kept on island1 too
        until(lambda: ray_runtime.usage() is not None and y._run.retired and held._run.retired,
              "their runs retired (their results' bytes alone kept in the ledger)", 60)
        pid = actor_process("island1")
        try:
            with admission_held(ray_runtime):
                queued = on_right.run(y, client=client)
                y.delete()
                # y's release is held back; the question waits until island1 took every message sent so far
                assert ray_runtime.islands["island1"].object_count() == 2
                if cancelled_by == "admission":
                    used = ledger.used["island1"]
                    ledger.capacity["island1"] = max(max(used[b:e]) + n for b, e, n in queued._run.need["island1"]) - 1
                stop_process(pid, 60)
                cancel = (lambda: client.cancel(queued)) if cancelled_by == "its client" else \
                    ray_runtime.scheduler.release
                cancelling = threading.Thread(target=cancel, daemon=True)
                cancelling.start()
                until(lambda: queued._run.error is not None, "the queued run is cancelled", 60)

                def run_on_island0():
                    ray_runtime.scheduler.release()         # (admission goes on: the other run is admitted)
                    return np.asarray(on_left.run(X, client=other).result(30))

                np.testing.assert_allclose(within(30, run_on_island0), np.asarray(jax.jit(grow.fn)(X)), rtol=1e-6)
                cancelling.join(30)
                assert not cancelling.is_alive(), "the cancel returned within 30 s"
        finally:
            os.kill(pid, signal.SIGCONT)
            ledger.capacity.update(capacity)
        expected_error = RunCancelled if cancelled_by == "its client" else pw.OutOfDeviceMemory
        with pytest.raises(expected_error):
            queued.result(60)
        until(lambda: actor_objects("island1") == 1, "island1 drops y once it resumes", 60)
        assert [i.name for i in ray_runtime.resources.topology.islands] == ["island0", "island1"]


@pytest.mark.parametrize("restored", [False, True], ids=["lost", "lost and restored"])
def test_a_holder_lost_before_the_pull_fails_the_reader_with_island_lost(ray_runtime, restored):
    """A result kept on island0 is passed to a run on island1 that waits for admission; island0 is lost (and
    restored, fresh) before that run starts: the run fails with `IslandLost`, as a reader on island0 would."""
    with Client(ray_runtime) as client:
        on_right.compiled(X, runtime=ray_runtime)
        y = produced(on_left, client)
        with admission_held(ray_runtime):
            out = on_right.run(y, client=client)
            ray_runtime.lose_island("island0")
            if restored:
                ray_runtime.restore_island("island0")
        try:
            with pytest.raises(pw.IslandLost, match=r"^island island0 was lost, with the results of run \d+ that "
                                                    r"lived there$"):
                out.result(60)
        finally:
            if not restored:
                ray_runtime.restore_island("island0")
        np.testing.assert_array_equal(np.asarray(across.run(X, client=client).result(60)), expected(X))


def test_zz_a_killed_island_actor_is_lost_and_can_be_restored(ray_runtime):
    """Last: island1's actor is killed. Programs move to island0, a result it kept raises `IslandLost` when
    passed on, and restore_island brings a fresh actor back, with a connection of its own. A run under way on
    it raises `IslandLost` when read, and its handle, dropped, is collected (raising the proxy's kept error
    attached the reader's frames to it, which kept the handle, and its bytes, for good)."""
    double = pw.program(pw.jit(lambda x: x * 2.0, slice=pw.virtual_slice(2, axes="x", name="anywhere"),
                               in_specs=P("x"), out_specs=P("x")))
    spin = pw.program(pw.jit(lambda x: jax.lax.fori_loop(0, 50_000_000, lambda i, y: jnp.tanh(y), x),
                             slice=pw.virtual_slice(2, axes="x", island="island1", name="spinning")))
    with Client(ray_runtime) as client:
        np.testing.assert_array_equal(np.asarray(across.run(X, client=client)), expected(X))
        kept = on_right.run(X, client=client)            # kept on island1
        kept.result(60)
        spin.compiled(X, runtime=ray_runtime)
        busy = spin.run(X, client=client)                # under way on island1 when it dies
        version = ray_runtime.resources.version
        ray.kill(ray.get_actor(island_name("island1"), namespace=NAMESPACE))
        deadline = time.monotonic() + 60
        while ray_runtime.resources.version == version:
            assert time.monotonic() < deadline, "the monitor takes island1 out within 60 s"
            time.sleep(0.02)
        for _ in range(2):
            with pytest.raises(pw.IslandLost, match="island island1 was lost"):
                busy.result(60)
        busy = weakref.ref(busy)
        gc.collect()
        assert busy() is None
        assert [i.name for i in ray_runtime.resources.topology.islands] == ["island0"]
        with pytest.raises(ValueError, match="cannot place slice .*: it asks for island 'island1', which the "
                                             "topology does not have \\(islands: island0\\)"):
            across.run(X, client=client)
        np.testing.assert_array_equal(np.asarray(double.run(X, client=client)), X * 2)
        with pytest.raises(pw.IslandLost, match="island island1 was lost"):
            on_left.run(kept, client=client)             # its holder died: no reference to it is sent
        ray_runtime.restore_island("island1")
        fresh = ray_runtime.islands["island1"].status()["transfers"]["island0"]
        assert fresh["path"] == "transfer server" and fresh["pulled"] == 0   # its path, before its first move
        with pytest.raises(pw.IslandLost, match="island island1 was lost"):
            on_left.run(kept, client=client)             # nor to the fresh actor, which never had it
        for k in range(3):
            np.testing.assert_array_equal(np.asarray(across.run(X * k, client=client)), expected(X * k))
    assert ray_runtime.object_count() == 0


def test_a_question_about_objects_waits_for_releases_sent_with_earlier_starts(ray_runtime):
    """A release leaves with the next start message, here one for the other island; a question about objects
    asked right after that start (whose acknowledgement the driver has not read) sees it taken, every round."""
    island0 = ray_runtime.islands["island0"]
    with Client(ray_runtime) as client:
        on_right.compiled(X, runtime=ray_runtime)
        for _ in range(20):
            y = produced(on_left, client)                # kept on island0
            y.delete()                                   # queued in the driver: it leaves with the next start
            z = on_right.run(X, client=client)           # work for island1 only; the message reaches both
            assert island0.object_count() == 0
            z.result(60)
            del z


fan = pw.jit(lambda x: tuple(x * i for i in range(64)), slice=left, in_specs=P("x"), out_specs=(P("x"),) * 64)


@pw.program
def sixty_four_on_left(x):
    return fan(x)


def test_a_question_about_objects_waits_for_release_batches_sent_without_waiting(ray_runtime):
    """Dropping `RELEASE_BATCH` x 24 handles sends their releases in 24 messages the driver does not wait
    for, and leaves none queued; a question asked next waits on the actor until it took them all (on
    db8518d it counted some of them, in each of two tries)."""
    with Client(ray_runtime) as client:
        for _ in range(8):
            handles = [h for _ in range(24) for h in sixty_four_on_left.run(X, client=client)]
            handles[-1].result(60)
            assert ray_runtime.object_count() == 24 * 64
            del handles
            assert ray_runtime.object_count() == 0


quad = pw.virtual_slice(4, axes="d", name="quad", island="island0")
descend = pw.jit(lambda w, x: w - 0.01 * jnp.mean(jnp.tanh(x @ w), axis=0), slice=quad, in_specs=(P(), P("d")),
                 out_specs=P())


@pw.program
def descend_step(w, x):
    return descend(w, x)


def test_a_loop_of_steps_with_an_all_reduce_never_waits_on_its_results(ray_runtime):
    """`w = step(w, x)` 400 times with nothing read until the end, each step an all-reduce over 4 devices: the
    island keeps at most `IN_FLIGHT` runs computing. Unbounded, XLA:CPU aborted the island's process in the
    all-reduce's rendezvous after 40 s (the run then fails with `IslandLost`)."""
    rng = np.random.default_rng(5)
    w0 = rng.normal(size=(512, 512)).astype(np.float32) / 23
    x = rng.normal(size=(512, 512)).astype(np.float32)
    step = jax.jit(descend.fn)
    want = w0
    for _ in range(400):
        want = step(want, x)
    with Client(ray_runtime) as client:
        w = descend_step.run(w0, x, client=client)
        for _ in range(399):
            w = descend_step.run(w, x, client=client)
        np.testing.assert_allclose(np.asarray(w.result(120)), np.asarray(want), rtol=1e-4, atol=1e-5)


churn = pw.jit(lambda x, n: jax.lax.fori_loop(0, n, lambda _, y: jnp.sin(y) * 0.5 + 0.25, x), slice=left,
               in_specs=(P("x"), P()), out_specs=P("x"))


@pw.program
def churn_on_left(x, n):
    return churn(x, n)


def test_runs_queued_behind_a_long_computation_do_not_hold_the_start_channel(ray_runtime):
    """80 runs with host arguments queued on island0 behind a computation of several seconds are all sent
    while it computes. Through the compiled start graph (gone since) each argument arrived as a view of one of
    the channel's 64 buffers; kept until its run executed, the 65th start waited (spinning) for the
    computation to end."""
    with Client(ray_runtime) as client:
        churn_on_left.run(X, np.int32(1), client=client).result(60)              # compiled
        on_left.run(X, client=client).result(60)
        began = time.perf_counter()
        churn_on_left.run(X, np.int32(100_000), client=client).result(60)
        iterations = int(100_000 * 8 / max(time.perf_counter() - began, 1e-3))    # about 8 s of computation
        long = churn_on_left.run(X, np.int32(iterations), client=client)
        queued = [on_left.run(X + i, client=client) for i in range(80)]
        assert not ray_runtime.run_done(long._run)
        for i in (0, 79):
            np.testing.assert_allclose(np.asarray(queued[i].result(120)), np.asarray(grow.fn(X + i)), rtol=1e-6)
        long.result(120)


def test_device_get_of_a_pytree_costs_one_fetch_per_island(ray_runtime):
    """`jax.device_get` announces every leaf (`copy_to_host_async`) before it reads them: the first read from
    the island brings back the others computed there, so the first run of a plan of 40 results costs one fetch
    request, not 40 (a Ray fault finder: 2101 requests, 3.5 s, for an optimizer's state). The values are the
    same; a handle released after its announcement is not brought back, and what was brought back goes once
    read or released."""
    width = 40
    make = pw.jit(lambda x: {f"w{i}": x + i for i in range(width)},
                  slice=pw.virtual_slice(2, axes="x", island="island0"))
    proxy = ray_runtime.islands["island0"]
    with Client(ray_runtime) as client:
        state = make.run(np.zeros(4, np.float32), client=client)
        client.wait(state["w0"]._run, timeout=120)
        before = proxy.calls["fetch"]
        values = jax.device_get(state)
        assert proxy.calls["fetch"] - before == 1
        assert {name: value.tolist() for name, value in values.items()} == {f"w{i}": [i] * 4 for i in range(width)}
        assert proxy._fetched == {} and proxy._wanted == {} and proxy._fetched_bytes == 0

        again = make.run(np.ones(4, np.float32), client=client)
        client.wait(again["w0"]._run, timeout=120)
        for name in again:
            again[name].copy_to_host_async()
        released = again.pop("w1")
        released.delete()
        del again["w2"]
        assert np.asarray(again["w0"]).tolist() == [1] * 4
        assert set(proxy._fetched) == {(again["w3"]._run.id, again[f"w{i}"]._buffer) for i in range(3, width)}
        with pytest.raises(ValueError, match=r"^handle to buffer \d+ of run \d+ was released$"):
            np.asarray(released)
        assert np.asarray(again.pop("w3")).tolist() == [4] * 4      # taken as it was brought back
        del again
        assert proxy._fetched == {} and proxy._wanted == {} and proxy._fetched_bytes == 0


def test_fetches_in_flight_at_once_share_the_read_ahead_bound(ray_runtime, monkeypatch):
    """What the driver holds of values brought back ahead of their read is bounded per island (`FETCHED_BYTES`),
    but each fetch chose up to the whole room, not counting what a fetch still in flight had asked for: two
    threads reading at once held twice the bound (a review: 128 MiB of 64). Now what fetches in flight ask for
    counts, until their replies come, they fail, or the results are released."""
    width = 8
    make = pw.jit(lambda x: {f"w{i}": x + i for i in range(width)},
                  slice=pw.virtual_slice(2, axes="x", island="island0"))
    proxy = ray_runtime.islands["island0"]
    request = proxy._request
    in_flight, go_on = threading.Event(), threading.Event()

    def held_back(run_id, buffer, timeout, siblings, value=True):
        if siblings and not in_flight.is_set():     # the first fetch asking for others waits until told
            in_flight.set()
            go_on.wait(120)
        return request(run_id, buffer, timeout, siblings, value)

    with Client(ray_runtime) as client:
        state, other = make.run(np.zeros(4, np.float32), client=client), make.run(np.ones(4, np.float32),
                                                                                 client=client)
        client.wait(other["w0"]._run, timeout=120)
        monkeypatch.setattr("pathways_mlir.runtime.ray_backend.proxy.FETCHED_BYTES", 3 * state["w0"].nbytes)
        monkeypatch.setattr(proxy, "_request", held_back)
        for leaf in state.values():
            leaf.copy_to_host_async()
        box = []
        reader = threading.Thread(target=lambda leaf: box.append(np.asarray(leaf)), args=(state["w0"],), daemon=True)
        reader.start()                           # asks for w1, w2 and w3 besides: the whole room
        assert in_flight.wait(120)
        state.pop("w1").delete()                 # on its way: its room is free again
        assert np.asarray(other["w0"]).tolist() == [1] * 4      # asks for w4 besides, only
        go_on.set()
        reader.join(120)
        assert box[0].tolist() == [0] * 4
        run_id = state["w0"]._run.id
        assert set(proxy._fetched) == {(run_id, state[name]._buffer) for name in ("w2", "w3", "w4")}
        assert proxy._fetched_bytes == 3 * state["w0"].nbytes and proxy._asked == {} and proxy._asked_bytes == 0

        asked = []

        def broken(run_id, buffer, timeout, siblings, value=True):
            asked.append((len(siblings), proxy._asked_bytes))
            raise RunFailed("the connection broke")

        assert np.asarray(state["w2"]).tolist() == [2] * 4      # taken as it was brought back: room for one
        monkeypatch.setattr(proxy, "_request", broken)
        with pytest.raises(RunFailed, match="^the connection broke$"):
            np.asarray(state["w5"])
        assert asked == [(1, state["w0"].nbytes)] and proxy._asked == {} and proxy._asked_bytes == 0
        monkeypatch.undo()
        assert {name: np.asarray(leaf).tolist() for name, leaf in state.items()} == \
            {f"w{i}": [i] * 4 for i in range(width) if i != 1}
        del state
        assert proxy._fetched == {} and proxy._fetched_bytes == 0


def test_device_get_of_a_cancelled_runs_results_raises_as_reading_one_does(ray_runtime):
    """A result announced for reading (`jax.device_get`) of a run that failed raises at its read what reading
    it alone raises."""
    with Client(ray_runtime) as client:
        spun = [spin_on_right.run(X, client=client), spin_on_right.run(X, client=client)]
        assert client.cancel(spun[0]) and client.cancel(spun[1])
        with pytest.raises(RunCancelled) as together:
            jax.device_get(spun)
        with pytest.raises(RunCancelled) as alone:
            np.asarray(spun[0])
        assert str(together.value) == str(alone.value)

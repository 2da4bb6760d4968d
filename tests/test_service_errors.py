"""A real `pw-serve` process raises what the embedded runtime raises: the same user misuse is an error a user
catches the same way through the service (an instance of the embedded error's class), with one line saying
what is wrong. Each check makes the same call on an embedded `Client` in this process and on a connection to
the service (2 islands of 2 CPU devices each, both). Every wait has a timeout; the service is stopped.
"""

import math
import re
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from test_service import TIMEOUT, procs, serve, stop  # noqa: F401  (procs: a fixture)
from wire_ranks import check_ranks_cross

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.admission import OutOfDeviceMemory
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.island_work import RunCancelled, RunFailed
from pathways_mlir.runtime.remote_client import RemoteError, RemoteSharedRef
from pathways_mlir.runtime.resource_manager import TopologyChanged
from pathways_mlir.runtime.runtime import Runtime
from pathways_mlir.runtime.service import open_connection

MEMORY = 1 << 20                    # bytes per device, on both sides
X = np.random.default_rng(3).normal(size=(8, 4)).astype(np.float32)
island0 = pw.virtual_slice(2, axes="d", island="island0")
inc = pw.jit(lambda x: x + 1.0, slice=island0, in_specs=P("d"), out_specs=P("d"))
spin = pw.jit(lambda x, n: jax.lax.fori_loop(0, n, lambda _, y: jnp.sin(y) * 0.5 + 0.25, x),
              slice=pw.virtual_slice(2, axes="d", island="island1"), in_specs=(P(), P()), out_specs=P())
# Iterations of `spin`: hours of device work, which a cancel does not stop (and which keeps the service's CPU
# devices from running anything else on a 2-core machine); the tests that run it start a service of their own
# (`computing`), stopped at their end.
FOREVER = np.int32(2**31 - 1)


@pw.program
def both(x, n):
    y = inc(x)
    return y, spin(y, n)           # y is computed before spin starts


@pw.program(donate_argnums=0)
def eat(x):
    return inc(x)


pair = pw.jit(lambda x: (x + 1.0, x + 2.0), slice=island0, in_specs=P("d"), out_specs=(P("d"), P("d")))


@pw.program
def pair_then_spin(x, n):
    a, b = pair(x)                 # a and b are computed together, before spin starts
    return a, b, spin(a, n)


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    """{"embedded": (client, other client), "service": (connection, other connection), "file": the service
    file}; the embedded runtime has the service's shape."""
    directory = tmp_path_factory.mktemp("errors") / "service"
    directory.mkdir(mode=0o700)
    procs = []
    runtime = Runtime(embedded_device_map(2, 2), device_memory_bytes=MEMORY)
    try:
        serve(procs, "--device-memory-bytes", str(MEMORY), "--service-file", str(directory / "service.json"))
        connections = [open_connection(str(directory / "service.json"), timeout=TIMEOUT) for _ in range(2)]
        clients = [Client(runtime), Client(runtime)]
        yield {"embedded": tuple(clients), "service": tuple(connections), "file": str(directory / "service.json"),
               "runtime": runtime}
        for client in clients + connections:
            client.close()
    finally:
        for proc in procs:
            stop(proc)
        runtime.close()


@pytest.fixture
def computing(tmp_path, procs):
    """A service of this test's own, for one whose device work it leaves going (`FOREVER`): (its service file,
    a connection that waits long, on which `spin` and `both` ran once, so the service compiled their plans)."""
    directory = tmp_path / "service"
    directory.mkdir(mode=0o700)
    serve(procs, "--service-file", str(directory / "service.json"))
    warm = open_connection(str(directory / "service.json"), timeout=TIMEOUT)
    try:
        v = np.ones(256, np.float32)
        np.testing.assert_allclose(np.asarray(spin.run(v, np.int32(1), client=warm)),
                                   np.full(256, np.sin(1.0) * 0.5 + 0.25, np.float32), rtol=1e-6)
        [np.asarray(h) for h in both.run(X, np.int32(1), client=warm)]
        yield str(directory / "service.json"), warm
    finally:
        warm.close()


def numbered(error: BaseException) -> str:
    """An error's message with every number as N (run, handle and client ids differ between runtimes)."""
    return re.sub(r"\d+", "N", str(error))


def raised_within(call, seconds=60) -> BaseException | str:
    """What `call` raises (run on a thread), or "returned" or "still waiting" after `seconds`."""
    box = []
    thread = threading.Thread(target=lambda: box.append(raised(call)), daemon=True)
    thread.start()
    thread.join(seconds)
    return box[0] if box else "still waiting"


def raised(call) -> BaseException:
    with pytest.raises(Exception) as info:
        call()
    return info.value


def misuses(client, other):
    """The same misuses, made with `client` (and `other`, another client of the same cluster): name -> call."""
    plan = inc.compiled(X, runtime=client.runtime).plan
    donated = inc.run(X, client=client)
    eat.run(donated, client=client).block_until_ready()
    owned = inc.run(X, client=client)
    ref = client.share(owned)

    return {
        "a wrong shape": lambda: client.run(plan, [np.ones((6, 4), np.float32)]),
        "a wrong dtype": lambda: client.run(plan, [X.astype(np.int8)]),
        "too many arguments": lambda: client.run(plan, [X, X]),
        "no arguments": lambda: client.run(plan, []),
        "timeout=0": lambda: inc.run(X, client=client, timeout=0),
        "timeout=-1": lambda: inc.run(X, client=client, timeout=-1),
        "timeout=nan": lambda: inc.run(X, client=client, timeout=float("nan")),
        "timeout=True": lambda: inc.run(X, client=client, timeout=True),
        "timeout=1e10": lambda: inc.run(X, client=client, timeout=1e10),
        "a donated handle read": lambda: np.asarray(donated),
        "a donated handle passed again": lambda: inc.run(donated, client=client).result(TIMEOUT),
        "a donated handle shared": lambda: client.share(donated),
        "a donated handle cancelled": lambda: client.cancel(donated),
        "a shared handle donated by its owner": lambda: eat.run(owned, client=client),
    }, ref


def test_misuses_raise_the_embedded_runtimes_classes_through_the_service(sides):
    """Errors the embedded runtime raises as ValueError or TypeError arrived through the service as a bare
    RemoteError (a RuntimeError), so `except ValueError:` caught them in-process and not through pw-serve. Now
    each is an instance of the embedded error's class, and still a RemoteError, in the embedded error's line
    (it had the class's name before it, which the class now says)."""
    embedded, _ = misuses(*sides["embedded"])
    served, _ = misuses(*sides["service"])
    for name, call in embedded.items():
        want = raised(call)
        assert type(want) in (ValueError, TypeError), (name, want)
        got = raised(served[name])
        assert isinstance(got, type(want)) and isinstance(got, RemoteError), (name, want, got)
        assert numbered(got) == numbered(want), (name, want, got)      # the same line, but for ids
        assert "\n" not in str(got) and str(got), (name, got)
        assert "Traceback" not in str(got) and "Error('" not in str(got), (name, got)


def test_arrays_of_up_to_64_dimensions_cross_the_service_and_more_fail_only_their_call(sides):
    """An argument or result of rank over 32 (the wire's old limit; NumPy takes 64) made the service drop the
    connection, and every later call on it failed (found by a fault finder). The wire takes NumPy's 64 now. A
    JAX array may have more, which no frame carries: such an argument is refused at the call, such a result's
    read fails, each in one line naming it, and the connection goes on."""
    connection, _ = sides["service"]
    check_ranks_cross(island0, connection, RemoteError,
                      r"^the result has 65 dimensions, over the limit of 64 of an array sent")


def test_a_token_the_service_never_gave_is_a_permission_error(sides):
    """A guessed token is refused as a PermissionError (and a RemoteError), in one line, when checked and when
    passed to a run."""
    connection, other = sides["service"]
    owned = inc.run(X, client=connection)
    token = connection.share(owned).token
    guessed = RemoteSharedRef("A" * len(token), (8, 4), "float32")
    for call in (lambda: other.shared(guessed.token), lambda: inc.run(guessed, client=other)):
        error = raised(call)
        assert isinstance(error, PermissionError) and isinstance(error, RemoteError), error
        assert "no shared object has the reference 'AAAAAA'..." in str(error) and "\n" not in str(error)
    assert other.shared(token).shape == (8, 4)


def test_a_shared_object_reads_as_an_array_as_in_process(sides):
    """A `SharedRef` reads as an array (`ref.result()`, `np.asarray(ref)`, as the README says); a service's
    `RemoteSharedRef` had only its token, shape and dtype (`np.asarray` of it was an object array). Now it
    fetches its value through its connection, for its owner and a reader given the token, until the owner
    releases it; then it says it is deleted, and reading it raises what a run taking it raises."""
    for side in ("embedded", "service"):
        owner, reader = sides[side]
        owned = inc.run(X, client=owner)
        ref = owner.share(owned)
        theirs = ref if side == "embedded" else reader.shared(ref.token)
        for each in (ref, theirs):
            value = each.result(TIMEOUT)
            assert isinstance(value, jax.Array) and value.dtype == np.float32, (side, value)
            np.testing.assert_array_equal(value, X + 1.0)
            array = np.asarray(each)
            assert array.dtype == np.float32 and array.shape == (8, 4), (side, array)
            np.testing.assert_array_equal(array, X + 1.0)
            np.testing.assert_allclose(float(each.sum()), float(np.sum(X + 1.0)), rtol=1e-5)
            assert each.is_ready() and not each.is_deleted(), side
        owned.delete()
        if side == "service":
            owner.object_count()            # the release, sent alone, is taken before this request is answered
        assert theirs.is_deleted(), side
        read, run = raised(lambda: theirs.result(TIMEOUT)), raised(lambda: inc.run(theirs, client=reader))
        assert type(read) is type(run) and str(read) == str(run) and "\n" not in str(read), (side, read, run)
    with pytest.raises(ValueError, match=r"^this RemoteSharedRef was made without a connection to read it through"):
        np.asarray(RemoteSharedRef("A" * 43, (8, 4), "float32"))


def test_a_donated_handle_or_jax_array_is_deleted_after_its_run_as_in_process(sides):
    """A donated handle says `is_deleted()`, and a donated JAX array the program writes a result into is deleted,
    as `jax.jit` deletes it: through the service the handle said False (while the service refused it) and the
    array was left as it was. A donation the program cannot use leaves the array, as `jax.jit` does, and a
    deleted array passed again is refused in the embedded runtime's line."""
    one = pw.virtual_slice(1, axes="d", island="island0")
    bump = pw.jit(lambda x: x + 1.0, slice=one, in_specs=None, out_specs=None, donate_argnums=0)
    total = pw.jit(lambda x: x.sum(), slice=one, in_specs=None, out_specs=None, donate_argnums=0)
    plain = jnp.asarray(X)
    jax.jit(lambda x: x + 1.0, donate_argnums=0)(plain)
    assert plain.is_deleted()                             # what jax.jit does
    lines = {}
    for side in ("embedded", "service"):
        client = sides[side][0]
        handle = eat.run(X, client=client)
        assert not handle.is_deleted(), side
        after = eat.run(handle, client=client)
        assert handle.is_deleted(), side
        np.testing.assert_array_equal(np.asarray(after), X + 2.0)
        array = jnp.asarray(X)
        np.testing.assert_array_equal(np.asarray(bump.run(array, client=client)), X + 1.0)
        assert array.is_deleted(), side
        again = raised(lambda: bump.run(array, client=client))
        kept = jnp.asarray(X)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")               # JAX's "donated buffers were not usable"
            np.testing.assert_allclose(float(total.run(kept, client=client)), float(np.sum(X)), rtol=1e-5)
        assert not kept.is_deleted(), side
        lines[side] = (type(again), numbered(again), numbered(raised(lambda: np.asarray(handle))))
    assert lines["service"][0] is lines["embedded"][0] is RuntimeError
    assert lines["service"][1:] == lines["embedded"][1:], lines
    assert lines["embedded"][1] == "argument N of program @lambda is a deleted jax.Array (deleted, or donated to " \
                                   "another computation, before the call)"


def test_a_released_handle_says_where_it_lay_as_a_deleted_jax_array_does_as_in_process(sides):
    """Donated or deleted, a handle still says its `sharding`, `is_fully_*` and `committed`, as it did before,
    and its `format` with no layout, as a deleted JAX array does (Orbax's restore target of a state a step took):
    in-process it raised `... was donated to program @eat: ...` for all of them, and through the service
    `format` raised. Its value still raises its one-line error."""
    plain = jnp.asarray(X)
    plain.delete()
    assert plain.format.layout is None                   # what a deleted JAX array says
    for side in ("embedded", "service"):
        client = sides[side][0]
        donated, deleted = eat.run(X, client=client), inc.run(X, client=client)

        def placement(handle):
            return handle.sharding, handle.is_fully_addressable, handle.is_fully_replicated, handle.committed

        before = [placement(handle) for handle in (donated, deleted)]
        eat.run(donated, client=client).block_until_ready()
        deleted.delete()
        for handle, was, line in zip((donated, deleted), before, ("was donated to program @eat", "was released")):
            assert handle.is_deleted() and placement(handle) == was, side
            assert handle.format == type(plain.format)(None, was[0]), side
            with pytest.raises(ValueError, match=line):
                np.asarray(handle)


def test_a_donated_handle_whose_value_was_read_ahead_raises_as_in_process(sides):
    """`jax.device_get` announces every leaf (`copy_to_host_async`), and through the service the first read brings
    back the others' values, held by the connection until read. A handle donated to a run since read the value
    held, where a donated handle raises (found by a review). Now the donation drops it: the read raises the line
    it raises in-process."""
    lines = {}
    for side in ("embedded", "service"):
        client = sides[side][0]
        a, b = pair.run(X, client=client)
        a.copy_to_host_async()
        np.testing.assert_allclose(np.asarray(b), X + 2.0)
        if side == "service":
            assert a._key in client._prefetched, "a's value came back with b's"
        eat.run(a, client=client).block_until_ready()
        lines[side] = numbered(raised(lambda: np.asarray(a)))
        assert side == "embedded" or a._key not in client._prefetched
    assert lines["service"] == lines["embedded"] == \
        "handle to buffer N of run N was donated to program @eat: a donated handle cannot be used again"


def test_a_run_that_can_never_fit_reads_as_in_process(sides):
    """A run that can never fit raises OutOfDeviceMemory through the service (as before) with the embedded
    runtime's message, which had its class's name before it (`OutOfDeviceMemory: program ...`); so does a
    cancelled run's `RunCancelled` (the last test)."""
    for side in ("embedded", "service"):
        with pytest.raises(OutOfDeviceMemory) as huge:
            inc.run(np.ones((2, 262144), np.float32), client=sides[side][0]).result(TIMEOUT)  # 1 MiB a device
        assert str(huge.value) == ("program lambda needs 2097152 bytes on device 0 of island0, which has only "
                                   "1048576 bytes: it can never fit"), (side, huge.value)


def test_a_released_handle_or_one_of_a_closed_connection_reads_as_in_process(sides):
    """A released remote handle passed to a run was sent, and the service answered `no handle 7`; a handle of a
    connection its user closed raised ServiceError (`the connection ... is closed`) where an embedded client's
    handle raises ValueError (`... belongs to closed client 3: its result was released`). Now both are the
    client's own ValueError lines, as in-process, and nothing is sent, also when the handle is passed to another
    client's run."""
    for side in ("embedded", "service"):
        client = sides[side][0]
        released = inc.run(X, client=client)
        released.block_until_ready()
        released.delete()
        error = raised(lambda: inc.run(released, client=client))
        assert type(error) is ValueError and re.fullmatch(r"(remote )?handle .* was released", str(error)), error
        closing = Client(sides["runtime"]) if side == "embedded" else open_connection(sides["file"], timeout=TIMEOUT)
        kept = inc.run(X, client=closing)
        kept.block_until_ready()
        closing.close()
        # Passed to a run of the embedded runtime, a closed connection's handle raised only when the run's result
        # was read (RunFailed), after the run had started.
        embedded = sides["embedded"][1]
        for call in (lambda: np.asarray(kept), lambda: kept.result(TIMEOUT), lambda: closing.share(kept),
                     lambda: inc.run(kept, client=embedded)):
            error = raised(call)
            assert type(error) is ValueError, (side, error)
            assert re.fullmatch(r"(remote )?handle .* belongs to (the )?closed (client|connection).*: its result was "
                                r"released", str(error)), error


def test_numpy_copies_a_handle_as_it_copies_a_jax_array_as_in_process(sides):
    """`np.array(h)` (NumPy 2's `copy=True`) gave a read-only view of the handle's own value, where a JAX array's
    is a new array the caller may write, and `np.asarray(h, dtype=int32, copy=False)` made a copy where NumPy
    raises for a JAX array ('Unable to avoid copy'): both in process and through the service. `np.asarray(h)`
    stays the handle's value itself, with no copy."""
    want = jnp.asarray(X) + 1.0
    for side in ("embedded", "service"):
        handle = inc.run(X, client=sides[side][0])
        for ref in (want, handle):
            copied = np.array(ref)
            assert copied.flags.writeable and not np.shares_memory(copied, np.asarray(ref)), side
            copied[0] = 0.0
            np.testing.assert_array_equal(np.array(ref, copy=True), X + 1.0)
            assert np.asarray(ref, copy=False).dtype == np.float32
            with pytest.raises(ValueError, match="Unable to avoid copy"):
                np.asarray(ref, dtype=np.int32, copy=False)
            assert np.asarray(ref, dtype=np.int32).tolist() == (X + 1.0).astype(np.int32).tolist()
    handle = inc.run(X, client=sides["embedded"][0])
    assert np.shares_memory(np.asarray(handle), np.asarray(handle.result()))     # the store's value, not a copy


def test_bytes_of_a_handle_are_its_values_as_a_jax_arrays_as_in_process(sides):
    """`bytes(h)` of an array handle raised 'Only integer scalar arrays can be converted to a scalar index' (a
    handle has no buffer protocol, and Python took its `__index__`), where a JAX array gives its raw bytes; of an
    integer scalar, both give that many zero bytes."""
    one = pw.virtual_slice(1, axes="d", island="island0")
    plus_two = pw.jit(lambda v: v + 2, slice=one, in_specs=None, out_specs=None)
    for side in ("embedded", "service"):
        client = sides[side][0]
        assert bytes(inc.run(X, client=client)) == bytes(jnp.asarray(X) + 1.0) == (X + 1.0).tobytes(), side
        assert bytes(plus_two.run(np.int32(1), client=client)) == bytes(jnp.int32(3)) == bytes(3), side


@pytest.mark.parametrize("pin, where", [("island0:6", "places slice '.*' on devices \\[6, 8\\) of 'island0'"),
                                        ("island2", "has steps on 'island2'")])
def test_a_plan_for_devices_the_cluster_lacks_is_refused_in_one_line(sides, pin, where):
    """A plan placed on devices or an island the cluster does not have (lowered for another cluster, or sent by
    a hostile peer) failed its run halfway with the island's `IndexError: tuple index out of range` (or
    `KeyError: 'island2'`); now its load is refused with TopologyChanged naming the slice or island."""
    from pathways_mlir.dialect.topology import Topology
    from pathways_mlir.passes import lower_to_plans

    anywhere = pw.jit(lambda x: x + 1.0, slice=pw.virtual_slice(2, axes="d"), in_specs=P("d"), out_specs=P("d"))
    lowered = anywhere.lower(X)
    [name] = [str(op.attributes["sym_name"]).strip('"') for op in lowered.module.body.operations
              if op.operation.name == "pw.virtual_slice"]
    plan = lower_to_plans(lowered.module, Topology.uniform(3, 8), pin=f"{name}={pin}")[lowered.program]
    for side in ("embedded", "service"):
        error = raised(lambda: sides[side][0].run(plan, [X]))
        assert isinstance(error, TopologyChanged), (side, error)
        assert re.search(f"plan @lambda {where}, which the cluster does not have \\(island0: 2 devices, island1: 2 "
                         f"devices\\): lower it for this cluster", str(error)) and "\n" not in str(error), error
    np.testing.assert_allclose(np.asarray(inc.run(X, client=sides["service"][0])), X + 1.0)


def test_a_result_still_being_computed_is_waited_for_in_requests_answered_within_the_deadline(computing):
    """    The service read a result's array (`np.asarray`) as soon as JAX handed it out, before its device work was
    over, so a fetch's reply waited for the computation however long it took: `result(timeout=1)` on a result
    still being computed got no reply within the connection's deadline, which closed the connection (a
    ServiceError, every object of the client released). Now the service waits for the computation in polls
    like any other wait: a TimeoutError, and the connection keeps serving."""
    connection = open_connection(computing[0], timeout=10)
    try:
        long = spin.run(np.ones(256, np.float32), FOREVER, client=connection)
        with pytest.raises(TimeoutError, match="not ready within 1 s"):
            long.result(timeout=1)
        assert not connection.closed and connection.object_count() == 1
        assert connection.cancel(long)
        with pytest.raises(RunCancelled) as cancelled:
            long.result(timeout=TIMEOUT)
        assert re.fullmatch(r"run \d+ of lambda was cancelled by client \d+", str(cancelled.value)), cancelled.value
    finally:
        connection.close()


def test_sharing_a_result_whose_run_is_still_going_waits_in_requests_answered_within_the_deadline(computing):
    """`RemoteClient.share` took no `timeout` (`Client.share` does), and the service waited up to 60 s for the
    result's run to be over before it replied, so sharing a computed result of a run still going past the
    connection's deadline closed the connection (ServiceError). Now it waits in polls, at most `timeout`
    seconds (TimeoutError), else as long as it takes, as in-process."""
    connection = open_connection(computing[0], timeout=10)
    try:
        ready, long = both.run(X, FOREVER, client=connection)
        ready.block_until_ready()
        with pytest.raises(TimeoutError, match="run was not over within 1 s"):
            connection.share(ready, timeout=1)
        outcome = []
        sharing = threading.Thread(target=lambda: outcome.append(raised(lambda: connection.share(ready))),
                                   daemon=True)
        sharing.start()
        sharing.join(15)                       # past the connection's deadline: still waiting, still connected
        assert sharing.is_alive() and not connection.closed, outcome
        assert connection.cancel(long)
        sharing.join(TIMEOUT)
        assert isinstance(outcome[0], RunCancelled), outcome
        assert not connection.closed and connection.object_count() >= 0
    finally:
        connection.close()


def test_a_result_timeout_that_is_nan_or_no_number_is_refused_not_waited_for_forever(sides, computing):
    """`result(timeout=nan)` on a result not produced yet waited forever, in-process (a NaN deadline is never
    reached) and through the service (whose client polled it without end); `result(True)` waited 1 s and
    `result("1")` failed adding a str to a float. Now each is a ValueError saying what a timeout must be, on
    both sides; 0 and -1 are a TimeoutError (only what is there already) on both."""
    runtime = sides["runtime"]
    runtime.scheduler.hold()                   # in-process, runs wait in the queue
    try:
        pending = {"embedded": inc.run(X, client=sides["embedded"][0]),
                   "service": spin.run(np.ones(256, np.float32), FOREVER, client=computing[1])}
        for side, handle in pending.items():
            for timeout in (math.nan, True, "1"):
                error = raised_within(lambda: handle.result(timeout))
                assert isinstance(error, ValueError), (side, timeout, error)
                assert str(error) == f"a result's timeout must be a number of seconds or None, not {timeout!r}"
            for timeout in (0, -1):
                assert isinstance(raised_within(lambda: handle.result(timeout)), TimeoutError), (side, timeout)
        assert computing[1].cancel(pending["service"])
    finally:
        runtime.scheduler.release()


def test_jax_debug_nans_is_refused_in_one_line_through_the_service(sides):
    """Under `jax_debug_nans` a NaN fails an embedded run with JAX's FloatingPointError, as `jax.jit` raises;
    through the service the run returned the NaN: its islands call their executables under the service's
    own configuration. The call is now refused in one line, as a host callback is."""
    bad = -np.ones((8, 4), np.float32)
    log = pw.jit(jnp.log, slice=island0, in_specs=P("d"), out_specs=P("d"))
    with jax.debug_nans(True):
        with pytest.raises(RunFailed, match=r"FloatingPointError: invalid value \(nan\)"):
            np.asarray(log.run(bad, client=sides["embedded"][0]))
        with pytest.raises(NotImplementedError, match=r"^jax_debug_nans is on, but the islands of pw-serve run in "
                                                      r"the service's process, under their own JAX configuration"):
            log.run(bad, client=sides["service"][0])
    assert np.isnan(np.asarray(log.run(bad, client=sides["service"][0]))).all()


def test_a_result_released_by_another_thread_while_it_is_read_says_so(computing):
    """A read waits for a result in polls; a thread that released the handle meanwhile made the next poll
    fail with the service's bare `no handle N`. The read now raises the handle's own line, as a read after
    the release does."""
    connection = open_connection(computing[0], timeout=10)
    try:
        long = spin.run(np.ones(256, np.float32), FOREVER, client=connection)
        reading = threading.Thread(target=lambda: box.append(raised(lambda: long.result(timeout=TIMEOUT))),
                                   daemon=True)
        box = []
        reading.start()
        reading.join(1.0)                    # polling by now: the result is hours away
        long.delete()
        reading.join(TIMEOUT)
        assert isinstance(box[0], ValueError) and re.fullmatch(r"remote handle \d+ was released", str(box[0])), \
            box[0]
    finally:
        connection.close()


def test_a_delete_while_another_threads_request_holds_the_connection_does_not_wait_for_it(sides):
    """`delete()` waited for the connection's lock, which a read polling for a result holds for up to 5 s a poll
    (here the test holds it): it now leaves the release to go once the connection is free."""
    client = sides["service"][0]
    before = client.object_count()
    handle = inc.run(X, client=client)
    handle.block_until_ready()
    deleting = threading.Thread(target=handle.delete, daemon=True)
    client._lock.acquire()
    try:
        deleting.start()
        deleting.join(TIMEOUT)
        assert not deleting.is_alive(), "delete() waited for the request that held the connection"
        assert handle.is_deleted()
    finally:
        client._lock.release()
    deadline = time.monotonic() + TIMEOUT
    while client.object_count() != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.object_count() == before


def test_a_value_read_ahead_of_a_run_cancelled_since_raises_as_reading_it_does(computing):
    """A value brought back ahead of its read (`copy_to_host_async`, as `jax.device_get` announces a pytree's leaves)
    was read from the connection after its run was cancelled, where reading it raises RunCancelled, as in-process
    and without the read-ahead (found by a review). A cancel now drops what is held."""
    connection = open_connection(computing[0], timeout=10)
    try:
        a, b, long = pair_then_spin.run(X, FOREVER, client=connection)
        b.copy_to_host_async()
        np.testing.assert_allclose(np.asarray(a), X + 1.0)
        assert b._key in connection._prefetched, "b's value came back with a's"
        assert connection.cancel(long)
        with pytest.raises(RunCancelled, match=r"^run \d+ of pair_then_spin was cancelled by client \d+$"):
            np.asarray(b)
    finally:
        connection.close()


def test_a_refused_runs_error_is_sent_again_as_it_was_first_sent():
    """A run sent without waiting for its reply (with keys of its own choosing) and refused has its error
    remembered for its keys; a request naming a key gets that error again. An error of no kind the wire knows
    came back with its class's name twice (`RuntimeError: RuntimeError: client 3 is closed`, seen as the
    service stopped), as it was remembered with the name and sent with it again (found by fault-finding)."""
    import socket
    import types

    from pathways_mlir.runtime.limits import Limits
    from pathways_mlir.runtime.session import Session
    from pathways_mlir.runtime.wire import reported

    runtime = Runtime(embedded_device_map(2, 2))
    ends = socket.socketpair()
    try:
        client = Client(runtime)
        endpoint = types.SimpleNamespace(limits=Limits())        # what a session reads of its endpoint here
        session = Session(endpoint, client, ends[0], owner=True)
        session.plans["inc"] = inc.compiled(X, runtime=runtime).plan
        client.close()                           # its runs are refused: RuntimeError, of no kind of the wire's
        request = {"name": "inc", "version": runtime.resources.version, "args": [["array", 0]],
                   "dispatch": "parallel", "keys": [5]}
        first = reported(raised(lambda: session.run(request, [X])), "error")
        again = reported(raised(lambda: session.fetch({"handle": 5}, [])), "error")
        assert first == ("error", f"RuntimeError: client {client.id} is closed")
        assert again == first
    finally:
        for end in ends:
            end.close()
        runtime.close()

"""Shared read-only objects (`runtime/shared.py`), embedded and on the Ray backend.

A client shares a result; other clients pass the reference to their programs: the values are plain
JAX's, the ledger counts the object once (for the owner, not again in a reader's peak), and the bytes
come back only once the owner has released it and no run that reads it is in flight (a run parked on a
receive that never comes, and a run queued behind a held scheduler). A reader cannot donate or release
it. The service's side, with real processes, is in tests/test_service_sharing.py. Every wait is bounded.
"""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fetching import until
from test_admission_and_lifetimes import read_on_a_thread

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime
from pathways_mlir.runtime.shared import SharedRef

TIMEOUT = 60
BASE = np.random.default_rng(0).normal(size=(256, 64)).astype(np.float32)
BASE_BYTES = BASE.nbytes
X = np.random.default_rng(1).normal(size=(8, 256)).astype(np.float32)
FEATURES_BYTES = X.nbytes
OUT_BYTES = 8 * 64 * 4


def copy_base(b):
    return b * 1.0


def head(x, b):
    return jnp.tanh(x @ b)


def test_a_result_of_a_program_with_a_cond_is_shared_right_after_the_call(runtime):
    """A cond's parent run is retired only after its branch run: `share` looked at the runs once, found the
    parent still in flight, and refused a live result as "not held on devices" nine times in ten (found by a
    fault finder). It now waits for the parent's retirement."""
    from jax.sharding import PartitionSpec as P
    one, pair = pw.virtual_slice(1, axes="x", island="island0"), pw.virtual_slice(2, axes="d", island="island1")
    positive = pw.jit(lambda x: jnp.sum(x) > 0, slice=one)
    double, negate = pw.jit(lambda x: 2 * x, slice=one), pw.jit(lambda x: -x, slice=one)
    square = pw.jit(lambda x: x * x, slice=pair, in_specs=P("d"), out_specs=P("d"))

    @pw.program
    def step(x):
        return square(pw.cond(positive(x), double, negate, x))

    x = np.arange(4, dtype=np.float32)
    with Client(runtime) as owner, Client(runtime) as reader:
        held, shared = [], []                  # (a shared object lives as long as its owner's handle)
        for _ in range(10):
            held.append(step.run(x, client=owner))
            shared.append(owner.share(held[-1], timeout=TIMEOUT))       # right after the call
        np.testing.assert_array_equal(np.asarray(square.run(shared[-1], client=reader)), (2 * x) ** 4)


def base_plan(plan_builder, topology, island="island1"):
    """The owner's program: the base, on one device of `island`."""
    p = plan_builder(topology, program="place_base")
    v = p.slice("v", (1,), ("x",), island, (0, 1))
    return p.build([p.launch(copy_base, [p.input(BASE.shape, v)], v, [(), ()])])


def reader_plan(plan_builder, topology, island="island1"):
    """A reader's program: `head` of its features and the base (read where it lives)."""
    p = plan_builder(topology, program="read_base")
    v = p.slice("v", (1,), ("x",), island, (0, 1))
    return p.build([p.launch(head, [p.input(X.shape, v), p.input(BASE.shape, v)], v, [(), ()])])


def parked_reader_plan(plan_builder, topology):
    """A reader's program whose island1 part waits for island0's send before it reads the base there."""
    p = plan_builder(topology, program="read_base_parked")
    v0 = p.slice("v0", (1,), ("x",), "island0", (0, 1))
    v1 = p.slice("v1", (1,), ("x",), "island1", (0, 1))
    features = p.launch(copy_base, [p.input(X.shape, v0)], v0, [(), ()])
    out = p.launch(head, [p.dcn(features, v1, [(), ()]), p.input(BASE.shape, v1)], v1, [(), ()])
    return p.build([out])


def test_readers_compute_what_plain_jax_does_and_the_base_is_counted_once(runtime):
    s = pw.virtual_slice(2, axes="x", island="island0")
    place = pw.jit(copy_base, slice=s, in_specs=None, out_specs=None)
    read = pw.jit(head, slice=s, in_specs=(None, None), out_specs=None)
    owner, readers = Client(runtime), [Client(runtime) for _ in range(3)]
    try:
        base = place.run(BASE, client=owner)
        ref = owner.share(base, timeout=TIMEOUT)
        assert isinstance(ref, SharedRef) and ref.shape == BASE.shape and ref.dtype == np.float32
        assert sum(runtime.usage().values()) == 2 * BASE_BYTES          # replicated on 2 devices, once
        features = [X + i for i in range(len(readers))]
        outs = [read.run(x, ref, client=c) for x, c in zip(features, readers)]
        for out, x in zip(outs, features):
            np.testing.assert_allclose(np.asarray(out.result(TIMEOUT)), np.asarray(jax.jit(head)(x, BASE)),
                                       rtol=1e-4, atol=1e-5)
        # A reader's peak leaves the base out; the owner passing its own handle counts it again.
        own = read.run(X, base, client=owner)
        own.block_until_ready()
        full = own._run.need["island0"][0][2]
        assert all(out._run.need["island0"] == [(0, 2, full - BASE_BYTES)] for out in outs)
        # Held: the base once, and each reader's own result.
        assert sum(runtime.usage().values()) == 2 * BASE_BYTES + 2 * OUT_BYTES * (len(readers) + 1)
        assert runtime.owned_by(readers[0].owner) == [(outs[0]._run.id, outs[0]._buffer)]
        base.delete()
        for out in [*outs, own]:
            out.delete()
        assert sum(runtime.usage().values()) == 0 and runtime.object_count() == 0
    finally:
        for c in [owner, *readers]:
            c.close()


def test_the_base_comes_back_only_after_the_owner_released_it_and_a_reader_in_flight_is_over(
        runtime, plan_builder):
    topology = runtime.resources.topology
    owner, reader = Client(runtime), Client(runtime)
    try:
        [base] = owner.run(base_plan(plan_builder, topology), [BASE])
        ref = owner.share(base, timeout=TIMEOUT)
        parked = parked_reader_plan(plan_builder, topology)
        runtime.islands["island0"].close()              # the reader's island1 part waits for ever
        [out] = reader.run(parked, [X, ref])
        # In flight: its receive and result on island1, not the base again.
        assert out._run.need["island1"] == [(0, 1, FEATURES_BYTES + OUT_BYTES)]
        assert runtime.usage()[("island1", 0)] == BASE_BYTES + FEATURES_BYTES + OUT_BYTES
        base.delete()                                   # the owner releases it while the reader reads it
        assert runtime.usage()[("island1", 0)] == BASE_BYTES + FEATURES_BYTES + OUT_BYTES
        with pytest.raises(ValueError, match=rf"^shared object \(buffer 1 of run {base._run.id}\) was released by "
                                             rf"its owner, client {owner.id}$"):
            reader.run(parked, [X, ref])
        assert reader.cancel(out)
        until(lambda: sum(runtime.usage().values()) == 0, "the base and the reader's run came back", TIMEOUT)
        assert runtime.object_count() == 0
    finally:
        owner.close()
        reader.close()


def test_the_owner_releases_a_shared_object_lost_with_its_island_while_a_reader_is_in_flight(runtime, plan_builder):
    """The base's island is lost while a reader's run is in flight, then the owner releases the base: the
    base, gone from the held results with its island, was counted as released while read, and once the
    reader was retired the scheduler gave its bytes back a second time (a KeyError out of
    `HeldResults.unread`, raised to whichever call polled the runs next: a run, or `usage`)."""
    topology = runtime.resources.topology
    owner, reader = Client(runtime), Client(runtime)
    try:
        [base] = owner.run(base_plan(plan_builder, topology), [BASE])
        ref = owner.share(base, timeout=TIMEOUT)
        runtime.islands["island0"].close()              # the reader's island1 part waits for ever
        [out] = reader.run(parked_reader_plan(plan_builder, topology), [X, ref])
        runtime.lose_island("island1")
        base.delete()
        with pytest.raises(pw.IslandLost):
            out.result(TIMEOUT)
        runtime.restore_island("island1")
        [again] = owner.run(base_plan(plan_builder, runtime.resources.topology), [BASE])
        np.testing.assert_array_equal(np.asarray(again.result(TIMEOUT)), BASE)
        again.delete()
        until(lambda: sum(runtime.usage().values()) == 0, "every result came back", TIMEOUT)
    finally:
        owner.close()
        reader.close()


def test_a_queued_reader_keeps_the_base_after_its_owner_closed_and_reads_it(runtime, plan_builder):
    topology = runtime.resources.topology
    owner, reader = Client(runtime), Client(runtime)
    try:
        [base] = owner.run(base_plan(plan_builder, topology), [BASE])
        ref = owner.share(base, timeout=TIMEOUT)
        read = reader_plan(plan_builder, topology)
        reader.run(read, [X, ref])[0].delete()          # loaded and compiled before
        until(lambda: sum(runtime.usage().values()) == BASE_BYTES, "the first read was over", TIMEOUT)
        runtime.scheduler.hold()
        try:
            [out] = reader.run(read, [X, ref])         # queued: a reader from now on
            owner.close()
            assert sum(runtime.usage().values()) == BASE_BYTES
        finally:
            runtime.scheduler.release()
        np.testing.assert_allclose(np.asarray(out.result(TIMEOUT)), np.asarray(jax.jit(head)(X, BASE)),
                                   rtol=1e-4, atol=1e-5)
        until(lambda: sum(runtime.usage().values()) == OUT_BYTES, "the base came back", TIMEOUT)
        out.delete()
        assert sum(runtime.usage().values()) == 0 and runtime.object_count() == 0
    finally:
        reader.close()


def test_a_reader_cannot_donate_or_release_a_shared_object(runtime):
    s = pw.virtual_slice(1, axes="x", island="island0")
    place = pw.jit(copy_base, slice=s, in_specs=None, out_specs=None)
    donating = pw.jit(head, slice=s, in_specs=(None, None), out_specs=None, donate_argnums=1)
    with Client(runtime) as owner, Client(runtime) as reader:
        base = place.run(BASE, client=owner)
        ref = owner.share(base, timeout=TIMEOUT)
        with pytest.raises(ValueError, match=r"^argument leaf 1 of program @head is a shared object, which is "
                                             r"read-only: it cannot be donated \(leave it out of donate_argnums/"
                                             r"donate_argnames\)$"):
            donating.run(X, ref, client=reader)
        assert not hasattr(ref, "delete") and not hasattr(ref, "donate")
        np.testing.assert_array_equal(np.asarray(base.result(TIMEOUT)), BASE)      # untouched, still the owner's
        assert sum(runtime.usage().values()) == BASE_BYTES


def head_of(features):
    return head(features["x"], features["base"])


def refused_for(owner: Client, runner: Client) -> str:
    """The end of the error that refuses a handle of `owner` passed to a run of `runner`, as a pattern."""
    return (rf"is a handle of client {owner.id}, not of client {runner.id}, which runs it: pass its owner's "
            rf"read-only reference, owner\.share\(handle\), instead$")


def test_a_run_of_another_client_refuses_a_handle_it_does_not_own_and_changes_nothing(runtime, plan_builder):
    """A client's handle passed as it is to another client's run was taken (found by a fault finder): a donating
    program of the other client deleted the owner's object, and its bytes went to the other client's account.
    Other clients read it through `owner.share(handle)`: a handle of another client is refused in one line,
    donated or not, in a pytree or not, by the front end and by `Client.run`, before anything runs."""
    s = pw.virtual_slice(1, axes="x", island="island0")
    place = pw.jit(copy_base, slice=s, in_specs=None, out_specs=None)
    donating = pw.jit(head, slice=s, in_specs=(None, None), out_specs=None, donate_argnums=1)
    reading = pw.jit(head_of, slice=s, in_specs=None, out_specs=None)
    with Client(runtime) as owner, Client(runtime) as other:
        base = place.run(BASE, client=owner)
        with pytest.raises(ValueError, match=r"^argument leaf 1 of program @head \(argument\[1\]\) " +
                           refused_for(owner, other)):
            donating.run(X, base, client=other)
        with pytest.raises(ValueError, match=r"^argument leaf 0 of program @head_of \(argument\[0\]\['base'\]\) " +
                           refused_for(owner, other)):
            reading.run({"x": X, "base": base}, client=other)
        with pytest.raises(ValueError, match=r"^argument 1 of program @read_base " + refused_for(owner, other)):
            other.run(reader_plan(plan_builder, runtime.resources.topology, "island0"), [X, base])
        assert not base.is_deleted() and len(owner.objects()) == 1 and other.objects() == []
        assert sum(runtime.usage().values()) == BASE_BYTES
        shared = owner.share(base, timeout=TIMEOUT)          # the way another client reads it
        y = reading.run({"x": X, "base": shared}, client=other)
        np.testing.assert_allclose(np.asarray(y.result(TIMEOUT)), np.asarray(jax.jit(head)(X, BASE)), rtol=1e-5)
        np.testing.assert_array_equal(np.asarray(base.result(TIMEOUT)), BASE)


def test_the_default_client_refuses_a_handle_of_another_client():
    """A call without `client=` runs with the runtime's default client, which takes another client's handle no
    more than any client does (the fast lane's plan: the lane leaves it to the general path, which refuses it)."""
    from pathways_mlir.runtime.client import default_client

    s = pw.virtual_slice(1, axes="x", island="island0")
    place = pw.jit(copy_base, slice=s, in_specs=None, out_specs=None)
    with pw.Client() as owner:
        base = place.run(BASE, client=owner)
        with pytest.raises(ValueError, match=r"^argument leaf 0 of program @copy_base \(argument\[0\]\) " +
                           refused_for(owner, default_client())):
            place(base)
        np.testing.assert_array_equal(np.asarray(place(BASE).result(TIMEOUT)), BASE)
        np.testing.assert_array_equal(np.asarray(place(base, client=owner).result(TIMEOUT)), BASE)


def test_a_handle_of_another_runtime_is_refused_naming_its_value(runtime):
    """A handle of another runtime's client (an embedded one's, passed to a program on Ray, say) was taken as a
    reference to a run its islands never had: "not kept on island0: it was released", or, for another island, a
    wait for ever (found by a Ray fault finder). It is refused in one line that says to pass its value."""
    s = pw.virtual_slice(1, axes="x", island="island0")
    place = pw.jit(copy_base, slice=s, in_specs=None, out_specs=None)
    elsewhere = Runtime(embedded_device_map(1, 2))
    try:
        with Client(elsewhere) as owner, Client(runtime) as runner:
            base = place.run(BASE, client=owner)
            with pytest.raises(ValueError, match=rf"^argument leaf 0 of program @copy_base \(argument\[0\]\) is a "
                                                 rf"handle of client {owner.id}, not of client {runner.id}, which "
                                                 rf"runs it: pass its value, np\.asarray\(handle\) \(its owner runs "
                                                 rf"on another runtime\), instead$"):
                place.run(base, client=runner)
            np.testing.assert_array_equal(np.asarray(place.run(np.asarray(base), client=runner).result(TIMEOUT)), BASE)
    finally:
        elsewhere.close()


def test_only_a_result_the_client_owns_and_holds_can_be_shared(runtime, plan_builder):
    plan = base_plan(plan_builder, runtime.resources.topology)
    with Client(runtime) as owner, Client(runtime) as other:
        [base] = owner.run(plan, [BASE])
        with pytest.raises(ValueError, match=rf"^client {other.id} can share only its own handles"):
            other.share(base)
        [gone] = owner.run(plan, [BASE])
        gone.delete()
        with pytest.raises(ValueError, match="was released"):
            owner.share(gone)
        ref = owner.share(base, timeout=TIMEOUT)
        elsewhere = Runtime(embedded_device_map(1, 2))
        try:
            with pytest.raises(ValueError, match="belongs to another runtime"):
                Client(elsewhere).run(reader_plan(plan_builder, elsewhere.resources.topology, "island0"), [X, ref])
        finally:
            elsewhere.close()


def test_a_shared_typed_key_or_weakly_typed_value_reads_as_its_owners_handle(runtime):
    """A shared reference reads as the owner's handle does: typed PRNG keys as keys of their implementation, a
    weakly typed value weakly typed. The `SharedRef` of a key was its raw uint32 key data, on which a reader's
    `split` computed something else (uint32[2, 2]) or, for rbg keys, JAX raised; that of a weakly typed `lr`
    made `bf16 * lr` float32 (found by a fault finder)."""
    s = pw.virtual_slice(1, axes="x", island="island0")
    make = pw.jit(lambda seed: jax.random.key(seed), slice=s)
    make_rbg = pw.jit(lambda seed: jax.random.key(seed, impl="rbg"), slice=s)
    split = pw.jit(jax.random.split, slice=s)
    half = pw.jit(lambda lr: lr * 0.5, slice=s)
    scale = pw.jit(lambda x, lr: x * lr, slice=s)

    def fold(key):
        return jax.random.fold_in(key, 1)

    donating = pw.jit(fold, slice=s, donate_argnums=0)
    x = jnp.ones(2, jnp.bfloat16)
    with Client(runtime) as owner, Client(runtime) as reader:
        keys = [make.run(np.int32(0), client=owner), make_rbg.run(np.int32(0), client=owner)]
        for key in keys:
            ref = owner.share(key, timeout=TIMEOUT)
            assert (ref.shape, ref.dtype, ref.weak_type) == (key.shape, key.dtype, False)
            assert isinstance(ref.owned(), SharedRef)
            got = split.run(ref, client=reader)
            assert (got.shape, got.dtype) == ((2,), key.dtype)
            np.testing.assert_array_equal(jax.random.key_data(got.result(TIMEOUT)),
                                          jax.random.key_data(jax.random.split(key.result(TIMEOUT))))
            with pytest.raises(ValueError, match=r"^argument leaf 0 of program @fold is a shared object, which "
                                                 r"is read-only"):
                donating.run(ref, client=reader)
        lr = half.run(0.1, client=owner)
        ref = owner.share(lr, timeout=TIMEOUT)
        assert ref.weak_type and ref.result(TIMEOUT).weak_type and isinstance(ref.owned(), SharedRef)
        want = jax.jit(lambda x, lr: x * lr)(x, lr.result(TIMEOUT))
        got = scale.run(x, ref, client=reader)
        assert got.dtype == want.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_shared_object_released_while_it_is_read_raises_instead_of_waiting_for_ever(runtime, plan_builder):
    """A reader of a shared object past its check, whose owner then released the object, waited for ever: the
    island cannot tell a result released from one whose run has not started there. The island now has the
    reference checked again before it waits. Here the owner deletes its handle between the two."""
    plan = base_plan(plan_builder, runtime.resources.topology)
    with Client(runtime) as owner:
        [base] = owner.run(plan, [BASE])
        ref = owner.share(base, timeout=TIMEOUT)
        island = runtime.islands["island1"]
        fetch = island.fetch

        def released_first(*args):
            base.delete()
            return fetch(*args)
        island.fetch = released_first
        error = read_on_a_thread(runtime, lambda: np.asarray(ref))
        assert isinstance(error, ValueError) and str(error) == ref.gone(), repr(error)


def test_a_result_is_shared_and_its_run_waited_for_after_another_of_its_results_was_released(runtime):
    """`Runtime.wait` (which `share` calls) checked every result of the run but those released before the run
    was over: one released after it was over was looked for on its island, never found, and the wait raised
    TimeoutError ("... was not produced within 0 s")."""
    from jax.sharding import PartitionSpec as P
    pair = pw.virtual_slice(2, axes="x", island="island0")
    double = pw.jit(lambda x: x * 2.0, slice=pair, in_specs=P("x"), out_specs=P("x"))
    triple = pw.jit(lambda x: x * 3.0, slice=pair, in_specs=P("x"), out_specs=P("x"))

    @pw.program
    def both(x):
        return double(x), triple(x)

    x = np.ones(8, np.float32)
    with Client(runtime) as owner:
        kept, released = both.run(x, client=owner)
        np.testing.assert_allclose(np.asarray(released.result(TIMEOUT)), x * 3)
        until(lambda: runtime.usage() is not None and kept._run.retired, "the run was over", TIMEOUT)
        released.delete()
        owner.wait(kept._run, timeout=TIMEOUT)
        ref = owner.share(kept, timeout=TIMEOUT)
        np.testing.assert_allclose(np.asarray(ref.result(TIMEOUT)), x * 2)


def test_a_conds_result_that_the_host_keeps_cannot_be_shared_and_says_why(runtime):
    from jax.sharding import PartitionSpec as P
    pair = pw.virtual_slice(2, axes="x", island="island0")
    positive = pw.jit(lambda x: jnp.sum(x) > 0, slice=pair, in_specs=P("x"), out_specs=P())
    double = pw.jit(lambda x: x * 2.0, slice=pair, in_specs=P("x"), out_specs=P("x"))

    @pw.program
    def route(x):
        return pw.cond(positive(x), double, double, x)

    with Client(runtime) as owner:
        out = route.run(np.ones(8, np.float32), client=owner)
        with pytest.raises(ValueError, match="cannot be shared: the host keeps it .a pw.cond's result that the "
                                             "program returns as it is; pass it through a placed function"):
            owner.share(out, timeout=TIMEOUT)


def test_a_client_forgets_what_it_shared_once_it_releases_it(runtime, plan_builder):
    """A client that shares and releases results again and again keeps no entry for them (it kept one per
    share until it closed)."""
    plan = base_plan(plan_builder, runtime.resources.topology)
    with Client(runtime) as owner:
        for _ in range(5):
            [base] = owner.run(plan, [BASE])
            owner.share(base, timeout=TIMEOUT)
            base.delete()
        assert owner._shared == set()


def test_sharing_on_the_ray_backend():
    pytest.importorskip("ray")
    rt = Runtime(backend="ray", islands=2, per_island=2)
    try:
        s = pw.virtual_slice(2, axes="x", island="island0")
        place = pw.jit(copy_base, slice=s, in_specs=None, out_specs=None)
        read = pw.jit(head, slice=s, in_specs=(None, None), out_specs=None)
        with Client(rt) as owner, Client(rt) as reader:
            base = place.run(BASE, client=owner)
            ref = owner.share(base, timeout=TIMEOUT)
            fetched = rt.islands["island0"].calls["fetch"]
            out = read.run(X, ref, client=reader)
            np.testing.assert_allclose(np.asarray(out.result(TIMEOUT)), np.asarray(jax.jit(head)(X, BASE)),
                                       rtol=1e-4, atol=1e-5)
            fetched += 1                                                    # the reader's own result
            # Held once, and read where it is kept (a reference, not an array through the driver): the reader's
            # peak leaves it out. (Its peak comes back once the actor has seen its run over, which may be after
            # its result is read: the actor's fetch returns a result its executor has made before the run ends.)
            until(lambda: sum(rt.usage().values()) == 2 * BASE_BYTES + 2 * OUT_BYTES, "the reader's run was over",
                  TIMEOUT)
            full = rt.load(read.compiled(X, ref, runtime=rt).plan).need["island0"][0][2]
            assert out._run.need["island0"] == [(0, 2, full - BASE_BYTES)]
            assert rt.islands["island0"].calls["fetch"] == fetched      # the base never came to the driver
            # A reader on the other island pulls it from island0 (its peak counts the copy it places).
            there = pw.jit(head, slice=pw.virtual_slice(2, axes="x", island="island1"), in_specs=(None, None),
                           out_specs=None)
            far = there.run(X, ref, client=reader)
            np.testing.assert_allclose(np.asarray(far.result(TIMEOUT)), np.asarray(jax.jit(head)(X, BASE)),
                                       rtol=1e-4, atol=1e-5)
            assert far._run.need == rt.load(there.compiled(X, ref, runtime=rt).plan).need
            assert rt.islands["island0"].calls["fetch"] == fetched
            far.delete()
            base.delete()
            until(lambda: sum(rt.usage().values()) == 2 * OUT_BYTES, "the base and the far read came back", TIMEOUT)
            with pytest.raises(ValueError, match="was released by its owner"):
                read.run(X, ref, client=reader)
    finally:
        rt.close()


def test_the_readme_snippet_runs():
    """The README's "Shared objects" snippet, in a process of its own."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## Shared objects"):]
    [snippet] = re.findall(r"```py\n# tests/test_shared_objects.py runs this snippet\n(.*?)```", section, re.S)[:1]
    result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == "[0.7615942 0.7615942]\n270336\n"


def test_a_shared_object_released_while_read_is_not_counted_as_held_for_good():
    """Its owner released the base while a reader computed with it: its bytes come back once the reader is
    over, but a run that fits then was refused at once with `OutOfDeviceMemory`, as if live handles held them
    for good (found by a review). It waits for the reader instead. The reader blocks in a host callback, on a
    thread of its own, until that run is submitted."""
    reading, go_on = threading.Event(), threading.Event()

    def wait(y):
        reading.set()
        go_on.wait(TIMEOUT)
        return y

    def gated_head(x, b):
        return jax.pure_callback(wait, jax.ShapeDtypeStruct((8, 64), jnp.float32), head(x, b))

    s = pw.virtual_slice(1, axes="x", island="island1")
    place, read = pw.jit(copy_base, slice=s), pw.jit(gated_head, slice=s)
    # The base placed (its copy from the host, and the result), beside the reader's features and results.
    capacity = 2 * BASE_BYTES + FEATURES_BYTES + 2 * OUT_BYTES + 1024
    rt = Runtime(embedded_device_map(2, 4), device_memory_bytes=capacity)
    owner, reading_client, third = Client(rt), Client(rt), Client(rt)
    outs = []
    reader = threading.Thread(target=lambda: outs.append(read.run(X, ref, client=reading_client)))
    try:
        base = place.run(BASE, client=owner)
        ref = owner.share(base, timeout=TIMEOUT)
        reader.start()
        assert reading.wait(TIMEOUT)
        base.delete()                            # released while read: its bytes come back when the read is over
        copy = place.run(BASE, client=third)     # fits once the reader is over: it waits
        go_on.set()
        reader.join(TIMEOUT)
        np.testing.assert_allclose(np.asarray(outs[0].result(TIMEOUT)), np.asarray(jax.jit(head)(X, BASE)),
                                   rtol=1e-5)
        np.testing.assert_array_equal(np.asarray(copy.result(TIMEOUT)), BASE)
    finally:
        go_on.set()
        if reader.ident is not None:
            reader.join(TIMEOUT)
        for client in (owner, reading_client, third):
            client.close()
        rt.close()

"""Ctrl-C (a KeyboardInterrupt) wherever it lands while a program is called or a handle is dropped: the interrupt
reaches the caller, and the runtime stays consistent, as a notebook user who presses Ctrl-C and goes on needs: no
island keeps the turn of a caller that was interrupted, no run stays under way for good, nothing stays held that
no handle can release, and the next call's result is `jax.jit`'s.

Each interrupt is delivered at a chosen point, deterministically: the function called right after the step that
registers something raises KeyboardInterrupt instead of running (or after it ran), as Ctrl-C landing there would.
Every wait here has a timeout; every runtime made here is closed.
"""

import collections
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime import scheduler as scheduler_module
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.runtime import Runtime

TIMEOUT = 60.0
X = np.arange(8 * 16, dtype=np.float32).reshape(8, 16) / 100

_near = pw.virtual_slice(2, axes="data")
_far = pw.virtual_slice(2, axes="data", island="island1")
_affine = pw.jit(lambda x: x * 3 + 1, slice=_near, in_specs=P("data"), out_specs=P("data"))
_tanh = pw.jit(lambda x: jnp.tanh(x) + 0.5, slice=_far, in_specs=P("data"), out_specs=P("data"))
_total = pw.jit(lambda y: jnp.sum(y), slice=_near, in_specs=P("data"))
_double = pw.jit(lambda y: y * 2, slice=_far, in_specs=P("data"), out_specs=P("data"))
_less = pw.jit(lambda y: y - 7, slice=_far, in_specs=P("data"), out_specs=P("data"))


@pw.program
def _across(x):
    return _tanh(_affine(x))


@pw.program
def _routed(x):
    return pw.cond(_total(x), _double, _less, _affine(x))


def _affine_reference(x):
    return np.asarray(jax.jit(lambda x: x * 3 + 1)(x))


def _across_reference(x):
    return np.asarray(jax.jit(lambda x: jnp.tanh(x * 3 + 1) + 0.5)(x))


def _routed_reference(x):
    return np.asarray(jax.jit(lambda x: jax.lax.cond(jnp.sum(x) != 0, lambda y: y * 2, lambda y: y - 7, x * 3 + 1))(x))


@pytest.fixture
def client(device_map):
    """A client of a fresh 2 x 4 embedded runtime; both closed after the test."""
    rt = Runtime(device_map)
    try:
        with Client(rt) as client:
            yield client
    finally:
        rt.close()


def interrupting(function, after: bool = False):
    """`function`, whose first call raises KeyboardInterrupt, as Ctrl-C landing there would: instead of running,
    or once it ran (`after`). Later calls run it."""
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(None)
        if len(calls) > 1:
            return function(*args, **kwargs)
        if after:
            function(*args, **kwargs)
        raise KeyboardInterrupt

    return interrupted


def settle(rt: Runtime) -> None:
    """Waits (at most `TIMEOUT` seconds) until no admitted run of `rt` is in flight: every run is over and
    retired, its bytes back in the ledger but for the results handles hold."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        rt.scheduler.retire_over()
        if not rt.scheduler._in_flight:
            return
        assert time.monotonic() < deadline, f"runs stay in flight: {rt.status()}"
        time.sleep(0.01)


def assert_consistent(client: Client) -> None:
    """Nothing of an interrupted call is left: no island keeps a caller's turn, no run is in flight, no result
    or byte is held."""
    rt = client.runtime
    assert not any(island._inline for island in rt.islands.values()), "an island keeps an interrupted caller's turn"
    settle(rt)
    deadline = time.monotonic() + TIMEOUT
    while any(island._pending for island in rt.islands.values()):   # (a peer's delivery may still be queued)
        assert time.monotonic() < deadline, f"work items stay queued: {rt.status()}"
        time.sleep(0.01)
    assert client.objects() == []
    assert rt.scheduler._results.held == {}


def test_ctrl_c_while_a_dropped_handle_is_released_reaches_the_caller_and_the_release_is_made(client, monkeypatch):
    # The interrupt landed halfway through `Handle.__del__`'s release (its island's store let the result go, the
    # scheduler did not): Python dropped it ("Exception ignored in: Handle.__del__"), and the bytes stayed held.
    rt = client.runtime
    handle = _affine.run(X, client=client)
    handle.block_until_ready()
    settle(rt)                                   # retired: its bytes are held for the handle
    assert rt.scheduler._results.held
    monkeypatch.setattr(rt.scheduler, "release_result", interrupting(rt.scheduler.release_result))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)     # (a background process ignores it)
    try:
        with pytest.raises(KeyboardInterrupt):
            del handle
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                time.sleep(0.01)                 # the interrupt comes here, once the finalizer returned
    finally:
        signal.signal(signal.SIGINT, previous)
    assert_consistent(client)                    # (`objects` makes the release the interrupt stopped)
    np.testing.assert_allclose(np.asarray(_affine.run(X, client=client).result(timeout=TIMEOUT)), _affine_reference(X))


@pytest.mark.parametrize("where", ["registered", "before its work"])
def test_ctrl_c_in_a_fast_lane_start_ends_the_islands_turn_and_gives_the_run_up(client, monkeypatch, where):
    # Once `Island.start_lane` gave the caller the island's turn, an interrupt before the caller ran the work kept
    # the turn taken for good: every later work item on the island waited in the executor, and the run's credit
    # was never given back. "registered": it lands where the lane records the run (`delivered`).
    rt = client.runtime
    island = rt.islands["island0"]
    np.testing.assert_allclose(np.asarray(_affine.run(X, client=client)), _affine_reference(X))   # the lane's
    [lane] = rt.scheduler._lanes
    if where == "registered":
        class Interrupting(collections.deque):
            def append(self, item):
                self.append = super().append
                raise KeyboardInterrupt
        monkeypatch.setattr(rt.scheduler, "delivered", Interrupting(rt.scheduler.delivered))
    else:
        monkeypatch.setattr(island, "run_lane", interrupting(island.run_lane))
    with pytest.raises(KeyboardInterrupt):
        _affine.run(X, client=client)
    assert_consistent(client)
    assert lane.in_use == 0
    handles = [_affine.run(X, client=client) for _ in range(3)]   # (those queued behind a run are the executor's)
    for handle in handles:
        np.testing.assert_allclose(np.asarray(handle.result(timeout=TIMEOUT)), _affine_reference(X))


@pytest.mark.parametrize("where", ["before any", "between islands"])
def test_ctrl_c_before_a_callers_inline_work_ends_every_islands_turn(client, monkeypatch, where):
    # The gang scheduler admitted the run and its idle islands handed their work back to the caller (each set its
    # turn taken); an interrupt before the caller entered an island's `run_inline` ("before any": as it begins;
    # "between islands": after island0's) kept that island's turn taken for good.
    rt = client.runtime
    np.testing.assert_allclose(np.asarray(_across.run(X, client=client, timeout=TIMEOUT)), _across_reference(X))
    if where == "before any":
        monkeypatch.setattr(scheduler_module, "_run_inline", interrupting(scheduler_module._run_inline))
    else:
        monkeypatch.setattr(rt.islands["island1"], "run_inline", interrupting(rt.islands["island1"].run_inline))
    with pytest.raises(KeyboardInterrupt):
        _across.run(X, client=client, timeout=TIMEOUT)           # (a timeout: the general path)
    assert_consistent(client)
    np.testing.assert_allclose(np.asarray(_across.run(X, client=client).result(timeout=TIMEOUT)), _across_reference(X))


def test_ctrl_c_once_a_cond_program_is_admitted_leaves_no_run_under_way(client, monkeypatch):
    # An interrupt once the scheduler admitted a run with a `pw.cond` (in its inline work, or before its cond's
    # thread started) left it waiting for more work for good, holding its reservation.
    rt = client.runtime
    np.testing.assert_allclose(np.asarray(_routed.run(X, client=client).result(timeout=TIMEOUT)), _routed_reference(X))
    monkeypatch.setattr(rt.scheduler, "submit", interrupting(rt.scheduler.submit, after=True))
    with pytest.raises(KeyboardInterrupt):
        _routed.run(X, client=client)
    assert_consistent(client)
    assert "waits for more work" not in str(rt.status())
    np.testing.assert_allclose(np.asarray(_routed.run(X, client=client).result(timeout=TIMEOUT)), _routed_reference(X))


@pytest.mark.parametrize("timeout", [None, TIMEOUT], ids=["plain call", "with a timeout"])
def test_ctrl_c_before_a_runs_handles_exist_releases_its_results(client, monkeypatch, timeout):
    # The run started, and the interrupt landed before its handles were made (`Compiled.call_plain`, or
    # `Client.run` for a call with a timeout): no handle would ever release its results.
    np.testing.assert_allclose(np.asarray(_affine.run(X, client=client)), _affine_reference(X))
    monkeypatch.setattr(client, "handles", interrupting(client.handles))
    with pytest.raises(KeyboardInterrupt):
        _affine.run(X, client=client, timeout=timeout)
    assert_consistent(client)
    np.testing.assert_allclose(np.asarray(_affine.run(X, client=client).result(timeout=TIMEOUT)), _affine_reference(X))


def test_ctrl_c_while_a_sequential_dispatch_delivers_its_steps_reaches_the_caller(client, monkeypatch):
    # The caller's thread delivers a sequential dispatch's steps one at a time, waiting for each one's inputs: an
    # interrupt there failed the run and was dropped, and the call returned the failed run's handle.
    monkeypatch.setattr(client._dispatcher, "_produced", interrupting(client._dispatcher._produced))
    with pytest.raises(KeyboardInterrupt):
        _across.run(X, client=client, dispatch="sequential")
    assert_consistent(client)
    np.testing.assert_allclose(np.asarray(_across.run(X, client=client, dispatch="sequential").result(timeout=TIMEOUT)),
                               _across_reference(X))


def test_ctrl_c_while_a_fast_lane_reserves_a_credit_gives_it_back(client, monkeypatch):
    # A lane with no credit free reserves one more run's peak (`FastLane._credit`): an interrupt once the ledger
    # took it, before the lane counted it, kept the peak reserved for good (no run and no reclaim gives it back).
    rt = client.runtime
    scheduler = rt.scheduler
    np.testing.assert_allclose(np.asarray(_affine.run(X, client=client)), _affine_reference(X))   # the lane's
    [lane] = scheduler._lanes
    settle(rt)
    baseline = scheduler.usage()                 # (takes the lane's unused credits back: the next run reserves one)
    assert lane.free == 0
    monkeypatch.setattr(scheduler.ledger, "take", interrupting(scheduler.ledger.take, after=True))
    with pytest.raises(KeyboardInterrupt):
        _affine.run(X, client=client)
    assert_consistent(client)
    assert scheduler.usage() == baseline, "the interrupted credit's bytes stay reserved"
    np.testing.assert_allclose(np.asarray(_affine.run(X, client=client).result(timeout=TIMEOUT)), _affine_reference(X))
    assert lane.runs == 2


def test_ctrl_c_while_a_fast_lane_run_computes_keeps_none_of_the_callers_handles(client, monkeypatch):
    # The run fails with the interrupt, which its island keeps as the failure's cause: raised again as it was, it
    # took the traceback of the caller's frames, which kept the caller's handles (and their results) alive for
    # the island's next 10000 failed runs.
    island = client.runtime.islands["island0"]
    argument = _affine.run(X, client=client)
    argument.block_until_ready()
    monkeypatch.setattr(island, "_execute_lane", interrupting(island._execute_lane))
    with pytest.raises(KeyboardInterrupt):
        _affine.run(argument, client=client)
    del argument
    assert_consistent(client)
    np.testing.assert_allclose(np.asarray(_affine.run(X, client=client).result(timeout=TIMEOUT)), _affine_reference(X))


@pytest.mark.parametrize("where", ["reserved", "in flight", "delivered"])
def test_ctrl_c_while_the_scheduler_admits_a_run_gives_its_reservation_and_islands_turns_back(client, monkeypatch,
                                                                                              where):
    # The interrupt landed in `GangScheduler._admit` before it marked the run admitted, so `Runtime.abandon` gave
    # nothing up: "reserved" (the ledger took the run's peak, the run was not in flight yet) kept its peak reserved
    # for good; "in flight" (before its islands had its work) kept its results' bytes held once it was retired;
    # "delivered" (its idle islands registered it and gave the caller their turn) kept each island's turn taken,
    # and every later run on them waited for good.
    rt = client.runtime
    scheduler = rt.scheduler
    np.testing.assert_allclose(np.asarray(_across.run(X, client=client, timeout=TIMEOUT)), _across_reference(X))
    settle(rt)
    baseline = scheduler.usage()
    if where == "reserved":
        monkeypatch.setattr(scheduler.ledger, "take", interrupting(scheduler.ledger.take, after=True))
    elif where == "in flight":
        monkeypatch.setattr(scheduler.policy, "admitted", interrupting(scheduler.policy.admitted))
    else:
        monkeypatch.setattr(scheduler.islands, "start", interrupting(scheduler.islands.start, after=True))
    with pytest.raises(KeyboardInterrupt):
        _across.run(X, client=client, timeout=TIMEOUT)
    assert_consistent(client)
    assert scheduler.usage() == baseline, "the interrupted run's bytes stay reserved"
    np.testing.assert_allclose(np.asarray(_across.run(X, client=client).result(timeout=TIMEOUT)), _across_reference(X))

"""Scheduling policies that use estimated time: `sjf` and `deadline` beside `fifo` and `share`.

Real runs on JAX CPU devices (2 islands of 4), orders read from what the scheduler delivered and what the
islands executed: shortest measured device time first, earliest deadline first, one order on every island,
and a run that a stream of shorter (or earlier-deadline) runs would starve admitted after exactly
`OVERTAKES` of them. A policy's window is counted per island (a reservation keeps its places), and a run is
never admitted past an older waiting run that its results would leave never fitting. Through `pw-serve`, the
policy is a service option. Every wait has a timeout; every runtime and process made here is stopped.
"""

import subprocess
import threading
import time

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from fetching import until
from test_admission_and_lifetimes import X, cross_island, tanh2
from test_fast_lane import running_inline
from test_islands_on_their_own import V, small_plan, spin_plan
from test_service import SERVE, TIMEOUT, procs, serve  # noqa: F401  (procs is a fixture)

import pathways_mlir as pw
from pathways_mlir.runtime.admission import result_need, run_need
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.policies import POLICIES
from pathways_mlir.runtime.runtime import Runtime
from pathways_mlir.runtime.scheduler import OVERTAKES
from pathways_mlir.runtime.service import open_connection

LONG_TRIPS = 200_000       # the long plan's measured runs: many times the small plan's device time


def measured(rt, client, plan, args, times=3):
    """Runs `plan` until runs of it have been measured (a run retired before its island's tracker reported its
    device time is not), so that the scheduler knows its device time; returns it."""
    key = rt.load(plan).key
    for attempt in range(200):
        client.wait(client.start(plan, args), timeout=120)
        time.sleep(0.01)                              # the island's tracker reports the run's device time
        rt.usage()                                    # retires the run: its device time is recorded
        if attempt + 1 >= times and rt.scheduler.estimates.measured(key) is not None:
            return rt.scheduler.estimates.measured(key)
    raise AssertionError(f"no run of {plan.program} was measured in 200 runs")


def delivered_clients(rt, count):
    """The clients of the latest `count` runs delivered, in ticket order."""
    return [client for _, client in list(rt.scheduler.delivered)[-count:]]


def test_sjf_admits_the_shortest_measured_runs_first_in_one_order_on_every_island(device_map, plan_builder):
    rt = Runtime(device_map, policy="sjf", window=10_000)      # every queued run admitted at release, in one pass
    try:
        topology = device_map.topology
        long_plan, small, (across, expected) = (spin_plan(plan_builder, topology), small_plan(plan_builder, topology),
                                                cross_island(plan_builder, topology))
        with Client(rt) as slow, Client(rt) as fast, Client(rt) as middle:
            long_s = measured(rt, slow, long_plan, [V, np.int32(LONG_TRIPS)])
            short_s = measured(rt, fast, small, [X])
            across_s = measured(rt, middle, across, [X])
            assert short_s < long_s and across_s < long_s
            rt.scheduler.hold()
            runs = []
            for _ in range(6):                       # interleaved arrivals, the long plan's first
                runs += [slow.start(long_plan, [V, np.int32(1)]), middle.start(across, [X]), fast.start(small, [X])]
            rt.scheduler.release()
            for run in runs:
                rt.wait(run, timeout=120)
            by_length = sorted([(short_s, fast.id), (across_s, middle.id), (long_s, slow.id)])
            assert delivered_clients(rt, len(runs)) == [c for _, c in by_length for _ in range(6)]
            # One order on every island: both run the cross-island runs in the same (ticket) order.
            ids = {run.id for run in runs if run.client_id == middle.id}
            executed = {name: [(ticket, run) for ticket, run, _ in island.executed if run in ids]
                        for name, island in rt.islands.items()}
            assert executed["island0"] == executed["island1"] == sorted(executed["island0"])
            assert len(executed["island0"]) == 6
            np.testing.assert_allclose(np.asarray(middle.handles(runs[1])[0].result(timeout=60)), expected, rtol=1e-6)
    finally:
        rt.close()


def reference_edf(queued: dict[int, list[tuple[float | None, int]]]) -> list[int]:
    """Earliest deadline first over clients' queues of (deadline, arrival), written plainly: the client whose
    oldest queued run has the earliest deadline goes next; runs without one go after, in arrival order."""
    queues = {c: list(runs) for c, runs in queued.items()}
    order = []
    while any(queues.values()):
        client = min((c for c in queues if queues[c]),
                     key=lambda c: (float("inf") if queues[c][0][0] is None else queues[c][0][0], queues[c][0][1]))
        order.append(client)
        queues[client].pop(0)
    return order


def test_deadline_admits_the_earliest_deadline_first(device_map, plan_builder):
    rt = Runtime(device_map, policy="deadline", window=10_000)
    try:
        plan = small_plan(plan_builder, device_map.topology)
        clients = [Client(rt) for _ in range(4)]
        timeouts = {clients[0].id: [300.0, 900.0, 100.0], clients[1].id: [200.0, 250.0, 1000.0],
                    clients[2].id: [None, None, None], clients[3].id: [150.0, None, 120.0]}
        clients[0].run(plan, [X])[0].result(timeout=60)
        rt.scheduler.hold()
        runs, queued = [], {}
        for i in range(3):                            # the timeouts are long: no run is cancelled
            for client in clients:
                run = client.start(plan, [X], timeout=timeouts[client.id][i])
                queued.setdefault(client.id, []).append((run.deadline, len(runs)))
                runs.append(run)
        rt.scheduler.release()
        for run in runs:
            rt.wait(run, timeout=120)
        assert delivered_clients(rt, len(runs)) == reference_edf(queued)
        for client in clients:
            client.close()
    finally:
        rt.close()


@pytest.mark.parametrize("policy", ["sjf", "deadline"])
def test_a_run_that_shorter_runs_would_starve_waits_for_at_most_overtakes_of_them(device_map, plan_builder,
                                                                                   policy):
    rt = Runtime(device_map, policy=policy, window=1)         # one run on the devices at a time
    try:
        topology = device_map.topology
        long_plan, small = spin_plan(plan_builder, topology), small_plan(plan_builder, topology, "island1")
        with Client(rt) as patient, Client(rt) as stream:
            assert measured(rt, stream, small, [X]) < measured(rt, patient, long_plan, [V, np.int32(LONG_TRIPS)])
            rt.scheduler.hold()
            waiting = patient.start(long_plan, [V, np.int32(1)])     # no deadline: under `deadline`, last
            shorts = [stream.start(small, [X], timeout=600.0 if policy == "deadline" else None)
                      for _ in range(OVERTAKES + 36)]
            assert [q["run"] for q in rt.status()["scheduler"]["queued"]][:1] == [waiting.id]
            rt.scheduler.release()
            rt.wait(waiting, timeout=120)
            for run in shorts:
                rt.wait(run, timeout=120)
            order = delivered_clients(rt, len(shorts) + 1)
            # Without the bound it would go after all of them (and for ever behind an endless stream).
            assert order.index(patient.id) == OVERTAKES and order.count(patient.id) == 1
            np.testing.assert_array_equal(np.asarray(stream.handles(shorts[-1])[0].result(timeout=60)),
                                          np.asarray(jax.jit(tanh2)(X)))
    finally:
        rt.close()


@pytest.mark.parametrize("policy", POLICIES)
def test_clients_whose_runs_waited_leave_no_queue_behind(device_map, plan_builder, policy):
    """Each client whose run ever waited for admission left an empty queue, which every later admission
    looked at: a service's scheduler slowed with every connection it had served."""
    rt = Runtime(device_map, policy=policy)
    try:
        plan = small_plan(plan_builder, rt.resources.topology)
        for _ in range(2):
            rt.scheduler.hold()
            clients = [Client(rt) for _ in range(8)]
            runs = [client.start(plan, [X]) for client in clients]
            rt.scheduler.release()
            for client, run in zip(clients, runs):
                client.wait(run, timeout=60)
                client.close()
        assert not rt.scheduler._waiting._queues
    finally:
        rt.close()


def test_a_policy_is_checked_where_it_is_given():
    message = r"unknown scheduling policy 'lifo' \(choose from fifo, share, sjf, deadline\)"
    with pytest.raises(ValueError, match=message):
        pw.configure(policy="lifo")
    with pytest.raises(ValueError, match=message):
        Runtime(embedded_device_map(1, 1), policy="lifo")
    with pytest.raises(ValueError, match=r"window= must be a positive integer \(admitted runs on the devices\), "
                                         r"not 0"):
        pw.configure(policy="sjf", window=0)
    with pytest.raises(ValueError, match=r"^policy 'fifo' has no window \(it admits every run that fits\): window= "
                                         r"is for share, sjf, deadline$"):
        Runtime(embedded_device_map(1, 1), policy="fifo", window=3)        # (was accepted, and ignored)
    result = subprocess.run([*SERVE, "--policy", "lifo"], capture_output=True, text=True, timeout=TIMEOUT)
    assert (result.returncode, result.stdout, result.stderr) == (
        1, "", "pw-serve: error: Invalid value for '--policy': 'lifo' is not one of 'fifo', 'share', 'sjf', "
               "'deadline'. (--help for usage)\n")
    assert POLICIES == ("fifo", "share", "sjf", "deadline")


def test_pw_serve_takes_a_policy_and_a_remote_runs_deadline(tmp_path, procs, plan_builder):  # noqa: F811
    directory = tmp_path / "service"
    directory.mkdir(mode=0o700)
    service_file = directory / "service.json"
    serve(procs, "--policy", "deadline", "--service-file", str(service_file))
    with open_connection(str(service_file), timeout=TIMEOUT) as remote:
        _, topology = remote.resources.snapshot()
        plan = small_plan(plan_builder, topology)
        [handle] = remote.run(plan, [X], timeout=600.0)
        np.testing.assert_array_equal(np.asarray(handle.result(timeout=TIMEOUT)), np.asarray(jax.jit(tanh2)(X)))
        assert remote.status(full=True)["scheduler"]["policy"] == "deadline"



# -- a pw.cond's branch run continues its admitted parent ----------------------------------------------------

_pair = pw.virtual_slice(2, axes="x", island="island0")
_positive = pw.jit(lambda x: jax.numpy.sum(x) > 0, slice=_pair, in_specs=P("x"), out_specs=P())
_double = pw.jit(lambda x: x * 2.0, slice=_pair, in_specs=P("x"), out_specs=P("x"))


@pw.program
def _route(x):
    return pw.cond(_positive(x), _double, lambda v: v, x)


@pw.program
def _doubled(x):
    return _double(x)


@pw.program
def _double_and_route(flag, x, y):
    return _double(x), pw.cond(flag, _double, lambda v: v, y)   # flag and y stay on the host


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "fifo"])
def test_a_cond_runs_under_every_window_its_branch_taking_its_parents_place(device_map, policy):
    # Under a policy with a window, the parent holds a place while its cond waits for the branch run; the
    # branch needs no place of its own. It waited for one: with window=1 one run never ended, and with the
    # default window as many cond programs at once as places hung every client for good.
    x = np.arange(8, dtype=np.float32)
    for window in (1, None):
        rt = Runtime(device_map, policy=policy, window=window)
        try:
            with Client(rt) as one, Client(rt) as other:
                rt.scheduler.hold()                   # admitted together at release: every place takes a parent
                outs = [_route.run(x, client=client) for client in (one, other) * rt.scheduler.window]
                rt.scheduler.release()
                for out in outs:
                    np.testing.assert_array_equal(np.asarray(out.result(timeout=60)), x * 2.0)
        finally:
            rt.close()


def test_a_conds_branch_run_is_not_queued_behind_its_clients_later_runs(plan_builder):
    # fifo, one island of 2 devices: the client's next run waits for memory its cond program holds. The branch
    # run, submitted after it by the cond's thread, went behind it in the client's queue: neither went on.
    x, y = np.arange(4096, dtype=np.float32), np.ones(4 * 4096, np.float32)
    rt = Runtime(embedded_device_map(1, 2))
    try:
        route = rt.load(_route.compiled(x, runtime=rt).plan)
        branch = rt.load(route.plan.host_steps[0].then_plan)
        after = rt.load(_doubled.compiled(y, runtime=rt).plan)
    finally:
        rt.close()

    def peak(loaded):
        return max(nbytes for ranges in loaded.need.values() for _, _, nbytes in ranges)
    held = x.nbytes // 2                                  # per device: the cond's result, which `out` holds
    capacity = max(peak(route) + peak(branch), peak(after) + held)
    assert capacity < peak(route) + peak(after)           # the next run fits beside that, not beside the program
    rt = Runtime(embedded_device_map(1, 2), device_memory_bytes=capacity)
    try:
        with Client(rt) as client:
            rt.scheduler.hold()
            out = _route.run(x, client=client)
            later = _doubled.run(y, client=client)
            rt.scheduler.release()
            np.testing.assert_array_equal(np.asarray(out.result(timeout=60)), x * 2.0)
            np.testing.assert_array_equal(np.asarray(later.result(timeout=60)), y * 2.0)
    finally:
        rt.close()


def test_cond_programs_that_each_fit_without_their_branch_do_not_wait_for_each_other_for_ever():
    # One island of 2 devices: two cond programs fit together, and one beside its branch run and the other's
    # result, not both beside a branch. Each parent was admitted alone, its branch run waited for memory the
    # other held, and neither went on; a parent's need now counts its largest branch's, so the second waits for
    # the first.
    x = np.arange(4096, dtype=np.float32)
    rt = Runtime(embedded_device_map(1, 2))
    try:
        plan = _route.compiled(x, runtime=rt).plan    # (held: a closed runtime's stages and their plans go)
        route = rt.load(plan)
        branch = rt.load(plan.host_steps[0].then_plan)
    finally:
        rt.close()
    own, with_branch = max(n for _, _, n in plan.peak("island0")), max(n for _, _, n in route.need["island0"])
    assert with_branch == own + max(n for _, _, n in branch.need["island0"])
    held = x.nbytes // 2                                   # per device: a program's result, which its handle holds
    capacity = with_branch + held                          # one program beside the other's result
    assert capacity < own + with_branch                    # both parents, not both beside a branch
    rt = Runtime(embedded_device_map(1, 2), device_memory_bytes=capacity)
    try:
        with Client(rt) as one, Client(rt) as other:
            rt.scheduler.hold()
            outs = [_route.run(x, client=client) for client in (one, other)]
            rt.scheduler.release()
            for out in outs:
                np.testing.assert_array_equal(np.asarray(out.result(timeout=60)), x * 2.0)
    finally:
        rt.close()


@pytest.mark.parametrize("branch", ["computing", "over"])
def test_a_conds_branch_results_are_not_counted_as_held_by_handles(branch):
    # One island of 2 devices, room for one cond program beside its branch, not two. The branch run's result
    # lies within its parent's reservation, and the cond's thread releases it before the parent goes on;
    # counted as held by a live handle (the branch run in flight, or over before that release), the second
    # program failed at once with OutOfDeviceMemory now and then on a loaded machine. Here the island's turn
    # keeps the branch run computing, and the scheduler's lock keeps its result unreleased once it is over.
    x = np.arange(4096, dtype=np.float32)
    rt = Runtime(embedded_device_map(1, 2))
    try:
        need = max(n for _, _, n in rt.load(_double_and_route.compiled(True, x, x, runtime=rt).plan).need["island0"])
    finally:
        rt.close()
    # Room for one program beside the other's result on the island (half of x per device): the second fits
    # once the first is over.
    rt = Runtime(embedded_device_map(1, 2), device_memory_bytes=need + x.nbytes // 2)
    island, scheduler = rt.islands["island0"], rt.scheduler
    try:
        with Client(rt) as one, Client(rt) as other:
            with running_inline(island):                     # the branch run's work waits for this turn
                first, _ = _double_and_route.run(True, x, x, client=one)
                until(lambda: any(r.parent is first._run for r in list(scheduler._in_flight.values())),
                      "the branch run admitted", 60)
                [inner] = [r for r in scheduler._in_flight.values() if r.parent is first._run]
                scheduler._lock.acquire()                    # the cond's thread cannot release the branch's result
                if branch == "computing":
                    second, _ = _double_and_route.run(True, x, x, client=other)
            try:
                if branch == "over":
                    until(lambda: island.run_done(inner.id), "the branch run over", 60)
                    second, _ = _double_and_route.run(True, x, x, client=other)
                assert [q["run"] for q in scheduler.status()["queued"]] == [second._run.id]
            finally:
                scheduler._lock.release()
            for out in (first, second):
                np.testing.assert_array_equal(np.asarray(out.result(timeout=60)), x * 2.0)
    finally:
        rt.close()


@pw.program
def _route_by(flag, x):
    return pw.cond(flag, _double, lambda v: v, x)       # no island work but in its branches


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_a_cond_program_holds_its_reservation_till_its_branch_is_over(dispatch):
    # One island of 2 devices, room for one program whose need is its branch's (it has no island work of its
    # own: its flag and operand stay on the host). It counted as over on its islands (none; in sequential
    # dispatch, once its last island step was) while its branch ran, and the next look gave its reservation
    # back: the second program was admitted beside that branch. Its cond started the branch before the program
    # was admitted, too. The island's turn keeps the first branch run computing; each call is made on a thread
    # of its own, a sequential one dispatching its steps (the branch's too) before it returns.
    x = np.arange(4096, dtype=np.float32)
    rt = Runtime(embedded_device_map(1, 2))
    try:
        need = max(n for _, _, n in rt.load(_route_by.compiled(True, x, runtime=rt).plan).need["island0"])
    finally:
        rt.close()
    # Room for one program beside the other's result (half of x per device), which its handle holds.
    rt = Runtime(embedded_device_map(1, 2), device_memory_bytes=need + x.nbytes // 2)
    island, scheduler = rt.islands["island0"], rt.scheduler
    outs, calls = [], []
    try:
        with Client(rt) as one, Client(rt) as other:
            with running_inline(island):                       # the branch run's work waits for this turn
                for client in (one, other):
                    calls.append(threading.Thread(target=lambda c=client: outs.append(
                        _route_by.run(True, x, client=c, dispatch=dispatch)), daemon=True))
                    calls[-1].start()
                    if client is one:
                        until(lambda: any(r.parent is not None for r in list(scheduler._in_flight.values())),
                              "the first program's branch run admitted", 60)
                until(lambda: len(scheduler.status()["queued"]) == 1, "the second program queued", 60)
                admitted = list(scheduler._in_flight.values())
                assert len(admitted) == 2 and admitted[1].parent is admitted[0], \
                    "only the first program and its branch run are admitted"
                first, branch = admitted
            for call in calls:
                call.join(60)
            for out in outs:
                np.testing.assert_array_equal(np.asarray(out.result(timeout=60)), x * 2.0)
            started = {}
            for ticket, run_id, _ in island.executed:
                started.setdefault(run_id, ticket)
            second = next(out._run for out in outs if out._run is not first)
            [second_branch] = set(started) - {first.id, branch.id, second.id}
            assert started[second.id] < started[second_branch], "the second program went before its branch run"
    finally:
        rt.close()


# -- a policy's window is counted per island; admission never fails an older waiting run -------------------

def retired_all(rt) -> bool:
    """Retires the runs that are over; whether none is left on the devices."""
    rt.scheduler.retire_over()
    return not rt.scheduler._in_flight


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "fifo"])
def test_a_full_window_on_one_island_holds_back_no_other_islands_run(device_map, plan_builder, policy):
    """The window was one count for the whole cluster: runs on island0 (a long computation and the runs queued
    behind it there) filled it, and a run for idle island1 waited for them (seconds), against the README's "a
    long computation on one island delays only that island's work". Each island now has a window of its own,
    and a run takes a place on every island it uses. The island's turn keeps island0's runs on the devices."""
    rt = Runtime(device_map, policy=policy)
    try:
        topology = device_map.topology
        on0, on1 = small_plan(plan_builder, topology, "island0"), small_plan(plan_builder, topology, "island1")
        across, expected = cross_island(plan_builder, topology)
        with Client(rt) as busy, Client(rt) as other:
            for plan in (on0, on1, across):
                other.wait(other.start(plan, [X]), timeout=60)        # loaded, and over
            until(lambda: retired_all(rt), "the first runs retired", 60)
            with running_inline(rt.islands["island0"]):
                held = [busy.start(on0, [X]) for _ in range(rt.scheduler.window)]
                assert all(run.admitted for run in held)             # island0's window is full
                [beside] = other.run(on1, [X])
                assert beside._run.admitted, rt.status()["scheduler"]
                np.testing.assert_array_equal(np.asarray(beside.result(timeout=60)), np.asarray(jax.jit(tanh2)(X)))
                [through] = other.run(across, [X])                   # it needs a place on island0 too
                waits_for = {q["run"]: q["waits_for"] for q in rt.status()["scheduler"]["queued"]}
                assert waits_for == {through._run.id: f"a place in the {policy} window ({rt.scheduler.window} runs "
                                                      f"on the devices of island0)"}
            np.testing.assert_allclose(np.asarray(through.result(timeout=60)), expected, rtol=1e-6)
            for run in held:
                busy.wait(run, timeout=60)
    finally:
        rt.close()


def test_a_reservation_keeps_a_place_in_the_window_of_each_of_its_islands(device_map, plan_builder):
    """With a window per island, a run on two islands needs a place on both at once: runs on one of them could
    take each place it needs as another frees. Overtaken `OVERTAKES` times, it holds a reservation, which now
    keeps it a place on each of its islands (sjf, a window of 1: island0's place is held by a run kept on the
    devices by the island's turn, and island1's is kept for the reserved run)."""
    rt = Runtime(device_map, policy="sjf", window=1)
    try:
        topology = device_map.topology
        on0, on1 = small_plan(plan_builder, topology, "island0"), small_plan(plan_builder, topology, "island1")
        across, expected = cross_island(plan_builder, topology)
        with Client(rt) as holder, Client(rt) as patient, Client(rt) as stream:
            for plan in (on0, on1, across):
                holder.wait(holder.start(plan, [X]), timeout=60)     # loaded, and over
            until(lambda: retired_all(rt), "the first runs retired", 60)
            with running_inline(rt.islands["island0"]):
                first = holder.start(on0, [X])
                waiting = patient.start(across, [X])
                assert first.admitted and not waiting.admitted
                for _ in range(OVERTAKES):                           # each takes island1's place, and overtakes it
                    run = stream.start(on1, [X])
                    assert rt.scheduler.wait_admitted(run, timeout=60), rt.status()["scheduler"]
                    stream.wait(run, timeout=60)
                assert rt.scheduler._waiting.reserved.run is waiting
                late = stream.start(on1, [X])                       # island1 is free, but its place is kept
                waits_for = {q["run"]: q["waits_for"] for q in rt.status()["scheduler"]["queued"]}
                assert not late.admitted and waits_for[late.id] == (
                    f"run {waiting.id}, which holds a reservation (it was overtaken {OVERTAKES} times)")
            rt.wait(waiting, timeout=60)
            rt.wait(late, timeout=60)
            assert delivered_clients(rt, 2) == [patient.id, stream.id]
            np.testing.assert_allclose(np.asarray(patient.handles(waiting)[0].result(timeout=60)), expected,
                                       rtol=1e-6)
    finally:
        rt.close()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_run_waiting_for_memory_is_never_failed_by_a_run_admitted_after_it(device_map, plan_builder, policy):
    """One device's memory: a run on the devices keeps its result; `big`, which fits once that run is over,
    waits; another client's small run fitted and was admitted past it, and once the first run was over `big`
    failed with OutOfDeviceMemory ("held by live handles"), the small run's result counted as held for good. A
    run now waits behind an older waiting run it would leave never fitting. The island's turn keeps the first
    run on the devices."""
    topology = device_map.topology
    held_plan, big_plan, tiny_plan = (small_plan(plan_builder, topology, "island0", shape)
                                      for shape in ((8, 16), (16, 16), (1, 16)))

    def peak(plan):
        return run_need(plan)["island0"][0][2]

    def kept(plan):
        return result_need(plan, plan.outputs[0])["island0"][0][2]
    capacity = kept(held_plan) + peak(big_plan)                   # `big` fits once the first run is over
    assert peak(held_plan) + peak(big_plan) > capacity >= peak(held_plan) + peak(tiny_plan)
    assert kept(held_plan) + kept(tiny_plan) + peak(big_plan) > capacity
    xs = {shape: np.random.default_rng(2).normal(size=shape).astype(np.float32) for shape in ((16, 16), (1, 16))}
    rt = Runtime(device_map, policy=policy, device_memory_bytes=capacity)
    try:
        with Client(rt) as holder, Client(rt) as first, Client(rt) as later:
            with running_inline(rt.islands["island0"]):
                [result] = holder.run(held_plan, [X])
                [big] = first.run(big_plan, [xs[(16, 16)]])
                [tiny] = later.run(tiny_plan, [xs[(1, 16)]])
                tiny_admitted = tiny._run.admitted
                waits_for = {q["run"]: q["waits_for"] for q in rt.status()["scheduler"]["queued"]}
            for handle, x in ((result, X), (big, xs[(16, 16)]), (tiny, xs[(1, 16)])):
                np.testing.assert_array_equal(np.asarray(handle.result(timeout=60)), np.asarray(jax.jit(tanh2)(x)))
            assert not tiny_admitted and waits_for[tiny._run.id] == (
                f"run {big._run.id}, which waits for memory that this run's results would keep")
            assert delivered_clients(rt, 3) == [holder.id, first.id, later.id]
    finally:
        rt.close()


def memory_plans(plan_builder, topology, island="island0"):
    """Plans on device 0 of `island` and a capacity where `big` fits once a run of `held` is over, its result
    kept, and `tiny` fits beside a run of `held` but would leave `big` never fitting, its result kept too."""
    held, big, tiny = (small_plan(plan_builder, topology, island, shape) for shape in ((8, 16), (16, 16), (1, 16)))

    def peak(plan):
        return run_need(plan)[island][0][2]

    def kept(plan):
        return result_need(plan, plan.outputs[0])[island][0][2]
    capacity = kept(held) + peak(big)
    assert peak(held) + peak(big) > capacity >= peak(held) + peak(tiny)
    assert kept(held) + kept(tiny) + peak(big) > capacity
    return held, big, tiny, capacity


XB, XT = (np.random.default_rng(3).normal(size=shape).astype(np.float32) for shape in ((16, 16), (1, 16)))


def run_and_drop(client, plan, x):
    """Runs `plan` on `x` to its end and releases its result (a small capacity holds few)."""
    [handle] = client.run(plan, [x])
    handle.result(timeout=60)
    handle.delete()


def warmed(rt, client, plans_and_args):
    """Loads and runs each plan once (compiled), and waits until no run is on the devices."""
    for plan, x in plans_and_args:
        run_and_drop(client, plan, x)
    until(lambda: retired_all(rt), "the first runs retired", 60)


def assert_computed(handle, x):
    np.testing.assert_array_equal(np.asarray(handle.result(timeout=60)), np.asarray(jax.jit(tanh2)(x)))


def assert_big_then_tiny(rt, result, a_big, b_tiny) -> None:
    """Both waiting runs are admitted, client `a`'s `big` delivered before client `b`'s `tiny`, and every result,
    the held run's `result` included, is right."""
    (a, big), (b, tiny) = a_big, b_tiny
    assert rt.scheduler.wait_admitted(big, timeout=60), rt.status()["scheduler"]
    assert rt.scheduler.wait_admitted(tiny, timeout=60), rt.status()["scheduler"]
    assert_computed(result, X)
    assert_computed(a.handles(big)[0], XB)
    assert_computed(b.handles(tiny)[0], XT)
    assert delivered_clients(rt, 2) == [a.id, b.id]


@pytest.mark.parametrize("policy", POLICIES)
def test_runs_overtaken_together_leave_the_reservation_to_the_oldest(device_map, plan_builder, policy):
    """`big` fits once the run on the devices is over; `tiny`, younger, fits now but would leave `big` never
    fitting, so it waits behind it. Runs on island1 overtook both, both got to `OVERTAKES` in one admission, and
    the reservation went to the first queue of the scheduler's, `tiny`'s client's (its first run was queued
    before `big`): `tiny` waited behind `big` and `big` behind the reservation, for ever, with nothing on the
    devices (a result() without a timeout hung). The oldest of them now holds the reservation. The island's turn
    keeps the first run on the devices."""
    topology = device_map.topology
    held, big_plan, tiny_plan, capacity = memory_plans(plan_builder, topology)
    on1 = small_plan(plan_builder, topology, "island1", (1, 16))
    rt = Runtime(device_map, policy=policy, device_memory_bytes=capacity)
    try:
        with Client(rt) as holder, Client(rt) as a, Client(rt) as b, Client(rt) as stream:
            warmed(rt, holder, ((held, X), (big_plan, XB), (tiny_plan, XT), (on1, XT)))
            with running_inline(rt.islands["island0"]):
                [result] = holder.run(held, [X])
                rt.scheduler.hold()
                b.start(on1, [XT])                  # `b`'s queue is made first
                big = a.start(big_plan, [XB])
                tiny = b.start(tiny_plan, [XT])
                rt.scheduler.release()
                for _ in range(OVERTAKES):
                    run_and_drop(stream, on1, XT)
                assert rt.scheduler._waiting.reserved.run is big, rt.status()["scheduler"]
            assert_big_then_tiny(rt, result, (a, big), (b, tiny))
    finally:
        rt.close()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_reserved_run_gives_its_reservation_to_an_older_run_it_would_leave_never_fitting(device_map, plan_builder,
                                                                                           policy):
    """`tiny` waits behind `big`, which it would leave never fitting; `big` came to the head of its queue later
    (the run before it was cancelled), so `tiny` was overtaken `OVERTAKES` times first and held the reservation:
    `big`, not fitting beside it, waited behind the reservation, `tiny` behind `big`, and neither was ever
    admitted once the run on the devices was over. The reservation now goes to `big`."""
    topology = device_map.topology
    held, big_plan, tiny_plan, capacity = memory_plans(plan_builder, topology)
    on1 = small_plan(plan_builder, topology, "island1", (1, 16))
    rt = Runtime(device_map, policy=policy, device_memory_bytes=capacity)
    try:
        with Client(rt) as holder, Client(rt) as a, Client(rt) as b, Client(rt) as stream:
            warmed(rt, holder, ((held, X), (big_plan, XB), (tiny_plan, XT), (on1, XT)))
            with running_inline(rt.islands["island0"]):
                [result] = holder.run(held, [X])
                cancelled = a.start(big_plan, [XB])
                big = a.start(big_plan, [XB])
                tiny = b.start(tiny_plan, [XT])
                for _ in range(OVERTAKES // 2):
                    run_and_drop(stream, on1, XT)
                assert rt.scheduler.cancel(cancelled, RuntimeError("cancelled by the test"))
                for _ in range(OVERTAKES - OVERTAKES // 2):      # `tiny` gets to OVERTAKES, `big` does not
                    run_and_drop(stream, on1, XT)
            assert_big_then_tiny(rt, result, (a, big), (b, tiny))
    finally:
        rt.close()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_run_behind_its_clients_run_is_never_failed_by_a_run_admitted_after_it(device_map, plan_builder, policy):
    """`second` waits behind its client's `first` (which waits for island1's memory) and fits island0 once the
    run on its devices is over; another client's `late` fitted island0 now and was admitted past it, as only the
    head of each queue was looked at, and `second` then failed with OutOfDeviceMemory, `late`'s result counted
    as held for good. Every older waiting run is looked at now: `late` waits behind `second`. The islands'
    turns keep the first runs on the devices."""
    topology = device_map.topology
    held0, big0, tiny0, capacity = memory_plans(plan_builder, topology, "island0")
    held1, big1, _, _ = memory_plans(plan_builder, topology, "island1")
    rt = Runtime(device_map, policy=policy, device_memory_bytes=capacity)
    try:
        with Client(rt) as holder, Client(rt) as a, Client(rt) as b:
            warmed(rt, holder, ((held0, X), (big0, XB), (tiny0, XT), (held1, X), (big1, XB)))
            with running_inline(rt.islands["island0"]), running_inline(rt.islands["island1"]):
                [result0] = holder.run(held0, [X])
                [result1] = holder.run(big1, [XB])
                first = a.start(held1, [X])           # waits for island1's memory
                second = a.start(big0, [XB])          # behind it
                [late] = b.run(tiny0, [XT])
                late_admitted = late._run.admitted
                waits_for = {q["run"]: q["waits_for"] for q in rt.status()["scheduler"]["queued"]}
            for handle, x in ((result0, X), (result1, XB), (a.handles(first)[0], X), (a.handles(second)[0], XB),
                              (late, XT)):
                assert_computed(handle, x)
            assert not late_admitted and waits_for[late._run.id] == (
                f"run {second.id}, which waits for memory that this run's results would keep")
            assert delivered_clients(rt, 3) == [a.id, a.id, b.id]
    finally:
        rt.close()

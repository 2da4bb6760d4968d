"""Device time: how an island's clock attributes time to its runs, and how `share` charges it.

Deterministic: the clock is given the bounds a completion tracker would see, and the `share` policy the
durations an island would measure; nothing here is timed.
"""

import pytest

from pathways_mlir.runtime.device_clock import DeviceClock
from pathways_mlir.runtime.device_estimates import DeviceTimeEstimates
from pathways_mlir.runtime.policies import Share
from pathways_mlir.runtime.run import Run
from pathways_mlir.runtime.waiting_runs import OVERTAKES, WaitingRuns


def test_runs_known_exactly_are_timed_one_after_another():
    clock = DeviceClock(widest=10.0)
    clock.begin(1, 10.0)
    clock.begin(2, 10.5)                             # dispatched while run 1 computes
    assert clock.end(1, 12.0, 12.0) == pytest.approx(2.0)
    assert clock.end(2, 13.0, 13.0) == pytest.approx(1.0)    # from run 1's end, not its own dispatch
    clock.begin(3, 20.0)                             # the devices were idle in between
    assert clock.end(3, 20.25, 20.25) == pytest.approx(0.25)


def test_an_end_seen_by_a_look_is_the_middle_of_its_bounds():
    clock = DeviceClock(widest=10.0)
    clock.begin(1, 0.0)
    assert clock.end(1, 1.0, 1.5) == pytest.approx(1.25)     # still computing at 1.0, over at 1.5
    clock.begin(2, 0.5)
    assert clock.end(2, 2.0, 2.5) == pytest.approx(1.0)      # 2.25 - 1.25


def test_two_runs_one_look_finds_over_together_leave_the_second_untimed():
    clock = DeviceClock(widest=10.0)
    for run in (1, 2, 3):
        clock.begin(run, 0.0)
    assert clock.end(1, 1.0, 2.0) == pytest.approx(1.5)
    assert clock.end(2, 0.2, 2.0) is None                     # both ends lie between 1.0 and 2.0
    # Run 2 ended after run 1 (1.5) and by 2.0: at 1.75. The next look's run is timed again, from there.
    assert clock.end(3, 2.5, 3.0) == pytest.approx(1.0)


def test_a_run_known_exactly_after_one_seen_together_is_timed():
    clock = DeviceClock(widest=10.0)
    for run in (1, 2):
        clock.begin(run, 0.0)
    assert clock.end(1, 1.0, 2.0) == pytest.approx(1.5)
    assert clock.end(2, 2.0, 2.0) == pytest.approx(0.5)      # computed when its dispatch ended (inline)


def test_an_end_seen_only_after_the_looks_were_held_up_leaves_the_run_untimed():
    clock = DeviceClock(widest=0.004)
    for run in (1, 2, 3):
        clock.begin(run, 0.0)
    assert clock.end(1, 0.001, 0.2) is None        # still computing at 1 ms, seen over only at 200 ms
    assert clock.end(2, 0.202, 0.203) is None      # it started when run 1 ended, which is not known
    assert clock.end(3, 0.204, 0.205) == pytest.approx(0.002)


def test_a_dropped_run_is_forgotten():
    clock = DeviceClock(widest=10.0)
    clock.begin(1, 0.0)
    clock.drop(1)
    clock.begin(1, 5.0)
    assert clock.end(1, 6.0, 6.0) == pytest.approx(1.0)


class _Head:
    """What the scheduler hands a policy's `order`: a queued run and its arrival."""

    def __init__(self, run: Run, arrival: int):
        self.run, self.arrival = run, arrival


def test_share_charges_what_runs_measured_not_what_they_were_expected_to_take():
    # Every client's runs are estimated at 1 s, but client 0's take 3 s and client 1's 1 s: once each run's
    # measured time corrects its charge, client 1 gets three runs for each of client 0's.
    policy = Share()
    took = {0: 3.0, 1: 1.0}
    for client in took:                      # the scheduler tells the policy of a client's first run
        policy.arrived(Run(None, 0, client, (), {}), True, lambda run: 1.0)
    arrival, order = 0, []
    for _ in range(40):
        heads = []
        for client in (0, 1):
            arrival += 1
            heads.append(_Head(Run(None, 0, client, (), {}), arrival))
        policy.order(heads, lambda run: 1.0)
        run = heads[0].run
        policy.admitted(run, lambda run: 1.0, took)        # both clients have runs queued
        assert run.charged == 1.0
        policy.retired(run, took[run.client_id])
        order.append(run.client_id)
    assert order.count(1) == 3 * order.count(0)
    assert policy.virtual[0] == pytest.approx(3.0 * order.count(0))
    assert policy.virtual[1] == pytest.approx(1.0 * order.count(1))


def _share_order(policy: Share, took: dict[int, float], steps: int, in_flight: int = 1) -> list[int]:
    """Admits `steps` runs of the clients in `took` (each estimated at 1 s, taking `took[client]` s), with at
    most `in_flight` of them on the devices (the oldest is over before another is admitted); every client
    always has a run queued, and one new to the policy arrives. Returns the clients in the order they
    were admitted."""
    order, arrival, flying = [], 0, []
    queued = {client: _Head(Run(None, 0, client, (), {}), client) for client in took}
    for client in took:
        if client not in policy.virtual:
            policy.arrived(queued[client].run, True, lambda run: 1.0)
    for _ in range(steps):
        if len(flying) == in_flight:
            run = flying.pop(0)
            policy.retired(run, took[run.client_id])
        heads = list(queued.values())
        policy.order(heads, lambda run: 1.0)
        run = heads[0].run
        arrival += 1
        queued[run.client_id] = _Head(Run(None, 0, run.client_id, (), {}), arrival)
        policy.admitted(run, lambda run: 1.0, queued)
        flying.append(run)
        order.append(run.client_id)
    for run in flying:
        policy.retired(run, took[run.client_id])
    return order


def test_share_gives_a_client_back_from_a_pause_its_share_not_the_devices_alone():
    policy = Share()
    _share_order(policy, {0: 1.0, 1: 1.0}, 100)
    _share_order(policy, {0: 1.0}, 100)          # client 1 pauses while client 0 goes on alone
    policy.arrived(Run(None, 0, 1, (), {}), True, lambda run: 1.0)
    back = _share_order(policy, {0: 1.0, 1: 1.0}, 40)
    # Up to a window of credit, then one run each: not the 100 runs it missed.
    assert back.count(1) <= 20 + policy.window
    # A client new to the policy starts where the others are.
    late = _share_order(policy, {0: 1.0, 1: 1.0, 2: 1.0}, 60)
    assert late.count(2) <= 20 + 1


def test_share_bounds_the_credit_of_a_client_back_from_idle_to_one_window():
    policy = Share(window=4)
    _share_order(policy, {0: 1.0, 1: 0.5, 2: 1.0}, 90, in_flight=4)
    now = policy.now
    # Client 1's runs took half their estimate: the credit of its last runs' corrections is kept ...
    policy.virtual[1] = now - 1.5
    policy.arrived(Run(None, 0, 1, (), {}), True, lambda run: 1.0)
    assert policy.virtual[1] == now - 1.5
    # ... while one that fell far behind (it was idle) comes back a window's estimate behind the others.
    policy.virtual[2] = now - 50.0
    policy.arrived(Run(None, 0, 2, (), {}), True, lambda run: 1.0)
    assert policy.virtual[2] == now - 4 * 1.0
    # A client with runs queued or on the devices was not idle: it keeps what it has.
    policy.virtual[0] = now - 50.0
    policy.arrived(Run(None, 0, 0, (), {}), False, lambda run: 1.0)
    assert policy.virtual[0] == now - 50.0


def test_share_keeps_nothing_for_a_closed_client_whose_queued_run_is_admitted_after():
    policy = Share()
    run = Run(None, 0, 1, (), {})
    policy.arrived(run, True, lambda run: 1.0)
    policy.forget(1)                              # client 1 closed with `run` still queued
    policy.admitted(run, lambda run: 1.0, ())
    policy.retired(run, 2.0)
    assert policy.virtual == {} and policy.now == 0.0


def _share_with_reservations(policy: Share, waiting: WaitingRuns, weights: dict[int, float], steps: int) -> list[int]:
    """Admits `steps` runs as the scheduler does when every run fits (the head holding the reservation first,
    then the policy's order), each client in `weights` (client -> weight) keeping one run queued; every run is
    estimated at 1 s, takes that and is over before the next is admitted. Returns the clients in the order
    they were admitted."""
    def one_second(run):
        return 1.0

    def queue(client):
        run = Run(None, 0, client, (), {}, weight=weights[client])
        policy.arrived(run, client not in policy.virtual, one_second)
        waiting.add(run, None)

    for client in weights:
        if not waiting.has_client(client):
            queue(client)
    order = []
    for _ in range(steps):
        item = waiting.heads(policy, one_second)[0]
        waiting.take(item)
        policy.admitted(item.run, one_second, waiting.clients())
        policy.retired(item.run, 1.0)
        order.append(item.run.client_id)
        queue(item.run.client_id)
    return order


def test_share_starts_a_newcomer_where_the_queued_clients_are_not_where_a_reserved_run_started():
    # Client 2's weight is 0.001: each of its runs moves its virtual time 1000 s ahead of clients 0 and 1, so
    # it is admitted only through the reservation, once every OVERTAKES runs. The run admitted that way starts
    # far ahead of the clients queued; a client new to the policy must start where they are, not there.
    policy, waiting = Share(), WaitingRuns()
    before = _share_with_reservations(policy, waiting, {0: 1.0, 1: 1.0, 2: 0.001}, 5 * OVERTAKES)
    assert before.count(2) >= 3                     # (reserved runs were admitted)
    assert policy.now <= min(policy.virtual[0], policy.virtual[1])
    after = _share_with_reservations(policy, waiting, {0: 1.0, 1: 1.0, 2: 0.001, 3: 1.0}, 5 * OVERTAKES)
    # Clients 0, 1 and 3 (weight 1 each) take turns; client 2 still gets its run in OVERTAKES.
    assert abs(after.count(3) - after.count(0)) <= 1 and abs(after.count(3) - after.count(1)) <= 1, \
        {client: after.count(client) for client in range(4)}


def test_a_client_whose_runs_of_a_shared_plan_take_longer_is_charged_what_they_take():
    # Two clients run plan 7 with different arguments: client 1's runs take 1 ms, client 2's 6 ms. Each run is
    # bounded by its own client's latest runs, not the plan's (which blend both: client 2 would be charged less
    # than its runs take).
    estimates = DeviceTimeEstimates()
    for _ in range(20):
        estimates.record(7, 1e-3, client_id=1)
        estimates.record(7, 6e-3, client_id=2)
    assert estimates.record(7, 1e-3, client_id=1) == pytest.approx(1e-3)
    assert estimates.record(7, 6e-3, client_id=2) == pytest.approx(6e-3)
    assert estimates.of(Run(None, 7, 2, (), {})) == pytest.approx(6e-3, rel=0.01)   # what its next run will take
    # A run of client 2 held up waiting for a core counts as twice the second longest of client 2's latest runs.
    assert estimates.record(7, 0.6, client_id=2) == pytest.approx(2 * 6e-3)
    # A client that closed is forgotten; a client's first run of the plan is bounded by the plan's latest runs.
    estimates.forget_client(2)
    estimates.record(7, 1e-3, client_id=1)
    assert estimates.record(7, 0.6, client_id=2) == pytest.approx(2 * 6e-3)


def test_one_run_that_waited_for_a_core_does_not_multiply_its_plans_estimate():
    estimates = DeviceTimeEstimates()
    for _ in range(10):
        estimates.record(7, 1e-3)
    assert estimates.record(7, 0.6) == pytest.approx(2e-3)     # 600x: the process was descheduled
    assert estimates.measured(7) == pytest.approx(1e-3 + 0.25 * 1e-3)
    assert estimates.record(7, 1e-3) == pytest.approx(1e-3)
    assert estimates.record(7, 0.3) == pytest.approx(2e-3)     # a second one among the latest runs
    for _ in range(16):
        estimates.record(7, 0.05)                     # the plan really grew 50x: the estimate follows
    assert estimates.measured(7) == pytest.approx(0.05, rel=0.01)


def test_a_client_whose_runs_of_one_plan_take_different_times_is_charged_what_they_took():
    # One client runs plan 7 with a loop's trip count that makes three runs take 1 ms and the fourth 50 ms.
    # Bounded by twice its average of what it was charged (pulled down by the short runs, never raised by the
    # bounded long ones), it was charged 5% of what its runs took; now the long runs are charged what they took
    # once two are among the client's latest runs.
    estimates = DeviceTimeEstimates()
    took = [50e-3 if i % 4 == 3 else 1e-3 for i in range(40)]
    charged = [estimates.record(7, seconds, client_id=1) for seconds in took]
    assert charged[8:] == pytest.approx(took[8:])
    assert sum(charged) >= 0.8 * sum(took)
    # Its next run is expected to take a moving average of what they took: the long runs are in it.
    assert 10e-3 < estimates.of(Run(None, 7, 1, (), {})) < 50e-3

"""One place to see it all (embedded backend): parked runs and what they wait for, the report as text.

A run queued for memory and its reason are checked in test_admission_and_lifetimes.py.

Every wait has a timeout; every runtime made here is closed.
"""

import threading

import jax
import pytest
from fetching import until
from test_admission_and_lifetimes import X, cross_island
from test_endpoint import slow_to_compile

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.runtime import Runtime
from pathways_mlir.runtime.status import LISTED


def test_a_run_waiting_forever_on_a_send_names_it(device_map, plan_builder):
    rt = Runtime(device_map)
    client = Client(rt)
    try:
        plan, _ = cross_island(plan_builder, rt.resources.topology)
        rt.islands["island0"].close()      # on purpose: island0 will never send
        run = client.start(plan, [X])
        with pytest.raises(TimeoutError):
            client.wait(run, timeout=0.5)
        [parked] = rt.status()["islands"]["island1"]["runs"]
        recv = next(s for s in plan.islands["island1"] if s.kind == "recv")
        send = next(s for s in plan.islands["island0"] if s.kind == "send")
        launch = next(s for s in plan.islands["island0"] if s.kind == "launch")
        assert parked["run"] == run.id
        assert parked["waits_for"] == (f"recv of buffer {recv.dst_buffer} from island0 (send step {send.id}): "
                                       f"its buffer {send.src_buffer}, the result of launch step {launch.id} "
                                       f"'{launch.label or launch.executable}'")
        assert f"run {run.id} (main, client {client.id}) waits for recv of buffer" in str(rt.status())
    finally:
        rt.close()          # fails the parked run, so the client closes at once
        client.close()


def test_pw_status_reports_the_default_runtime():
    pw.configure(islands=2, per_island=4)
    try:
        f = pw.jit(jax.numpy.tanh, slice=pw.virtual_slice(2, axes="x"), in_specs=None, out_specs=None)
        y = f(X)
        y.result(timeout=60)
        status = pw.status()
        assert status["scheduler"]["queued"] == [] and sum(c["objects"] for c in status["clients"].values()) == 1
        assert set(status["islands"]) == {"island0", "island1"} and "island0: 0 run(s) under way" in str(status)
    finally:
        pw.configure()


def test_status_names_a_plan_compiling_for_its_first_run(device_map, plan_builder):
    """A program's first run waits for its plan to compile (`Runtime.load`), which status did not show: a call
    waiting for a long compile looked like a hang."""
    rt = Runtime(device_map)
    try:
        p = plan_builder(rt.resources.topology)
        a = p.slice("a", (2,), ("x",), "island0", (0, 2))
        plan = p.build([p.launch(slow_to_compile, [p.input((8, 16), a, [("x",), ()])], a, [("x",), ()])])
        loader = threading.Thread(target=rt.load, args=(plan,), daemon=True)
        loader.start()
        until(lambda: rt.status()["compiling"], "the compile reported", 60)
        status = rt.status()
        assert [c["program"] for c in status["compiling"]] == [plan.program]
        assert f"compiling {plan.program} for its first run, for " in str(status)
        loader.join(60)
        assert not loader.is_alive() and rt.status()["compiling"] == []
    finally:
        rt.close()


def test_a_report_of_many_runs_lists_a_few_of_each_and_counts_them_all(device_map, plan_builder):
    """Every run was listed: 30,000 runs in flight made a 9 MB report, over a service reply's 8 MiB header, so
    `pw-serve --status` failed when the service was busiest. Each list shows `LISTED` runs, oldest first, with its
    exact count; the queue lists each client's oldest run first, so a client with many queued hides no other's."""
    rt = Runtime(device_map)
    many, few = Client(rt), Client(rt)
    try:
        plan, _ = cross_island(plan_builder, rt.resources.topology)
        rt.islands["island0"].close()      # on purpose: island0 never sends, so the runs stay under way on island1
        parked = [many.start(plan, [X]) for _ in range(LISTED + 5)]
        until(lambda: rt.status()["islands"]["island1"]["runs_count"] == LISTED + 5, "the runs parked", 60)
        rt.scheduler.hold()
        queued = [many.start(plan, [X]) for _ in range(LISTED + 3)] + [few.start(plan, [X])]

        status = rt.status()
        scheduler, island1 = status["scheduler"], status["islands"]["island1"]
        assert scheduler["queued_count"] == LISTED + 4 and len(scheduler["queued"]) == LISTED
        listed = [q["run"] for q in scheduler["queued"]]
        assert listed == [run.id for run in queued[:LISTED - 1]] + [queued[-1].id]    # the other client's too
        assert scheduler["admitted_count"] == LISTED + 5
        assert scheduler["admitted"] == [run.id for run in parked[:LISTED]]
        assert island1["runs_count"] == LISTED + 5
        assert [r["run"] for r in island1["runs"]] == [run.id for run in parked[:LISTED]]
        text = str(status)
        assert "  and 4 more queued run(s)" in text
        assert f"admitted runs on the devices: {scheduler['admitted']} and 5 more" in text
        assert f"island1: {LISTED + 5} run(s) under way" in text and "  and 5 more run(s) under way" in text
        assert text.count(" waits for ") == 2 * LISTED                  # the queue's and island1's, no more

        own = rt.status(few.id)                 # a client's own view: its runs listed and counted, none other's
        assert [q["run"] for q in own["scheduler"]["queued"]] == [queued[-1].id]
        assert own["scheduler"]["queued_count"] == 1 and own["scheduler"]["admitted_count"] == LISTED + 5
        assert own["islands"]["island1"]["runs"] == [] and own["islands"]["island1"]["runs_count"] == 0
    finally:
        rt.close()          # fails the parked and queued runs, so the clients close at once
        many.close()
        few.close()

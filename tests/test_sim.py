"""pw-sim: the simulator's invariants, its trace, its errors, and a short validation run."""

import dataclasses
import json
import pathlib
import time

import pytest

from pathways_mlir.cli.pw_sim import main as pw_sim
from pathways_mlir.sim import inputs, network, trace
from pathways_mlir.dialect.plan_steps import Send
from pathways_mlir.sim.engine import SimError, Simulator, Submission
from pathways_mlir.sim.profile import PROFILE_DIR, Host, LinkSpec, ProfileError, load_profile

ROOT = pathlib.Path(__file__).resolve().parent.parent
US = 1e-6


def chain_ir(k: int, n: int = 4, island_b: str = "island0") -> str:
    """A chain of `k` tanh computations, the first half on slice @va, the rest on @vb."""
    t = f"tensor<{n}x128xf32>"
    slices = "".join(
        f'"pw.virtual_slice"() {{sym_name = "{s}", shape = array<i64: {n}>, axes = ["x"], '
        f'constraints = {{island = "{i}"}}}} : () -> ()\n' for s, i in (("va", "island0"), ("vb", island_b)))
    body = "".join(
        f'  %{j + 1} = "pw.compute"(%{j if j else "x"}) {{callee = @layer, slice = @{"va" if j < k // 2 else "vb"}, '
        f'in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "l{j}"}} : ({t}) -> {t}\n'
        for j in range(k))
    body = body.replace("(%0)", "(%x)")
    return (slices + f'module @layer attributes {{pw.executable}} {{\n  func.func @main(%x: {t}) -> {t} {{\n'
            f'    %0 = "stablehlo.tanh"(%x) : ({t}) -> {t}\n    return %0 : {t}\n  }}\n}}\n'
            f"func.func @chain(%x: {t}) -> {t} attributes {{pw.program}} {{\n{body}  return %{k} : {t}\n}}\n")


def simple_profile(**host):
    """tpu-v4 with every fixed cost zero except 10 us per launch and what `host` sets; links free."""
    p = load_profile("tpu-v4")
    zero_host = Host(**{f.name: 0.0 for f in dataclasses.fields(Host)})
    accel = dataclasses.replace(p.accelerator, launch_us=10.0, peak_tflops=1e9, memory_gbytes_per_s=1e9)
    free = LinkSpec(0.0, 1e9)
    return dataclasses.replace(p, accelerator=accel, ici=free, dcn=free, pcie=free,
                               host=dataclasses.replace(zero_host, **host))


def plan_of(text: str, profile, topology: str = "2x4", fuse: bool = False):
    from pathways_mlir.passes import lower, program_plans

    lowered = lower(text, inputs.profile_topology(topology, profile), fuse=fuse)
    return program_plans(lowered)["chain"]


def test_a_chain_takes_its_launches_one_after_another():
    profile = simple_profile(step_us=2.0)
    plan = plan_of(chain_ir(6), profile)
    result = Simulator(profile).simulate([Submission(plan)], closed_loop=True)
    # The island prepares the first launch (2 us); the devices then run 6 launches of 10 us back to back
    # (copies are free), while the host prepares the rest ahead of them.
    assert result.latency() == pytest.approx((2 + 6 * 10) * US)


def test_host_bound_chain_pays_every_step_on_the_island_thread():
    profile = simple_profile(step_us=30.0)
    plan = plan_of(chain_ir(4, island_b="island0"), profile)
    steps = sum(1 for s in plan.islands["island0"] if s.kind in ("launch", "copy", "send"))
    result = Simulator(profile).simulate([Submission(plan)], closed_loop=True)
    assert result.latency() == pytest.approx((steps * 30 + 10) * US)


def test_transfers_on_one_link_contend_and_on_two_links_do_not():
    links = network.Links()
    spec = LinkSpec(latency_us=5.0, bandwidth_gbps=8.0)    # 1 GB/s: 1000 bytes take 1 us
    first = links.transfer(0.0, (("dcn", "out", "i0", "a"),), 1000, spec)
    second = links.transfer(0.0, (("dcn", "out", "i0", "a"),), 1000, spec)
    other = links.transfer(0.0, (("dcn", "out", "i0", "b"),), 1000, spec)
    assert first == pytest.approx((0.0, 6 * US))
    assert second == pytest.approx((1 * US, 7 * US))
    assert other == pytest.approx((0.0, 6 * US))


def test_a_run_that_does_not_fit_waits_for_the_one_before():
    def with_memory(nbytes):
        profile = simple_profile()
        return dataclasses.replace(profile, accelerator=dataclasses.replace(profile.accelerator, memory_bytes=nbytes))

    def simulate(profile, runs):
        plan = plan_of(chain_ir(4), simple_profile())      # placed for roomy devices
        return Simulator(profile).simulate([Submission(plan) for _ in range(runs)])

    plan = plan_of(chain_ir(4), simple_profile())
    peak = max(b for i in plan.islands for (_, _, b) in plan.peak(i))
    roomy = simulate(with_memory(1 << 30), 2)
    assert roomy.runs[1].admitted < roomy.runs[0].done
    stalled = simulate(with_memory(peak + peak // 2), 2)
    assert stalled.runs[1].admitted >= stalled.runs[0].done
    with pytest.raises(SimError, match="can never fit"):
        simulate(with_memory(peak - 1), 1)


def test_an_island_too_large_to_simulate_is_one_error():
    """A plan file's topology may say anything (placement never walks the devices); pw-sim's ledger counts
    each device, so 2^33 of them are refused, not allocated."""
    plan = plan_of(chain_ir(4), simple_profile())
    huge = dataclasses.replace(plan.topology.islands[0], hosts=1 << 31)
    plan = dataclasses.replace(plan, topology=dataclasses.replace(plan.topology, islands=(huge,)))
    with pytest.raises(SimError, match=r"has 8589934592 devices; pw-sim simulates islands of at most 4194304"):
        Simulator(simple_profile()).simulate([Submission(plan)])


def test_sequential_dispatch_pays_a_round_trip_per_step_and_parallel_does_not():
    profile = simple_profile(step_us=1.0, sequential_step_us=20.0, message_latency_us=50.0)
    latencies = {}
    for k in (4, 8):
        plan = plan_of(chain_ir(k, island_b="island1"), profile)
        sim = Simulator(profile)
        latencies[k] = {mode: sim.simulate([Submission(plan, mode)], closed_loop=True).latency()
                        for mode in ("parallel", "sequential")}
    for k in (4, 8):
        assert latencies[k]["sequential"] > latencies[k]["parallel"]
    gap = {k: latencies[k]["sequential"] - latencies[k]["parallel"] for k in (4, 8)}
    assert gap[8] > gap[4] + 4 * 50 * US          # at least one message latency more per extra step


def test_parallel_dispatch_overlaps_runs_on_one_island_in_ticket_order():
    profile = simple_profile(step_us=1.0)
    plan = plan_of(chain_ir(4), profile)
    result = Simulator(profile).simulate([Submission(plan) for _ in range(5)])
    done = [r.done for r in result.runs]
    assert done == sorted(done)
    # Device-bound: 4 launches of 10 us per run, back to back.
    assert result.throughput() == pytest.approx(1 / (40 * US), rel=1e-6)


def test_trace_is_chrome_json_with_a_process_per_island():
    profile = simple_profile(step_us=1.0)
    plan = plan_of(chain_ir(4, island_b="island1"), profile)
    result = Simulator(profile, record_spans=True).simulate([Submission(plan)])
    chrome = json.loads(json.dumps(trace.to_chrome(result)))
    assert chrome["displayTimeUnit"] == "ms"
    names = {e["args"]["name"] for e in chrome["traceEvents"] if e["name"] == "process_name"}
    assert {"island0 (simulated)", "island1 (simulated)", "controller (simulated)"} <= names
    spans = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    assert {e["cat"] for e in spans} >= {"launch", "send", "host"}
    assert all(e["args"]["simulated"] and e["dur"] >= 0 for e in spans)


def test_plan_json_and_ir_give_the_same_times(tmp_path):
    profile = load_profile("tpu-v4")
    ir_path = ROOT / "examples" / "three_blocks.mlir"
    from_ir = inputs.load(ir_path, inputs.profile_topology("2x8", profile))
    plan = from_ir.program(None, "three_blocks")
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    from_json = inputs.load(path, None)
    assert from_json.program(None, "x").flops == plan.flops and sum(plan.flops.values()) > 0
    times = [Simulator(profile).simulate([Submission(loaded.program(None, "x"))]).latency()
             for loaded in (from_ir, from_json)]
    assert times[0] == pytest.approx(times[1])


def test_a_plan_whose_devices_the_profile_cannot_describe_is_one_line(tmp_path, capsys):
    cpu = load_profile("cpu-here")
    plan = inputs.load(ROOT / "examples" / "three_blocks.mlir", inputs.profile_topology("2x8", cpu)).program(None, "")
    path = tmp_path / "cpu_plan.json"
    path.write_text(plan.to_json())
    assert pw_sim(["run", str(path), "--profile", "tpu-v4"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "device kind 'cpu', which profile tpu-v4 does not describe" in err
    with pytest.raises(ProfileError):
        Simulator(load_profile("tpu-v4")).simulate([Submission(plan)])


def test_bad_profiles_and_inputs_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "device_kinds": ["x"], "accelerator": {"peak_tflops": -1}}')
    ir_path = str(ROOT / "examples" / "three_blocks.mlir")
    for argv, message in (
            (["run", ir_path, "--profile", str(bad), "--topology", "2x8"], "must be a finite non-negative number"),
            (["run", ir_path, "--profile", "no-such"], "no profile named 'no-such'"),
            (["run", ir_path], "needs --topology"),
            (["run", str(tmp_path / "missing.json")], "no such file"),
            (["run", ir_path, "--topology", "2x6"], "multiple of 4"),
            (["pipeline", "--stages", "6", "--slices", "4"], "must be multiples of --slices 4"),
            (["pipeline", "--stages", "64", "--slices", "32"], "--stages 64 must divide the model's 32 layers"),
            (["pipeline", "--stages", "2", "--micro-batches", "3"], "--micro-batches 3 must cut the batch"),
            (["pipeline", "--stages", "2", "--micro-batches", "16384"], "--micro-batches 16384 must cut"),
            (["pipeline", "--here", "--stages", "8"], "--here measures its own 4-stage step (sim/programs.py's "
                                                      "training_pipeline), which takes no --stages"),
            (["pipeline", "--here", "--micro-batches", "4", "--memory", "5"], "which takes no --micro-batches or "
                                                                               "--memory")):
        assert pw_sim(argv) == 1
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and message in err, (argv, err)


@pytest.mark.parametrize("field, value", [("peak_tflops", float("nan")), ("peak_tflops", float("inf")),
                                          ("memory_bytes", float("inf"))])
def test_a_profile_number_that_is_not_finite_is_one_line(tmp_path, capsys, field, value):
    # NaN and Infinity are JSON to Python: a NaN rate simulated as if it were a number (exit 0), an infinite
    # int field was an internal error (OverflowError).
    profile = json.loads((PROFILE_DIR / "cpu-here.json").read_text())
    profile["accelerator"][field] = value
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    ir_path = str(ROOT / "examples" / "three_blocks.mlir")
    assert pw_sim(["run", ir_path, "--profile", str(path), "--topology", "2x8"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"accelerator.{field} must be a finite non-negative number, not {value}" in err


def test_pw_sim_run_writes_a_labelled_record_and_a_trace(tmp_path, capsys):
    out, trace_path = tmp_path / "r.json", tmp_path / "t.json"
    assert pw_sim(["run", str(ROOT / "examples" / "three_blocks.mlir"), "--topology", "2x8", "--runs", "3",
                   "--trace", str(trace_path), "-o", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["kind"].startswith("SIMULATED") and record["runs_per_s"] > 0
    assert json.loads(trace_path.read_text())["traceEvents"]
    assert "SIMULATED" in capsys.readouterr().out


def test_one_step_of_a_65536_device_plan_simulates_in_under_10_s():
    from pathways_mlir.sim import scale

    profile = load_profile("tpu-v4")
    plan = scale.pipeline(16, 65536, 16, profile, micro=2)
    start = time.perf_counter()
    scale.latency(plan, profile)
    assert time.perf_counter() - start < 10


def test_short_validation_reports_an_error_per_program():
    import pathways_mlir as pw
    from pathways_mlir.sim.validate import run_validation

    try:
        record, profile = run_validation(rounds=3)
    finally:
        pw.configure()
    assert profile.name == "cpu-here" and "fitted" in profile.sources["host"]
    names = set(record["validation"])
    assert names and not names & set(record["calibration"])
    for r in record["validation"].values():
        assert r["measured_ms"] > 0 and r["simulated_ms"] > 0
    assert record["median_abs_error"] == sorted(abs(r["error"]) for r in record["validation"].values())[
        len(names) // 2]


def test_device_rates_are_read_from_the_profiles_the_simulator_uses():
    from pathways_mlir.dialect.device_time import DEFAULT_RATES, device_rates

    for name in ("tpu-v4", "h100", "cpu-here"):
        accel = load_profile(name).accelerator
        for kind in load_profile(name).device_kinds:
            assert device_rates(kind) == (accel.peak_tflops * 1e12, accel.memory_gbytes_per_s * 1e9)
    assert device_rates("tpu") == device_rates("tpu-v4") and device_rates("no-such-kind") == DEFAULT_RATES


def reduce_ir() -> str:
    """One computation whose input is split over 4 devices and whose output is replicated."""
    t = "tensor<8x128xf32>"
    return ('"pw.virtual_slice"() {sym_name = "va", shape = array<i64: 4>, axes = ["x"], constraints = {}} : () -> ()\n'
            f'module @layer attributes {{pw.executable}} {{\n  func.func @main(%x: {t}) -> {t} {{\n'
            f'    %0 = "stablehlo.tanh"(%x) : ({t}) -> {t}\n    return %0 : {t}\n  }}\n}}\n'
            f"func.func @chain(%x: {t}) -> {t} attributes {{pw.program}} {{\n"
            f'  %1 = "pw.compute"(%x) {{callee = @layer, slice = @va, in_shardings = [[["x"], []]], '
            f'out_shardings = [[[], []]], label = "reduce"}} : ({t}) -> {t}\n  return %1 : {t}\n}}\n')


def test_a_replicated_output_of_split_work_is_an_all_reduce_on_the_ici():
    from pathways_mlir.dialect.device_time import launch_costs

    profile = simple_profile()
    plan = plan_of(reduce_ir(), profile)
    (cost,) = launch_costs(plan).values()
    assert cost.all_reduces == ((8 * 128 * 4, 4),)          # the whole output, combined among 4 devices
    ici = LinkSpec(latency_us=1.0, bandwidth_gbps=8.0)     # 1 GB/s
    # A ring of 4: each device moves 2 * 3 / 4 of the buffer in 6 latency-bound steps.
    assert network.all_reduce_seconds(4000, 4, ici) == pytest.approx(4000 * 6 / 4 * 1e-9 + 6 * US)
    with_ici = dataclasses.replace(profile, ici=ici)
    times = [Simulator(p).simulate([Submission(plan)], closed_loop=True).latency() for p in (profile, with_ici)]
    assert times[1] - times[0] == pytest.approx(network.all_reduce_seconds(8 * 128 * 4, 4, ici))


def test_resident_inputs_cross_no_pcie():
    profile = dataclasses.replace(simple_profile(), pcie=LinkSpec(0.0, 8e-3))   # 1 MB/s: an input takes ms
    plan = plan_of(chain_ir(2), profile)
    sim = Simulator(profile)
    fed = sim.simulate([Submission(plan)], closed_loop=True).latency()
    resident = sim.simulate([Submission(plan, resident=frozenset(plan.inputs))], closed_loop=True).latency()
    assert resident == pytest.approx((2 * 10) * US)
    assert fed - resident == pytest.approx(4 * 128 * 4 / 4 / 1e6)   # one device's shard of the input at 1 MB/s


def test_gradients_exchanged_over_dcn_hide_behind_the_backward_pass():
    from pathways_mlir.sim import models, scale

    profile = load_profile("tpu-v4")
    times = {}
    for islands in (1, 2):
        step, args = models.data_parallel_step(islands, 8, params=4e9, tokens=1 << 14, grad_bytes=1e9, chunks=4,
                                               width=1024)
        plan = scale._lowered(step, args, inputs.profile_topology(f"{islands}x{16 // islands}", profile),
                              pin=scale._stage_pins(2, 8, islands, name="replica"))
        assert sum(isinstance(s, Send) for steps in plan.islands.values() for s in steps) == (8 if islands == 2 else 0)
        times[islands] = scale.latency(plan, profile, resident=scale.weights_resident(plan, 2))
    exchange = profile.dcn.serialise_seconds(1e9 / 8)        # one replica's gradients over one device's DCN
    # Of the 4 chunks' exchange, the last is left after the backward pass (and the latencies).
    assert 0.25 * exchange < times[2] - times[1] < 0.5 * exchange


@pytest.mark.parametrize("option", ["inline", "interpreter_lock"])
def test_inline_work_and_one_interpreter_lock_each_make_the_controller_and_the_island_take_turns(option):
    """`inline`: the controller runs an idle island's work itself, then waits; `interpreter_lock`: the
    controller's and the island thread's work hold one lock in turn (the GIL). Either way no host work overlaps."""
    plan = plan_of(chain_ir(4), simple_profile())
    steps = sum(1 for s in plan.islands["island0"] if s.kind in ("launch", "copy", "send"))
    runs = [Submission(plan)] * 5
    for on in (0, 1):
        profile = simple_profile(run_us=100.0, step_us=30.0, **{option: on})
        makespan = Simulator(profile).simulate(runs).makespan()
        if on:       # each call's work and the last one's steps take turns
            assert makespan == pytest.approx((5 * (100 + steps * 30) + 10) * US)
        else:        # the island's thread runs them while the controller makes the next call
            assert makespan == pytest.approx((100 + 5 * steps * 30 + 10) * US)


def test_a_synchronous_launch_holds_the_thread_that_makes_it():
    profile = simple_profile(step_us=2.0)
    profile = dataclasses.replace(profile, accelerator=dataclasses.replace(profile.accelerator, synchronous=1))
    plan = plan_of(chain_ir(6), profile)
    # Against (2 + 6 * 10) us when the host prepares ahead of the devices (the first test).
    assert Simulator(profile).simulate([Submission(plan)], closed_loop=True).latency() == pytest.approx(6 * 12 * US)


def test_a_delivery_costs_the_receiving_island_recv_us():
    plan = plan_of(chain_ir(4, island_b="island1"), simple_profile())
    times = [Simulator(simple_profile(recv_us=r)).simulate([Submission(plan)], closed_loop=True).latency()
             for r in (0.0, 50.0)]
    assert times[1] - times[0] == pytest.approx(50 * US)


def test_a_launch_pays_its_fixed_cost_once_and_its_device_cost_per_device():
    accel = dataclasses.replace(load_profile("tpu-v4").accelerator, launch_us=10.0, launch_device_us=20.0,
                                shared_cores=2)
    assert accel.launch_seconds(0.0, 0.0, 2) == pytest.approx(30 * US)
    assert accel.launch_seconds(0.0, 0.0, 4) == pytest.approx(50 * US)    # 4 devices' 20 us on 2 cores


@pytest.fixture(scope="module")
def route_plan():
    from pathways_mlir.runtime.cluster import embedded_topology
    from pathways_mlir.sim import programs

    plan, _ = programs.plan_of(programs.route(), embedded_topology(2, 4))
    return plan


def _launched(result) -> set[str]:
    return {s.name for s in result.spans if s.kind == "launch"}


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_a_cond_takes_the_branch_its_probability_or_trace_says(route_plan, dispatch):
    from pathways_mlir.sim.branches import BranchOutcomes

    (cond,) = route_plan.host_steps
    branch_launches = {b.program: {s.label or s.executable for ss in b.islands.values() for s in ss
                                   if s.kind == "launch"} for b in (cond.then_plan, cond.else_plan)}
    profile = load_profile("cpu-here")
    runs = [Submission(route_plan, dispatch)] * 4

    def simulate(outcomes):
        return Simulator(profile, record_spans=True, branches=outcomes).simulate(runs, closed_loop=True)

    always, never = simulate(BranchOutcomes(probability=1.0)), simulate(BranchOutcomes(probability=0.0))
    # p = 1 and p = 0 run exactly the plan with only that branch: its launches, and the same times as a trace
    # that says so.
    assert branch_launches[cond.then_plan.program] <= _launched(always)
    assert not branch_launches[cond.else_plan.program] & _launched(always) - branch_launches[cond.then_plan.program]
    assert branch_launches[cond.else_plan.program] <= _launched(never)
    for outcomes, result in ((BranchOutcomes(trace=(True,) * 4), always), (BranchOutcomes(trace=(False,) * 4), never)):
        assert [r.done for r in simulate(outcomes).runs] == [r.done for r in result.runs]
    # The then branch (a 256 matrix product on 4 devices) costs more than the else branch (an add).
    assert always.latency() > never.latency()
    mixed = simulate(BranchOutcomes(trace=(True, False, False, True)))
    took = [r.done - r.submitted for r in mixed.runs]
    assert took[0] == pytest.approx(always.latency()) and took[1] == pytest.approx(never.latency())


def test_parallel_dispatch_runs_a_runs_conds_on_a_thread_of_its_own_and_a_cond_moves_values_over_ici(route_plan):
    from pathways_mlir.sim import calibrate
    from pathways_mlir.sim.branches import BranchOutcomes

    # cpu-here as `pw-sim calibrate` fits it (the caller runs idle islands' work, synchronous launches, one
    # interpreter lock), at the fit's starting values.
    base = calibrate.cpu_profile({(r, f): v for r, f, v in calibrate.PARAMETERS}, {})

    def latency(dispatch, cond_thread_us):
        profile = dataclasses.replace(base, host=dataclasses.replace(base.host, cond_thread_us=cond_thread_us))
        result = Simulator(profile, record_spans=True, branches=BranchOutcomes(probability=1.0)).simulate(
            [Submission(route_plan, dispatch)], closed_loop=True)
        return result.latency(), result.spans

    # The thread's start and end are host work on the cond's path in parallel dispatch (some of it beside the
    # predicate's read and the moves); sequential dispatch has no such thread.
    assert 100 * US < latency("parallel", 300.0)[0] - latency("parallel", 0.0)[0] <= 300 * US
    assert latency("sequential", 300.0)[0] == latency("sequential", 0.0)[0]
    # The branch's input and its result move between slices of island0: ICI copies, not PCIe puts.
    moves = [s for s in latency("parallel", 0.0)[1] if s.kind == "input" and s.track.startswith("ici")]
    assert [s.track for s in moves] == ["ici route_large", "ici route_small"]


def test_a_cond_without_outcomes_or_with_too_short_a_trace_is_one_error(route_plan, tmp_path, capsys):
    from pathways_mlir.sim.branches import BranchOutcomes

    profile = load_profile("cpu-here")
    with pytest.raises(SimError, match="branch probability"):
        Simulator(profile).simulate([Submission(route_plan)])
    with pytest.raises(SimError, match="has 1 values"):
        Simulator(profile, branches=BranchOutcomes(trace=(True,))).simulate([Submission(route_plan)] * 2)
    with pytest.raises(SimError, match="not between 0 and 1"):
        BranchOutcomes(probability=1.5)
    bad = tmp_path / "trace.json"
    bad.write_text('{"not": "a list"}')
    plan_json = tmp_path / "route.json"
    plan_json.write_text(route_plan.to_json())
    assert pw_sim(["run", str(plan_json), "--profile", "cpu-here", "--branch-trace", str(bad)]) != 0
    assert "a trace of predicate values is a non-empty JSON list" in capsys.readouterr().err


def test_a_trace_that_cannot_be_written_is_one_error(route_plan, tmp_path, capsys):
    plan_json = tmp_path / "route.json"
    plan_json.write_text(route_plan.to_json())
    missing = tmp_path / "missing" / "trace.json"
    assert pw_sim(["run", str(plan_json), "--profile", "cpu-here", "--branch-probability", "0.5",
                   "--trace", str(missing)]) == 1
    assert capsys.readouterr().err == f"pw-sim: error: cannot write {missing}: No such file or directory\n"


def test_a_copy_that_changes_its_layout_pays_the_reshard_and_one_that_keeps_it_does_not():
    from pathways_mlir.runtime.cluster import embedded_topology
    from pathways_mlir.sim import programs

    topology = embedded_topology(2, 4)
    profile = load_profile("cpu-here")
    resharded = dataclasses.replace(profile, accelerator=dataclasses.replace(profile.accelerator, reshard_us=100.0))
    for reshard, added in ((True, 100 * US), (False, 0.0)):
        plan, _ = programs.plan_of(programs.hop((8, 16), cross_island=False, reshard=reshard), topology)
        times = [Simulator(p).simulate([Submission(plan)], closed_loop=True).latency() for p in (profile, resharded)]
        assert times[1] - times[0] == pytest.approx(added)


@pytest.mark.parametrize("dispatch", ["parallel", "sequential"])
def test_a_free_is_a_step_of_the_islands_thread_only_in_sequential_dispatch(dispatch):
    from pathways_mlir.dialect.plan_steps import Free
    from pathways_mlir.runtime.cluster import embedded_topology
    from pathways_mlir.sim import programs

    plan, _ = programs.plan_of(programs.chain(4, 2, (8, 16)), embedded_topology(2, 4))
    frees = {f"prepare step {s.id}" for steps in plan.islands.values() for s in steps if isinstance(s, Free)}
    result = Simulator(load_profile("cpu-here"), record_spans=True).simulate([Submission(plan, dispatch)])
    taken = {s.name for s in result.spans if s.kind == "host"} & frees
    assert frees and taken == (frees if dispatch == "sequential" else set())


def test_an_input_its_launch_places_costs_launch_input_us_in_parallel_dispatch_and_input_us_in_sequential():
    """The runtime leaves a host input whose one reader is a launch to that launch (`ProgramPlan.launch_placed`)
    in parallel dispatch; in sequential dispatch the input's own message puts it before the launch is sent."""
    plan = plan_of(chain_ir(2), simple_profile())
    assert set(plan.inputs) <= plan.launch_placed("island0")
    for dispatch, charged in (("parallel", "launch_input_us"), ("sequential", "input_us")):
        times = {name: Simulator(simple_profile(**{name: 40.0})).simulate(
            [Submission(plan, dispatch)], closed_loop=True).latency() for name in ("input_us", "launch_input_us")}
        base = Simulator(simple_profile()).simulate([Submission(plan, dispatch)], closed_loop=True).latency()
        assert times[charged] - base == pytest.approx(40 * US)
        assert times[({"input_us", "launch_input_us"} - {charged}).pop()] == pytest.approx(base)


def test_an_open_loop_of_many_runs_takes_work_without_scanning_every_run(monkeypatch):
    """Each island's thread looked for its next work by scanning every run in flight on the island (and sorted
    them at each delivery): an open loop of N calls on a slow host cost O(N^2), 26 s for 5000 runs of the
    three-block plan on `cpu-here` and more than 300 s for 10,000. The runs with work are now a heap in ticket
    order. Counted, not timed: the looks at a run's next step grow with the runs, not with their square."""
    profile = load_profile("cpu-here")          # its host is slower than its calls: the island's runs pile up
    plan = plan_of(chain_ir(6), profile)
    looks = []

    def count(runs: int) -> int:
        looks.clear()
        Simulator(profile).simulate([Submission(plan) for _ in range(runs)])
        return len(looks)

    available = Simulator._available
    monkeypatch.setattr(Simulator, "_available", lambda self, run, island: looks.append(1) or
                        available(self, run, island))
    few, many = count(100), count(800)
    assert many < 8 * few * 1.5, (few, many)


def _profile_file(tmp_path, section: str, field: str, value) -> str:
    """Writes cpu-here with `section.field` set to `value`; returns its path."""
    profile = json.loads((PROFILE_DIR / "cpu-here.json").read_text())
    profile[section][field] = value
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    return str(path)


@pytest.mark.parametrize("shape", ["1x0", "0x0", "0x4"])
def test_a_topology_without_devices_is_one_line(shape, capsys):
    # 1x0 was an internal ZeroDivisionError; 0x0 said "a multiple of 0 per host".
    assert pw_sim(["run", str(ROOT / "examples" / "three_blocks.mlir"), "--topology", shape]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"pw-sim: error: --topology {shape}: need at least one island of at least one device"


def test_runs_that_take_no_simulated_time_have_no_rate(tmp_path, capsys):
    # A program that returns its argument, under a profile whose run_us is 0: an internal ZeroDivisionError.
    t = "tensor<4xf32>"
    ir = tmp_path / "passthru.mlir"
    ir.write_text(f"func.func @passthru(%x: {t}) -> {t} attributes {{pw.program}} {{\n  return %x : {t}\n}}\n")
    out = tmp_path / "r.json"
    assert pw_sim(["run", str(ir), "--topology", "1x8", "--profile", _profile_file(tmp_path, "host", "run_us", 0),
                   "-o", str(out)]) == 0
    assert "latency 0.000 ms, inf runs/s" in capsys.readouterr().out
    assert json.loads(out.read_text())["runs_per_s"] is None


@pytest.mark.parametrize("section, field, value, message", [
    ("accelerator", "peak_tflops", 5e-324, "accelerator.peak_tflops must be at least 1e-06, not 4.94066e-324"),
    ("dcn", "bandwidth_gbps", 1e-9, "dcn.bandwidth_gbps must be at least 1e-06, not 1e-09"),
    ("host", "run_us", 1e300, "host.run_us must be at most 1e+12 us, not 1e+300"),
    ("accelerator", "memory_bytes", 2 ** 63, "accelerator.memory_bytes must be below 2^63 (an i64), not 9.22337e+18")])
def test_a_profile_rate_too_small_or_cost_too_large_for_finite_times_is_one_line(tmp_path, capsys, section, field,
                                                                                  value, message):
    # A peak of 5e-324 TFLOPS made every time infinite: pw-sim wrote "Infinity" into its record and trace. Memory
    # of 2^63 bytes was an internal TypeError over several lines (the topology's memory is an i64 in the IR).
    ir_path = str(ROOT / "examples" / "three_blocks.mlir")
    assert pw_sim(["run", ir_path, "--profile", _profile_file(tmp_path, section, field, value),
                   "--topology", "2x8"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err


def test_a_record_that_is_not_finite_is_refused_not_written_as_nonstandard_json(tmp_path):
    from pathways_mlir.cli.pw_sim import SimCliError, _emit

    out = tmp_path / "r.json"
    with pytest.raises(SimCliError, match=f"cannot write {out}: a simulated figure is not a finite number"):
        _emit({"latency_ms": float("inf")}, str(out))
    assert not out.exists()


def test_topology_is_refused_for_ir_that_is_lowered_already(tmp_path, capsys):
    # It was ignored: the IR's own 2x4 simulated while the command asked for 7x16.
    from pathways_mlir.dialect.topology import Topology
    from pathways_mlir.passes import lower

    lowered = tmp_path / "lowered.mlir"
    lowered.write_text(str(lower((ROOT / "examples" / "three_blocks.mlir").read_text(), Topology.uniform(2, 4))))
    assert pw_sim(["run", str(lowered), "--topology", "7x16", "--profile", "cpu-here"]) == 1
    assert capsys.readouterr().err.strip() == (f"pw-sim: error: {lowered}: the IR is lowered already (it holds "
                                               f"plans); --topology applies to pw IR without plans only")
    assert pw_sim(["run", str(lowered), "--profile", "cpu-here"]) == 0


def test_a_plan_pw_run_refuses_for_its_executables_is_refused_too(tmp_path, capsys):
    # Buffers declared f32[16,8] where the executables take f32[8,16] (the same bytes): pw-run refuses the plan at
    # load (runtime/plan_check.py), and pw-sim simulated it.
    cpu = load_profile("cpu-here")
    plan = inputs.load(ROOT / "examples" / "three_blocks.mlir", inputs.profile_topology("2x8", cpu)).program(None, "")
    value = plan.to_python()
    for buffer in value["buffers"]:
        buffer["shape"] = buffer["shape"][::-1]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(value))
    assert pw_sim(["run", str(path), "--profile", "cpu-here"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is float32[8, 16], but the plan's" in err and "float32[16, 8]" in err, err


@pytest.mark.parametrize("change, message", [
    (lambda v: next(s for s in v["islands"]["island0"] if s["kind"] == "copy").update(bytes=10 ** 15),
     "its 'bytes' is 1000000000000000"),
    (lambda v: v["flops"].update({next(iter(v["flops"])): 10 ** 400}), "are a 401-digit number"),
])
def test_a_plan_with_unbounded_numbers_is_one_line(tmp_path, capsys, change, message):
    # Flops of 10**400 were an internal OverflowError; a move of 10**15 bytes simulated for 320,000 s.
    cpu = load_profile("cpu-here")
    plan = inputs.load(ROOT / "examples" / "three_blocks.mlir", inputs.profile_topology("1x8", cpu)).program(None, "")
    value = plan.to_python()
    change(value)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(value))
    assert pw_sim(["run", str(path), "--profile", "cpu-here"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err


def test_a_cond_whose_predicate_is_not_a_scalar_is_refused(route_plan, tmp_path, capsys):
    # It simulated; pw-run failed at the run with NumPy's "truth value of an array" message.
    value = route_plan.to_python()
    value["host_steps"][0]["pred_buffer"] = value["inputs"][0]
    path = tmp_path / "route.json"
    path.write_text(json.dumps(value))
    assert pw_sim(["run", str(path), "--profile", "cpu-here", "--branch-probability", "0.5"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "as its predicate, which must be a scalar" in err, err


def test_pipeline_and_scale_on_a_profile_too_small_are_one_line(capsys):
    # cpu-here's 1 GiB devices cannot hold the 3B model (an internal LoweringError over two lines).
    for argv in (["pipeline", "--stages", "2", "--micro-batches", "2"], ["scale", "--quick"]):
        assert pw_sim([*argv, "--profile", "cpu-here"]) == 1
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "@step cannot be lowered onto 1 island(s) of 128 cpu devices: " in err, err


def test_figure6_crossover_times_a_launch_as_the_simulator_does(monkeypatch):
    # Its ideal was a launch on one device: on cpu-here's 2 shared cores one on 128 devices takes 64 times that, so
    # no computation reached 95% of it (2/128 at most) and `pw-sim scale --profile cpu-here` said so. A computation
    # of one loop trip reaches it there; the search started at two.
    from pathways_mlir.sim import scale

    cpu = load_profile("cpu-here")
    plan = scale.one_computation(128, 1, cpu)
    result = Simulator(cpu, record_spans=True).simulate([Submission(plan)])
    [launch] = [span for span in result.spans if span.kind == "launch"]
    assert scale.one_launch_seconds(plan, cpu) == pytest.approx(launch.end - launch.start)
    found = scale.crossover(128, cpu)
    assert found["efficiency"] >= 0.95 and found["computation_ms"] == pytest.approx((launch.end - launch.start) * 1e3)
    # No computation of up to MAX_TRIPS loop trips reaching it (the trip count doubled until it overflowed an int32:
    # an internal OverflowError) is one line.
    monkeypatch.setattr(scale, "MAX_TRIPS", 4)
    monkeypatch.setattr(scale, "throughput", lambda plan, profile, runs: 0.5 / scale.one_launch_seconds(plan, profile))
    with pytest.raises(SimError, match="^profile cpu-here: no computation of up to 4 loop trips reaches 95% of the "
                                       r"ideal throughput on 128 devices \(it reaches 50.0%\)$"):
        scale.crossover(128, cpu)


def test_pipeline_and_scale_on_a_profile_whose_costs_are_all_zero_are_a_result_or_one_line(tmp_path, capsys):
    # pipeline: the bubble fraction divided by a step of no time; scale: the ideal throughput of a launch of no time
    # was infinite (efficiency NaN), then the crossovers' ratio 0 / 0. Both internal ZeroDivisionErrors.
    profile = json.loads((PROFILE_DIR / "tpu-v4.json").read_text())
    for section in ("accelerator", "ici", "dcn", "pcie", "host"):
        profile[section].update({key: 0 for key in profile[section] if key.endswith("_us")})
    profile["accelerator"].update(peak_tflops=1e308, memory_gbytes_per_s=1e308)
    for link in ("ici", "dcn", "pcie"):
        profile[link]["bandwidth_gbps"] = 1e308
    path = tmp_path / "free.json"
    path.write_text(json.dumps({**profile, "name": "free"}))
    assert pw_sim(["pipeline", "--stages", "2", "--micro-batches", "2", "--slices", "1", "--profile", str(path)]) == 0
    assert "step     0.000 ms  bubble  0.0%" in capsys.readouterr().out
    assert pw_sim(["scale", "--quick", "--profile", str(path)]) == 1
    assert capsys.readouterr().err.strip() == ("pw-sim: error: profile free: a computation on 128 devices takes no "
                                               "device time, so there is no ideal throughput to reach")

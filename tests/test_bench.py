"""pw-bench's machinery: the harness, the report and the CLI listing (no benchmark is run)."""

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time
import types

import pytest

from pathways_mlir.benchmarks import BENCHMARKS, harness, load
from pathways_mlir.benchmarks.report import load_records, markdown_table, write_report
from pathways_mlir.cli import pw_bench

HEADLINES = {
    "dispatch": tuple(f"{ratio}_{where}" for where in ("worst", "1dev", "8dev") for ratio in (
        "chained_over_jax_opbyop", "opbyop_over_jax_opbyop", "chained_fused_over_jax_opbyop", "fused_over_jax_fused"))
    + ("opbyop_over_ray_8dev", "opbyop_many_leaves_over_jax_100", "opbyop_many_leaves_over_jax_400",
       "opbyop_many_leaves_over_jax_worst"),
    "crossover": ("crossover_ms_95", "crossover_ms_99"),
    "first-call": ("first_call_over_jax_worst",),
    "parallel-dispatch": ("parallel_over_sequential_latency_k16_1ms", "parallel_over_sequential_throughput_k16_1ms",
                          "parallel_over_sequential_latency_k16_1ms_heavy",
                          "parallel_over_sequential_throughput_k16_1ms_heavy", "parallel_over_sequential_worst",
                          "parallel_k16_over_k1_1ms"),
    "multi-tenancy": ("aggregate_4clients_over_1", "aggregate_4clients_over_1_worst", "jax_4threads_over_1_worst",
                      "aggregate_4clients_over_jax_4threads_worst", "jax_4threads_in_order_over_1_worst",
                      "share_error_1111", "share_error_1248", "other_island_latency_under_load"),
    "mixed-serving": ("sjf_p99_over_fifo_p99", "sjf_training_over_fifo", "deadline_p99_over_fifo_p99",
                      "deadline_training_over_fifo"),
    "pipeline": ("pipeline4_over_jax_pipeline4", "spmd_over_jax_spmd", "spmd_explicit_over_jax_spmd_explicit",
                 "pipeline4_over_jax_spmd", "pipeline8_over_pipeline4", "two_islands_over_one"),
    "three-blocks": ("three_blocks_over_jax", "three_blocks_unfused_over_jax"),
    "pipeline-schedules": ("onef1b_peak_over_gpipe_stage0", "gpipe_over_plain_jax", "onef1b_over_plain_jax",
                           "zbh1_over_plain_jax", "zbh1_step_over_onef1b", "zbh1_trace_bubble_over_onef1b"),
    "lowering-scale": ("ops_65536_over_8", "time_65536_over_8", "baseline_over_ours_2048"),
    "object-store": ("embedded_over_ray_put_worst", "ray_backend_over_ray_put_worst"),
    "rl": ("rl_overlap_over_sequential", "rl_over_plain_jax"),
    "moe": ("moe_bytes_over_dense", "moe_time_over_dense"),
    "ray": ("ray_three_blocks_over_handwritten", "ray_three_blocks_over_handwritten_1dev",
            "ray_three_blocks_over_handwritten_cgraph",
            "ray_handle_arg_over_handwritten_refs", "ray_over_embedded", "ray_two_nodes_over_one",
            "actor_call_over_pull"),
    "service": ("service_over_embedded", "service_over_embedded_8_in_flight"),
    "placement": ("auto_over_spread", "model_rank_agreement"),
    "sim": ("median_abs_error", "worst_abs_error", "crossover_2048_over_128", "stages16_over_stages4",
            "islands4_over_one", "two_islands_over_one_sim", "parallel_over_sequential_dispatch",
            "seconds_to_simulate_65536_devices", "schedule_pick_over_best_measured"),
    "elastic": ("recovery_s", "recovery_s_cached", "elastic_after_over_before", "trainer_over_plain_loop",
                "ray_elastic_trainer_over_embedded"),
    "elastic-shrink": ("shrunk_throughput_over_full", "regrown_over_full", "jax_4_over_8", "shrunk_over_jax_shrunk"),
    "shared-base": ("shared_base_bytes_4_over_1", "unshared_base_bytes_4_over_1", "shared_over_plain_jax",
                    "shared_over_unshared"),
}


# Headlines that may be None in a record: fused dispatch until pw-lower can fuse launches, and a
# crossover that the measured durations never reach.
MAY_BE_MISSING = {"chained_fused_over_jax_opbyop_worst", "chained_fused_over_jax_opbyop_1dev",
                  "chained_fused_over_jax_opbyop_8dev", "crossover_ms_95", "crossover_ms_99"}


def test_measure_interleaves_cases_in_shuffled_order():
    calls = []
    cases = {name: (lambda name=name: calls.append(name)) for name in "abcd"}
    times = harness.measure(cases, repetitions=5, seed=3, warmup=1)
    assert calls[:4] == list("abcd")                       # the warm-up, once each
    rounds = [calls[4 + 4 * r: 8 + 4 * r] for r in range(5)]
    assert all(sorted(r) == list("abcd") for r in rounds)  # every case once per repetition
    assert len({tuple(r) for r in rounds}) > 1             # in changing orders
    assert {k: len(v) for k, v in times.items()} == dict.fromkeys("abcd", 5)


def test_median_and_spread():
    assert harness.median([3.0, 1.0, 2.0]) == 2.0
    assert harness.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert harness.spread([1.0, 1.0, 1.0, 1.0]) == 0.0
    assert harness.spread([0.001, 0.002, 0.5]) is None     # too few values to say, not "steady"
    assert harness.spread([1.0, 2.0, 3.0, 4.0, 5.0]) > 0
    assert harness.widest_spread([1.0, 2.0, 3.0, 4.0, 5.0], [1.0] * 4) == harness.spread([1.0, 2.0, 3.0, 4.0, 5.0])
    assert harness.widest_spread([1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0]) is None


def test_worst_is_the_smallest_ratio_and_none_if_any_is_missing():
    assert harness.worst([1.5, 0.25, 0.9]) == 0.25
    assert harness.worst([1.0, None]) is None
    assert harness.worst([1.0, float("nan")]) is None
    assert harness.worst([]) is None


def test_same_results_compares_whole_trees():
    import numpy as np

    a = [np.arange(6.0).reshape(2, 3), np.ones(2)]
    assert harness.same_results(a, [x.copy() for x in a])
    b = [a[0].copy(), a[1].copy()]
    b[0][1, 2] += 1.0                          # a difference outside row 0 is seen
    assert not harness.same_results(a, b)
    assert not harness.same_results(a, a[:1])


def test_record_has_the_interface_keys():
    record = harness.record("dispatch", {"k": 4}, [{"case": "ours", "per_s": 10.0}], {"ratio": 2, "none": None})
    assert {"benchmark", "params", "rows", "headline", "machine"} <= set(record)
    assert record["headline"] == {"ratio": 2.0, "none": None}
    assert "jax" in record["machine"]["packages"]
    json.dumps(record)


def test_every_benchmark_declares_its_headline():
    assert {name: load(name).HEADLINE for name in BENCHMARKS} == HEADLINES
    assert all(load(name).NAME == name for name in BENCHMARKS)


# Headlines that read lower is better: times, bytes, errors and latencies of ours (over a baseline's).
LOWER_IS_BETTER = {
    "crossover": ("crossover_ms_95", "crossover_ms_99"),
    "multi-tenancy": ("share_error_1111", "share_error_1248", "other_island_latency_under_load"),
    "mixed-serving": ("sjf_p99_over_fifo_p99", "deadline_p99_over_fifo_p99"),
    "pipeline-schedules": ("onef1b_peak_over_gpipe_stage0", "zbh1_step_over_onef1b", "zbh1_trace_bubble_over_onef1b"),
    "lowering-scale": ("ops_65536_over_8", "time_65536_over_8"),
    "moe": ("moe_bytes_over_dense", "moe_time_over_dense"),
    "sim": ("median_abs_error", "worst_abs_error", "crossover_2048_over_128", "seconds_to_simulate_65536_devices"),
    "elastic": ("recovery_s", "recovery_s_cached"),
    "shared-base": ("shared_base_bytes_4_over_1", "unshared_base_bytes_4_over_1"),
}


def test_every_benchmark_declares_which_headlines_read_lower_is_better():
    declared = {name: load(name).LOWER_IS_BETTER for name in BENCHMARKS if hasattr(load(name), "LOWER_IS_BETTER")}
    assert declared == LOWER_IS_BETTER
    assert all(set(keys) <= set(HEADLINES[name]) for name, keys in declared.items())


def test_pw_bench_list_names_every_benchmark_and_headline(capsys, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")      # pw-bench sets its device count; keep this process's
    assert pw_bench.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{name}: {', '.join(keys)}" for name, keys in HEADLINES.items()]


def test_pw_bench_errors_are_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")
    assert pw_bench.main(["report", "--results", str(tmp_path / "missing")]) == 1
    assert pw_bench.main(["report", "--results", str(tmp_path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("pw-bench: error: ") for line in err)


def test_report_names_a_record_it_cannot_read(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    results, out = tmp_path / "results", tmp_path / "RESULTS.md"
    results.mkdir()
    (results / "a.json").write_text("[1, 2]")
    assert pw_bench.main(["report", "--results", str(results), "--out", str(out)]) == 1
    (results / "a.json").write_text(json.dumps({**harness.record("crossover", {}, [], {}), "headline": {"r": "high"}}))
    assert pw_bench.main(["report", "--results", str(results), "--out", str(out)]) == 1
    (results / "a.json").write_text(json.dumps(harness.record("crossover", {}, [{"x": 1}], {})))
    assert pw_bench.main(["report", "--results", str(results), "--out", str(out)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"pw-bench: error: {results / 'a.json'}: not a pw-bench record: not an object",
        f"pw-bench: error: {results / 'a.json'}: not a pw-bench record: a headline value is not a number",
        f"pw-bench: error: {results / 'a.json'}: the record of crossover does not hold what its plot reads: "
        "KeyError: 'duration_ms'"]


def _report_error(results: pathlib.Path, out: pathlib.Path | str, capsys) -> str:
    """Runs `pw-bench report` on `results`, expecting a user error; returns its one line."""
    assert pw_bench.main(["report", "--results", str(results), "--out", str(out)]) == 1
    [line] = capsys.readouterr().err.splitlines()
    return line


def test_report_names_a_malformed_record_in_one_line(tmp_path, capsys):
    """Records that pass as JSON objects but would crash the report: one line naming the file."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "out" / "RESULTS.md"
    cases = {"machine": json.dumps({**harness.record("custom", {}, [{"x": 1}], {"h": 1.0}), "machine": {}}),
             "deep": "[" * 100000 + "]" * 100000}
    sim = json.loads((pathlib.Path(pw_bench.RESULTS) / "sim.json").read_text())
    for row in sim["rows"]:
        if row["name"] == "table2_tokens_per_s_4":
            row["value"] = 0                                       # the plot divides by it
    cases["sim"] = json.dumps(sim)
    cases["ray"] = json.dumps(harness.record("ray", {}, [], {}))   # no ms_per_run rows to plot
    for name, text in cases.items():
        results = tmp_path / name
        results.mkdir()
        (results / f"{name}.json").write_text(text)
        assert _report_error(results, out, capsys).startswith(f"pw-bench: error: {results / name}.json: "), name
    assert not out.parent.exists()                   # not even the folder its output check made


@pytest.mark.parametrize("where, value, message", [
    ("rows", "1e999", "'rows[0].devices' is not a finite number in float range: inf"),
    ("rows", "1" * 400, "'rows[0].devices' is not a finite number in float range: " + "1" * 40),
    ("params", "[" * 400 + "1" + "]" * 400, "'params.devices' is nested more than 32 deep")])
def test_report_refuses_numbers_out_of_float_range_and_values_nested_too_deeply(tmp_path, capsys, where, value,
                                                                                message):
    # All JSON that Python reads: the numbers were an internal OverflowError in the plot, the nesting an internal
    # RecursionError in the parameters' cell.
    pytest.importorskip("matplotlib")
    results = tmp_path / "results"
    results.mkdir()
    record = _synthetic_records()[1]
    (record["rows"][0] if where == "rows" else record["params"])["devices"] = "VALUE"
    (results / "dispatch.json").write_text(json.dumps(record).replace('"VALUE"', value))
    assert _report_error(results, tmp_path / "out" / "RESULTS.md", capsys) == (
        f"pw-bench: error: {results / 'dispatch.json'}: not a pw-bench record: {message}")


def test_report_draws_nothing_until_every_record_is_drawn(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    results, out = tmp_path / "results", tmp_path / "out" / "RESULTS.md"
    results.mkdir()
    (results / "dispatch.json").write_text(json.dumps(_synthetic_records()[1]))
    (results / "crossover.json").write_text(json.dumps(harness.record("crossover", {}, [{"x": 1}], {})))
    assert "crossover.json: the record of crossover" in _report_error(results, out, capsys)
    assert not out.parent.exists()      # dispatch's plot, drawn first, was not written, nor its folder made


def test_report_skips_folders_named_like_records(tmp_path):
    pytest.importorskip("matplotlib")
    results, out = tmp_path / "results", tmp_path / "RESULTS.md"
    (results / "old.json").mkdir(parents=True)
    (results / "dispatch.json").write_text(json.dumps(_synthetic_records()[1]))
    assert pw_bench.main(["report", "--results", str(results), "--out", str(out)]) == 0
    assert [path.name for path, _ in load_records(results)] == ["dispatch.json"]


def test_report_output_that_cannot_be_written_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    (results / "dispatch.json").write_text(json.dumps(_synthetic_records()[1]))
    (tmp_path / "afile").write_text("")
    assert "afile is not a folder" in _report_error(results, tmp_path / "afile" / "RESULTS.md", capsys)
    monkeypatch.chdir(tmp_path / "results")
    assert _report_error(results, "", capsys).startswith("pw-bench: error: cannot write")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "results"]
    assert [p.name for p in results.iterdir()] == ["dispatch.json"]


def _synthetic_records() -> list[dict]:
    """A crossover and a dispatch record, as `harness.record` makes them."""
    dispatch_rows = [{"devices": n, "case": case, "computations_per_s": 1000.0 * n, "spread": 0.1}
                     if case != "ours Chained+fusion" else
                     {"devices": n, "case": case, "computations_per_s": None, "note": "unavailable"}
                     for n in (1, 2, 4, 8) for case in load("dispatch").CASES]
    crossover_rows = [{"iterations": i, "duration_ms": 0.1 * i, "ours_chained_per_s": 1.0,
                       "jax_opbyop_per_s": 1.0, "ratio": min(1.0, 0.8 + 0.05 * i), "spread": 0.0}
                      for i in (1, 4, 16)]
    return [harness.record("crossover", {"devices": 8}, crossover_rows,
                           {"crossover_ms_95": 0.3, "crossover_ms_99": None}),
            harness.record("dispatch", {"chain_length": 4}, dispatch_rows,
                           dict.fromkeys(HEADLINES["dispatch"], 1.5))]


def test_report_writes_tables_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    results = tmp_path / "results"
    results.mkdir()
    for record in _synthetic_records():
        (results / f"{record['benchmark']}.json").write_text(json.dumps(record))
    records = load_records(results)
    assert [r["benchmark"] for _, r in records] == ["dispatch", "crossover"]   # pw-bench list order
    out = tmp_path / "report" / "RESULTS.md"
    written = write_report(records, out)
    text = out.read_text()
    assert "| dispatch | dispatch.json | chained_over_jax_opbyop_8dev | 1.5 | higher |" in text
    assert "| crossover | crossover.json | crossover_ms_99 | – | lower |" in text
    assert "![dispatch](plots/dispatch.png)" in text
    assert "Warning: these records do not come from one `pw-bench all` run" in text   # made outside `all`
    plots = [p for p in written if p.suffix == ".png"]
    assert sorted(p.name for p in plots) == ["crossover.png", "dispatch.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in plots)


def test_report_says_when_records_come_from_one_run(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setenv(harness.RUN_ID_VARIABLE, "run-1")
    records = [(tmp_path / f"{record['benchmark']}.json", record) for record in _synthetic_records()]
    out = tmp_path / "RESULTS.md"
    write_report(records, out)
    assert "All records come from one `pw-bench all` run (run-1)." in out.read_text()


def test_report_draws_each_record_of_one_benchmark_apart(tmp_path):
    """Several records of one benchmark (as benchmarks/results-h200/ holds) each get their plot and say their file."""
    pytest.importorskip("matplotlib")
    results = tmp_path / "results"
    results.mkdir()
    for n in (1, 2):
        (results / f"dispatch-{n}.json").write_text(json.dumps(_synthetic_records()[1]))
    out = tmp_path / "RESULTS.md"
    written = write_report(load_records(results), out)
    assert sorted(p.name for p in written if p.suffix == ".png") == ["dispatch-1.png", "dispatch-2.png"]
    first, second = out.read_text().split("\n## dispatch\n")[1:]
    assert "Record: `dispatch-1.json`." in first and "![dispatch-1](plots/dispatch-1.png)" in first
    assert "Record: `dispatch-2.json`." in second and "![dispatch-2](plots/dispatch-2.png)" in second


def test_report_says_which_way_each_headline_reads(tmp_path):
    """Lower-is-better headlines (ours over a baseline of a time or bytes) are named in the header and marked."""
    pytest.importorskip("matplotlib")
    moe = harness.record("moe", {}, [{"variant": "routed", "ms": 2.495, "bytes_moved": 1},
                                     {"variant": "dense exchange", "ms": 2.577, "bytes_moved": 4}],
                         {"moe_bytes_over_dense": 0.25, "moe_time_over_dense": 0.968})
    out = tmp_path / "RESULTS.md"
    write_report([(tmp_path / "moe.json", moe)], out)
    header, table = out.read_text().split("## Headline ratios")
    assert "above 1: ours is faster" in header and "`moe_time_over_dense`" in header
    assert "| moe | moe.json | moe_time_over_dense | 0.968 | lower |" in table


def test_markdown_table_formats_cells():
    table = markdown_table([{"a": 1, "b": 0.123456}, {"a": 2, "c": None}])
    assert table.splitlines() == ["| a | b | c |", "|---|---|---|", "| 1 | 0.1235 | – |", "| 2 | – | – |"]


def test_pw_bench_all_quick_runs_green(tmp_path):
    """Every benchmark runs end to end in quick mode and writes its headline ratios (no timing checks), two at a
    time: a quick benchmark alone leaves much of a second core idle (most of it is compiling, on one core)."""
    result = subprocess.run([sys.executable, "-m", "pathways_mlir.cli.pw_bench", "all", "--quick", "--jobs", "2",
                             "--json-dir", str(tmp_path)], capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = set()
    for name in BENCHMARKS:
        record = json.loads((tmp_path / f"{name}.json").read_text())
        assert record["benchmark"] == name and record["rows"]
        runs.add(record["machine"]["run"])
        assert list(record["headline"]) == list(load(name).HEADLINE)
        for key, value in record["headline"].items():
            if value is None:
                assert key in MAY_BE_MISSING, f"{name}: {key} is missing"
            else:
                assert math.isfinite(value) and value > 0, f"{name}: {key} = {value}"
    [run] = runs
    assert run.endswith(", 2 benchmarks at a time"), run      # figures measured side by side say so
    dispatch = json.loads((tmp_path / "dispatch.json").read_text())
    scalar = [r for r in dispatch["rows"] if r["case"] in load("dispatch").CASES]
    assert {(r["devices"], r["case"]) for r in scalar} == {
        (n, case) for n in load("dispatch").DEVICES for case in load("dispatch").CASES}
    for row in scalar:       # a case not measured says why
        assert (row["computations_per_s"] is None) == ("note" in row)
    assert {(r["leaves"], r["case"]) for r in dispatch["rows"] if r not in scalar} == {
        (n, case) for n in load("dispatch").PYTREE_LEAVES for case in load("dispatch").PYTREE_CASES}
    for name in ("pipeline", "three-blocks", "service", "shared-base"):     # the baselines do the same work as ours
        params = json.loads((tmp_path / f"{name}.json").read_text())["params"]
        matches = params.get("baselines_match_ours", params.get("baseline_matches_ours"))
        assert matches is True or (isinstance(matches, dict) and all(matches.values()))


def _fake_benchmark(monkeypatch, **attributes) -> list:
    """Makes every benchmark `pw-bench` loads a stand-in whose `run` records its arguments (returned)."""
    calls = []

    def run(quick, **kwargs):
        calls.append((quick, kwargs))
        return harness.record("moe", {}, [{"x": 1}], {})
    monkeypatch.setattr(pw_bench, "load", lambda name: types.SimpleNamespace(run=run, **attributes))
    return calls


def test_benchmark_output_is_checked_before_it_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")
    calls = _fake_benchmark(monkeypatch)
    (tmp_path / "afile").write_text("")
    assert pw_bench.main(["moe", "--quick", "--json", str(tmp_path / "afile" / "moe.json")]) == 1
    assert pw_bench.main(["all", "--quick", "--out", str(tmp_path / "afile" / "records")]) == 1
    assert calls == []
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("pw-bench: error: cannot write ") for line in err)
    assert pw_bench.main(["moe", "--quick", "--json", str(tmp_path / "records" / "moe.json")]) == 0
    assert calls == [(True, {})] and json.loads((tmp_path / "records" / "moe.json").read_text())["rows"]


def test_benchmark_figures_go_beside_its_record(tmp_path, monkeypatch):
    """A benchmark that draws figures of its own (pipeline-schedules) draws them beside the record it writes;
    only a record in the package's results/ has them in the package's plots/."""
    monkeypatch.setenv("XLA_FLAGS", "")
    calls = _fake_benchmark(monkeypatch, FIGURES=("figure.png",))
    assert pw_bench.main(["pipeline-schedules", "--json", str(tmp_path / "records" / "p.json")]) == 0
    assert calls == [(False, {"plots": tmp_path / "records" / "plots"})]
    assert pw_bench.figures_folder(pw_bench.RESULTS / "p.json") == pw_bench.REPORT.parent / "plots"
    assert load("pipeline-schedules").FIGURES          # so pw-bench passes it where to draw them


def _wait_for(condition, timeout: float = 120.0) -> None:
    """Polls `condition` until it holds; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


SIGTERM_IN_A_BENCHMARK = """
import os, signal, sys, time, types
from pathways_mlir.cli import pw_bench

def run(quick):
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(120)
    finally:
        print("cleaned up", flush=True)          # as harness.local_ray's ray.shutdown()

pw_bench.load = lambda name: types.SimpleNamespace(run=run)
sys.exit(pw_bench.main(["moe", "--json", sys.argv[1]]))
"""


def test_sigterm_runs_a_benchmarks_cleanup(tmp_path):
    result = subprocess.run([sys.executable, "-c", SIGTERM_IN_A_BENCHMARK, str(tmp_path / "moe.json")],
                            capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout) == (128 + signal.SIGTERM, "cleaned up\n")
    assert "Traceback" not in result.stderr


ALL_WITH_A_STAND_IN = """
import sys
from pathways_mlir.cli import pw_bench
sys.executable = sys.argv[1]             # `all` starts the stand-in as each benchmark's process
sys.exit(pw_bench.main(["all", "--out", sys.argv[2], "--jobs", sys.argv[3]]))
"""

STAND_IN_BENCHMARK = """#!{python}
import os, pathlib, signal, sys, time
marks = pathlib.Path({marks!r})

def stop(signum, frame):
    (marks / f"terminated-{{os.getpid()}}").touch()
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
(marks / f"started-{{os.getpid()}}").write_text("")
time.sleep(120)
"""


@pytest.mark.parametrize("jobs", [1, 2])
def test_sigterm_to_all_terminates_its_benchmark_processes(tmp_path, jobs):
    marks = tmp_path / "marks"
    marks.mkdir()
    stand_in = tmp_path / "benchmark"
    stand_in.write_text(STAND_IN_BENCHMARK.format(python=sys.executable, marks=str(marks)))
    stand_in.chmod(0o755)
    proc = subprocess.Popen([sys.executable, "-c", ALL_WITH_A_STAND_IN, str(stand_in), str(tmp_path / "records"),
                             str(jobs)])
    try:
        _wait_for(lambda: len(list(marks.glob("started-*"))) == jobs)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
        started = {path.name.removeprefix("started-") for path in marks.glob("started-*")}
        assert {path.name.removeprefix("terminated-") for path in marks.glob("terminated-*")} == started
        assert len(started) == jobs
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)


def test_service_that_does_not_start_says_why(tmp_path):
    """pw-serve's own error, read before its pipes are closed (not 'I/O operation on closed file')."""
    service = load("service")
    (tmp_path / "afile").write_text("")
    with pytest.raises(RuntimeError, match="^pw-serve did not start: pw-serve: "):
        service.start_service(str(tmp_path / "afile"))


def test_default_paths_are_anchored_to_the_package(tmp_path, monkeypatch):
    """pw-bench's default folders do not depend on the working directory."""
    import pathways_mlir.benchmarks as package

    monkeypatch.chdir(tmp_path)
    root = pathlib.Path(package.__file__).resolve().parent
    for path in (pw_bench.RESULTS, pw_bench.QUICK_RESULTS, pw_bench.REPORT):
        assert path.is_absolute() and path.parent == root


def test_three_blocks_on_one_device_per_slice_matches_jax():
    """What `pw-bench three-blocks` runs on a one-accelerator machine: the three blocks on 1-device
    slices sharing one device (their specs name different axes), fused and unfused, against JAX."""
    import numpy as np

    from pathways_mlir.runtime.client import Client
    from pathways_mlir.runtime.cluster import embedded_device_map
    from pathways_mlir.runtime.runtime import Runtime

    three_blocks = load("three-blocks")
    example = three_blocks.load_example()
    assert three_blocks.program_on(example, three_blocks.slice_shapes(example)) is example.three_blocks
    shapes = ((1,), (1, 1), (1,))
    program, baseline = three_blocks.program_on(example, shapes), three_blocks.jax_three_blocks(example, shapes)
    x = np.random.default_rng(0).normal(size=three_blocks.SHAPE).astype(np.float32)
    runtime = Runtime(embedded_device_map(1, 1))
    client = Client(runtime)
    try:
        unfused = harness.compile_program(program, (x,), runtime, fuse=False)
        assert harness.same_results(program.run(x, client=client), baseline(x))
        assert harness.same_results(unfused(client, x), baseline(x))
    finally:
        client.close()
        runtime.close()

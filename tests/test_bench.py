"""pw-bench's machinery: the harness, the report and the CLI listing (no benchmark is run)."""

import json
import math
import pathlib

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
    assert harness.spread([1.0, 2.0]) == 0.0               # too few values to say
    assert harness.spread([1.0, 2.0, 3.0, 4.0, 5.0]) > 0


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
        "pw-bench: error: report: the record of crossover does not hold what its plot reads: KeyError: 'duration_ms'"]


def _synthetic_records() -> list[dict]:
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
    assert [r["benchmark"] for r in records] == ["dispatch", "crossover"]   # pw-bench list order
    out = tmp_path / "report" / "RESULTS.md"
    written = write_report(records, out)
    text = out.read_text()
    assert "| dispatch | chained_over_jax_opbyop_8dev | 1.5 |" in text
    assert "| crossover | crossover_ms_99 | – |" in text
    assert "![dispatch](plots/dispatch.png)" in text
    assert "Warning: these records do not come from one `pw-bench all` run" in text   # made outside `all`
    plots = [p for p in written if p.suffix == ".png"]
    assert sorted(p.name for p in plots) == ["crossover.png", "dispatch.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in plots)


def test_report_says_when_records_come_from_one_run(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setenv(harness.RUN_ID_VARIABLE, "run-1")
    records = _synthetic_records()
    out = tmp_path / "RESULTS.md"
    write_report(records, out)
    assert "All records come from one `pw-bench all` run (run-1)." in out.read_text()


def test_markdown_table_formats_cells():
    table = markdown_table([{"a": 1, "b": 0.123456}, {"a": 2, "c": None}])
    assert table.splitlines() == ["| a | b | c |", "|---|---|---|", "| 1 | 0.1235 | – |", "| 2 | – | – |"]


def test_pw_bench_all_quick_runs_green(tmp_path):
    """Every benchmark runs end to end in quick mode and writes its headline ratios (no timing checks)."""
    import json
    import subprocess
    import sys

    from pathways_mlir.benchmarks import BENCHMARKS, load

    result = subprocess.run([sys.executable, "-m", "pathways_mlir.cli.pw_bench", "all", "--quick",
                             "--json-dir", str(tmp_path)], capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in BENCHMARKS:
        record = json.loads((tmp_path / f"{name}.json").read_text())
        assert record["benchmark"] == name and record["rows"]
        assert list(record["headline"]) == list(load(name).HEADLINE)
        for key, value in record["headline"].items():
            if value is None:
                assert key in MAY_BE_MISSING, f"{name}: {key} is missing"
            else:
                assert math.isfinite(value) and value > 0, f"{name}: {key} = {value}"
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

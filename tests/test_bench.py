"""pw-bench's machinery: the harness, the report and the CLI listing (no benchmark is run)."""

import json

import pytest

from pathways_mlir.benchmarks import BENCHMARKS, harness, load
from pathways_mlir.benchmarks.report import load_records, markdown_table, write_report
from pathways_mlir.cli import pw_bench

HEADLINES = {
    "dispatch": ("chained_over_jax_opbyop_8dev", "fused_over_jax_fused_8dev", "opbyop_over_ray_8dev"),
    "crossover": ("crossover_ms_95", "crossover_ms_99"),
    "parallel-dispatch": ("parallel_over_sequential_k16_1ms", "parallel_k16_over_k1_1ms"),
    "multi-tenancy": ("aggregate_4clients_over_1", "share_error_1248"),
    "pipeline": ("pipeline4_over_spmd", "pipeline8_over_pipeline4", "two_islands_over_one"),
    "lowering-scale": ("ops_65536_over_8", "time_65536_over_8", "baseline_over_ours_2048"),
    "object-store": ("handles_per_s_over_ray_put",),
    "ray": ("ray_three_blocks_over_handwritten", "ray_over_embedded", "ray_two_nodes_over_one"),
}


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


def _synthetic_records() -> list[dict]:
    dispatch_rows = [{"devices": n, "case": case, "computations_per_s": 1000.0 * n, "spread": 0.1}
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
    plots = [p for p in written if p.suffix == ".png"]
    assert sorted(p.name for p in plots) == ["crossover.png", "dispatch.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in plots)


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
                             "--json-dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in BENCHMARKS:
        record = json.loads((tmp_path / f"{name}.json").read_text())
        assert record["benchmark"] == name and record["rows"]
        assert set(record["headline"]) == set(load(name).HEADLINE)

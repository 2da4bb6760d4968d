"""pw-bench: a failed run leaves no output folder behind; a benchmark whose sessions yield no sample says so."""

import json
import shutil
import sys
import types

import pytest

from pathways_mlir.benchmarks import harness, mixed_serving, multi_tenancy
from pathways_mlir.cli import pw_bench


def _fake_load(monkeypatch, run) -> None:
    """Makes every benchmark `pw-bench` loads a stand-in running `run(quick)`."""
    monkeypatch.setenv("XLA_FLAGS", "")      # pw-bench sets its device count; keep this process's
    monkeypatch.setattr(pw_bench, "load", lambda name: types.SimpleNamespace(run=run))


def test_a_failed_run_leaves_no_folder_it_made(tmp_path, capsys, monkeypatch):
    """The output check made the --json or --out folder before the run: one that failed left it behind, empty."""
    def fails(quick):
        raise RuntimeError("boom")
    _fake_load(monkeypatch, fails)
    assert pw_bench.main(["moe", "--quick", "--json", str(tmp_path / "new" / "deeper" / "moe.json")]) == 1
    monkeypatch.setattr(sys, "executable", shutil.which("false"))      # every benchmark process fails
    assert pw_bench.main(["all", "--quick", "--out", str(tmp_path / "out" / "records")]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == "pw-bench: error: failed: " + ", ".join(pw_bench.BENCHMARKS)
    assert list(tmp_path.iterdir()) == []

    # A run that succeeds still makes the folders it writes in, and so does the report.
    _fake_load(monkeypatch, lambda quick: harness.record("not-a-benchmark", {}, [{"x": 1}], {"ratio": 1.0}))
    assert pw_bench.main(["moe", "--quick", "--json", str(tmp_path / "new" / "deeper" / "moe.json")]) == 0
    assert json.loads((tmp_path / "new" / "deeper" / "moe.json").read_text())["rows"] == [{"x": 1}]
    assert pw_bench.main(["report", "--results", str(tmp_path / "new" / "deeper"),
                          "--out", str(tmp_path / "report" / "RESULTS.md")]) == 0
    assert "# pw-bench results" in (tmp_path / "report" / "RESULTS.md").read_text()


def test_multi_tenancy_says_when_the_island_timed_none_of_a_clients_runs():
    """A share run in which the island timed none of a client's runs (each found over together with the one
    before it, on a loaded machine) ended in `StatisticsError: no median for empty data`."""
    multi_tenancy.check_timed([[0.1, None], [None, 0.2]], (1, 2))
    with pytest.raises(RuntimeError, match=r"^share run 1:2: the island timed none of client 1's 2 runs "):
        multi_tenancy.check_timed([[0.1, None], [None, None]], (1, 2))


@pytest.mark.parametrize("empty, message", [
    ({"latencies": []}, r"^pipeline training under deadline: a 1 s session completed 0 inference requests "
                        r"\(25 cancelled\) and started 10 training steps: too few to measure$"),
    ({"steps": 0}, r"^pipeline training under fifo: a 1 s session completed 1 inference "
                   r"requests \(0 cancelled\) and started 0 training steps: too few"),
])
def test_mixed_serving_says_when_a_session_yields_no_sample(empty, message):
    """A session whose every request was cancelled at its deadline ended in `IndexError: index -1 is out of
    bounds for axis 0 with size 0` (a percentile of no latency); one in which fifo started no training step in
    `ZeroDivisionError` (the ratios to fifo's steps/s)."""
    sample = {"latencies": [0.01], "steps_per_s": 10.0, "steps": 10, "cancelled": 0}
    results = {(v, p): [dict(sample)] for v in mixed_serving.VARIANTS for p in mixed_serving.POLICIES}
    mixed_serving.check_samples(results, 1.0)
    policy = "deadline" if "latencies" in empty else "fifo"
    results["pipeline", policy][0].update(empty, cancelled=25 if "latencies" in empty else 0)
    with pytest.raises(RuntimeError, match=message):
        mixed_serving.check_samples(results, 1.0)

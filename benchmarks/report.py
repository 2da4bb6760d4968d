"""Benchmark records as Markdown tables and PNG plots (`pw-bench report`)."""

from __future__ import annotations

import io
import json
import pathlib
import sys
import textwrap
from typing import Any

from . import BENCHMARKS, load


def format_value(value: Any) -> str:
    """Formats one table cell: floats to 4 significant digits, None as a dash."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(format_value(v) for v in value)
    return str(value)


def markdown_table(rows: list[dict]) -> str:
    """Returns rows as a Markdown table whose columns are the keys in order of first appearance."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(format_value(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


class RecordError(ValueError):
    """A file that is not a pw-bench record, or a record that does not hold what the report reads."""


def load_records(results: pathlib.Path) -> list[tuple[pathlib.Path, dict]]:
    """Reads the JSON records in `results` (files named *.json; folders are skipped) as (file, record) pairs,
    in `pw-bench list` order (unknown benchmarks last, a benchmark's records by file name); a file that is
    not JSON or not shaped as `harness.record` makes them is a `RecordError` naming it."""
    records = []
    for path in sorted(path for path in results.glob("*.json") if path.is_file()):
        try:
            record = json.loads(path.read_text())
        except OSError as e:
            raise RecordError(f"{path}: cannot read: {e.strerror or e}") from None
        except RecursionError:
            raise RecordError(f"{path}: not a pw-bench record: nested too deeply") from None
        except ValueError as e:
            raise RecordError(f"{path}: not JSON: {e}") from None
        problem = _shape_problem(record)
        if problem:
            raise RecordError(f"{path}: not a pw-bench record: {problem}")
        records.append((path, record))
    order = {name: i for i, name in enumerate(BENCHMARKS)}
    return sorted(records, key=lambda pair: order.get(pair[1]["benchmark"], len(order)))


# What `write_report` reads of a record's `machine`, and the type of each.
MACHINE_KEYS = {"cpus": (int, type(None)), "system": str, "python": str, "date": str, "packages": dict}
# How deep a record's values may nest (harness.record's nest 4 deep; the report formats them recursively).
MAX_DEPTH = 32


def _shape_problem(record) -> str | None:
    """Why `record` is not shaped as `harness.record` makes records (None if it is)."""
    if not isinstance(record, dict):
        return "not an object"
    for key, kind in (("benchmark", str), ("params", dict), ("rows", list), ("headline", dict), ("machine", dict)):
        if not isinstance(record.get(key), kind):
            return f"'{key}' is missing or not a{'n' if kind is list else ''} {kind.__name__}"
    if not all(isinstance(row, dict) for row in record["rows"]):
        return "a row is not an object"
    if not all(value is None or type(value) in (int, float) for value in record["headline"].values()):
        return "a headline value is not a number"
    for key, kind in MACHINE_KEYS.items():
        if not isinstance(record["machine"].get(key), kind):
            return f"'machine' has no '{key}' of the kind harness.machine_info writes"
    return _value_problem(record)


def _value_problem(record: dict) -> str | None:
    """Why a value in `record` cannot be reported (None if none): nested too deeply, or a number that is not
    finite or out of float range (JSON's 1e999 and long integers are both JSON to Python)."""
    stack = [((key,), value) for key, value in record.items()]
    while stack:
        parts, value = stack.pop()
        if len(parts) > MAX_DEPTH:
            return f"'{_field(parts[:2 if isinstance(parts[1], str) else 3])}' is nested more than {MAX_DEPTH} deep"
        if isinstance(value, (int, float)) and not abs(value) <= sys.float_info.max:     # NaN too
            return f"'{_field(parts)}' is not a finite number in float range: {value!r:.40}"
        if isinstance(value, (dict, list)):
            stack += [((*parts, key), item) for key, item in (value.items() if isinstance(value, dict)
                                                                else enumerate(value))]
    return None


def _field(parts: tuple) -> str:
    """Names a value of a record by its keys and indexes, e.g. rows[0].devices."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in parts)[1:]


def better(benchmark: str, headline: str) -> str:
    """Which way a headline reads: "lower" is better (it is in its module's `LOWER_IS_BETTER`) or "higher",
    or "–" for an unknown benchmark's."""
    if benchmark not in BENCHMARKS:
        return "–"
    return "lower" if headline in getattr(load(benchmark), "LOWER_IS_BETTER", ()) else "higher"


def draw_plot(path: pathlib.Path, record: dict) -> bytes:
    """Draws the figure of the record read from `path` with its benchmark's `plot`; returns it as PNG bytes.
    A record that does not hold what its plot reads is a `RecordError` naming `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    png = io.BytesIO()
    try:
        load(record["benchmark"]).plot(record, ax)
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(png, format="png", dpi=110)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
        raise RecordError(f"{path}: the record of {record['benchmark']} does not hold what its plot reads: "
                          f"{type(e).__name__}: {e}") from None
    finally:
        plt.close(fig)
    return png.getvalue()


def write_report(records: list[tuple[pathlib.Path, dict]], out: pathlib.Path) -> list[pathlib.Path]:
    """Writes `out` (Markdown: headline ratios, then each record's table and plot) and the plots in `plots/`
    beside it, each named after its record's file; returns the files written. Every plot is drawn before
    anything is written, so a record that cannot be drawn leaves the files as they were."""
    plots = out.parent / "plots"
    pictures = {plots / f"{path.stem}.png": draw_plot(path, record)
                for path, record in records if record["benchmark"] in BENCHMARKS}
    lower = dict.fromkeys(key for _, record in records for key in record["headline"]
                          if better(record["benchmark"], key) == "lower")
    header = ("Generated by `pw-bench report` from the JSON records of `pw-bench all`. Every figure is a median over "
              "interleaved repetitions in one process; the headline figures are ratios of our system to a baseline "
              "measured in the same run (above 1: ours is faster, or larger), except where the headline table's "
              "`better` column says `lower`: times, bytes, errors or latencies (ours, or ours over a baseline's "
              "or over a smaller size's), where lower is better"
              + (": " + ", ".join(f"`{key}`" for key in lower) if lower else "") + ". "
              "`share_error_*` is the relative error of a share, `crossover_ms_*` milliseconds, `recovery_s*` "
              "seconds from a lost island to the first replayed step, `other_island_latency_under_load` a latency "
              "over the same latency idle, `*_p99_over_fifo_p99` an inference tail latency over fifo's, "
              "`*_65536_over_8` growth from 8 to 65,536 shards, and `sim`'s `*_abs_error` simulated against "
              "measured here. `sim`'s scale figures are SIMULATED, never measured, the paper's figure beside each "
              "in its table, and `seconds_to_simulate_*` is the simulator's measured wall time. A `_worst` "
              "headline is the smallest ratio over every size and device count measured.")
    lines = ["# pw-bench results", "", *textwrap.wrap(header, 100, break_on_hyphens=False), ""]
    if records:
        machine = records[0][1]["machine"]
        packages = ", ".join(f"{k} {v}" for k, v in machine["packages"].items() if v)
        lines += [f"Machine: {machine['cpus']} CPUs, {machine['system']}, Python {machine['python']}; "
                  f"{packages}; run {machine['date']}.", ""]
        runs = sorted({str(record["machine"].get("run")) for _, record in records})
        lines += [f"All records come from one `pw-bench all` run ({runs[0]})." if len(runs) == 1 and runs[0] != "None"
                  else f"Warning: these records do not come from one `pw-bench all` run (runs: {', '.join(runs)}).",
                  ""]
    lines += ["## Headline ratios", "", markdown_table(
        [{"benchmark": record["benchmark"], "record": path.name, "ratio": key, "value": value,
          "better": better(record["benchmark"], key)}
         for path, record in records for key, value in record["headline"].items()]), ""]
    for path, record in records:
        name = record["benchmark"]
        lines += [f"## {name}", ""]
        if name in BENCHMARKS:
            lines += [load(name).__doc__.strip().split("\n\n")[0], ""]
        lines += [f"Record: `{path.name}`.", ""]
        if name in BENCHMARKS:
            lines += [f"![{path.stem}](plots/{path.stem}.png)", ""]
        lines += ["Parameters: " + ", ".join(f"{k} = {format_value(v)}" for k, v in record["params"].items()),
                  "", markdown_table(record["rows"]), ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    if pictures:
        plots.mkdir(parents=True, exist_ok=True)
    for picture, png in pictures.items():
        picture.write_bytes(png)
    out.write_text("\n".join(lines))
    return [out, *pictures]

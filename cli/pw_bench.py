"""`pw-bench`: the Pathways paper's experiments, ours beside the baselines, as ratios.

    pw-bench list                              # benchmarks and their headline ratios
    pw-bench dispatch --quick                  # one benchmark: table, headline, record in results-quick/
    pw-bench dispatch --json dispatch.json     # ... its JSON record elsewhere
    pw-bench all --quick                       # every benchmark, records in benchmarks/results-quick/
    pw-bench all --quick --jobs 2              # ... two at a time: that they all run (figures disturbed)
    pw-bench report                            # records -> benchmarks/RESULTS.md + plots/*.png

The default folders are the package's own `benchmarks/` (wherever `pw-bench`
is run from); `--json-dir`, `--results` and `--out` name others.

Every benchmark process asks XLA for `harness.HOST_DEVICES` CPU devices before
JAX starts; `all` runs each benchmark in its own process, so one's threads,
caches and Ray instance never touch the next one's figures (`--jobs N` runs N
of those processes at once, which the tests use to check that every benchmark
runs: their figures then disturb each other). Errors are one line each; no
Python traceback. SIGTERM stops `pw-bench` as an exception would, so that its
cleanup runs: a benchmark shuts its Ray instance down, and `all` stops the
benchmark processes it waits for.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import click

from pathways_mlir import benchmarks
from pathways_mlir.benchmarks import BENCHMARKS, harness, load

from .entry import run_command

# Anchored to the package, not the working directory.
BENCHMARKS_DIR = pathlib.Path(benchmarks.__file__).resolve().parent
RESULTS = BENCHMARKS_DIR / "results"
QUICK_RESULTS = BENCHMARKS_DIR / "results-quick"
REPORT = BENCHMARKS_DIR / "RESULTS.md"
CHILD_STOP_TIMEOUT = 60.0   # seconds a benchmark process of `all` has to stop on SIGTERM before it is killed
CHILD_POLL_INTERVAL = 0.1   # seconds between `all`'s looks at whether one of its benchmark processes is over


class BenchError(Exception):
    """A problem reported on one line."""


def _use_host_devices(count: int) -> None:
    """Sets the XLA CPU device count (replacing any other) before JAX starts."""
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", ""))
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


def _cannot_write(path: pathlib.Path | str, error: OSError) -> BenchError:
    """The one-line error for an output `path` that cannot be written."""
    return BenchError(f"cannot write {path}: {error.strerror or error}")


def _check_writable(path: pathlib.Path) -> None:
    """Checks that `path` can be written, making its folder for the check, and leaves no new file or folder
    there (the writer makes the folder once there is something to write: a run that fails leaves none): a bad
    output path is an error before a run of minutes, not after it."""
    missing = [folder for folder in (path.parent, *path.parent.parents) if not folder.exists()]
    nearest = next(folder for folder in (path.parent, *path.parent.parents) if folder.exists())
    if not nearest.is_dir():
        raise BenchError(f"cannot write {path}: {nearest} is not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        with open(path, "a"):
            pass
        if not existed:
            path.unlink()
    except OSError as e:
        raise _cannot_write(path, e) from None
    finally:
        for folder in missing:                   # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()


def figures_folder(json_path: pathlib.Path) -> pathlib.Path:
    """Where a benchmark draws figures of its own (`FIGURES`) beside its record at `json_path`: plots/ beside
    the record, or the package's plots/ (which its RESULTS.md and README link) for a record in its results/."""
    return REPORT.parent / "plots" if json_path.parent.resolve() == RESULTS else json_path.parent / "plots"


def run_benchmark(name: str, quick: bool, json_path: pathlib.Path) -> dict:
    """Runs benchmark `name` in this process (XLA's device count already set); returns its record, whose
    place is `json_path` (a benchmark with `FIGURES` draws them in `figures_folder(json_path)`)."""
    module = load(name)
    try:
        record = (module.run(quick, plots=figures_folder(json_path)) if hasattr(module, "FIGURES")
                  else module.run(quick))
    except ImportError as e:
        raise BenchError(f"{name}: {e} (pip install 'pathways-mlir[bench]')") from None
    except Exception as e:  # noqa: BLE001  (a benchmark failed: one line, no traceback)
        raise BenchError(f"{name}: {type(e).__name__}: {e}") from None
    record["params"]["quick"] = quick
    return record


def _summary(record: dict) -> str:
    from pathways_mlir.benchmarks.report import format_value

    rows = record["rows"]
    columns = list(dict.fromkeys(k for r in rows for k in r))
    table = [columns] + [[format_value(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in table]
    lines += [f"{key} = {format_value(value)}" for key, value in record["headline"].items()]
    return "\n".join(lines)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Run the Pathways paper's experiments side by side with their baselines."""
    _use_host_devices(harness.HOST_DEVICES)


def _benchmark_command(name: str) -> click.Command:
    @click.command(name, help=f"Run the {name} benchmark (see pw-bench list).")
    @click.option("--quick", is_flag=True, help="Fewer repetitions and sizes: under a minute.")
    @click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=pathlib.Path),
                  help=f"Write the JSON record here (default: {RESULTS}/{name}.json, where report reads by "
                       f"default, or {QUICK_RESULTS} with --quick: report --results reads it there).")
    def command(quick: bool, json_path: pathlib.Path | None) -> None:
        json_path = json_path or (QUICK_RESULTS if quick else RESULTS) / f"{name}.json"
        _check_writable(json_path)
        record = run_benchmark(name, quick, json_path)
        click.echo(_summary(record))
        try:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(record, indent=1) + "\n")
        except OSError as e:
            raise _cannot_write(json_path, e) from None
        click.echo(f"record: {json_path}")
    return command


for _name in BENCHMARKS:
    cli.add_command(_benchmark_command(_name))


@cli.command("all")
@click.option("--quick", is_flag=True, help="Fewer repetitions and sizes: each under a minute.")
@click.option("--json-dir", "--out", "json_dir", type=click.Path(file_okay=False, path_type=pathlib.Path),
              default=None,
              help=f"Where to write one JSON record per benchmark (default: {RESULTS}, or "
                   f"{QUICK_RESULTS} with --quick, so a quick run never replaces a full run's records).")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Benchmarks to run at once, each in its own process. Above 1 they share the machine's cores, "
                   "so their figures disturb each other (a check that every benchmark runs, not a measurement; "
                   "their records say so), and their output interleaves.")
def run_all(quick: bool, json_dir: pathlib.Path | None, jobs: int) -> None:
    """Run every benchmark, each in its own process."""
    json_dir = json_dir or (QUICK_RESULTS if quick else RESULTS)
    for name in BENCHMARKS:
        _check_writable(json_dir / f"{name}.json")
    start = time.perf_counter()
    run_id = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if jobs > 1:          # the report shows a record's run: figures measured side by side say so there
        run_id += f", {jobs} benchmarks at a time"
    env = {**os.environ, harness.RUN_ID_VARIABLE: run_id}
    failed = _run_children({name: json_dir / f"{name}.json" for name in BENCHMARKS}, quick, env, jobs)
    click.echo(f"all benchmarks: {time.perf_counter() - start:.0f} s", err=True)
    if failed:
        raise BenchError(f"failed: {', '.join(failed)}")


def _run_children(json_paths: dict[str, pathlib.Path], quick: bool, env: dict[str, str], jobs: int) -> list[str]:
    """Runs each benchmark of `json_paths` in a process of its own writing its record there, at most `jobs` at
    once, starting them in order; returns the names of those that failed, in that order. If `pw-bench` is
    stopped meanwhile (SIGTERM, Ctrl-C), the running ones are terminated so that their own cleanup runs, and
    killed if they have not stopped within CHILD_STOP_TIMEOUT."""
    waiting, running, failed = list(json_paths), {}, set()
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                name = waiting.pop(0)
                click.echo(f"== {name}", err=True)
                command = [sys.executable, "-m", "pathways_mlir.cli.pw_bench", name, "--json",
                           str(json_paths[name])] + (["--quick"] if quick else [])
                running[name] = (subprocess.Popen(command, env=env), time.perf_counter())
            time.sleep(CHILD_POLL_INTERVAL)       # Popen has no wait for the first of several processes
            for name, (child, began) in list(running.items()):
                if child.poll() is None:
                    continue
                del running[name]
                if child.returncode != 0:
                    failed.add(name)
                else:
                    click.echo(f"   {json_paths[name]} ({time.perf_counter() - began:.0f} s)", err=True)
    finally:
        _stop_children([child for child, _ in running.values()])
    return [name for name in json_paths if name in failed]


def _stop_children(children: list[subprocess.Popen]) -> None:
    """Terminates the benchmark processes still running, all at once so that their cleanups overlap, and kills
    any that has not stopped within CHILD_STOP_TIMEOUT."""
    children = [child for child in children if child.poll() is None]
    for child in children:
        child.terminate()
    deadline = time.monotonic() + CHILD_STOP_TIMEOUT
    for child in children:
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=CHILD_STOP_TIMEOUT)


@cli.command("list")
def list_benchmarks() -> None:
    """List the benchmarks and their headline ratios."""
    for name in BENCHMARKS:
        click.echo(f"{name}: {', '.join(load(name).HEADLINE)}")


@cli.command("report")
@click.option("--results", type=click.Path(file_okay=False, path_type=pathlib.Path), default=RESULTS,
              show_default=True, help="Folder of JSON records.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=pathlib.Path), default=REPORT,
              show_default=True, help="Markdown report; plots go to plots/ beside it.")
def report(results: pathlib.Path, out: pathlib.Path) -> None:
    """Write RESULTS.md (tables) and PNG plots from the JSON records."""
    from pathways_mlir.benchmarks.report import RecordError, load_records, write_report

    if not results.is_dir():
        raise BenchError(f"{results}: no such folder (run pw-bench all first)")
    try:
        records = load_records(results)
    except RecordError as e:
        raise BenchError(str(e)) from None
    if not records:
        raise BenchError(f"{results}: no JSON records (run pw-bench all first)")
    _check_writable(out)
    try:
        written = write_report(records, out)
    except ImportError as e:
        raise BenchError(f"report: {e} (pip install 'pathways-mlir[bench]')") from None
    except RecordError as e:
        raise BenchError(str(e)) from None
    except OSError as e:
        raise _cannot_write(e.filename or out, e) from None
    for path in written:
        click.echo(str(path))


def _stop_on_sigterm(signum: int, frame) -> None:
    """Turns SIGTERM into SystemExit (status 128 + SIGTERM, as the signal would give), so that `finally`
    blocks run: a benchmark's Ray shutdown, `all`'s termination of its child."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pw-bench`; returns the exit status (SIGTERM: SystemExit, after cleaning up)."""
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        return run_command(cli, argv, "pw-bench", (BenchError,), lambda e: f"pw-bench: error: {e}")
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())

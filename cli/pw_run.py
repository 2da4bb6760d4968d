"""`pw-run`: run a program on the cluster (embedded, or Ray actors with --backend ray), printing results
and timing.

    pw-run examples/three_blocks.py                 # a Python script, as __main__
    pw-run three_blocks.mlir --program three_blocks # pw IR (lowered here if needed)
    pw-run plan.json --dispatch sequential --repeat 10 --trace trace.json
    pw-run examples/three_blocks.py --backend ray     # each island a Ray actor

For IR and plan files the inputs are seeded random arrays of the program's
argument shapes. `--trace` writes a Chrome/Perfetto trace with one track per
device. Errors are one line each; no Python traceback.
"""

from __future__ import annotations

import json
import os
import pathlib
import runpy
import sys
import time
import traceback

import click

from pathways_mlir.dialect.input_files import MAX_INPUT_BYTES, parse_json, read_bounded, read_text
from pathways_mlir.runtime.cluster import CLUSTER_ENV, ClusterError, parse_shape, prepare_host_devices
from pathways_mlir.runtime.dispatch_mode import DispatchMode

from .entry import error_line, run_command, write_output


class RunError(Exception):
    """A problem with pw-run's input, reported on one line."""


def select_program(plans: dict, wanted: str | None, where: str, error: type[Exception]):
    """Returns the plan of program `wanted`, or of the one program no branch calls; raises `error` naming
    `where` and the programs there otherwise."""
    if not plans:
        raise error(f"{where}: no program to run: the file holds no pw.program")
    branches = {s.then_plan.program for p in plans.values() for s in p.host_steps} | \
               {s.else_plan.program for p in plans.values() for s in p.host_steps}
    roots = sorted(name for name in plans if name not in branches)
    if wanted is not None:
        if wanted not in plans:
            raise error(f"{where}: no program named '{wanted}' (programs: {', '.join(sorted(plans))})")
        return plans[wanted]
    if len(roots) != 1:
        raise error(f"{where}: choose a program with --program (programs: {', '.join(roots)})")
    return plans[roots[0]]


def _plans_of(path: pathlib.Path, topology):
    from pathways_mlir.dialect.plan import ProgramPlan
    from pathways_mlir.passes import LoweringError, load_plans

    text = read_text(path, RunError)
    if path.suffix == ".json":
        value = parse_json(text, str(path), RunError)
        try:
            plan = ProgramPlan.from_python(value)
        except (ValueError, KeyError, TypeError) as e:
            raise RunError(f"{path}: not a pw plan: {type(e).__name__}: {e}") from None
        return _checked(path, {plan.program: plan})
    try:
        plans = load_plans(text, topology)    # plans written elsewhere are verified before anything trusts them
    except LoweringError as e:
        raise RunError("\n".join(d.format(str(path)) for d in e.diagnostics)) from None
    return _checked(path, plans)


def _checked(path: pathlib.Path, plans: dict) -> dict:
    """Returns `plans` once their executables are checked (`runtime/plan_check.py`): a plan from a file is
    untrusted input."""
    from pathways_mlir.dialect.plan import PlanError
    from pathways_mlir.runtime.plan_check import check_plan

    for plan in plans.values():
        try:
            check_plan(plan)
        except PlanError as e:
            raise RunError(f"{path}: {e}") from None
    return plans


def _inputs(plan, seed: int):
    import numpy as np

    from pathways_mlir.runtime.executables import numpy_dtype

    rng = np.random.default_rng(seed)
    arrays = []
    for b in plan.inputs:
        info = plan.buffers[b]
        dtype = numpy_dtype(info.dtype)
        if np.issubdtype(dtype, np.floating) or str(dtype) == "bfloat16":
            arrays.append(rng.normal(size=info.shape).astype(dtype))
        elif dtype == np.bool_:
            arrays.append(rng.integers(0, 2, size=info.shape).astype(bool))
        else:
            arrays.append(rng.integers(-8, 8, size=info.shape).astype(dtype))
    return arrays


def _run_ir(path: pathlib.Path, program: str | None, dispatch: DispatchMode, repeat: int, seed: int) -> None:
    import numpy as np

    import pathways_mlir as pw
    from pathways_mlir.runtime.client import default_client

    runtime = pw.get_runtime()
    plan = select_program(_plans_of(path, runtime.resources.topology), program, str(path), RunError)
    placed, cluster = _shape(plan.topology), _shape(runtime.resources.topology)
    if any(cluster.get(island, 0) < devices for island, devices in placed.items()):
        raise RunError(f"{path}: @{plan.program} is placed for {_describe(placed)}, but the cluster has "
                       f"{_describe(cluster)} (--cluster ISLANDSxDEVICES chooses it)")
    client = default_client(runtime)
    args = _inputs(plan, seed)
    try:
        start = time.perf_counter()
        handles = client.run(plan, args, dispatch)
        values = [np.asarray(h) for h in handles]
        first = time.perf_counter() - start
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            for h in client.run(plan, args, dispatch):
                h.block_until_ready()
            times.append(time.perf_counter() - start)
    except Exception as e:  # noqa: BLE001  (the program failed on the cluster: say so in one line)
        raise RunError(f"{path}: running @{plan.program} failed: {type(e).__name__}: {_first_line(e)}") from None
    islands = sorted(i for i, steps in plan.islands.items() if steps)
    where = ", ".join(islands) or "the host alone"       # no island has a step: it returns its arguments
    click.echo(f"program @{plan.program} on {where} ({dispatch} dispatch)")
    for n, (h, value) in enumerate(zip(handles, values)):
        click.echo(f"  result {n}: {value.dtype}{list(value.shape)} on {h.slice or 'the host'} "
                   f"sum={_sum(value):.6g} first={value.ravel()[:4].tolist()}")
    click.echo(f"  first run (compiles): {first * 1e3:.2f} ms")
    if times:
        click.echo(f"  median of {repeat} runs: {sorted(times)[len(times) // 2] * 1e3:.3f} ms")


def _sum(value):
    """Returns the sum of array `value` in double precision: complex128 for a complex array (float64 would drop
    its imaginary part), float64 otherwise."""
    import numpy as np

    return value.astype(np.complex128 if np.iscomplexobj(value) else np.float64).sum()


def _first_line(error: Exception) -> str:
    """The first line of `error`'s message: XLA's compile errors go on with the failing op and its source."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def _shape(topology) -> dict[str, int]:
    return {island.name: island.num_devices for island in topology.islands}


def _describe(shape: dict[str, int], shown: int = 8) -> str:
    """`shape`'s islands and their device counts, the first `shown` of them (a plan file may name thousands)."""
    named = [f"{name[:40]}: {devices} devices" for name, devices in list(shape.items())[:shown]]
    more = f" and {len(shape) - shown} more island(s)" if len(shape) > shown else ""
    return ", ".join(named) + more


def _run_script(path: pathlib.Path) -> None:
    try:
        with open(path, "rb") as file:
            source = read_bounded(file)        # its encoding is Python's to read (PEP 263)
    except OSError as e:
        raise RunError(f"{path}: cannot read the script: {e.strerror}") from None
    if len(source) > MAX_INPUT_BYTES:
        raise RunError(f"{path}: the script is larger than {MAX_INPUT_BYTES >> 20} MiB")
    if b"\0" in source:
        raise RunError(f"{path}: the script contains a NUL byte, which Python source cannot")
    if not source.strip():
        raise RunError(f"{path}: the script is empty: nothing to run")
    sys.argv = [str(path)]
    sys.path.insert(0, str(path.parent))
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise RunError(f"{path}: exited with status {e.code}") from None
    except Exception as e:  # noqa: BLE001  (the user's script failed: say where, briefly)
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(path)]
        where = f"{path}:{frames[-1].lineno}" if frames else str(path)
        raise RunError(f"{where}: {type(e).__name__}: {_first_line(e)}") from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", type=click.Path(path_type=pathlib.Path))
@click.option("--program", default=None, help="Program to run from an IR or plan file.")
@click.option("--dispatch", type=click.Choice([mode.value for mode in DispatchMode]), default="parallel",
              help="Asynchronous dispatch mode (IR and plans).")
@click.option("--repeat", type=click.IntRange(min=0), default=0, show_default=True,
              help="Timed runs after the first (IR and plans).")
@click.option("--trace", "trace_path", default=None, type=click.Path(dir_okay=False),
              help="Write a Chrome/Perfetto trace (one track per device).")
@click.option("--cluster", default=None, metavar="ISLANDSxDEVICES",
              help=f"Embedded cluster shape (sets {CLUSTER_ENV}).")
@click.option("--emulate-dcn", is_flag=True, help="Sleep for the modelled DCN time on cross-island moves.")
@click.option("--backend", type=click.Choice(["embedded", "ray"]), default="embedded", show_default=True,
              help="Run the islands in this process, or each in a Ray actor on a local Ray instance.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the random inputs (IR and plans).")
def cli(target, program, dispatch, repeat, trace_path, cluster, emulate_dcn, backend, seed) -> None:
    """Run TARGET (a .py script, pw IR .mlir, or plan .json) on the cluster: embedded in this process, or
    each island in a Ray actor with --backend ray."""
    if cluster:
        # Checked here, so that an error names the option the user wrote, not the variable it sets.
        parse_shape(cluster, f"--cluster {cluster}")
        os.environ[CLUSTER_ENV] = cluster
    prepare_host_devices()
    if not target.exists():
        raise RunError(f"{target}: no such file")
    if target.is_dir():
        raise RunError(f"{target}: is a directory: give a .py script, a .mlir file or a .json plan")
    from pathways_mlir.runtime.runtime import command_line_options, get_runtime
    from pathways_mlir.runtime.tracing import Tracer

    if trace_path == "":
        raise click.BadParameter("an empty path names no file", param_hint="'--trace'")
    if trace_path and os.path.exists(trace_path) and os.path.samefile(trace_path, target):    # links too
        raise RunError(f"--trace {trace_path} is {target}, the file to run: the trace would replace it")
    if trace_path and backend != "embedded":
        raise RunError("--trace records the embedded backend only")
    if trace_path and not pathlib.Path(trace_path).resolve().parent.is_dir():
        raise RunError(f"cannot write {trace_path}: its folder does not exist")
    if target.suffix not in (".py", ".mlir", ".json"):
        raise RunError(f"{target}: expected a .py script, a .mlir file or a .json plan")
    tracer = Tracer() if trace_path else None
    # A script's own pw.configure keeps these, and the trace (the runtime is made at its first use).
    with command_line_options(tracer, emulate_dcn=emulate_dcn, backend=backend):
        if target.suffix == ".py":
            _refuse_ir_options(target)
            _run_script(target)
        else:
            _run_ir(target, program, DispatchMode(dispatch), repeat, seed)
        if tracer is not None:
            get_runtime().stop_tracing()        # (its steps' ends recorded: `Tracer.flush`)
            write_output(trace_path, json.dumps(tracer.to_chrome()), RunError)
            click.echo(f"trace: {trace_path}")


def _refuse_ir_options(script: pathlib.Path) -> None:
    """Raises RunError if the command line gives a script an option that only IR and plan files take."""
    context = click.get_current_context()
    given = [f"--{name}" for name in ("program", "dispatch", "repeat", "seed")
             if context.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE]
    if given:
        raise RunError(f"{script}: {given[0]} applies to IR and plan files, not to a script, which chooses its own "
                       f"programs, dispatch (f.run(..., dispatch=...)) and inputs")


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pw-run`; returns the exit status."""
    return run_command(cli, argv, "pw-run", (RunError, ClusterError), error_line("pw-run"))


if __name__ == "__main__":
    sys.exit(main())

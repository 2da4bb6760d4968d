"""`pw-sim`: simulate per-island plans on a described machine (all figures simulated).

    pw-sim run plan.json --profile tpu-v4 --runs 20 --trace sim_trace.json
    pw-sim run examples/three_blocks.mlir --profile tpu-v4 --topology 2x2048
    pw-sim validate                     # real runs here against the simulation, per-program error
    pw-sim calibrate                    # fit dialect/profiles/cpu-here.json to measured calibration programs
    pw-sim scale [--quick]              # the paper's results at scale, simulated on tpu-v4
    pw-sim pipeline --stages 16 --micro-batches 64   # each schedule simulated; the pick is the fastest that fits
    pw-sim pipeline --here              # the same for a real pw.pipeline step here, each schedule also measured
    pw-sim profiles                     # the bundled machine descriptions

Errors are one line each; no Python traceback.
"""

from __future__ import annotations

import json
import math
import pathlib
import sys

import click

from pathways_mlir.runtime.dispatch_mode import DispatchMode

from .entry import error_line, run_command, write_output


class SimCliError(Exception):
    """A problem with pw-sim's input, reported on one line."""


def _user_errors() -> tuple[type[Exception], ...]:
    from pathways_mlir.dialect.plan import PlanError
    from pathways_mlir.runtime.cluster import ClusterError
    from pathways_mlir.sim.engine import SimError
    from pathways_mlir.sim.inputs import InputError
    from pathways_mlir.sim.profile import ProfileError

    return (SimCliError, PlanError, ProfileError, InputError, SimError, ClusterError)


def _strict_json(value, where: str, **options) -> str:
    """Returns `value` as standard JSON (no Infinity or NaN, which strict readers and Perfetto refuse); raises
    SimCliError naming `where` if a figure in it is not finite."""
    try:
        return json.dumps(value, allow_nan=False, **options)
    except ValueError:
        raise SimCliError(f"cannot write {where}: a simulated figure is not a finite number") from None


def _emit(record: dict, output: str | None) -> None:
    if output:
        write_output(output, _strict_json(record, output, indent=2) + "\n", SimCliError)
        click.echo(f"wrote {output}")


def _finite_or_none(value: float) -> float | None:
    """Returns `value`, or None (JSON's null) if it is not finite: the rate of runs that take no simulated time."""
    return value if math.isfinite(value) else None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Simulate pw plans (pw-sim); every figure it prints is simulated unless it says measured."""


@cli.command()
@click.argument("target", type=click.Path(dir_okay=False, path_type=pathlib.Path))
@click.option("--profile", "profile_name", default="tpu-v4", show_default=True, help="Profile name or JSON path.")
@click.option("--topology", default=None, help="For pw IR not yet lowered: ISLANDSxDEVICES or a topology JSON.")
@click.option("--program", default=None, help="Program to simulate from a file with several.")
@click.option("--dispatch", type=click.Choice([mode.value for mode in DispatchMode]), default="parallel",
              show_default=True)
@click.option("--runs", default=1, show_default=True, type=click.IntRange(1, 100000), help="Calls of the program.")
@click.option("--closed-loop", is_flag=True, help="Each call waits for the previous results.")
@click.option("--trace", "trace_path", default=None, type=click.Path(dir_okay=False),
              help="Write the simulated timeline as a Chrome/Perfetto trace.")
@click.option("--branch-probability", type=float, default=None,
              help="For plans with pw.cond: the probability that a predicate is true (drawn per cond, seeded).")
@click.option("--branch-trace", type=click.Path(dir_okay=False), default=None,
              help="For plans with pw.cond: a JSON list of predicate values (true/false or 1/0), in the order "
                   "the conds are evaluated.")
@click.option("-o", "output", default=None, help="Write the result as JSON here.")
def run(target, profile_name, topology, program, dispatch, runs, closed_loop, trace_path, branch_probability,
        branch_trace, output) -> None:
    """Simulate TARGET (a plan .json, or pw IR .mlir lowered for --topology)."""
    from pathways_mlir.sim import inputs, trace
    from pathways_mlir.sim.branches import BranchOutcomes, load_trace
    from pathways_mlir.sim.engine import Simulator, Submission
    from pathways_mlir.sim.profile import load_profile

    profile = load_profile(profile_name)
    if not target.exists():
        raise SimCliError(f"{target}: no such file")
    if topology and target.suffix == ".json":
        raise SimCliError(f"{target}: a plan is lowered already; --topology applies to pw IR only")
    loaded = inputs.load(target, inputs.profile_topology(topology, profile) if topology else None)
    plan = loaded.program(program, str(target))
    if branch_probability is not None and branch_trace:
        raise SimCliError("give --branch-probability or --branch-trace, not both")
    branches = load_trace(branch_trace) if branch_trace else \
        BranchOutcomes(probability=branch_probability) if branch_probability is not None else None
    sim = Simulator(profile, record_spans=bool(trace_path), branches=branches)
    result = sim.simulate([Submission(plan, dispatch) for _ in range(runs)], closed_loop=closed_loop)
    record = {"kind": "SIMULATED with pw-sim (not a measurement)", "program": plan.program, "profile": profile.name,
              "dispatch": dispatch, "runs": runs, "closed_loop": closed_loop,
              **({"branch_probability": branch_probability} if branch_probability is not None else {}),
              **({"branch_trace": branch_trace} if branch_trace else {}),
              "latency_ms": result.latency() * 1e3, "runs_per_s": _finite_or_none(result.throughput()),
              "makespan_ms": result.makespan() * 1e3}
    click.echo(f"SIMULATED @{plan.program} on {profile.name} ({dispatch} dispatch, {runs} run(s)): "
               f"latency {record['latency_ms']:.3f} ms, {result.throughput():.1f} runs/s, "
               f"makespan {record['makespan_ms']:.3f} ms")
    if trace_path:
        write_output(trace_path, _strict_json(trace.to_chrome(result), trace_path), SimCliError)
        click.echo(f"trace: {trace_path}")
    _emit(record, output)


@cli.command()
@click.option("--rounds", default=60, show_default=True, type=click.IntRange(3, 10000),
              help="Interleaved rounds of real runs.")
@click.option("--profile", "profile_name", default=None,
              help="Use this stored profile instead of fitting one to the calibration programs.")
@click.option("-o", "output", default=None, help="Write the validation record as JSON here.")
def validate(rounds, profile_name, output) -> None:
    """Run the validation programs for real, simulate them, and report each one's error."""
    from pathways_mlir.runtime.cluster import prepare_host_devices

    prepare_host_devices()
    from pathways_mlir.sim.profile import load_profile
    from pathways_mlir.sim.validate import run_validation

    record, _ = run_validation(rounds, load_profile(profile_name) if profile_name else None)
    click.echo(f"validation against profile {record['profile']['name']} ({rounds} interleaved rounds):")
    for name, r in record["validation"].items():
        click.echo(f"  {name:28s} measured {r['measured_ms']:8.3f} ms  simulated {r['simulated_ms']:8.3f} ms  "
                   f"error {r['error']:+.1%}")
    targets = record["targets"]
    click.echo(f"median_abs_error {record['median_abs_error']:.1%}, worst {record['worst_abs_error']:.1%} "
               f"(targets {targets['median_abs_error']:.0%} / {targets['worst_abs_error']:.0%}: "
               f"{'met' if record['met'] else 'NOT met'})")
    _emit(record, output)


@cli.command()
@click.option("--rounds", default=60, show_default=True, type=click.IntRange(3, 10000))
@click.option("-o", "output", default=None, help="Where to write the profile (default: the bundled cpu-here).")
def calibrate(rounds, output) -> None:
    """Measure the calibration programs and fit the cpu-here profile to them."""
    from pathways_mlir.runtime.cluster import prepare_host_devices

    prepare_host_devices()
    from pathways_mlir.sim.calibrate import calibrate_here
    from pathways_mlir.sim.profile import PROFILE_DIR

    profile, record = calibrate_here(rounds)
    for name, r in record.items():
        click.echo(f"  {name:28s} measured {r['measured_ms']:8.3f} ms  fitted {r['fitted_ms']:8.3f} ms")
    path = output or str(PROFILE_DIR / "cpu-here.json")
    write_output(path, json.dumps(profile.to_python(), indent=2) + "\n", SimCliError)
    click.echo(f"wrote {path}")


@cli.command()
@click.option("--profile", "profile_name", default="tpu-v4", show_default=True)
@click.option("--quick", is_flag=True, help="Fewer runs per point, 100 stages instead of 1,000.")
@click.option("-o", "output", default=None, help="Write the simulated record as JSON here.")
def scale(profile_name, quick, output) -> None:
    """Simulate the paper's scale results (Figure 6, Table 2, two islands, dispatch at many stages)."""
    from pathways_mlir.sim.profile import load_profile
    from pathways_mlir.sim.scale import run_scale

    record = run_scale(load_profile(profile_name), quick)
    click.echo(f"{record['kind']}, profile {record['profile']}:")
    for name, h in record["headline"].items():
        paper = f"  (paper: {h['paper']})" if "paper" in h else ""
        click.echo(f"  {name:40s} {h['value']:.4g}{paper}")
    _emit(record, output)


@cli.command()
@click.option("--profile", "profile_name", default=None, help="Profile (default: tpu-v4, or cpu-here with --here).")
@click.option("--stages", default=16, show_default=True, type=click.IntRange(2, 4096))
@click.option("--micro-batches", "micro", default=64, show_default=True, type=click.IntRange(1, 100000))
@click.option("--slices", default=None, type=click.IntRange(1, 4096),
              help="Slices interleaved-1f1b runs the stages on (default: stages / 2).")
@click.option("--memory", "memory_bytes", default=None, type=click.IntRange(1), help="Bytes per device (default: the profile's).")
@click.option("--here", is_flag=True, help="A real pw.pipeline step on this machine, each schedule also measured.")
@click.option("--rounds", default=20, show_default=True, type=click.IntRange(3, 10000), help="With --here.")
@click.option("-o", "output", default=None, help="Write the record as JSON here.")
def pipeline(profile_name, stages, micro, slices, memory_bytes, here, rounds, output) -> None:
    """Simulate each pipeline schedule of a training step and pick the fastest that fits in memory."""
    from pathways_mlir.sim import scale, schedules
    from pathways_mlir.sim.profile import load_profile

    source = click.get_current_context().get_parameter_source
    given = [flag for flag, name in (("--stages", "stages"), ("--micro-batches", "micro"), ("--slices", "slices"),
                                     ("--memory", "memory_bytes"))
             if source(name) is click.core.ParameterSource.COMMANDLINE]
    if here and given:
        raise SimCliError(f"--here measures its own 4-stage step (sim/programs.py's training_pipeline), which takes "
                          f"no {' or '.join(given)}")
    if here:
        from pathways_mlir.runtime.cluster import prepare_host_devices

        prepare_host_devices()
        record = schedules.check_here(rounds, load_profile(profile_name or "cpu-here"))
    else:
        profile = load_profile(profile_name or "tpu-v4")
        slices = slices or max(1, stages // 2)
        if stages % slices or micro % slices or scale.DEVICES % stages:
            raise SimCliError(f"--stages {stages} and --micro-batches {micro} must be multiples of --slices {slices}, "
                              f"and {scale.DEVICES} devices a multiple of the stages")
        if scale.LAYERS % stages:
            raise SimCliError(f"--stages {stages} must divide the model's {scale.LAYERS} layers")
        if scale.BATCH_TOKENS % micro or scale.BATCH_TOKENS // micro % (scale.DEVICES // slices):
            raise SimCliError(f"--micro-batches {micro} must cut the batch of {scale.BATCH_TOKENS} tokens into "
                              f"micro-batches that a slice's {scale.DEVICES // slices} devices split evenly")
        reports = {}
        for schedule, count in (("gpipe", stages), ("1f1b", stages), ("interleaved-1f1b", slices)):
            plan = scale.training_pipeline(stages, 1, profile, micro, schedule, count)
            reports[schedule] = schedules.report(plan, profile, memory_bytes, scale.weights_resident(plan, micro))
        record = {"kind": f"schedules SIMULATED on {profile.name} (not a measurement)", "stages": stages,
                  "micro_batches": micro, "devices": scale.DEVICES, "model": "3B decoder (sim/scale.py)",
                  "schedules": reports, "pick": schedules.pick(reports)}
    click.echo(record["kind"] + ":")
    for name, r in record["schedules"].items():
        measured = f"  measured {r['measured_ms']:9.3f} ms" if "measured_ms" in r else ""
        click.echo(f"  {name:17s} step {r['step_ms']:9.3f} ms  bubble {r['bubble_fraction']:5.1%}  peak "
                   f"{max(r['peak_bytes'].values()) / 2**20:9.1f} MiB per device{'' if r['fits'] else ' (does not fit)'}"
                   f"{measured}")
    click.echo(f"pick: {record['pick'] or 'none fits'}" + (
        f"; fastest measured: {record['best_measured']} ({record['pick_over_best_measured']:.3f} of it)"
        if "best_measured" in record else ""))
    _emit(record, output)


@cli.command()
def profiles() -> None:
    """List the bundled machine descriptions."""
    from pathways_mlir.sim.profile import load_profile, profile_names

    for name in profile_names():
        p = load_profile(name)
        a = p.accelerator
        click.echo(f"{name:10s} {', '.join(p.device_kinds):12s} {a.peak_tflops:g} TFLOPS, "
                   f"{a.memory_gbytes_per_s:g} GB/s, {a.memory_bytes / 2**30:.0f} GiB, {a.devices_per_host} per host; "
                   f"ICI {p.ici.bandwidth_gbps:g} Gbit/s, DCN {p.dcn.bandwidth_gbps:g} Gbit/s")


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pw-sim`; returns the exit status."""
    return run_command(cli, argv, "pw-sim", _user_errors(), error_line("pw-sim"))


if __name__ == "__main__":
    sys.exit(main())

"""Plans to simulate: a plan JSON as the runtime loads it, or pw IR lowered here.

A `.mlir` file without plans yet is lowered with `pw-lower` for a
topology: `<islands>x<devices>` builds islands of the profile's device kind
(its memory, its devices per host), or a topology JSON file is used as is;
IR that holds plans already is refused a topology, as a plan JSON is.
Every plan's executables are checked as pw-run checks them
(`runtime/plan_check.check_plan`).
Each plan carries its executables' `pw.cost` flops (`ProgramPlan.flops`);
a plan JSON that lacks them for an executable it launches is refused.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

from pathways_mlir.dialect.input_files import parse_json, read_text
from pathways_mlir.dialect.plan import PlanError, ProgramPlan
from pathways_mlir.dialect.plan_steps import Launch
from pathways_mlir.dialect.topology import Island, Link, Topology, TopologyError, uniform_counts

from .profile import Profile


class InputError(ValueError):
    """A file or option that does not give plans to simulate; one line naming it."""


@dataclass(frozen=True)
class Loaded:
    """The plans of a file, by program."""

    plans: dict[str, ProgramPlan]

    def program(self, name: str | None, where: str) -> ProgramPlan:
        """Returns the plan of program `name`, or of the only one no `pw.cond` calls as a branch."""
        from pathways_mlir.cli.pw_run import select_program

        return select_program(self.plans, name, where, InputError)


def profile_topology(text: str, profile: Profile) -> Topology:
    """Reads `--topology`: `<islands>x<devices>` of the profile's devices and links (bounded as pw-opt's
    topology option is: `uniform_counts`), or a JSON path."""
    try:
        counts = uniform_counts(text)
    except TopologyError as e:
        raise InputError(f"--topology: {e}") from None
    if counts is None:
        try:
            return Topology.load(text)
        except TopologyError as e:
            raise InputError(str(e)) from None
    islands, devices = counts
    if islands < 1 or devices < 1:
        raise InputError(f"--topology {text}: need at least one island of at least one device")
    per_host = min(profile.accelerator.devices_per_host, devices)
    if devices % per_host:
        raise InputError(f"--topology {text}: devices must be a multiple of {per_host} per host")
    ici = Link(profile.ici.latency_us, profile.ici.bandwidth_gbps)
    return Topology(tuple(Island(f"island{i}", profile.device_kinds[0], devices // per_host, per_host,
                                 profile.accelerator.memory_bytes, ici) for i in range(islands)),
                    Link(profile.dcn.latency_us, profile.dcn.bandwidth_gbps))


def load(path: pathlib.Path, topology: Topology | None) -> Loaded:
    """Reads plans from a plan JSON or a (lowered or not) `.mlir` file, and checks their executables as pw-run
    does (`runtime/plan_check.check_plan`: nothing is compiled), so that pw-sim simulates only plans pw-run runs."""
    from pathways_mlir.runtime.plan_check import check_plan

    loaded = _read(path, topology)
    for plan in loaded.plans.values():
        try:
            check_plan(plan)
        except PlanError as e:
            raise InputError(f"{path}: {e}") from None
    return loaded


def _read(path: pathlib.Path, topology: Topology | None) -> Loaded:
    text = read_text(path, InputError)
    if path.suffix == ".json":
        value = parse_json(text, str(path), InputError)
        try:
            plan = ProgramPlan.from_python(value)
        except (ValueError, PlanError) as e:
            raise InputError(f"{path}: not a pw plan: {e}") from None
        missing = sorted({s.executable for steps in plan.islands.values() for s in steps
                          if isinstance(s, Launch)} - set(plan.flops))
        if missing:
            raise InputError(f"{path}: the plan has no flops for executable '{missing[0]}' (written before "
                             f"plans kept pw.cost flops? lower it again)")
        return Loaded({plan.program: plan})
    if path.suffix != ".mlir":
        raise InputError(f"{path}: expected a plan .json or pw IR .mlir")
    return lower_text(text, topology, str(path))


def lower_text(text: str, topology: Topology | None, where: str = "input") -> Loaded:
    """Returns the plans of pw IR (`passes.load_plans`): lowered for `topology` if the IR holds no plans yet, or
    its own plans, verified, if it does, in which case `topology` must be None (the plans are placed already)."""
    from pathways_mlir.passes import LoweringError, TopologyNeeded, load_plans

    try:
        try:
            plans = load_plans(text, None)
        except TopologyNeeded:
            if topology is None:
                raise InputError(f"{where}: pw IR without plans needs --topology") from None
            return Loaded(load_plans(text, topology))
    except LoweringError as e:
        raise InputError("\n".join(d.format(where) for d in e.diagnostics)) from None
    if topology is not None:
        raise InputError(f"{where}: the IR is lowered already (it holds plans); --topology applies to pw IR "
                         f"without plans only")
    return Loaded(plans)

"""`pw.pipeline(..., schedule="auto")`: the schedule picked by simulating every one offered.

Each schedule `pw.pipeline` offers for the given stages, slices and
micro-batches (interleaved-1f1b only where the slices repeat round-robin)
is built and traced; on the first call for a runtime and argument
signature, each one's step is lowered for that runtime's topology (the plan
it would run), simulated on the profile of its device kind (`sim/`,
`dialect/profiles/`), and the fastest whose static peak fits the device
memory is picked: `pipeline(..., profile=)` names another profile (a
name, a JSON path or a `sim.profile.Profile`), `memory_bytes=` another
device memory than the topology's. `step.choice` says what was picked and why: every
schedule's simulated step time, bubble fraction and peak bytes per stage,
and the schedules not offered with the reason. The picked step's program is
`@pipeline_<schedule>`, as a named schedule's is.

    step = pw.pipeline(stages, slices, loss=mse, schedule="auto", micro_batches=8)
    loss, grads = step(params, x, target)
    print(step.choice.summary())
"""

from __future__ import annotations

import numbers
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import jax

from .avals import aval_of, has_tracers, signature_of
from .lowered import Lowered
from .tracer import current_program

if TYPE_CHECKING:
    from .compiled import Compiled
    from .pipeline import PipelineProgram


@dataclass(frozen=True)
class ScheduleChoice:
    """The schedule picked for one runtime and argument signature, and each offered schedule's report
    (`sim.schedules.report`: step_ms, bubble_fraction, peak_bytes per stage's devices, fits)."""

    pick: str
    program: "PipelineProgram"          # the picked schedule's step
    reports: dict[str, dict]            # offered schedule -> its simulated report
    plans: dict                         # offered schedule -> the plan simulated (what its step runs)
    not_offered: dict[str, str]         # schedule -> why these stages, slices and micro-batches rule it out
    profile: str                        # the profile the steps were simulated on

    def summary(self) -> str:
        """Returns the choice as text: one line per schedule, then the pick."""
        lines = [f"pipeline schedules SIMULATED on {self.profile}:"]
        for name, r in self.reports.items():
            lines.append(f"  {name:17s} step {r['step_ms']:9.3f} ms  bubble {r['bubble_fraction']:5.1%}  peak "
                         f"{max(r['peak_bytes'].values(), default=0) / 2**20:9.2f} MiB per device"
                         f"{'' if r['fits'] else ' (does not fit)'}")
        lines += [f"  {name:17s} not offered: {why}" for name, why in self.not_offered.items()]
        lines.append(f"picked: {self.pick}")
        return "\n".join(lines)


class AutoPipeline:
    """A pipelined training step whose schedule is picked by simulation; see the module docstring.

    It is called, run, lowered and compiled as the `Program` of a named
    schedule is; `choice` is the latest pick (`choose` gives the pick for
    given arguments and runtime).
    """

    def __init__(self, build: Callable[[str], "PipelineProgram"], schedules: tuple[str, ...], profile=None,
                 memory_bytes: int | None = None):
        from pathways_mlir.sim.profile import Profile, load_profile

        if memory_bytes is not None and (isinstance(memory_bytes, bool)
                                         or not isinstance(memory_bytes, numbers.Integral) or memory_bytes <= 0):
            raise ValueError(f"memory_bytes must be a positive number of bytes per device, not {memory_bytes!r}")
        if profile is not None and not isinstance(profile, (str, Profile)):
            raise TypeError(f"profile must be a profile name, a JSON path or a sim Profile, not "
                            f"{type(profile).__name__}")
        self._profile = load_profile(profile) if isinstance(profile, str) else profile
        self._memory_bytes = None if memory_bytes is None else int(memory_bytes)
        self.candidates: dict[str, PipelineProgram] = {}
        self.not_offered: dict[str, str] = {}
        errors = []
        for schedule in schedules:
            try:
                self.candidates[schedule] = build(schedule)
            except ValueError as error:
                self.not_offered[schedule] = str(error)
                errors.append(error)
        if not self.candidates:
            raise errors[0]
        self.choice: ScheduleChoice | None = None
        self._choices: "weakref.WeakKeyDictionary[Any, dict[tuple, ScheduleChoice]]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def choose(self, *args: Any, runtime=None, **kwargs: Any) -> ScheduleChoice:
        """Returns the pick for arguments of these shapes on `runtime` (default: the process's), simulating
        the offered schedules the first time only."""
        from pathways_mlir.runtime.runtime import get_runtime

        runtime = runtime or get_runtime()
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        key = tree, tuple(signature_of(aval_of(x)) for x in leaves)
        with self._lock:
            found = self._choices.get(runtime, {}).get(key)
            if found is None:
                found = self._choices.setdefault(runtime, {})[key] = self._simulate(args, kwargs, runtime)
            self.choice = found
        return found

    def _simulate(self, args: tuple, kwargs: dict, runtime) -> ScheduleChoice:
        from pathways_mlir.sim.profile import profile_of_kind
        from pathways_mlir.sim.schedules import pick, report

        _, topology = runtime.resources.snapshot()
        profile = self._profile or profile_of_kind(topology.islands[0].device_kind)
        plans, reports = {}, {}
        for schedule, step in self.candidates.items():
            lowered = step.lower(*args, **kwargs)
            plans[schedule] = lowered.plan_on(topology)
            reports[schedule] = report(plans[schedule], profile, self._memory_bytes)
        chosen = pick(reports)
        if chosen is None:
            smallest = min(reports, key=lambda s: max(reports[s]["peak_bytes"].values(), default=0))
            peak = max(reports[smallest]["peak_bytes"].values())
            raise ValueError(f"no pipeline schedule fits the device memory ({reports[smallest]['memory_bytes']} "
                             f"bytes per device): the smallest peak, {smallest}'s, is {peak} bytes")
        return ScheduleChoice(chosen, self.candidates[chosen], reports, plans, dict(self.not_offered), profile.name)

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Traces the step of the schedule picked for these arguments on the process's runtime."""
        return self.choose(*args, **kwargs).program.lower(*args, **kwargs)

    def compiled(self, *args: Any, runtime=None, **kwargs: Any) -> "Compiled":
        """Returns the `Compiled` stage of the schedule picked for these arguments on `runtime`."""
        return self.choose(*args, runtime=runtime, **kwargs).program.compiled(*args, runtime=runtime, **kwargs)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """Returns the step's results' `jax.ShapeDtypeStruct`s (every schedule's are the same), running nothing."""
        return next(iter(self.candidates.values())).eval_shape(*args, **kwargs)

    def run(self, *args: Any, dispatch: str = "parallel", client=None, timeout: float | None = None,
            **kwargs: Any) -> Any:
        """Runs the picked schedule's step, as `Program.run` does."""
        runtime = client.runtime if client is not None else None
        return self.choose(*args, runtime=runtime, **kwargs).program.run(
            *args, dispatch=dispatch, client=client, timeout=timeout, **kwargs)

    def draw(self, path: str, trace=None) -> float:
        """Draws the latest pick's schedule as `PipelineProgram.draw` does (planned, or measured with `trace`)."""
        if self.choice is None:
            raise ValueError("a pipeline with schedule='auto' has no schedule to draw before it picks one: call "
                             "the step (or step.choose(*args)) first")
        return self.choice.program.draw(path, trace)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the picked schedule's step on the cluster (results are handles)."""
        if current_program() is not None or has_tracers((args, kwargs)):
            raise ValueError("a pipeline with schedule='auto' picks its schedule for a runtime, so it cannot be "
                             "called inside another trace or JAX transformation: name the schedule there "
                             "(step.choice.pick after a call)")
        return self.run(*args, **kwargs)

"""`pw-lower`, the lowering pipeline, and its Python entry points.

    lower(source, topology)            -> the lowered ir.Module
    lower_to_plans(source, topology)   -> {program: ProgramPlan}: what a runtime runs
    load_plans(text, topology)         -> the plans of pw IR text, planned or not (a file)

`lower_to_plans` backs `Lowered.compile`, the simulator and the benchmarks;
`load_plans` is the one reader of plan files in IR (`pw-run`, `pw-sim`): IR
that holds plans already is checked by pw-verify-plans before its plans are
read, as pw-lower checks its own.
"""

from __future__ import annotations

from mlir import ir

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.context import ParseError, make_context, parse_module
from pathways_mlir.dialect.diagnostics import Diagnostic, DiagnosticEngine
from pathways_mlir.dialect.phases import Phase, holds_plans
from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.dialect.plan_reader import program_plans
from pathways_mlir.dialect.structure import verify_structure
from pathways_mlir.dialect.topology import Topology

from .alias_slices import AliasSlicesPass
from .emit_plans import EmitPlansPass
from .fuse_island import FuseIslandPass
from .fuse_launches import FuseLaunchesPass
from .insert_transfers import InsertTransfersPass
from .mark_static_subgraphs import MarkStaticSubgraphsPass
from .pipeline import run_passes
from .plan_memory import PlanMemoryPass
from .place import PlacePass, Strategy
from .registry import Option, Pass, register_pipeline
from .schedule import SchedulePass
from .verify import VerifyPass
from .verify_phase import VerifyPhasePass
from .verify_plans import VerifyPlansPass
from .verify_schedule import VerifySchedulePass


class LoweringError(ValueError):
    """A program that cannot be lowered (or plans that do not verify); `diagnostics` says where and why."""

    def __init__(self, diagnostics: DiagnosticEngine | list[Diagnostic]):
        self.diagnostics = diagnostics.diagnostics if isinstance(diagnostics, DiagnosticEngine) else diagnostics
        super().__init__("\n".join(d.format() for d in self.diagnostics))


class TopologyNeeded(ValueError):
    """`load_plans` was given pw IR without plans, and no topology to lower it onto."""


_FUSE = Option("fuse", bool, True, "fuse an island's launches across its slices (pw-fuse-island) and consecutive "
                                     "launches on one slice (pw-fuse-launches)")
# `lower`'s own option, checked as a pass option is (`Option.check`): `verify_each="false"` is false.
_VERIFY_EACH = Option("verify_each", bool, False, "check the IR between passes, not only the input and the output")


@register_pipeline("pw-lower", "Lower device-agnostic programs to per-island plans",
                   options=PlacePass.options + (_FUSE,))
def lower_pipeline(topology: str = "", strategy: Strategy = Strategy.AUTO, pin: str = "", explain: bool = False,
                   fuse: bool = True) -> list[Pass]:
    """Lowers device-agnostic programs to per-island plans, through the
    phases of `dialect/phases.py` (input, placed, lowered, partitioned,
    scheduled, planned), each ended by `pw-verify-phase` (and `pw-verify`
    after placing, moving values and planning) so that a bug is caught at the
    pass that made it. The comment before each pass says why it sits where it
    does; `fuse=false` leaves out pw-fuse-island and pw-fuse-launches (whose
    `step_us` keeps its default here).

    Options are pw-place's, and `fuse`. Requires a device-agnostic module:
    one that passes pw-verify and the input phase, without plans or moved
    values (pw-place's requirements).

        // before: slices, compiled functions and programs
        // after: placements, transfers, pw.subgraph / pw.order / pw.cost marks,
        //   module @<program>_<island> {pw.island_plan} per island used, and
        //   module @<program>_host {pw.host_plan} per program
    """
    # A call from Python passes `fuse` as given (a pipeline string's text was parsed already): it is checked as
    # PlacePass checks the options passed on to it, so that `fuse="false"` is false and `fuse=0` a TypeError.
    fuse = _FUSE.check("pw-lower", fuse)
    return [
        # The passes below assume well-formed pw IR with no plan ops yet.
        VerifyPass(), VerifyPhasePass(phase=Phase.INPUT),
        # Every later pass needs the island of each slice.
        PlacePass(topology=topology, strategy=strategy, pin=pin, explain=explain),
        # Slices on the same devices share buffers before any transfer is inserted.
        AliasSlicesPass(),
        # Placements are checked (device counts, ranges) before links are chosen from them.
        VerifyPass(), VerifyPhasePass(phase=Phase.PLACED),
        # Links depend on islands; transfers are ops, so they go in before anything groups or orders ops.
        InsertTransfersPass(),
        # The lowered rule: every operand lives where it is used.
        VerifyPass(), VerifyPhasePass(phase=Phase.LOWERED),
        # Subgraphs are cut over the final ops, transfers included.
        MarkStaticSubgraphsPass(), VerifyPhasePass(phase=Phase.PARTITIONED),
        # Fusion needs the subgraphs and must come before ordering and costs; island fusion calls only
        # unfused executables, so it goes first, and launch fusion takes the single-slice runs it left.
        *([FuseIslandPass(), FuseLaunchesPass()] if fuse else []),
        # The order puts static subgraphs first, so it comes after they are final.
        SchedulePass(), VerifyPhasePass(phase=Phase.SCHEDULED),
        # The order is proved deadlock-free before plans are cut from it.
        VerifySchedulePass(),
        # Plans read placements, subgraphs and orders, all final now.
        EmitPlansPass(),
        # Frees and peaks need each island's steps, which the plans now list.
        PlanMemoryPass(),
        # The module and the plans the runtime will trust are checked last.
        VerifyPass(), VerifyPhasePass(phase=Phase.PLANNED), VerifyPlansPass(),
    ]


def lower(module: ir.Module | str, topology: Topology, strategy: Strategy | str = Strategy.AUTO,
          pin: str = "", fuse: bool = True, explain: bool = False, verify_each: bool = False) -> ir.Module:
    """Lowers a device-agnostic module onto `topology`; returns a new, lowered module.

    `module` is IR text, which is parsed, or a module, which is copied and
    left unchanged. The new module gets `topology` as its `pw.topology` and
    runs `pw-lower`. Lowering the same program again after the topology
    changes (a device removed, an island added) yields new plans. `explain=True` leaves pw-place's
    `pw.placement_cost` on every slice. Raises `LoweringError` with the
    diagnostics if the text does not parse, its pw ops do not match their
    definitions (pw-opt's check after parsing), or the program cannot be
    lowered.

    The input and the output are checked in full; the checks between
    passes run only with `verify_each=True` (see `run_passes`), as JAX
    verifies the module it lowered once, and as a release compiler runs
    without MLIR's verify-each. `pw-opt` runs them by default.
    A topology with no island (a runtime whose every island is lost) places
    nothing: `LoweringError` says so. Options are checked as pass options
    are (`Option.check`): a string is read as in a pipeline string
    (`fuse="false"` is false), another value must have the option's type.
    """
    verify_each = _VERIFY_EACH.check("lower", verify_each)
    if not topology.islands:
        diagnostics = DiagnosticEngine()
        diagnostics.error(None, "cannot place any slice: the topology has no island (every island was lost)")
        raise LoweringError(diagnostics)
    lowered = _parse(module, make_context()) if isinstance(module, str) else _checked(_copy(module))
    with lowered.context, lowered.operation.location:
        ops.set_topology(lowered, topology)
        diagnostics = DiagnosticEngine()
        passes = lower_pipeline(strategy=strategy, pin=pin, explain=explain, fuse=fuse)
        if not run_passes(lowered, passes, diagnostics, verify_each=verify_each):
            raise LoweringError(diagnostics)
    return lowered


def _parse(text: str, context: ir.Context) -> ir.Module:
    """Parses pw IR text; raises `LoweringError` for text that does not parse or pw ops that do not match
    their definitions."""
    try:
        module = parse_module(text, context)
    except ParseError as error:
        raise LoweringError(error.diagnostics) from None
    return _checked(module)


def _checked(module: ir.Module) -> ir.Module:
    """Returns `module` if its pw ops match their IRDL definitions (pw-opt's check after parsing: the passes
    read attributes of the kinds it checks), else raises `LoweringError` with the problems."""
    problems = verify_structure(module)
    if problems:
        raise LoweringError(problems)
    return module


def _copy(source: ir.Module) -> ir.Module:
    with source.context, source.operation.location:
        copy = ir.Module.create(source.operation.location)
        for name in source.operation.attributes:
            copy.operation.attributes[name] = source.operation.attributes[name]
        with ir.InsertionPoint(copy.body):
            for op in source.body.operations:
                op.clone()
    return copy


def lower_to_plans(source: ir.Module | str, topology: Topology, strategy: Strategy | str = Strategy.AUTO,
                   pin: str = "", fuse: bool = True, verify_each: bool = False) -> dict[str, ProgramPlan]:
    """Lowers `source` onto `topology` (as `lower`) and returns the plan of every program, which pw-lower's
    last pass, pw-verify-plans, has checked. Raises `LoweringError` with the diagnostics."""
    return program_plans(lower(source, topology, strategy=strategy, pin=pin, fuse=fuse, verify_each=verify_each))


def load_plans(text: str, topology: Topology | None) -> dict[str, ProgramPlan]:
    """Returns the plans of pw IR text: lowered onto `topology` unless the IR holds plans already, in which
    case pw-verify-plans checks its plans first (they were written elsewhere). Raises `LoweringError` with
    the diagnostics (parse, structure, lowering or plan errors), `TopologyNeeded` for IR without plans
    when `topology` is None."""
    with make_context() as context:
        module = _parse(text, context)
        if not holds_plans(module):
            if topology is None:
                raise TopologyNeeded("pw IR without plans needs a topology to lower onto")
            return lower_to_plans(module, topology)
        diagnostics = DiagnosticEngine()
        if not run_passes(module, [VerifyPlansPass()], diagnostics):
            raise LoweringError(diagnostics)
        return program_plans(module)

"""`pw-verify-phase{phase=...}`: checks that the module is in a phase of lowering.

One table (`dialect/phases.py`) says, for every `pw` op, from which phase on
it may appear and which marks it carries from which phase on; this pass
checks the module against it, reporting each problem at the op at fault. The
lowering pipeline runs it at each phase boundary, so that a pass that left
its phase's work undone is caught where it ran.

Requires IR that passes pw-verify (the driver runs its checks first); changes
nothing.

    // pw-verify-phase{phase=placed}
    "pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
    // error: the module has no pw.topology, which the placed phase requires (pw-place adds it)
    // error: 'pw.virtual_slice' op has no pw.placement, which the placed phase requires (pw-place adds it)
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from pathways_mlir.dialect.diagnostics import DiagnosticEngine
from pathways_mlir.dialect.phases import Phase, phase_problems

from .registry import Pass, option, register


@register
@dataclass
class VerifyPhasePass(Pass):
    __doc__ = __doc__
    name = "pw-verify-phase"
    summary = "Check every op against the phase table: legal in the phase, carrying the marks it requires"
    changes_ir = False
    boundary_check = True
    needs_verified_input = True
    phase: Phase = option(Phase.INPUT, "input, placed, lowered, partitioned, scheduled or planned")

    def run(self, module: ir.Operation, diagnostics: DiagnosticEngine) -> None:
        for op, message in phase_problems(module, self.phase):
            diagnostics.error(op, message)

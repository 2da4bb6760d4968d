"""Parsing textual pass pipelines and running them in MLIR's pass manager.

The text follows `mlir-opt`: `builtin.module(pw-a{opt=v other="x y"},pw-b)`.
Names resolve in the `pw` registry (passes and named pipelines); each Python
pass runs inside MLIR's `PassManager`, which verifies the IR after each one.
"""

from __future__ import annotations

import sys

from mlir import ir
from mlir.passmanager import PassManager

from pathways_mlir.dialect.diagnostics import Diagnostic, DiagnosticEngine, from_mlir_error
from pathways_mlir.dialect.phases import Phase, holds_plans, phase_problems
from pathways_mlir.dialect.structure import verify_structure

from .registry import PASSES, PIPELINES, OptionError, Pass
from .verify import VerifyPass, verify_module
from .verify_phase import VerifyPhasePass


class PipelineError(ValueError):
    """A pipeline string that does not parse or names an unknown pass."""


def _parse_options(text: str, start: int, owner: str) -> tuple[dict[str, str], int]:
    """Parses `{a=1 b="x y"}` starting at the `{`; returns options and the index after `}`."""
    options: dict[str, str] = {}
    i = start + 1
    while True:
        while i < len(text) and text[i] in " ,":
            i += 1
        if i >= len(text):
            raise PipelineError(f"unterminated option list of '{owner}' at column {start + 1}")
        if text[i] == "}":
            return options, i + 1
        key_start = i
        while i < len(text) and text[i] not in "= }":
            i += 1
        key = text[key_start:i]
        value = ""
        if i < len(text) and text[i] == "=":
            i += 1
            if i < len(text) and text[i] in "\"'":
                quote = text[i]
                end = text.find(quote, i + 1)
                if end < 0:
                    raise PipelineError(f"unterminated quoted value of option '{key}' of '{owner}'")
                value, i = text[i + 1:end], end + 1
            else:
                depth, value_start = 0, i
                while i < len(text) and (depth or text[i] not in " }"):
                    depth += {"{": 1, "[": 1, "}": -1, "]": -1}.get(text[i], 0)
                    i += 1
                value = text[value_start:i]
        if not key:
            raise PipelineError(f"empty option name in the options of '{owner}' at column {key_start + 1}")
        if key in options:               # mlir-opt refuses it too: which value was meant is not clear
            raise PipelineError(f"option '{key}' of '{owner}' is given twice, again at column {key_start + 1}")
        options[key] = value


def parse_pipeline(text: str) -> list[Pass]:
    """Returns the pass instances named by a pipeline string.

    Accepts `builtin.module(a,b{x=1})` or the bare list `a,b{x=1}`; as in
    `mlir-opt`, each pass is followed by `,` or by the end of the list.
    Errors give columns of `text`.
    """
    i = _skip_spaces(text, 0)
    wrapped = text.startswith("builtin.module(", i)
    if wrapped:
        i = _skip_spaces(text, i + len("builtin.module("))
    passes: list[Pass] = []
    name = None   # the last pass read
    if i < len(text) and not (wrapped and text[i] == ")"):     # `builtin.module()` runs nothing
        while True:
            name_start = i
            while i < len(text) and not text[i].isspace() and text[i] not in "{,()":
                i += 1
            name = text[name_start:i]
            if not name:
                raise PipelineError(f"expected a pass name at column {i + 1}")
            given: dict[str, str] = {}
            if i < len(text) and text[i] == "{":
                given, i = _parse_options(text, i, name)
            passes.extend(instantiate(name, given))
            i = _skip_spaces(text, i)
            if i >= len(text) or text[i] != ",":
                break
            i = _skip_spaces(text, i + 1)
    if wrapped and i >= len(text):
        raise PipelineError("missing ')' at the end of 'builtin.module(...)'")
    if i < len(text) and not (wrapped and text[i] == ")"):
        end = "')'" if wrapped else "the end"
        raise PipelineError(f"expected ',' or {end} after '{name}' at column {i + 1}, not '{text[i]}'")
    rest = _skip_spaces(text, i + 1) if wrapped else len(text)
    if rest < len(text):
        raise PipelineError(f"unexpected text after ')' at column {rest + 1}: '{text[rest:rest + 40]}'")
    return passes


def _skip_spaces(text: str, i: int) -> int:
    """Returns the index of the first character at or after `i` that is not white space."""
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def instantiate(name: str, given: dict[str, str]) -> list[Pass]:
    """Returns the passes for one registered pass or pipeline name with option texts."""
    try:
        if name in PASSES:
            return [PASSES[name].from_text(given)]
        if name in PIPELINES:
            return PIPELINES[name].from_text(given)
    except OptionError as e:
        raise PipelineError(str(e)) from None
    known = ", ".join(sorted([*PASSES, *PIPELINES]))
    raise PipelineError(f"'{name}' is not a registered pass or pipeline (known: {known})")


def run_passes(module: ir.Module, passes: list[Pass], diagnostics: DiagnosticEngine,
               print_ir_after_all: bool = False, verify_each: bool = True) -> bool:
    """Runs `passes` on `module` in MLIR's pass manager; returns True on success.

    The first pass that needs verified input, or requires a phase of
    lowering, runs only if pw-verify's checks pass (their errors are reported
    instead), unless pw-verify already ran; a pass that requires a phase runs
    only if the module is in it (pw-verify-phase's errors, naming the pass,
    are reported instead):
    bad input must not crash a pass, and passes keep valid IR valid (the
    pipelines' own verifier phases check that). After each pass, the pw
    structural verifier and MLIR's verifier check the IR. Errors (a pass's
    own or a verifier's) are recorded in `diagnostics`. A pass that changes
    nothing (`changes_ir = False`) is not followed by the verifiers once the
    module has passed them (MLIR's pass manager itself skips its verifier
    after a pass that preserves everything, which Python passes cannot
    declare to it). IR printed after each pass goes to stderr, as `mlir-opt`.

    `verify_each=False` (`mlir-opt --verify-each=false`) checks only the
    ends: the input, as above, and the output of the last pass that changes
    IR. The verifiers do not run after the passes before it, their boundary
    checks (`Pass.boundary_check`) between the first and last such pass are
    left out, and a later pass's phase is taken as given: passes are trusted
    to keep valid IR valid, which the runs with `verify_each=True` (pw-opt's
    default, and the lit tests) check.
    """
    changing = [i for i, instance in enumerate(passes) if instance.changes_ir]
    if not verify_each and changing:
        passes = [instance for i, instance in enumerate(passes)
                  if not (instance.boundary_check and changing[0] < i < changing[-1])]
    last_change = next((instance for instance in reversed(passes) if instance.changes_ir), None)
    if not passes:
        return True
    manager = PassManager("builtin.module", context=module.context)
    manager.enable_verifier(False)  # run below, after the passes that change IR
    if print_ir_after_all:
        sys.stderr.flush()
        manager.enable_ir_printing(print_after_all=True)

    verified = []  # holds True once the input passed pw-verify's checks
    phased = set()  # the phases the module was found in (a pass that changes IR empties it)
    structured = []  # holds True once the module passed the structural verifier and MLIR's
    changed = []  # holds True once a pass changed the IR
    interrupted = []  # a KeyboardInterrupt (Ctrl-C) inside a pass: raised again once the pass manager returns

    def adapt(instance: Pass):
        def run(op: ir.Operation, mlir_pass) -> None:
            try:
                checked_run(op, mlir_pass)
            except KeyboardInterrupt as interrupt:   # the pass manager would make it a RuntimeError
                interrupted.append(interrupt)
                mlir_pass.signal_pass_failure()

        def checked_run(op: ir.Operation, mlir_pass) -> None:
            before = diagnostics.error_count
            if (instance.needs_verified_input or instance.requires_phase is not None) and not verified:
                if not verify_module(op, diagnostics):
                    mlir_pass.signal_pass_failure()
                    return
                verified.append(True)
            phase = instance.requires_phase
            if phase is not None and phase not in phased and (verify_each or not changed):
                if phase.rank < Phase.PLANNED.rank and holds_plans(op):      # (one line, not one per plan op)
                    diagnostics.error(op, f"{instance.name} runs on programs before their plans exist, but this "
                                          f"module holds plans already (pw-emit-plans has run)")
                    mlir_pass.signal_pass_failure()
                    return
                for at, message in phase_problems(op, phase):
                    diagnostics.error(at, f"{message}, before {instance.name}")
                if diagnostics.error_count > before:
                    mlir_pass.signal_pass_failure()
                    return
                phased.add(phase)
            instance.run(op, diagnostics)
            if instance.changes_ir:
                phased.clear()
                changed.append(True)
            elif isinstance(instance, VerifyPhasePass) and diagnostics.error_count == before:
                phased.add(instance.phase)
            if isinstance(instance, VerifyPass) and diagnostics.error_count == before:
                verified.append(True)
            if (instance.changes_ir and (verify_each or instance is last_change)) or not structured:
                for problem in verify_structure(op):
                    diagnostics.diagnostics.append(
                        Diagnostic(problem.severity, problem.location,
                                   f"{problem.message} (after {instance.name})"))
                if diagnostics.error_count == before:
                    try:
                        op.verify()
                        structured.append(True)
                    except ir.MLIRError as error:
                        diagnostics.diagnostics.extend(from_mlir_error(error))
            if diagnostics.error_count > before:
                mlir_pass.signal_pass_failure()
        return run

    for instance in passes:
        manager.add(adapt(instance), name=instance.name, argument=instance.name,
                    description=instance.summary)
    try:
        manager.run(module.operation)
    except ir.MLIRError as error:
        if not interrupted:
            if error.error_diagnostics or not diagnostics.has_errors:
                diagnostics.diagnostics.extend(from_mlir_error(error))
            return False
    if interrupted:
        raise interrupted[0]
    return True

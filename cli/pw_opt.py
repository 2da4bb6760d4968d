"""`pw-opt`: parse pw IR, run pw passes, print the result (after `mlir-opt`).

    pw-opt input.mlir --pass-pipeline='builtin.module(pw-verify)' -o out.mlir
    pw-opt input.mlir --pw-verify
    pw-opt input.mlir --pw-lower=topology=2x4 --emit=plan-json -o plan.json   # what pw-run and pw-sim read
    pw-opt --list-passes

Every problem with the input is reported as `file:line:col: error: message`
with exit status 1; no Python traceback reaches the user.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

import click

from pathways_mlir import passes as _passes  # noqa: F401  (registers the passes)
from pathways_mlir.dialect.context import ParseError, make_context, parse_module
from pathways_mlir.dialect.diagnostics import Diagnostic, DiagnosticEngine, from_mlir_error
from pathways_mlir.dialect.input_files import decode, read_bounded
from pathways_mlir.dialect.structure import verify_structure
from pathways_mlir.passes.pipeline import PipelineError, instantiate, parse_pipeline, run_passes, _parse_options
from pathways_mlir.passes.registry import PASSES, PIPELINES, Pass

from .entry import run_command, write_output
from .verify_diagnostics import AnnotationError, parse_expectations, verify

SPLIT_MARKER = re.compile(r"^// -----[ \t]*$", re.MULTILINE)


class UsageError(Exception):
    """A bad command line or input that is not IR."""


@dataclass
class Chunk:
    """A piece of the input, padded with newlines so that its line numbers are the file's."""

    text: str
    first_line: int


def split_input(text: str, split: bool) -> list[Chunk]:
    """Splits the input at `// -----` lines when asked."""
    if not split:
        return [Chunk(text, 1)]
    chunks, start = [], 0
    for marker in SPLIT_MARKER.finditer(text):
        chunks.append(text[start:marker.start()])
        start = marker.end()
    chunks.append(text[start:])
    # Each piece after the first starts at the end of its marker's line.
    out, line = [], 1
    for piece in chunks:
        out.append(Chunk("\n" * (line - 1) + piece, line))
        line += piece.count("\n")
    return out


def process_chunk(chunk: Chunk, passes: list[Pass], print_ir_after_all: bool, generic: bool,
                  emit: str = "ir", program: str | None = None, filename: str = "<stdin>",
                  verify_each: bool = True) -> tuple[str | None, list[Diagnostic]]:
    """Parses one chunk and runs the passes; returns its printed IR, or with `emit="plan-json"` the plan
    JSON of `program` (default: the only one), None on error, and diagnostics."""
    from mlir import ir

    diagnostics = DiagnosticEngine()
    with make_context() as context:
        try:
            module = parse_module(chunk.text, context)
        except ParseError as error:
            return None, error.diagnostics
        structural = verify_structure(module)
        if structural:
            return None, structural
        if not run_passes(module, passes, diagnostics, print_ir_after_all, verify_each) or diagnostics.has_errors:
            return None, diagnostics.diagnostics
        try:
            module.operation.verify()
        except ir.MLIRError as error:
            return None, diagnostics.diagnostics + from_mlir_error(error)
        if emit == "plan-json":
            return _plan_json(module, program, filename) + "\n", diagnostics.diagnostics
        text = module.operation.get_asm(print_generic_op_form=generic)
        return text, diagnostics.diagnostics


def _plan_json(module, program: str | None, filename: str) -> str:
    """The plan JSON (`ProgramPlan.to_json`) of one program of a lowered module."""
    from pathways_mlir.dialect import ops
    from pathways_mlir.dialect.phases import holds_plans
    from pathways_mlir.passes import program_plans

    from .pw_run import select_program

    if not ops.programs(module):
        raise UsageError(f"{filename}: error: --emit=plan-json writes a program's plan, but the module has no "
                         "program (a func.func marked pw.program)")
    if not holds_plans(module):
        raise UsageError(f"{filename}: error: --emit=plan-json needs a module with plans: add --pw-lower "
                         "(for example --pw-lower=topology=2x4)")
    return select_program(program_plans(module), program, f"{filename}: error", UsageError).to_json()


def list_passes() -> str:
    """Returns the `--list-passes` text: every pass and pipeline with its options."""
    lines = ["Passes:"]
    for name in sorted(PASSES):
        lines.extend(_describe(name, PASSES[name].summary, PASSES[name].options))
    lines.append("Pipelines:")
    for name in sorted(PIPELINES):
        lines.extend(_describe(name, PIPELINES[name].summary, PIPELINES[name].options))
    lines.append("Use --pass-help=NAME for what a pass requires and a before/after example.")
    return "\n".join(lines)


def _describe(name: str, summary: str, options) -> list[str]:
    lines = [f"  {name}  -  {summary}"]
    for o in options:
        default = "" if o.default in (None, "") else f" (default: {o.default})"
        lines.append(f"      {o.name}=<{o.type.__name__}>  {o.help}{default}")
    return lines


def _pass_flags(args: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Takes `--pw-<name>[=options]` flags out of the arguments, in order."""
    rest, flags = [], []
    for arg in args:
        name, _, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if name in PASSES or name in PIPELINES:
            flags.append((name, value))
        else:
            rest.append(arg)
    return rest, flags


class _Command(click.Command):
    """Keeps the `--pw-<pass>` flags, in command-line order, beside click's options."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest, ctx.meta["pass_flags"] = _pass_flags(list(args))
        return super().parse_args(ctx, rest)

    def format_epilog(self, ctx: click.Context, formatter) -> None:
        with formatter.section("Passes (also usable as --NAME or --NAME='opt=value ...')"):
            # A pipeline's purpose only: its summary's list of pass names, wrapped here at their hyphens, is for
            # --list-passes and --pass-help.
            formatter.write_dl([(n, PASSES[n].summary) for n in sorted(PASSES)]
                               + [(n, f"{PIPELINES[n].purpose} (--pass-help={n} lists its passes)")
                                  for n in sorted(PIPELINES)])


@click.command(cls=_Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("input_file", default="-", metavar="INPUT")
@click.option("-o", "output", default="-", help="Output file (default: stdout).")
@click.option("--pass-pipeline", default=None, help="Pipeline, e.g. 'builtin.module(pw-verify)'.")
@click.option("--split-input-file", is_flag=True, help="Process each '// -----' chunk on its own.")
@click.option("--verify-diagnostics", is_flag=True, help="Check diagnostics against expected-* comments.")
@click.option("--mlir-print-ir-after-all", is_flag=True, help="Print the IR after every pass (stderr).")
@click.option("--mlir-print-op-generic", is_flag=True, help="Print ops in generic form.")
@click.option("--verify-each", type=bool, default=True, show_default=True,
              help="Check the IR after every pass and at every phase boundary; false checks the input and the "
                   "last output only, as lower() does.")
@click.option("--list-passes", is_flag=True, help="List passes and pipelines with their options.")
@click.option("--pass-help", default=None, metavar="NAME", help="Describe one pass or pipeline.")
@click.option("--emit", type=click.Choice(["ir", "plan-json"]), default="ir", show_default=True,
              help="Write the IR, or the plan JSON of a lowered program (what pw-run and pw-sim read).")
@click.option("--program", default=None, help="With --emit=plan-json: the program (default: the only one).")
@click.pass_context
def cli(ctx: click.Context, input_file: str, output: str, pass_pipeline: str | None,
        split_input_file: bool, verify_diagnostics: bool, mlir_print_ir_after_all: bool,
        mlir_print_op_generic: bool, verify_each: bool, list_passes: bool, pass_help: str | None, emit: str,
        program: str | None) -> None:
    """Parse pw IR from INPUT ('-' for stdin), run passes, print the result."""
    if list_passes:
        click.echo(globals()["list_passes"]())
        return
    if pass_help is not None:
        click.echo(_pass_help(pass_help))
        return
    if program is not None and emit != "plan-json":
        raise UsageError("pw-opt: error: --program chooses the program of --emit=plan-json: add --emit=plan-json, "
                         "or leave --program out to write the IR of every program")
    if split_input_file and emit == "plan-json":
        # One JSON document per chunk, joined by `// -----`, would be a file no JSON reader can read.
        raise UsageError("pw-opt: error: --emit=plan-json writes one program's plan as one JSON document, but "
                         "--split-input-file makes one output per chunk: leave one of them out")
    passes = _build_passes(pass_pipeline, ctx.meta["pass_flags"])
    filename = "<stdin>" if input_file == "-" else input_file
    try:
        if input_file == "-":
            data = read_bounded(sys.stdin.buffer)
        else:
            with open(input_file, "rb") as file:
                data = read_bounded(file)
    except OSError as e:
        raise UsageError(f"{filename}: error: cannot read input: {e.strerror}") from None
    text = decode(data, filename, UsageError)
    outputs, failed = [], False
    for chunk in split_input(text, split_input_file):
        printed, diagnostics = process_chunk(chunk, passes, mlir_print_ir_after_all, mlir_print_op_generic,
                                             emit, program, filename, verify_each)
        if verify_diagnostics:
            try:
                expectations = parse_expectations(chunk.text)
            except AnnotationError as e:
                raise UsageError(f"{filename}:{e}") from None
            problems = verify(diagnostics, expectations, filename)
            for problem in problems:
                click.echo(problem, err=True)
            failed |= bool(problems)
        else:
            for d in diagnostics:
                click.echo(d.format(filename), err=True)
            failed |= printed is None
        if printed is not None:
            outputs.append(printed)
    # An output file is written only when every chunk succeeded, so that a failed run leaves the file of an
    # earlier run as it was. Standard output gets the chunks that succeeded, as mlir-opt prints them.
    if not failed or output == "-":
        write_output(output, "// -----\n".join(outputs), lambda m: UsageError(f"pw-opt: error: {m}"))
    if failed:
        ctx.exit(1)


def _build_passes(pass_pipeline: str | None, flags: list[tuple[str, str]]) -> list[Pass]:
    try:
        passes = parse_pipeline(pass_pipeline) if pass_pipeline else []
        for name, value in flags:
            given, _ = _parse_options("{" + value + "}", 0, name)
            passes.extend(instantiate(name, given))
    except PipelineError as e:
        if ": error: " in str(e):            # a file an option names, with the place in it: said as it is
            raise UsageError(str(e)) from None
        raise UsageError(f"pw-opt: error: invalid pass pipeline: {e}") from None
    return passes


def _pass_help(name: str) -> str:
    if name in PASSES:
        cls = PASSES[name]
        return "\n".join([f"{name}: {cls.summary}", "", cls.description(), "",
                          *(["Options:"] + _describe(name, "", cls.options)[1:] if cls.options else [])])
    if name in PIPELINES:
        p = PIPELINES[name]
        return "\n".join([f"{name}: {p.summary}", "", p.description(), "",
                          *(["Options:"] + _describe(name, "", p.options)[1:] if p.options else [])])
    raise UsageError(f"pw-opt: error: no pass or pipeline named '{name}' (see --list-passes)")


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pw-opt`; returns the exit status."""
    return run_command(cli, argv, "pw-opt", (UsageError,), str)


if __name__ == "__main__":
    sys.exit(main())

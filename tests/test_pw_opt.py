"""The pw-opt driver: options, pipelines, diagnostics, and robustness to bad input."""

import json
import math
import pathlib
import subprocess
import sys
import textwrap

import pytest

from pathways_mlir.cli import pw_opt
from pathways_mlir.cli.verify_diagnostics import parse_expectations, verify
from pathways_mlir.dialect.diagnostics import Diagnostic, SourceLocation
from pathways_mlir.passes.pipeline import PipelineError, parse_pipeline
from pathways_mlir.passes.fuse_island import FuseIslandPass
from pathways_mlir.passes.place import PlacePass, Strategy
from pathways_mlir.dialect.topology import Topology
from pathways_mlir.passes.lower import lower, lower_pipeline, lower_to_plans
from pathways_mlir.passes.registry import PASSES, PIPELINES

ROOT = pathlib.Path(__file__).resolve().parents[1]
SLICE = '"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()\n'
BAD_SLICE = '"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 2, 2>, axes = ["x"], constraints = {}} : () -> ()\n'


def run(tmp_path, text, *args):
    path = tmp_path / "in.mlir"
    path.write_text(text)
    return pw_opt.main([str(path), *args]), path


def test_round_trip_to_file(tmp_path, capsys):
    status, path = run(tmp_path, SLICE, "-o", str(tmp_path / "out.mlir"), "--pw-verify")
    assert status == 0
    assert 'sym_name = "v0"' in (tmp_path / "out.mlir").read_text()


def test_error_has_file_line_col(tmp_path, capsys):
    status, path = run(tmp_path, "\n" + BAD_SLICE, "--pass-pipeline=builtin.module(pw-verify)")
    err = capsys.readouterr().err
    assert status == 1
    assert err.startswith(f"{path}:2:1: error: 'pw.virtual_slice' op slice @v0 has 2 mesh dimensions")


def test_parse_error_has_file_line_col(tmp_path, capsys):
    status, path = run(tmp_path, SLICE + '"pw.virtual_slice"() {sym_name = 1} : () -> ()\n')
    assert status == 1
    assert capsys.readouterr().err.startswith(f"{path}:2:1: error:")


def test_split_input_file_keeps_line_numbers(tmp_path, capsys):
    status, path = run(tmp_path, SLICE + "// -----\n" + SLICE + "// -----\n\n" + BAD_SLICE,
                       "--split-input-file", "--pw-verify")
    out, err = capsys.readouterr()
    assert status == 1
    assert out.count("// -----") == 1  # two good chunks printed
    assert err.startswith(f"{path}:6:1: error:")
    # Blank lines right after a marker stay in the next chunk.
    assert [c.first_line for c in pw_opt.split_input("a\n// -----\n\nb\n// -----\nc", True)] == [1, 2, 5]


def test_pipeline_parsing_orders_and_options():
    [p] = parse_pipeline("builtin.module(pw-verify)")
    assert p.name == "pw-verify"
    assert [p.name for p in parse_pipeline("pw-verify, pw-verify{}")] == ["pw-verify", "pw-verify"]
    with pytest.raises(PipelineError, match="has no option 'x'"):
        parse_pipeline("builtin.module(pw-verify{x=1})")
    with pytest.raises(PipelineError, match="unterminated option list"):
        parse_pipeline("builtin.module(pw-verify{x=1)")
    with pytest.raises(PipelineError, match="missing '\\)'"):
        parse_pipeline("builtin.module(pw-verify")
    with pytest.raises(PipelineError, match="not a registered pass"):
        parse_pipeline("canonicalize")
    assert [p.name for p in parse_pipeline(" builtin.module( pw-verify , pw-verify ) ")] == ["pw-verify"] * 2
    assert parse_pipeline("builtin.module()") == []


@pytest.mark.parametrize("pipeline, message", [
    ("builtin.module(pw-place{topology=2x4}pw-verify)", "expected ',' or ')' after 'pw-place' at column 38, not 'p'"),
    ("builtin.module(pw-verify pw-verify)", "expected ',' or ')' after 'pw-verify' at column 26, not 'p'"),
    ("pw-verify pw-verify", "expected ',' or the end after 'pw-verify' at column 11, not 'p'"),
    ("builtin.module(pw-verify,)", "expected a pass name at column 26"),
    ("builtin.module(pw-place{strategy=pack strategy=spread})",
     "option 'strategy' of 'pw-place' is given twice, again at column 39"),
    ("builtin.module(pw-verify)x", "unexpected text after ')' at column 26: 'x'"),
    ("builtin.module(pw-verify{x=1", "unterminated option list of 'pw-verify' at column 25"),
])
def test_a_malformed_pipeline_is_refused_at_its_column(pipeline, message):
    """Passes without a ',' between them ran, a repeated option's last value won, and text after the ')' was
    said to be a missing ')'; columns counted from after `builtin.module(`."""
    with pytest.raises(PipelineError) as error:
        parse_pipeline(pipeline)
    assert str(error.value) == message


def test_list_passes_names_every_pass(capsys):
    assert pw_opt.main(["--list-passes"]) == 0
    out = capsys.readouterr().out
    for name, cls in PASSES.items():
        assert f"{name}  -  {cls.summary}" in out
        for option in cls.options:
            assert f"{option.name}=<" in out


def test_pass_help_of_pw_place_gives_the_device_rates_its_cost_model_reads(capsys):
    from pathways_mlir.dialect.device_time import DEVICE_RATES

    assert pw_opt.main(["--pass-help=pw-place"]) == 0
    out = capsys.readouterr().out
    flops, memory = DEVICE_RATES["cpu"]
    assert f"  cpu: {flops:.4g} flop/s, {memory:.4g} B/s" in out
    assert "1e11 flop/s" not in out


def test_every_pass_has_a_lit_test_of_its_name():
    lit_files = {p.stem for p in (ROOT / "lit_tests").rglob("*.mlir")}
    for name in PASSES:
        stem = name.removeprefix("pw-")
        assert stem in lit_files or name in lit_files, f"no lit test named after {name}"


# -- the diagnostic verifier -------------------------------------------------

def _diag(line, message, severity="error"):
    return Diagnostic(severity, SourceLocation("-", line, 1), message)


def test_expectation_offsets():
    text = textwrap.dedent("""\
        a // expected-error {{same}}
        // expected-error@below {{below}}
        // expected-warning@below {{below2}}
        b
        c
        // expected-remark@above {{above}}
        // expected-error@-2 {{minus}}
        // expected-note@+1 {{plus}}
        d""")
    found = {(e.severity, e.text, e.line) for e in parse_expectations(text)}
    assert found == {("error", "same", 1), ("error", "below", 4), ("warning", "below2", 4),
                     ("remark", "above", 5), ("error", "minus", 5), ("note", "plus", 9)}


def test_verifier_fails_on_missing_and_unexpected():
    expectations = parse_expectations("x // expected-error {{wanted}}\ny")
    problems = verify([_diag(2, "surprise")], expectations, "f.mlir")
    assert problems == ['f.mlir:2:1: error: unexpected error: surprise',
                        'f.mlir:1:6: error: expected error "wanted" was not produced']
    expectations = parse_expectations("x // expected-error {{wanted}}\ny")
    assert verify([_diag(1, "it is wanted here")], expectations, "f.mlir") == []
    # Severity must match too.
    expectations = parse_expectations("x // expected-warning {{wanted}}")
    assert len(verify([_diag(1, "wanted")], expectations, "f.mlir")) == 2


def test_verify_diagnostics_exit_status(tmp_path, capsys):
    good = "// expected-error@below {{has 2 mesh dimensions}}\n" + BAD_SLICE
    assert run(tmp_path, good, "--verify-diagnostics", "--pw-verify")[0] == 0
    missing = "// expected-error@below {{nothing like this}}\n" + SLICE
    assert run(tmp_path, missing, "--verify-diagnostics", "--pw-verify")[0] == 1
    assert run(tmp_path, BAD_SLICE, "--verify-diagnostics", "--pw-verify")[0] == 1
    pointing_nowhere = SLICE + "// expected-error@below {{x}}"
    assert run(tmp_path, pointing_nowhere, "--verify-diagnostics")[0] == 1
    assert capsys.readouterr().err.endswith(":2:4: error: 'expected-error@below {{x}}' points outside the input\n")


def test_a_diagnostic_in_another_file_meets_no_expectation(tmp_path, capsys):
    """An error located in another file (`loc("model.py":2:1)`) met an expectation on line 2 of the input (exit
    0); as in mlir-opt it is unexpected. The input's own file, by its name or "<stdin>", is still the input."""
    expect = "// expected-error@below {{has 2 mesh dimensions}}\n"
    elsewhere = expect + BAD_SLICE.rstrip() + ' loc("model.py":2:1)\n'
    status, path = run(tmp_path, elsewhere, "--verify-diagnostics", "--pw-verify")
    assert status == 1
    assert capsys.readouterr().err.splitlines() == [
        "model.py:2:1: error: unexpected error: 'pw.virtual_slice' op slice @v0 has 2 mesh dimensions but 1 axis "
        "names", f'{path}:1:4: error: expected error "has 2 mesh dimensions" was not produced']
    assert run(tmp_path, expect + BAD_SLICE.rstrip() + f' loc("{path}":2:1)\n', "--verify-diagnostics",
               "--pw-verify")[0] == 0
    result = subprocess.run([sys.executable, "-m", "pathways_mlir.cli.pw_opt", "-", "--verify-diagnostics",
                             "--pw-verify"], input=expect + BAD_SLICE.rstrip() + ' loc("<stdin>":2:1)\n',
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_expected_at_unknown_meets_a_diagnostic_with_no_line(tmp_path, capsys):
    """`expected-error@unknown` (mlir-opt's, for an unknown location) did not parse, so an error with no line (at
    `loc(unknown)`, or at the module the parser wraps around the input) could not be expected."""
    unknown = "// expected-error@unknown {{has 2 mesh dimensions}}\n" + BAD_SLICE.rstrip() + " loc(unknown)\n"
    assert run(tmp_path, unknown, "--verify-diagnostics", "--pw-verify")[0] == 0
    no_topology = "// expected-error@unknown {{pw-place needs a topology}}\n" + SLICE
    assert run(tmp_path, no_topology, "--verify-diagnostics", "--pw-place")[0] == 0
    # An error at a line of the input does not meet it.
    status, path = run(tmp_path, "// expected-error@unknown {{has 2 mesh dimensions}}\n" + BAD_SLICE,
                       "--verify-diagnostics", "--pw-verify")
    assert status == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{path}:2:1: error: unexpected error: 'pw.virtual_slice' op slice @v0 has 2 mesh dimensions but 1 axis "
        "names", f'{path}:1:4: error: expected error "has 2 mesh dimensions" was not produced']


@pytest.mark.parametrize("annotation, message", [
    ("// expected-error-re@+1 {{{{.*never produced.*}}}}",
     "'expected-error-re' is not supported (no regular expressions): write expected-error"),
    ("// expected-error@+1 {{never produced", "cannot read annotation 'expected-error@+1 {{never produced'"),
    ("// expected-error @+1 never produced", "cannot read annotation 'expected-error @+1 never produced'"),
    ("// expected-note@@ {{never produced}}", "cannot read annotation 'expected-note@@"),
])
def test_an_annotation_that_does_not_parse_is_an_error(tmp_path, capsys, annotation, message):
    """Annotations the verifier could not read were skipped: valid IR expecting an error passed (exit 0)."""
    status, path = run(tmp_path, annotation + "\n" + SLICE, "--verify-diagnostics", "--pw-verify")
    err = capsys.readouterr().err
    assert status == 1
    assert err.startswith(f"{path}:1:4: error: {message}") and err.count("\n") == 1, err
    # The text of an annotation may name another kind of annotation.
    [e] = parse_expectations("x // expected-error {{an expected-note@ is not a note}}")
    assert e.text == "an expected-note@ is not a note"


def test_an_annotation_may_have_spaces_before_its_offset(tmp_path, capsys):
    """`expected-error @+1 {{...}}`, which mlir-opt reads (its pattern allows spaces before `@`), was refused as
    an annotation that does not parse."""
    spaced = "// expected-error @below {{has 2 mesh dimensions}}\n" + BAD_SLICE
    assert run(tmp_path, spaced, "--verify-diagnostics", "--pw-verify")[0] == 0, capsys.readouterr().err
    found = [(e.severity, e.line, e.text) for e in parse_expectations("// expected-note  @+1   {{x}}\ny")]
    assert found == [("note", 2, "x")]


def test_a_failed_run_leaves_the_output_file_as_it_was(tmp_path, capsys):
    """-o FILE was emptied (or given the chunks that succeeded) when the input had an error."""
    out = tmp_path / "out.mlir"
    for text in [BAD_SLICE, SLICE + "// -----\n" + BAD_SLICE]:
        out.write_text("an earlier result\n")
        assert run(tmp_path, text, "--split-input-file", "--pw-verify", "-o", str(out))[0] == 1
        assert out.read_text() == "an earlier result\n"


# -- robustness: no traceback, no signal, whatever the input ------------------

def test_errors_from_many_nested_modules_do_not_abort(tmp_path):
    # MLIR verifies sibling modules in worker threads; their diagnostics once
    # reached Python without the GIL and aborted the process (rc 134).
    dup = "\n".join(f"module @m{i} attributes {{pw.executable}} {{\n  func.func @main() {{ return }}\n"
                    f"  func.func @main() {{ return }}\n}}" for i in range(8))
    path = tmp_path / "dup.mlir"
    path.write_text(dup)
    for _ in range(5):
        result = subprocess.run([sys.executable, "-m", "pathways_mlir.cli.pw_opt", str(path)],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 1, result.stderr[-2000:]
        assert f"{path}:3:3: error: redefinition of symbol named 'main'" in result.stderr


@pytest.mark.parametrize("text", [
    "module {" * 5000 + "}" * 5000,
    '"pw.x"() {a = ' + "[" * 5000 + "]" * 5000 + "} : () -> ()",
    "func.func private @f(" + "tuple<" * 5000 + "i32" + ">" * 5000 + ")",
])
def test_deep_nesting_is_an_error_before_parsing(tmp_path, text):
    path = tmp_path / "deep.mlir"
    path.write_text(text)
    result = subprocess.run([sys.executable, "-m", "pathways_mlir.cli.pw_opt", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.startswith(f"{path}:1:")
    assert "nests deeper than 256 levels" in result.stderr
    assert "Traceback" not in result.stderr


def test_nesting_scan_skips_strings_comments_and_arrows():
    from pathways_mlir.dialect.context import nesting_error

    assert nesting_error('"' + "{" * 300 + '"\n// ' + "(" * 300 + "\n" + "() -> ()\n" * 300, 256) is None
    error = nesting_error("a\n  " + "<" * 3, 2)
    assert (error.location.line, error.location.column) == (2, 5)


def test_fuzzed_lit_inputs_exit_0_or_1():
    # A short run of scripts/fuzz.py: mutated lit inputs through pw-opt with
    # each file's own RUN arguments and the pw-lower pipeline.
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "fuzz.py"), "--count", "400", "--seed", "7"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "400 cases in" in result.stdout and "0 failures" in result.stdout


def test_a_pass_that_runs_before_plans_on_a_planned_module_is_one_error_line(tmp_path, capsys):
    """A pass that reads programs before their plans exist, given a lowered module, reported each plan op as
    not legal in its phase: 146 lines for a pipeline's plans. It is now one line, pw-emit-plans's too: writing
    the plans again dropped pw-plan-memory's frees and peaks, and pw-run ran them reserving no memory."""
    lowered = tmp_path / "lowered.mlir"
    assert pw_opt.main([str(ROOT / "examples" / "three_blocks.mlir"), "--pw-lower=topology=2x4",
                        "-o", str(lowered)]) == 0
    capsys.readouterr()
    for name in ("pw-insert-transfers", "pw-emit-plans"):
        assert pw_opt.main([str(lowered), f"--{name}", "-o", str(tmp_path / "again.mlir")]) == 1
        assert capsys.readouterr().err == (f"{lowered}:1:1: error: {name} runs on programs before their plans "
                                           f"exist, but this module holds plans already (pw-emit-plans has run)\n")


def test_pw_plan_memory_before_the_plans_exist_says_which_pass_writes_them(tmp_path, capsys):
    """The planned phase made plan ops legal but did not require them, so pw-plan-memory run before
    pw-emit-plans exited 0 having planned nothing."""
    pipeline = "builtin.module(pw-place{topology=2x4},pw-insert-transfers,pw-mark-static-subgraphs,pw-schedule," \
               "pw-plan-memory)"
    source = ROOT / "examples" / "three_blocks.mlir"
    assert pw_opt.main([str(source), f"--pass-pipeline={pipeline}", "-o", str(tmp_path / "out.mlir")]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{source}:") and line.endswith(
        ": error: the module has no plans, which the planned phase requires (pw-emit-plans writes them), before "
        "pw-plan-memory")


@pytest.mark.parametrize("pipeline, message", [
    ("pw-lower{topology=3}", "option 'topology' of 'pw-place': 3: cannot read topology: No such file or directory "
                             "(in 'pw-lower')"),
    ("pw-place{topology=0x4}", "option 'topology' of 'pw-place': topology '0x4': expected ISLANDSxDEVICES, two "
                               "positive integers such as 2x4, or a topology JSON file"),
    ("pw-lower{strategy=random}", "option 'strategy' of 'pw-place' takes auto, spread or pack, not 'random' "
                                  "(in 'pw-lower')"),
    # One Island object per island: 99999999999999999999x4 ran without bound, its memory growing.
    ("pw-lower{topology=99999999999999999999x4}", "option 'topology' of 'pw-place': topology "
                                                  "'99999999999999999999x4': more than the 4096 islands a topology "
                                                  "may have (in 'pw-lower')"),
    # 2**63 devices an island was an internal error (a TypeError of the MLIR bindings writing pw.topology).
    ("pw-lower{topology=1x9223372036854775808}", "option 'topology' of 'pw-place': topology "
                                                 "'1x9223372036854775808': more devices an island than a 64-bit "
                                                 "integer holds (the IR's i64) (in 'pw-lower')"),
    ("pw-lower{fuse=maybe}", "option 'fuse' of 'pw-lower' takes true or false, not 'maybe'"),
    ("pw-lower{bogus=1}", "'pw-lower' has no option 'bogus' (options: topology, strategy, pin, explain, fuse)"),
    # Options joined by a comma: the topology `2x4,strategy=spread` was a file that could not be read.
    ("pw-lower{topology=2x4,strategy=spread}", "option 'topology' of 'pw-place' is given '2x4,strategy=spread', "
                                               "which holds ',strategy=': options are separated by spaces "
                                               "(topology=... strategy=...) (in 'pw-lower')"),
])
def test_a_bad_option_names_the_pass_and_the_option(pipeline, message, capsys):
    """A bad topology named neither the pass nor the option (`invalid pass pipeline: 3: cannot read
    topology`), and an option of a pipeline's pass did not say which pipeline the user wrote; one of the
    pipeline's own named it twice (`option 'fuse' of 'pw-lower' ... (in 'pw-lower')`)."""
    source = ROOT / "examples" / "three_blocks.mlir"
    assert pw_opt.main([str(source), f"--pass-pipeline=builtin.module({pipeline})", "-o", "-"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line == f"pw-opt: error: invalid pass pipeline: {message}"


def test_options_given_from_python_are_checked_as_pipeline_texts_are():
    """Only enum options were parsed from Python: PlacePass(explain="false") kept the string, which is true,
    and FuseIslandPass(step_us=nan) was accepted though `step_us=nan` in a pipeline string is refused."""
    assert PlacePass(explain="false").explain is False
    assert PlacePass(strategy="pack").strategy is Strategy.PACK
    assert FuseIslandPass(step_us=50).step_us == 50.0 and isinstance(FuseIslandPass(step_us=50).step_us, float)
    with pytest.raises(ValueError, match="^option 'step_us' of 'pw-fuse-island' takes a finite number, not nan$"):
        FuseIslandPass(step_us=math.nan)
    with pytest.raises(ValueError, match="^option 'explain' of 'pw-place' takes true or false, not 'maybe'$"):
        PlacePass(explain="maybe")
    with pytest.raises(TypeError, match="^option 'explain' of 'pw-place' takes true or false, not 1 of type int$"):
        PlacePass(explain=1)
    with pytest.raises(TypeError, match="^option 'topology' of 'pw-place' takes a string, not 3 of type int$"):
        PlacePass(topology=3)


def test_lowering_options_given_from_python_are_checked_as_pipeline_texts_are():
    """lower_pipeline(fuse="false") kept the string, which is true: the fusion passes ran; lower(verify_each="false")
    checked between passes, and values of any type were taken for true or false (pw-place's `explain` was checked
    already, by PlacePass)."""
    names = [p.name for p in lower_pipeline(fuse="false")]
    assert "pw-fuse-island" not in names and "pw-fuse-launches" not in names
    with pytest.raises(ValueError, match="^option 'fuse' of 'pw-lower' takes true or false, not 'no'$"):
        lower_pipeline(fuse="no")
    three_blocks = (ROOT / "examples" / "three_blocks.mlir").read_text()
    topology = Topology.uniform(2, 4)
    with pytest.raises(TypeError, match="^option 'fuse' of 'pw-lower' takes true or false, not 0 of type int$"):
        lower(three_blocks, topology, fuse=0)
    with pytest.raises(ValueError, match="^option 'verify_each' of 'lower' takes true or false, not 'maybe'$"):
        lower_to_plans(three_blocks, topology, verify_each="maybe")
    with pytest.raises(TypeError, match="^option 'verify_each' of 'lower' takes true or false, not 1 of type int$"):
        lower(three_blocks, topology, verify_each=1)


def test_a_pipeline_summary_names_every_pass_it_runs(capsys):
    """pw-lower's summary, a string written beside its pass list, left out pw-alias-slices and pw-plan-memory."""
    assert pw_opt.main(["--list-passes"]) == 0
    out = capsys.readouterr().out
    for name, pipeline in PIPELINES.items():
        assert f"{name}  -  {pipeline.summary}" in out
        for instance in pipeline.expand(**{o.name: o.default for o in pipeline.options}):
            assert instance.name in pipeline.summary


def test_pw_sim_bounds_its_topology_counts_as_pw_opt_does(capsys):
    """pw-sim's `--topology` builds its islands from the same `<islands>x<devices>` counts: too many islands ran
    without bound there too."""
    from pathways_mlir.cli import pw_sim

    source = ROOT / "examples" / "three_blocks.mlir"
    assert pw_sim.main(["run", str(source), "--topology", "99999999999999999999x4"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "pw-sim: error: --topology: topology '99999999999999999999x4': more than the 4096 islands a topology may have"]


def test_plan_json_of_a_module_without_a_program_says_so(tmp_path, capsys):
    """`--pw-lower=... --emit=plan-json` on a module without a program said to add --pw-lower, which was given."""
    status, path = run(tmp_path, "module {}\n", "--pw-lower=topology=2x4", "--emit=plan-json")
    assert status == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{path}: error: --emit=plan-json writes a program's plan, but the module has no program (a func.func "
        f"marked pw.program)"]


def test_plan_json_of_a_split_input_file_is_refused(tmp_path, capsys):
    """`--split-input-file --emit=plan-json` wrote one JSON document per chunk joined by `// -----`, exit status 0:
    a file no JSON reader (pw-run, pw-sim) can read."""
    three_blocks = (ROOT / "examples" / "three_blocks.mlir").read_text()
    out = tmp_path / "plan.json"
    status, _ = run(tmp_path, three_blocks + "// -----\n" + three_blocks, "--split-input-file",
                    "--pw-lower=topology=2x4", "--emit=plan-json", "-o", str(out))
    assert status == 1 and not out.exists()
    assert capsys.readouterr().err.splitlines() == [
        "pw-opt: error: --emit=plan-json writes one program's plan as one JSON document, but --split-input-file "
        "makes one output per chunk: leave one of them out"]


def test_program_without_plan_json_output_is_refused_not_ignored(capsys):
    """`--program` chooses the program of `--emit=plan-json`; with the IR written it was silently ignored,
    even when it named no program of the input."""
    source = ROOT / "examples" / "three_blocks.mlir"
    for program in ("three_blocks", "nosuch"):
        assert pw_opt.main([str(source), "--program", program, "-o", "-"]) == 1
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.splitlines() == [
            "pw-opt: error: --program chooses the program of --emit=plan-json: add --emit=plan-json, or leave "
            "--program out to write the IR of every program"]
    assert pw_opt.main([str(source), "--pw-lower=topology=2x4", "--emit=plan-json", "--program", "three_blocks",
                        "-o", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["program"] == "three_blocks"

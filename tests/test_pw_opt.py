"""The pw-opt driver: options, pipelines, diagnostics, and robustness to bad input."""

import pathlib
import subprocess
import sys
import textwrap

import pytest

from pathways_mlir.cli import pw_opt
from pathways_mlir.cli.verify_diagnostics import parse_expectations, verify
from pathways_mlir.dialect.diagnostics import Diagnostic, SourceLocation
from pathways_mlir.passes.pipeline import PipelineError, parse_pipeline
from pathways_mlir.passes.registry import PASSES

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


def test_list_passes_names_every_pass(capsys):
    assert pw_opt.main(["--list-passes"]) == 0
    out = capsys.readouterr().out
    for name, cls in PASSES.items():
        assert f"{name}  -  {cls.summary}" in out
        for option in cls.options:
            assert f"{option.name}=<" in out


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
    assert "points outside the input" in capsys.readouterr().err


# -- robustness: no traceback, whatever the input ----------------------------

_FUZZ_DRIVER = textwrap.dedent("""\
    import contextlib, io, sys
    from pathways_mlir.cli import pw_opt
    args = sys.argv[1:]
    for path in sys.stdin.read().split():
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            status = pw_opt.main([path, *args])
        text = err.getvalue()
        if status not in (0, 1) or "Traceback" in text or "internal error" in text:
            print("FAIL", path, status, text[-2000:])
    print("DONE")
    """)


def _variants(data: bytes, seed: int):
    import random

    rng = random.Random(seed)
    yield data[: len(data) // 2]
    yield data[: len(data) // 3]
    yield data[: rng.randrange(1, len(data))]
    for _ in range(12):
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 6)):
            i = rng.randrange(len(flipped))
            flipped[i] = rng.choice([ord('"'), ord("{"), ord("}"), ord("%"), ord("@"), 0xFF, 0,
                                     ord("["), ord(">"), ord("1"), flipped[i] ^ (1 << rng.randrange(8))])
        yield bytes(flipped)


def test_no_traceback_for_truncated_or_flipped_inputs(tmp_path):
    paths = []
    for n, source in enumerate(sorted((ROOT / "lit_tests").rglob("*.mlir"))):
        for k, variant in enumerate(_variants(source.read_bytes(), seed=n)):
            path = tmp_path / f"{source.stem}.{k}.mlir"
            path.write_bytes(variant)
            paths.append(str(path))
    for args in (["--pw-verify", "--split-input-file"], ["--pw-verify"],
                 ["--split-input-file", "--pass-pipeline=builtin.module(pw-lower{topology=2x4})"]):
        result = subprocess.run([sys.executable, "-c", _FUZZ_DRIVER, *args], input="\n".join(paths),
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "FAIL" not in result.stdout, result.stdout[-3000:]
        assert result.stdout.strip().endswith("DONE")

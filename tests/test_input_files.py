"""Input files that are not UTF-8 or that Python's JSON reader cannot take are one-line errors in every tool.

Before `dialect/input_files.py`, pw-opt alone checked its input's encoding: a profile, topology, trace of
predicate values, plan JSON or IR file given to pw-sim or pw-run that held a byte that is not UTF-8, JSON
nested deeper than Python's recursion limit, or an integer of more than 4300 digits ended in
`internal error: UnicodeDecodeError` (RecursionError, ValueError) with exit status 2.
"""

import pathlib
import subprocess
import sys
import textwrap

import pytest

from pathways_mlir.dialect import input_files
from pathways_mlir.dialect.input_files import read_json, read_text

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONTENTS = {
    "not-utf8": (b'{"name": "\xff"}', ":1:11: error: {what} is not valid UTF-8"),
    "deep": (b"[" * 100_000 + b"]" * 100_000, ": invalid JSON: nested too deeply"),
    "digits": (b"[" + b"7" * 5000 + b"]", ": invalid JSON: Exceeds the limit (4300 digits)"),
    "nul": (b'{"a":\n 1\x00}', ":2:3: error: {what} contains a NUL byte"),
}


class Refused(Exception):
    pass


@pytest.mark.parametrize("kind", sorted(CONTENTS))
def test_read_json_refuses_in_one_line(tmp_path, kind):
    data, message = CONTENTS[kind]
    path = tmp_path / f"{kind}.json"
    path.write_bytes(data)
    with pytest.raises(Refused) as raised:
        read_json(path, Refused, "profile")
    assert str(raised.value).startswith(f"{path}{message.format(what='profile')}")
    assert "\n" not in str(raised.value)


def test_read_text_names_a_file_it_cannot_read(tmp_path):
    with pytest.raises(Refused, match=r"missing.json: cannot read topology: No such file or directory$"):
        read_text(tmp_path / "missing.json", Refused, "topology")


def test_an_input_that_never_ends_or_is_too_large_is_refused_without_reading_it_all(tmp_path, monkeypatch):
    """pw-opt and every reader read a file whole before looking at it: `pw-opt /dev/zero` filled memory (10 GB
    in 20 s here) until the kernel killed it. Reading stops at the first NUL byte, or past the size limit."""
    done = subprocess.run([sys.executable, "-m", "pathways_mlir.cli.pw_opt", "/dev/zero", "-o", "/dev/null"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr == "/dev/zero:1:1: error: input contains a NUL byte\n", done.stderr
    with pytest.raises(Refused, match=r"^/dev/zero:1:1: error: topology contains a NUL byte$"):
        read_text("/dev/zero", Refused, "topology")
    monkeypatch.setattr(input_files, "MAX_INPUT_BYTES", 3 << 20)
    large = tmp_path / "large.json"
    large.write_bytes(b" " * (4 << 20))
    with pytest.raises(Refused, match=r"large.json: error: topology is larger than 3 MiB$"):
        read_text(large, Refused, "topology")

def _plan() -> str:
    """A plan JSON of the three-block example, from pw-opt."""
    ir = ROOT / "examples" / "three_blocks.mlir"
    done = subprocess.run([sys.executable, "-m", "pathways_mlir.cli.pw_opt", str(ir), "--pw-lower=topology=2x4",
                           "--emit=plan-json", "-o", "-"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


# Each reader of an input file, through its tool, with one kind of bad content (the readers share
# `read_json`/`read_text`, whose every kind the tests above check).
READERS = {
    "pw-sim --profile": ("profile.json", "not-utf8", ["pw_sim", "run", "{plan}", "--profile", "{bad}"]),
    "pw-sim --topology": ("topology.json", "deep", ["pw_sim", "run", "{ir}", "--topology", "{bad}"]),
    "pw-sim --branch-trace": ("trace.json", "digits", ["pw_sim", "run", "{plan}", "--branch-trace", "{bad}"]),
    "pw-sim plan": ("plan.json", "not-utf8", ["pw_sim", "run", "{bad}"]),
    "pw-sim ir": ("module.mlir", "not-utf8", ["pw_sim", "run", "{bad}", "--topology", "2x4"]),
    "pw-run plan": ("plan.json", "not-utf8", ["pw_run", "{bad}"]),
    "pw-run ir": ("module.mlir", "not-utf8", ["pw_run", "{bad}"]),
    "pw-opt topology": ("topology.json", "not-utf8",
                        ["pw_opt", "{ir}", "--pass-pipeline=builtin.module(pw-lower{{topology={bad}}})"]),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_tool_refuses_a_bad_input_file_in_one_line(tmp_path, reader):
    name, kind, argv = READERS[reader]
    bad = tmp_path / name
    bad.write_bytes(CONTENTS[kind][0])
    plan = tmp_path / "good-plan.json"
    if "{plan}" in argv:
        plan.write_text(_plan())
    args = [a.format(bad=bad, plan=plan, ir=ROOT / "examples" / "three_blocks.mlir") for a in argv]
    done = subprocess.run([sys.executable, "-m", f"pathways_mlir.cli.{args[0]}", *args[1:]],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0], done.stderr
    assert "internal error" not in done.stderr
    assert lines[0].count("error:") == 1, lines[0]       # pw-sim wrote `pw-sim: error: plan.json:1:8: error: ...`


# IR that MLIR's parser or its bindings abort on, or that passed pw-verify and stopped placement with an
# internal error: each reader of IR refused it with SIGABRT, an internal error, or exit status 2.
_SLICE = '"pw.virtual_slice"() {{sym_name = {name}, shape = {shape}, axes = ["x"], constraints = {{}}}} : () -> ()\n'
BAD_IR = {
    "index-array": (_SLICE.format(name='"s"', shape="array<index: 2>"),
                    ":1:53: error: array<index ...> is not supported: write array<i64: ...>"),
    "non-utf8-string": (_SLICE.format(name='"\\ff"', shape="array<i64: 2>"),
                        ":1:34: error: string literal is not UTF-8 once its escapes are decoded"),
    "index-tensor": (_SLICE.format(name='"s"', shape="array<i64: 2>") + textwrap.dedent("""\
        module @f attributes {pw.executable} {
          func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }
        }
        module @unused attributes {pw.executable} {
          func.func @main(%a: tensor<4xindex>) -> tensor<4xindex> { return %a : tensor<4xindex> }
        }
        func.func @p(%x: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {
          %0 = "pw.compute"(%x) {callee = @f, slice = @s, in_shardings = [[[]]], out_shardings = [[[]]],
                                 label = "f#0"} : (tensor<4xf32>) -> tensor<4xf32>
          return %0 : tensor<4xf32>
        }
        """), ":6:3: error: 'func.func' op argument 0 is tensor<4xindex>, whose element type index is not a pw "
              "element type (known: i1, i4,"),
}
IR_READERS = {"pw-opt": ["pw_opt", "{ir}", "--pw-lower=topology=2x4"], "pw-run": ["pw_run", "{ir}"],
              "pw-sim": ["pw_sim", "run", "{ir}", "--topology", "2x4"]}


@pytest.mark.parametrize("reader", sorted(IR_READERS))
@pytest.mark.parametrize("kind", sorted(BAD_IR))
def test_every_tool_refuses_ir_mlir_aborts_on_or_cannot_size_in_one_line(tmp_path, reader, kind):
    text, message = BAD_IR[kind]
    ir = tmp_path / "module.mlir"
    ir.write_text(text)
    args = [a.format(ir=ir) for a in IR_READERS[reader]]
    done = subprocess.run([sys.executable, "-m", f"pathways_mlir.cli.{args[0]}", *args[1:]],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"{ir}{message}") and done.stderr.count("\n") == 1, done.stderr

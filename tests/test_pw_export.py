"""The pw-export driver: import a placed function or program, trace it, print pw IR."""

import pathlib

import pytest

from pathways_mlir.cli import pw_export, pw_opt

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "three_blocks.py")


def test_exports_the_example_for_pw_opt(tmp_path, capsys):
    out = tmp_path / "three_blocks.mlir"
    assert pw_export.main([f"{EXAMPLE}:three_blocks", "--arg", "f32[8,16]", "-o", str(out)]) == 0
    assert pw_opt.main([str(out), "--pw-verify"]) == 0
    text = capsys.readouterr().out
    assert text.count('"pw.compute"') == 3 and "func.func @three_blocks" in text


def test_module_targets_and_debug_info(capsys):
    assert pw_export.main(["json:dumps"]) == 1  # importable, but not exportable
    assert "json:dumps is a function, not a placed function" in capsys.readouterr().err
    assert pw_export.main([f"{EXAMPLE}:block_b", "--arg", "f32[4,4]", "--mlir-print-debuginfo"]) == 0
    assert 'loc("block_b"' in capsys.readouterr().out


def test_a_target_that_exits_at_import_is_one_error_line(tmp_path, capsys):
    """A target file calling sys.exit() at import made pw-export exit 0 with no IR, or print its message alone
    (found by a fault finder)."""
    for code, said in (("0", "sys.exit(0)"), ("'bye'", "sys.exit('bye')")):
        (tmp_path / "leaves.py").write_text(f"import sys\nsys.exit({code})\n")
        assert pw_export.main([f"{tmp_path / 'leaves.py'}:f"]) == 1
        assert capsys.readouterr().err == (f"pw-export: error: cannot import {tmp_path / 'leaves.py'}: it called "
                                           f"{said}\n")


@pytest.mark.parametrize("args, message", [
    (["nocolon"], "target 'nocolon' is not module:name or path/to/file.py:name"),
    (["missing.py:f"], "no such file: missing.py"),
    (["no_such_module_xyz:f"], "cannot import no_such_module_xyz: ModuleNotFoundError"),
    ([f"{EXAMPLE}:nope"], "has no attribute 'nope'"),
    ([f"{EXAMPLE}:three_blocks", "--arg", "f32(8)"], "--arg 'f32(8)' is not a shape such as f32[8,16]"),
    ([f"{EXAMPLE}:three_blocks", "--arg", "q7[8]"], "unknown element type 'q7'"),
    ([f"{EXAMPLE}:three_blocks", "--arg", f"f32[{1 << 63},16]"],      # was MLIR's two-line 'Unable to parse type'
     "has a dimension of more than a 64-bit integer holds"),
    ([f"{EXAMPLE}:three_blocks", "--arg", "f32[3,16]"], "PlacementError: block_a at "),
    ([f"{EXAMPLE}:three_blocks"], "TypeError: three_blocks() missing 1 required positional argument"),
    # Found by a fault finder: empty or non-ASCII dimensions were read as none or as digits.
    *[([f"{EXAMPLE}:three_blocks", "--arg", shape], f"--arg '{shape}' is not a shape such as f32[8,16]")
      for shape in ("f32[4,,5]", "f32[,]", "f32[,4]", "f32[\u0663]")],
])
def test_errors_are_one_line(args, message, capsys):
    assert pw_export.main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("pw-export: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err

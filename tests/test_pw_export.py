"""The pw-export driver: import a placed function or program, trace it, print pw IR."""

import os
import pathlib
import sys

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


STATIC = """
import pathways_mlir as pw
s = pw.virtual_slice((1,), axes=("d",))
scaled = pw.jit(lambda x, n: x * n, slice=s, static_argnums=1)

@pw.program(static_argnames="n")
def program(x, n):
    return scaled(x, n)

def shifted(x, *, by, mode="add"):
    return x + by if mode == "add" else x * by

keyword = pw.jit(shifted, slice=s, static_argnames="mode")
"""


def test_static_arguments_are_given_as_python_literals(tmp_path, capsys):
    """A static argument's --arg (a ShapeDtypeStruct) was baked into the trace as its value: an unrelated
    TypeError (`unsupported operand type(s) for *: 'DynamicJaxprTracer' and 'ShapeDtypeStruct'`; found by a
    fault finder). It is the value, as `jax.jit(f).lower` takes it; a shape there is one line saying so."""
    (tmp_path / "static.py").write_text(STATIC)
    where = tmp_path / "static.py"
    for name in ("scaled", "program"):
        assert pw_export.main([f"{where}:{name}", "--arg", "f32[4]", "--arg", "3"]) == 0
        assert "dense<3.000000e+00>" in capsys.readouterr().out
        assert pw_export.main([f"{where}:{name}", "--arg", "f32[4]", "--arg", "f32[]"]) == 1
        assert capsys.readouterr().err == (f"pw-export: error: --arg 'f32[]' is for static argument 1 of "
                                           f"{where}:{name}: give its value, a Python literal such as 3, True, "
                                           f"(1, 2) or '\"relu\"'\n")
    assert pw_export.main([f"{where}:keyword", "--arg", "f32[4]", "--kwarg", "by=f32[]", "--kwarg", "mode='mul'"]) == 0
    assert "stablehlo.multiply" in capsys.readouterr().out
    assert pw_export.main([f"{where}:keyword", "--arg", "f32[4]", "--kwarg", "by=f32[]"]) == 0
    assert "stablehlo.add" in capsys.readouterr().out
    for kwargs, message in ((["mode=mul"], "--kwarg 'mode=mul' is for static argument 'mode' of "),
                            (["by"], "--kwarg 'by' is not NAME=VALUE"),
                            (["by=f32[]", "by=f32[]"], "--kwarg 'by=f32[]': 'by' is given twice"),
                            (["by=f32(1)"], "--kwarg 'by=f32(1)': 'f32(1)' is not a shape such as f32[8,16]")):
        options = [a for k in kwargs for a in ("--kwarg", k)]
        assert pw_export.main([f"{where}:keyword", "--arg", "f32[4]", *options]) == 1
        err = capsys.readouterr().err
        assert err.startswith("pw-export: error: ") and message in err and err.count("\n") == 1


def test_typed_prng_key_arguments(tmp_path, capsys):
    """`key<fry>[]` (as `jax.random.key` types keys, and flax NNX programs take them) was not a shape."""
    (tmp_path / "keys.py").write_text("import jax\nimport pathways_mlir as pw\n"
                                      "noise = pw.jit(lambda key, x: x + jax.random.normal(key[0], x.shape),\n"
                                      "               slice=pw.virtual_slice((1,), axes=('d',)))\n")
    where = tmp_path / "keys.py"
    # Its key data in the IR: 2 words a threefry key, 4 an rbg one.
    for shape, data in (("key<fry>[2]", "2x2xui32"), ("key<rbg>[1]", "1x4xui32"), ("key<urbg>[1]", "1x4xui32"),
                        (" key<threefry2x32> [ 3 ] ", "3x2xui32")):
        assert pw_export.main([f"{where}:noise", "--arg", shape, "--arg", "f32[4]"]) == 0
        assert f"(%arg0: tensor<{data}>, %arg1: tensor<4xf32>)" in capsys.readouterr().out
    assert pw_export.main([f"{where}:noise", "--arg", "key<bogus>[]", "--arg", "f32[4]"]) == 1
    assert capsys.readouterr().err == ("pw-export: error: --arg 'key<bogus>[]' has unknown PRNG implementation "
                                       "'bogus' (use key<fry>, key<rbg>, key<urbg> or a name jax.random.key takes, "
                                       "such as threefry2x32)\n")
    assert pw_export.main([f"{where}:noise", "--arg", f"key<fry>[{1 << 63}]"]) == 1
    assert "has a dimension of more than a 64-bit integer holds" in capsys.readouterr().err


def test_complex_arguments_as_pw_spells_them(tmp_path, capsys):
    """`complex<f32>[2]`, as `format_aval` and pw's messages write a complex shape, was 'not a shape such as
    f32[8,16]' (found by a fault finder)."""
    (tmp_path / "twice.py").write_text("import pathways_mlir as pw\n"
                                       "twice = pw.jit(lambda x: x * 2, slice=pw.virtual_slice((1,), axes=('d',)))\n")
    # (complex<f64> is canonicalised as JAX does: complex<f32> unless x64 is enabled)
    for shape, tensor in (("complex<f32>[2]", "2xcomplex<f32>"), (" complex<f64> [ 3,1 ] ", "3x1xcomplex<f32>"),
                          ("complex64[2]", "2xcomplex<f32>")):
        assert pw_export.main([f"{tmp_path / 'twice.py'}:twice", "--arg", shape]) == 0
        assert f"(%arg0: tensor<{tensor}>)" in capsys.readouterr().out
    assert pw_export.main([f"{tmp_path / 'twice.py'}:twice", "--arg", "complex<f16>[2]"]) == 1
    assert "unknown element type 'complex<f16>'" in capsys.readouterr().err


def test_a_module_in_the_current_directory(tmp_path, monkeypatch, capsys):
    """`mymod:fn` run where mymod.py is was a ModuleNotFoundError: the current directory is on the path as
    `python -m` puts it, first, once."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p and os.path.abspath(p) != str(tmp_path)])
    (tmp_path / "here_module_xyz.py").write_text(
        "import pathways_mlir as pw\ndouble = pw.jit(lambda x: x * 2, slice=pw.virtual_slice((1,), axes=('d',)))\n")
    try:
        for _ in range(2):
            assert pw_export.main(["here_module_xyz:double", "--arg", "f32[4]"]) == 0
            assert "func.func @lambda" in capsys.readouterr().out
        assert sys.path[0] == str(tmp_path) and sys.path.count(str(tmp_path)) == 1
    finally:
        sys.modules.pop("here_module_xyz", None)

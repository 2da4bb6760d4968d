"""`pw-export`: trace a placed function or program and print its pw IR.

    pw-export examples/three_blocks.py:three_blocks --arg 'f32[8,16]' -o three_blocks.mlir
    pw-export mypackage.model:train_step --arg 'bf16[64,512]' --arg 'i32[64]'

    pw-export model.py:step --arg 'key<fry>[]' --arg 'f32[8]' --arg True --kwarg 'mode="eval"'

The target is `module:name` or `path/to/file.py:name`, naming an object made
by `pathways_mlir.jit` or `@pathways_mlir.program`; a module is looked up as
`python -m` does, the current directory first. Each `--arg` gives one
positional argument's shape and element type (f32, bf16, f16, i32, i1, ui8,
... or a numpy dtype name), or typed PRNG keys (`key<fry>[]`, `key<rbg>[2]`,
`key<threefry2x32>[]`: `jax.random.key`'s implementations); a static
argument (`static_argnums`, `static_argnames`) is given its value, a Python
literal, as `jax.jit(f).lower` takes it. `--kwarg NAME=VALUE` gives a
keyword argument, either way. Every problem is reported on one line as
`pw-export: error: ...` with exit status 1; no Python traceback reaches the
user.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
from typing import Any

import click

from .entry import error_line, run_command, write_output


class _ExportError(Exception):
    """A problem to report on one line."""


_LITERALS = "a Python literal such as 3, True, (1, 2) or '\"relu\"'"


def _load(target: str) -> Any:
    """Returns the object `target` (`module:name` or `file.py:name`) names."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise _ExportError(f"target '{target}' is not module:name or path/to/file.py:name")
    try:
        if where.endswith(".py") or os.sep in where:
            if not os.path.isfile(where):
                raise _ExportError(f"no such file: {where}")
            # Like `python file.py`: the file's folder comes first on the path.
            sys.path.insert(0, os.path.dirname(os.path.abspath(where)))
            spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(where))[0], where)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            # Like `python -m`: the current directory comes first on the path (unless it is on it already).
            here = os.getcwd()
            if here not in {os.path.abspath(p or os.curdir) for p in sys.path}:
                sys.path.insert(0, here)
            module = importlib.import_module(where)
    except _ExportError:
        raise
    except SystemExit as e:              # (it exited with no IR written, or its message alone)
        raise _ExportError(f"cannot import {where}: it called sys.exit({e.code!r})") from None
    except Exception as e:
        raise _ExportError(f"cannot import {where}: {type(e).__name__}: {e}") from None
    if not hasattr(module, name):
        raise _ExportError(f"{where} has no attribute '{name}'")
    return getattr(module, name)


def _export(target: str, args: tuple[str, ...], kwargs: tuple[str, ...], debug_info: bool) -> str:
    from pathways_mlir.frontend.placed import PlacedFunction
    from pathways_mlir.frontend.tracer import Program

    fn = _load(target)
    if not isinstance(fn, (PlacedFunction, Program)):
        raise _ExportError(f"{target} is a {type(fn).__name__}, not a placed function "
                           f"(pathways_mlir.jit) or a program (@pathways_mlir.program)")
    signature = fn._signature
    static = signature._positions(signature.static_nums, len(args))
    values = [_value("--arg", a, a, f"argument {i} of {target}" if i in static else None) for i, a in enumerate(args)]
    named = {}
    for item in kwargs:
        name, sep, text = item.partition("=")
        if not sep or not name.isidentifier():
            raise _ExportError(f"--kwarg '{item}' is not NAME=VALUE")
        if name in named:
            raise _ExportError(f"--kwarg '{item}': '{name}' is given twice")
        static_name = f"argument '{name}' of {target}" if name in signature.static_names else None
        named[name] = _value("--kwarg", item, text, static_name)
    try:
        return fn.lower(*values, **named).as_text(debug_info=debug_info)
    except Exception as e:
        raise _ExportError(f"{type(e).__name__}: {e}") from None


def _value(option: str, item: str, text: str, static: str | None) -> Any:
    """The argument `text` (of `option`'s `item`) gives: the value of a Python literal for a `static` one (it
    says which), else the abstract value of a shape (`parse_aval`)."""
    from pathways_mlir.frontend.avals import parse_aval

    if static is not None:
        try:
            return ast.literal_eval(text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise _ExportError(f"{option} '{item}' is for static {static}: give its value, {_LITERALS}") from None
    try:
        return parse_aval(text)
    except ValueError as e:
        raise _ExportError(f"{option} {e}" if item == text else f"{option} '{item}': {e}") from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target")
@click.option("--arg", "args", multiple=True, metavar="SHAPE",
              help="One positional argument, in order: its shape, e.g. 'f32[8,16]' or 'key<fry>[]', or for a "
                   "static one its value, a Python literal (3, True, '\"relu\"').")
@click.option("--kwarg", "kwargs", multiple=True, metavar="NAME=VALUE",
              help="One keyword argument: NAME=SHAPE, or NAME=LITERAL for a static one.")
@click.option("-o", "output", default="-", help="Output file (default: stdout).")
@click.option("--mlir-print-debuginfo", "debug_info", is_flag=True,
              help="Print locations: the Python call site of every op.")
def cli(target: str, args: tuple[str, ...], kwargs: tuple[str, ...], output: str, debug_info: bool) -> None:
    """Trace TARGET (module:name or file.py:name) for --arg shapes and print its pw IR."""
    write_output(output, _export(target, args, kwargs, debug_info), _ExportError)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pw-export`; returns the exit status."""
    return run_command(cli, argv, "pw-export", (_ExportError,), error_line("pw-export"))


if __name__ == "__main__":
    sys.exit(main())

"""`pw-export`: trace a placed function or program and print its pw IR.

    pw-export examples/three_blocks.py:three_blocks --arg 'f32[8,16]' -o three_blocks.mlir
    pw-export mypackage.model:train_step --arg 'bf16[64,512]' --arg 'i32[64]'

The target is `module:name` or `path/to/file.py:name`, naming an object made
by `pathways_mlir.jit` or `@pathways_mlir.program`. Each `--arg` gives one
positional argument's shape and element type (f32, bf16, f16, i32, i1, ui8,
... or a numpy dtype name). Every problem is reported on one line as
`pw-export: error: ...` with exit status 1; no Python traceback reaches the
user.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

import click

from .entry import error_line, run_command, write_output


class _ExportError(Exception):
    """A problem to report on one line."""


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


def _export(target: str, args: tuple[str, ...], debug_info: bool) -> str:
    from pathways_mlir.frontend.avals import parse_aval
    from pathways_mlir.frontend.placed import PlacedFunction
    from pathways_mlir.frontend.tracer import Program

    fn = _load(target)
    if not isinstance(fn, (PlacedFunction, Program)):
        raise _ExportError(f"{target} is a {type(fn).__name__}, not a placed function "
                           f"(pathways_mlir.jit) or a program (@pathways_mlir.program)")
    try:
        avals = [parse_aval(a) for a in args]
    except ValueError as e:
        raise _ExportError(f"--arg {e}") from None
    try:
        return fn.lower(*avals).as_text(debug_info=debug_info)
    except Exception as e:
        raise _ExportError(f"{type(e).__name__}: {e}") from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target")
@click.option("--arg", "args", multiple=True, metavar="SHAPE",
              help="Shape of one positional argument, e.g. 'f32[8,16]' (repeat in order).")
@click.option("-o", "output", default="-", help="Output file (default: stdout).")
@click.option("--mlir-print-debuginfo", "debug_info", is_flag=True,
              help="Print locations: the Python call site of every op.")
def cli(target: str, args: tuple[str, ...], output: str, debug_info: bool) -> None:
    """Trace TARGET (module:name or file.py:name) for --arg shapes and print its pw IR."""
    write_output(output, _export(target, args, debug_info), _ExportError)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pw-export`; returns the exit status."""
    return run_command(cli, argv, "pw-export", (_ExportError,), error_line("pw-export"))


if __name__ == "__main__":
    sys.exit(main())

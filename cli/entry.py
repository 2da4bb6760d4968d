"""The entry-point wrapper shared by the command-line tools.

Runs a click command outside click's standalone mode so that every failure
becomes a one-line message and an exit status, never a Python traceback.
"""

from __future__ import annotations

import sys
from typing import Callable

import click


def write_output(output: str, text: str, error: Callable[[str], Exception]) -> None:
    """Writes `text` to the file `output`, or to stdout for "-"; a failure raises `error(message)`."""
    if output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        with open(output, "w") as f:
            f.write(text)
    except OSError as e:
        raise error(f"cannot write {output}: {e.strerror}") from None


def error_line(prog: str) -> Callable[[Exception], str]:
    """Formats a user error of tool `prog`: as it is if it names its place already (`file:line:col: error:
    ...`), else `prog: error: ...`."""
    def line(error: Exception) -> str:
        text = str(error)
        return text if ": error: " in text else f"{prog}: error: {text}"
    return line


def run_command(command: click.Command, argv: list[str] | None, prog: str,
                user_errors: tuple[type[Exception], ...], format_error: Callable[[Exception], str]) -> int:
    """Runs `command`; returns 0, 1 for bad input (`user_errors`, or a bad command line), click's status,
    or 2 for a bug."""
    try:
        status = command.main(args=argv, prog_name=prog, standalone_mode=False)
    except user_errors as e:
        click.echo(format_error(e), err=True)
        return 1
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.UsageError as e:      # a bad argument or option: one line, like any other bad input
        click.echo(f"{prog}: error: {e.format_message()} (--help for usage)", err=True)
        return 1
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except click.exceptions.Abort:
        return 1
    except Exception as e:  # noqa: BLE001  (a bug in the tool itself: reported, no traceback)
        click.echo(f"{prog}: internal error: {type(e).__name__}: {e}", err=True)
        return 2
    return status if isinstance(status, int) else 0

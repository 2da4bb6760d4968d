"""Reading input files other programs or people wrote: UTF-8 text and JSON, each failure one line.

Every tool reads its input files through these (pw IR, plan JSON, topology
JSON, machine profiles, traces of predicate values), so that bytes that are
not UTF-8, a NUL byte, JSON nested past Python's recursion limit or an
integer of more digits than Python converts are each a one-line error naming
the file (and the line and column where the text says), as a malformed value
is, never an internal error. `error` is the caller's exception class (or any
callable from a message to an exception), so each tool reports these as its
other input errors.
"""

from __future__ import annotations

import json
from typing import Any, Callable

ErrorClass = Callable[[str], Exception]
MAX_INPUT_BYTES = 1 << 30           # an input file larger than this is refused (a plan's is a few MiB)
_CHUNK = 1 << 20


def read_text(path, error: ErrorClass, what: str = "input") -> str:
    """Returns the UTF-8 text of the file `path`; raises `error` if it cannot be read, is not text or is larger
    than `MAX_INPUT_BYTES`."""
    try:
        with open(path, "rb") as file:
            data = read_bounded(file)
    except OSError as e:
        raise error(f"{path}: cannot read {what}: {e.strerror}") from None
    return decode(data, str(path), error, what)


def read_bounded(file) -> bytes:
    """Reads a binary file to its end, or to its first NUL byte (kept: `decode` says where it is), or to one
    byte past `MAX_INPUT_BYTES` (`decode` refuses that): a device or pipe that never ends (`/dev/zero`) is
    refused after its first read, or at that size, instead of filling memory."""
    chunks, size = [], 0
    while size <= MAX_INPUT_BYTES:
        chunk = file.read(min(_CHUNK, MAX_INPUT_BYTES + 1 - size))
        if not chunk:
            break
        nul = chunk.find(0)
        if nul >= 0:
            chunks.append(chunk[:nul + 1])
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def decode(data: bytes, filename: str, error: ErrorClass, what: str = "input") -> str:
    """Decodes `data` as UTF-8; raises `error` at the line and column of the first byte that is not text
    (a NUL byte included), or if it is larger than `MAX_INPUT_BYTES`."""
    if len(data) > MAX_INPUT_BYTES:
        raise error(f"{filename}: error: {what} is larger than {MAX_INPUT_BYTES >> 20} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{_position(data, e.start, filename)}: error: {what} is not valid UTF-8") from None
    if "\x00" in text:
        raise error(f"{_position(data, data.index(0), filename)}: error: {what} contains a NUL byte")
    return text


def parse_json(text: str, where: str, error: ErrorClass) -> Any:
    """Returns the JSON value of `text`; raises `error` naming `where` (and the line and column, for a
    syntax error) for text that is not JSON or that Python cannot read as JSON (nested too deeply, an
    integer of too many digits)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{where}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    except RecursionError:
        raise error(f"{where}: invalid JSON: nested too deeply") from None
    except ValueError as e:             # an integer past Python's limit on the digits it converts
        raise error(f"{where}: invalid JSON: {str(e).split(';')[0]}") from None


def read_json(path, error: ErrorClass, what: str = "input") -> Any:
    """Returns the JSON value of the file `path` (`read_text`, then `parse_json`)."""
    return parse_json(read_text(path, error, what), str(path), error)


def _position(data: bytes, offset: int, filename: str) -> str:
    line = data.count(b"\n", 0, offset) + 1
    column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return f"{filename}:{line}:{column}"

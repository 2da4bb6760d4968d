"""Reading what a child process prints, one line at a time, each wait bounded.

`select()` on a pipe tells whether the pipe holds bytes, not whether Python's buffer in front of it does.
A buffered `proc.stdout.readline()` takes every byte the pipe holds (up to 8 KiB), so when a process had
printed two lines before the first was read, the second one is in that buffer and the next `select()`
waits for a line the process never prints (test_service.py's `hold` client prints "checked" and, a moment
later, "holding", then waits to be killed: on a loaded machine the test read "checked" late, and then
waited its whole timeout for "holding"). `read_line` reads the pipe itself, a byte at a time, so nothing
beyond the line it returns leaves the pipe, where the next `select()` sees it (and `proc.stdout.read()`
still gets the rest).
"""

import os
import select
import time


def read_line(proc, timeout: float, what: str = "the process") -> str:
    """Returns the next line `proc` prints, with its newline ("" once it exited, the partial line if it
    exited in the middle of one); fails if no whole line came within `timeout` seconds."""
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    line = bytearray()
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"{what} printed nothing in time" if not line else \
            f"{what} printed no whole line in time (got {bytes(line)!r})"
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    return line.decode()

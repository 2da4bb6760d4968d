"""The endpoint's wire format: one frame per message, never pickle.

    u32 header length (big-endian) | JSON object | raw bytes of each array

The header's "arrays" lists `[dtype, shape]` per array. Dtypes are numeric
only (`DTYPES`), in this machine's byte order (both ends share it). The
header is small (`Limits.max_header_bytes`, `runtime/limits.py`, 8 MiB by default: a plan's
structure, never its compiled functions, which travel as arrays of bytes),
and every size, and the number of arrays (`Limits.max_arrays`: each costs a
few hundred bytes, even empty), is checked before anything is allocated: the header's buffer
is allocated at its checked length, each array's at the size its checked
shape gives, and their pages are committed only as their bytes arrive.
Headers over 64 KiB are parsed one at a time per endpoint, once their bytes
have all arrived (JSON parsing can take about 25x the bytes it reads), so a
slow peer holds up only its own connection. A connection's `FrameReader`
asks its socket for up to 64 KiB at a time (the buffer it holds), so a small
frame is one `recv` call, not one per part.
"""

from __future__ import annotations

import fcntl
import json
import math
import select
import socket
import struct
import termios
import threading
import time
from typing import Callable

import jax.numpy as jnp
import numpy as np

from pathways_mlir.dialect.element_types import ELEMENT_TYPES

from .admission import OutOfDeviceMemory
from .island_work import FAILURE_KINDS
from .limits import Limits
from .resource_manager import TopologyChanged

MAX_DIMS = 64                    # an array's dimensions at most: NumPy's own limit (JAX and XLA take more)
LARGE_HEADER = 64 << 10          # headers past this are parsed one at a time (`recv_message`'s `large`)
DTYPES = {name: jnp.dtype(name) for name in ELEMENT_TYPES}     # pw's element types (ml_dtypes' narrow ones too)
_NAMES = {dtype: name for name, dtype in DTYPES.items()}   # (`dtype.name` takes microseconds)

_LENGTH = struct.Struct(">I")
_JOINED = 1 << 16                  # bytes of arrays at most sent in one call with their header
CHUNK = 1 << 16                    # bytes a `FrameReader` asks the socket for at a time, and holds
MIN_PROGRESS = 0.01                # seconds between the progress frames of a run whose plan compiles, at least

# The kind of an error reply: the first of these classes the error is an instance of (subclasses come before
# the classes they refine), else the sender's kind for any other (`reported`: "error" from an endpoint). The
# client raises a reply of these kinds as these errors, except "value", "type" and "permission", which it
# raises as RemoteError subclasses that are also ValueError, TypeError and PermissionError
# (`remote_client.RAISED`); any other kind as a RemoteError. Only the name of a kind crosses the wire, never an
# object.
ERROR_KINDS = {"timeout": TimeoutError, "topology": TopologyChanged, "memory": OutOfDeviceMemory, **FAILURE_KINDS,
               "permission": PermissionError, "value": ValueError, "type": TypeError}


class Reported(Exception):
    """An error sent back before, to send again as it was: its kind and message (`reported`)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def reported(error: BaseException, otherwise: str) -> tuple[str, str]:
    """The kind (`ERROR_KINDS`, else `otherwise`) and message an error is sent back with. The receiver raises the
    kind's class, so the message names the error's own class only if that is another (a subclass, or an error
    of no kind), as the error's own message does not. A `Reported` error goes as it went before."""
    if isinstance(error, Reported):
        return error.kind, str(error)
    kind = next((k for k, cls in ERROR_KINDS.items() if isinstance(error, cls)), otherwise)
    named = "" if type(error) is ERROR_KINDS.get(kind) else f"{type(error).__name__}: "
    return kind, f"{named}{error}"


class ProtocolError(ValueError):
    """A frame that breaks the wire format; the connection is dropped."""


def send_message(sock: socket.socket, header: dict, arrays=(), limits: Limits = Limits(),
                 patient: bool = False) -> None:
    """Sends one frame: `header` as JSON, then the raw bytes of `arrays` (numeric dtypes only). `patient`: a
    send that waited the socket's timeout for the peer to read goes on waiting while bytes from the peer keep
    arriving unread: a service compiling a plan reads nothing, but says it still compiles (a client's timeout
    bounded the whole send of a large run sent meanwhile). Raises ValueError, before anything is sent, if the
    frame is over `limits` (`frame_parts`)."""
    parts = frame_parts(header, arrays, limits)
    heard = _arrivals(sock) if patient else None
    for part in parts:
        _send_all(sock, part, heard)


def frame_parts(header: dict, arrays=(), limits: Limits = Limits()) -> list:
    """The bytes of one frame (`send_message`), in the pieces to send: the header's, then each array's as a
    view of its bytes, or all of them joined when the arrays are small (one call: a small frame's parts are not
    sent, and woken for, apart). Raises ValueError, before anything is sent, if the frame is over `limits`."""
    for position, array in enumerate(arrays):     # (the receiver drops a frame over it, as a hostile peer's)
        check_dims(array, f"array {position} of the frame")
    arrays = [wire_array(a) for a in arrays]
    if len(arrays) > limits.max_arrays:
        raise ValueError(f"{len(arrays)} arrays are over the endpoint's limit of {limits.max_arrays} per frame")
    total = sum(a.nbytes for a in arrays)
    if total > limits.max_array_bytes:
        raise ValueError(f"arrays of {total} bytes are over the endpoint's limit of {limits.max_array_bytes}")
    data = json.dumps({**header, "arrays": [[_NAMES.get(a.dtype) or a.dtype.name, list(a.shape)] for a in arrays]},
                      separators=(",", ":")).encode()
    if len(data) > limits.max_header_bytes:
        raise ValueError(f"a header of {len(data)} bytes is over the endpoint's limit of "
                         f"{limits.max_header_bytes}")
    parts = [_LENGTH.pack(len(data)) + data, *(a.reshape(-1).view(np.uint8) for a in arrays)]
    return [b"".join(parts)] if total <= _JOINED else parts


def _send_all(sock: socket.socket, data, heard: Callable[[], bool] | None) -> None:
    """Sends all of `data` (bytes, or an array of bytes); see `send_message` for `heard`."""
    if heard is None:
        sock.sendall(data)
        return
    view = memoryview(data).cast("B")
    while view:
        try:
            view = view[sock.send(view):]
        except TimeoutError:
            if not heard():
                raise


def _arrivals(sock: socket.socket) -> Callable[[], bool]:
    """Returns a function that says whether more bytes arrived on `sock`, unread, than when it was last called
    (first: than now)."""
    unread = _unread_bytes(sock)

    def heard() -> bool:
        nonlocal unread
        before, unread = unread, _unread_bytes(sock)
        return unread > before
    return heard


def _unread_bytes(sock: socket.socket) -> int:
    """The bytes that arrived on `sock` and are not read yet (the kernel's count); 0 once it is closed."""
    fd = sock.fileno()
    return 0 if fd < 0 else struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]


def recv_message(sock: socket.socket, limits: Limits = Limits(), large: threading.Lock | None = None,
                 frame_timeout: float | None = None) -> tuple[dict, list[np.ndarray]]:
    """Receives one frame, reading no byte past it (`FrameReader.recv`, which reads ahead, says more)."""
    return FrameReader(sock, read_ahead=False).recv(limits, large, frame_timeout)


class FrameReader:
    """Receives the frames of one socket. Reading ahead (the default), it asks the socket for up to `CHUNK`
    bytes at a time and keeps those past a frame for the next ones, so a small frame takes one `recv` call
    instead of one per part (each a system call and a GIL hand-off); it holds `CHUNK` bytes, and parts larger
    than that are read straight into their arrays. Only one reader may read a socket that reads ahead."""

    def __init__(self, sock: socket.socket, read_ahead: bool = True):
        self.sock = sock
        self._buffer = memoryview(bytearray(CHUNK)) if read_ahead else None
        self._start = self._end = 0                  # the bytes read ahead: self._buffer[_start:_end]

    @property
    def buffered(self) -> bool:
        """Whether bytes of the next frame were read ahead already (the socket may have none left to read)."""
        return self._end > self._start

    def header_ahead(self) -> bytes:
        """The next frame's header (its JSON, unparsed) if it was read ahead whole, else b""."""
        if self._end - self._start < _LENGTH.size:
            return b""
        (size,) = _LENGTH.unpack_from(self._buffer, self._start)
        begin = self._start + _LENGTH.size
        return bytes(self._buffer[begin:begin + size]) if begin + size <= self._end else b""

    def recv_arrived(self, limits: Limits = Limits()) -> tuple[dict, list[np.ndarray]] | None:
        """Receives the next frame if it has arrived whole (read ahead, or waiting in the socket), else None,
        waiting for nothing: a frame begun stays for a later `recv`. Raises as `recv` does, and EOFError if the
        peer left."""
        while not self._frame_ahead(limits):
            if not self._read_ahead_now():
                return None
        return self.recv(limits)

    def _frame_ahead(self, limits: Limits) -> bool:
        """Whether the next frame was read ahead whole, arrays and all: `recv` then takes it without waiting.
        Raises ProtocolError if its header is malformed."""
        header = self.header_ahead()
        if not header:
            return False
        size = _LENGTH.size + len(header)
        size += sum(nbytes for _, _, nbytes in _array_specs(_parse(header).get("arrays", []), limits))
        return self._end - self._start >= size

    def _read_ahead_now(self) -> bool:
        """Reads what the socket holds now into the read-ahead buffer, waiting for nothing; returns whether any
        bytes came (none: the socket had none, or the buffer is full of a frame larger than it). Raises
        EOFError if the peer left."""
        buffer = self._buffer
        if buffer is None:
            return False
        if self._start:                          # (what is left of the frames read ahead, to the buffer's start)
            left = bytes(buffer[self._start:self._end])
            buffer[:len(left)] = left
            self._start, self._end = 0, len(left)
        if self._end == len(buffer) or not select.select([self.sock], [], [], 0)[0]:
            return False
        received = self.sock.recv_into(buffer[self._end:])      # (readable: it returns what is there)
        if received == 0:
            raise EOFError("the connection was closed")
        self._end += received
        return True

    def recv(self, limits: Limits = Limits(), large: threading.Lock | None = None,
             frame_timeout: float | None = None) -> tuple[dict, list[np.ndarray]]:
        """Receives one frame; raises ProtocolError if it is malformed, EOFError if the peer left. A header
        over `LARGE_HEADER` bytes is parsed holding `large` (if given), once its bytes have all arrived. With
        `frame_timeout`, the rest of the frame must arrive within that many seconds of its first byte, else
        TimeoutError (a peer that sends a byte now and then cannot hold a frame open)."""
        length = bytearray(_LENGTH.size)
        self._read_into(memoryview(length)[:1], None)   # waiting for a frame: the socket's own timeout
        deadline = None if frame_timeout is None else time.monotonic() + frame_timeout
        previous = self.sock.gettimeout()
        try:
            self._read_into(memoryview(length)[1:], deadline)
            (size,) = _LENGTH.unpack(length)
            if size > limits.max_header_bytes:
                raise ProtocolError(f"a header of {size} bytes is over the limit of {limits.max_header_bytes}")
            data = np.empty(size, np.uint8)          # read without `large`: a slow peer holds up only itself
            self._read_into(memoryview(data), deadline)
            if large is not None and size > LARGE_HEADER:
                with large:
                    header = _parse(data.tobytes())
            else:
                header = _parse(data.tobytes())
            del data
            arrays = []
            for dtype, shape, nbytes in _array_specs(header.pop("arrays", []), limits):
                data = np.empty(nbytes, np.uint8)    # pages are committed as the bytes arrive
                self._read_into(memoryview(data), deadline)
                arrays.append(data.view(dtype).reshape(shape))
            return header, arrays
        finally:
            if deadline is not None and self.sock.gettimeout() != previous:   # read past the first chunk
                self.sock.settimeout(previous)

    def _read_into(self, view: memoryview, deadline: float | None) -> None:
        """Fills `view` with the bytes read ahead, then from the socket: through the buffer (reading ahead) if
        what is missing fits in it, else straight into `view`."""
        buffer = self._buffer
        if buffer is not None and self._end > self._start:
            n = min(len(view), self._end - self._start)
            view[:n] = buffer[self._start:self._start + n]
            self._start += n
            view = view[n:]
        if not view:
            return
        if buffer is None or len(view) >= CHUNK:
            _recv_into(self.sock, view, deadline)
            return
        self._start = self._end = 0              # everything read ahead has been taken
        while self._end < len(view):
            self._end += _recv_some(self.sock, buffer[self._end:], deadline)
        view[:] = buffer[:len(view)]
        self._start = len(view)


def too_many_dims(value) -> str | None:
    """Why no frame carries array `value` (NumPy's or JAX's, whose rank may pass NumPy's): " has N dimensions,
    over ...", to follow its name; None if a frame carries its rank."""
    ndim = np.ndim(value)
    return f" has {ndim} dimensions, over the limit of {MAX_DIMS} of an array sent (NumPy's)" if ndim > MAX_DIMS \
        else None


def check_dims(value, what: str) -> None:
    """Raises ValueError, naming the array as `what`, if no frame carries its rank (`too_many_dims`)."""
    why = too_many_dims(value)
    if why is not None:
        raise ValueError(f"{what}{why}")


def wire_array(value) -> np.ndarray:
    """Returns `value` as a C-ordered array of a dtype frames carry; raises ValueError for any other."""
    array = np.asarray(value)
    if array.dtype in _NAMES and array.flags.c_contiguous:
        return array
    dtype = DTYPES.get(array.dtype.name)
    if dtype is None:
        raise ValueError(f"arrays of dtype {array.dtype} cannot be sent: only {', '.join(DTYPES)}")
    return array.astype(dtype, order="C", copy=False)


def _parse(data: bytearray) -> dict:
    try:
        header = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise ProtocolError(f"the header is not JSON: {str(error)[:200]}") from None
    if not isinstance(header, dict):
        raise ProtocolError("the header is not a JSON object")
    return header


def _array_specs(specs, limits: Limits) -> list[tuple[np.dtype, tuple[int, ...], int]]:
    """Checks a header's array list against the allow-list, the count limit and the size limit."""
    if not isinstance(specs, list):
        raise ProtocolError("'arrays' must be a list of [dtype, shape]")
    if len(specs) > limits.max_arrays:
        raise ProtocolError(f"{len(specs)} arrays are over the limit of {limits.max_arrays} per frame")
    out, total, limit = [], 0, limits.max_array_bytes
    for spec in specs:
        if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[1], list)):
            raise ProtocolError(f"an array must be described as [dtype, shape], not {str(spec)[:80]}")
        name, shape = spec
        dtype = DTYPES.get(name) if isinstance(name, str) else None
        if dtype is None:
            raise ProtocolError(f"dtype {str(name)[:40]!r} is not allowed: only {', '.join(DTYPES)}")
        if len(shape) > MAX_DIMS or not all(type(d) is int and d >= 0 for d in shape):
            raise ProtocolError(f"a shape must be at most {MAX_DIMS} non-negative integers, not {str(shape)[:80]}")
        if math.prod(d for d in shape if d) * dtype.itemsize > limit:   # NumPy refuses such shapes, even of 0 bytes
            raise ProtocolError(f"a shape of {str(shape)[:80]} is over the limit of {limit} bytes, counting its "
                                f"dimensions other than 0")
        nbytes = math.prod(shape) * dtype.itemsize
        total += nbytes
        if total > limit:
            raise ProtocolError(f"arrays of {total} bytes are over the limit of {limit}")
        out.append((dtype, tuple(shape), nbytes))
    return out


def recv_exact(sock: socket.socket, size: int) -> bytearray:
    """Reads exactly `size` bytes; raises EOFError if the peer closes first."""
    data = bytearray(size)
    _recv_into(sock, memoryview(data))
    return data


def _recv_into(sock: socket.socket, view: memoryview, deadline: float | None = None) -> None:
    """Fills `view` from `sock`; raises EOFError if the peer closes first, TimeoutError past `deadline`."""
    while view:
        view = view[_recv_some(sock, view, deadline):]


def _recv_some(sock: socket.socket, view: memoryview, deadline: float | None) -> int:
    """Reads at least one byte into `view`; returns how many. Raises EOFError if the peer closed, TimeoutError
    past `deadline`."""
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the rest of the frame did not arrive in time")
        sock.settimeout(left)
    n = sock.recv_into(view)
    if n == 0:
        raise EOFError("the connection was closed")
    return n

"""Keys and the handshake: both ends of a connection prove they hold an endpoint's key.

Each endpoint draws a random key and writes it, as hex, to a file only its
owner can read (`write_private`). On a new connection the endpoint sends
a magic string and a fresh nonce; the client answers with its own nonce and
HMAC-SHA256(key, "client" + both nonces), and the endpoint proves it back
with HMAC-SHA256(key, "server" + both nonces). The key never crosses the
socket. The endpoint's side (`ServerHandshake`) never blocks: the endpoint
advances many handshakes from one thread as their bytes arrive. A handshake
the endpoint drops because too many are under way (its limits) gets `BUSY`
in place of the proof, so the client can say so rather than blame the key.
"""

from __future__ import annotations

import hmac
import os
import secrets
import socket
import tempfile

from .wire import recv_exact

MAGIC = b"PWE1"
NONCE = 32
BUSY = b"PWE1 too many handshakes".ljust(NONCE, b".")   # sent in place of the proof by an endpoint that drops one


class AuthenticationError(ConnectionError):
    """One end of a connection does not hold the endpoint's key."""


def write_private(path: str, text: str) -> None:
    """Writes `text` and a newline to `path`, readable by its owner only (mode 0600), replacing any file."""
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".pw-")  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def read_key(path: str) -> bytes:
    """Returns the key an endpoint wrote to `path`."""
    with open(path) as f:
        text = f.read().strip()
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{path} does not hold an endpoint key") from None


def _proof(key: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.digest(key, role + server_nonce + client_nonce, "sha256")


class ServerHandshake:
    """The endpoint's side of one handshake on a non-blocking socket: `start()`, then `advance()` each
    time the socket is readable until it returns True (the client holds the key and has the proof)."""

    def __init__(self, sock: socket.socket, key: bytes):
        self.sock, self._key = sock, key
        self._nonce = secrets.token_bytes(NONCE)
        self._answer = bytearray()

    def start(self) -> None:
        """Sends the magic string and the endpoint's nonce (fits a fresh socket's buffer)."""
        self.sock.sendall(MAGIC + self._nonce)

    def advance(self) -> bool:
        """Reads what has arrived; returns True once the client proved it holds the key (the endpoint's
        proof is sent). Raises AuthenticationError for a wrong proof, EOFError if the client left."""
        try:
            data = self.sock.recv(2 * NONCE - len(self._answer))
        except BlockingIOError:
            return False
        if not data:
            raise EOFError("the client left during the handshake")
        self._answer += data
        if len(self._answer) < 2 * NONCE:
            return False
        client_nonce, proof = bytes(self._answer[:NONCE]), bytes(self._answer[NONCE:])
        if not hmac.compare_digest(proof, _proof(self._key, b"client", self._nonce, client_nonce)):
            raise AuthenticationError("the client does not hold the endpoint's key")
        self.sock.sendall(_proof(self._key, b"server", self._nonce, client_nonce))
        return True

    def refuse(self) -> None:
        """Tells the client its handshake is dropped because too many are under way (before it is closed)."""
        try:
            self.sock.send(BUSY)
            self.sock.recv(2 * NONCE)      # its answer, if it came: closed unread, it could reset BUSY away (TCP)
        except OSError:
            pass   # gone already, or nothing to read: it is closed all the same


def client_handshake(sock: socket.socket, key: bytes) -> None:
    """The client's side, on a blocking socket; raises AuthenticationError if either end lacks the key."""
    try:
        hello = recv_exact(sock, len(MAGIC) + NONCE)
    except EOFError:
        raise AuthenticationError("the endpoint closed the connection before the handshake") from None
    if hello[:len(MAGIC)] != MAGIC:
        raise AuthenticationError("the address is not a pathways-mlir endpoint")
    server_nonce, client_nonce = bytes(hello[len(MAGIC):]), secrets.token_bytes(NONCE)
    try:
        sock.sendall(client_nonce + _proof(key, b"client", server_nonce, client_nonce))
    except (BrokenPipeError, ConnectionResetError):
        pass   # the endpoint dropped the handshake already: what it sent says why
    try:
        proof = bytes(recv_exact(sock, NONCE))
    except (EOFError, ConnectionResetError):
        raise AuthenticationError("the endpoint refused the key") from None
    if proof == BUSY:
        raise AuthenticationError("the endpoint dropped the handshake: too many connections from this process "
                                  "(or host) were completing their handshakes at once; open fewer at a time")
    if not hmac.compare_digest(proof, _proof(key, b"server", server_nonce, client_nonce)):
        raise AuthenticationError("the endpoint does not hold the key")

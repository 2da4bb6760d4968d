"""What an endpoint allows each connection, and how many it serves (`Endpoint`, `pw-serve`'s options).

Kept apart from the wire format so that `pw-serve` reads its defaults without importing NumPy, which
starts threads: the service blocks its stop signals before any thread starts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


MAX_SECONDS = 1e9      # a timeout past this (about 31 years) bounds nothing, and a socket cannot take inf


@dataclass(frozen=True)
class Limits:
    """What an endpoint allows each connection, and how many it serves; each is an `Endpoint` option.

    - `max_header_bytes`: a frame's JSON header (8 MiB);
    - `max_array_bytes`: all the arrays of one frame together (4 GiB; a plan's compiled functions too);
    - `max_arrays`: the arrays of one frame, each a run's argument or a plan's compiled function (4096;
      each costs the endpoint a few hundred bytes, even of 0 bytes);
    - `max_plans`: the plans one connection holds (4096; a `RemoteClient` has the endpoint forget a plan
      once nothing holds it);
    - `max_plan_bytes`: the plans one connection holds together, each counted as its JSON with its compiled
      functions (1 GiB; a plan several connections load counts for each);
    - `max_objects`: the results one connection holds (65536; each costs the endpoint a few KiB, even of 0
      bytes, which device memory does not count);
    - `idle_timeout`: seconds a connection may send nothing, or take to send the rest of a frame, before
      it is dropped (120 s; a `RemoteClient` sends a keepalive every quarter of it; at most `MAX_SECONDS`,
      as `handshake_timeout`);
    - `handshake_timeout`: seconds a new connection has to prove it holds the key (10 s);
    - `max_connections`: connections served at once; the next is told so and closed (64);
    - `max_status_connections`: past `max_connections`, connections of the service's owner on its Unix socket
      that may ask for the full status only (`pw-serve --status` while the service is full), at once (4);
    - `max_pending`: handshakes under way at once; past it the oldest is dropped (256);
    - `max_pending_per_peer`: handshakes under way from one peer (a process on the Unix socket, a host
      on TCP); past it that peer's oldest is dropped (16).
    """

    max_header_bytes: int = 8 << 20
    max_array_bytes: int = 4 << 30
    max_arrays: int = 4096
    max_plans: int = 4096
    max_plan_bytes: int = 1 << 30
    max_objects: int = 1 << 16
    idle_timeout: float = 120.0
    handshake_timeout: float = 10.0
    max_connections: int = 64
    max_status_connections: int = 4
    max_pending: int = 256
    max_pending_per_peer: int = 16

    def __post_init__(self):
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"endpoint limit {name} must be a positive number, not {value!r}")
            if name.endswith("_timeout") and not value <= MAX_SECONDS:
                raise ValueError(f"endpoint limit {name} must be at most {MAX_SECONDS:g} seconds, not {value!r}")

    def to_python(self) -> dict:
        """Returns the limits as JSON-ready data (sent to every client when it connects)."""
        return asdict(self)

    @staticmethod
    def from_python(value) -> "Limits":
        """Reads what `to_python` wrote (unknown fields are ignored); raises ValueError if malformed."""
        if not isinstance(value, dict):
            raise ValueError("the endpoint's limits are not an object")
        known = {k: v for k, v in value.items() if k in Limits.__dataclass_fields__}
        return Limits(**known)

"""Execution traces in the Chrome/Perfetto JSON format.

One process per island and one track (thread) per device: every computation
and transfer appears on each device it uses, from the time it could start on
that device (enqueued, and the device's previous work done) until its outputs
were ready. A DCN transfer is a send slice on the sending island's devices
and a recv slice on the receiving island's, joined by a flow arrow.
Measuring readiness waits on every output, so tracing perturbs timing a
little; it is off unless asked for.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

from .workers import Workers


@dataclass(frozen=True)
class TraceEvent:
    """One step's work on its devices."""

    name: str
    kind: str
    island: str
    devices: tuple[int, ...]
    enqueued: float
    ready: float
    flow: tuple[str, int] | None = None    # ("out" | "in", id): the two ends of one DCN transfer


class Tracer:
    """Collects trace events and writes them as Chrome trace JSON."""

    def __init__(self):
        self.events: list[TraceEvent] = []
        self._lock = threading.Lock()
        self._pool = Workers(2, "pw-trace")
        self._pending: list[threading.Event] = []
        self._origin = time.perf_counter()

    def record(self, name: str, kind: str, island: str, devices, arrays, flow: tuple[str, int] | None = None) -> None:
        """Records a step enqueued now whose outputs are `arrays` (waited for off-thread); `flow` marks one end
        of a DCN transfer."""
        enqueued = time.perf_counter()

        done = threading.Event()

        def wait():
            try:
                for a in arrays:
                    a.block_until_ready()
                with self._lock:
                    self.events.append(TraceEvent(name, kind, island, tuple(devices), enqueued,
                                                  time.perf_counter(), flow))
            finally:
                done.set()
        with self._lock:
            self._pending.append(done)
        self._pool.submit(wait)

    def flush(self) -> list[TraceEvent]:
        """Waits for pending events; returns all events."""
        with self._lock:
            pending, self._pending = self._pending, []
        for done in pending:
            done.wait()
        with self._lock:
            return list(self.events)

    def to_chrome(self) -> dict:
        """Returns the trace as a Chrome trace-event object."""
        events = sorted(self.flush(), key=lambda e: e.enqueued)
        islands = sorted({e.island for e in events})
        out = [{"ph": "M", "name": "process_name", "pid": i, "args": {"name": island}}
               for i, island in enumerate(islands)]
        busy_until: dict[tuple[str, int], float] = {}
        for e in events:
            pid = islands.index(e.island)
            for d in e.devices:
                start = max(e.enqueued, busy_until.get((e.island, d), 0.0))
                end = max(start, e.ready)
                busy_until[(e.island, d)] = end
                out.append({"ph": "X", "name": e.name, "cat": e.kind, "pid": pid, "tid": d,
                            "ts": (start - self._origin) * 1e6, "dur": (end - start) * 1e6})
                if e.flow is not None and d == e.devices[0]:     # the arrow leaves a send's end, enters a recv
                    end_of_send = e.flow[0] == "out"
                    out.append({"ph": "s" if end_of_send else "f", "name": "dcn", "cat": "dcn", "id": e.flow[1],
                                "pid": pid, "tid": d, "ts": ((end if end_of_send else start) - self._origin) * 1e6,
                                **({} if end_of_send else {"bp": "e"})})
        for island in islands:
            for d in sorted({d for e in events if e.island == island for d in e.devices}):
                out.append({"ph": "M", "name": "thread_name", "pid": islands.index(island), "tid": d,
                            "args": {"name": f"device {d}"}})
        return {"traceEvents": out, "displayTimeUnit": "ms"}

    def close(self) -> None:
        """Stops the tracer's threads after the events under way."""
        self._pool.close()

    def write(self, path: str) -> None:
        """Writes the Chrome trace JSON to `path`."""
        with open(path, "w") as f:
            json.dump(self.to_chrome(), f)

"""The simulated timeline as a Chrome/Perfetto trace, in `pw-run --trace`'s format.

One process per island (and one for the controller), one thread per track:
each slice's devices (one track for a slice's whole device range, since
they run in lockstep: the trace stays O(slices)), the island's host thread,
and each link a transfer leaves by. Every event is marked simulated.
"""

from __future__ import annotations

from .engine import SimResult


def to_chrome(result: SimResult) -> dict:
    """Returns the spans of `result` as a Chrome trace-event object."""
    islands = sorted({s.island for s in result.spans})
    names = {i: (i or "controller") + " (simulated)" for i in islands}
    out = [{"ph": "M", "name": "process_name", "pid": p, "args": {"name": names[i]}} for p, i in enumerate(islands)]
    tracks: dict[tuple[str, str], int] = {}
    for span in result.spans:
        key = (span.island, span.track)
        if key not in tracks:
            tracks[key] = len(tracks)
            out.append({"ph": "M", "name": "thread_name", "pid": islands.index(span.island), "tid": tracks[key],
                        "args": {"name": span.track}})
        out.append({"ph": "X", "name": span.name, "cat": span.kind, "pid": islands.index(span.island),
                    "tid": tracks[key], "ts": span.start * 1e6, "dur": (span.end - span.start) * 1e6,
                    "args": {"simulated": True}})
    return {"traceEvents": out, "displayTimeUnit": "ms"}

"""ICI and DCN links with contention.

A copy inside an island holds its source slice's ICI egress and its
destination slice's ICI ingress; a DCN move holds the source slice's DCN
egress and the destination slice's DCN ingress. Each link serves transfers
one at a time in the order they are issued (a DMA queue), each for its bytes
per device over the link's bandwidth; the data then arrives one latency
later. Links are per slice, so the state is O(slices), never O(devices).
"""

from __future__ import annotations

from .profile import LinkSpec


class Links:
    """The time each link is next free."""

    def __init__(self):
        self.free_at: dict[tuple, float] = {}

    def transfer(self, ready: float, keys: tuple[tuple, ...], nbytes: int, spec: LinkSpec) -> tuple[float, float]:
        """Schedules `nbytes` over the links `keys` once `ready`; returns (start, arrival)."""
        start = max([ready, *(self.free_at.get(k, 0.0) for k in keys)])
        done = start + spec.serialise_seconds(nbytes)
        for k in keys:
            self.free_at[k] = done
        return start, done + spec.latency_us * 1e-6

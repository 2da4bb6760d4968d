"""ICI and DCN links with contention, and the all-reduce inside a launch.

A copy inside an island holds its source slice's ICI egress and its
destination slice's ICI ingress; a DCN move holds the source slice's DCN
egress and the destination slice's DCN ingress. Each link serves transfers
one at a time in the order they are issued (a DMA queue), each for its bytes
per device over the link's bandwidth; the data then arrives one latency
later. Links are per slice, so the state is O(slices), never O(devices).

An all-reduce that combines a launch's output across the devices that
computed its parts (dialect/device_time.py says which) is a ring
all-reduce on the ICI: each of `n` devices sends and receives 2(n-1)/n of
the buffer in 2(n-1) latency-bound steps (Patarasuk and Yuan, "Bandwidth
optimal all-reduce algorithms for clusters of workstations", JPDC 2009).
It holds the launch's devices, so it adds to the launch's time. An
all-reduce across islands is what a program writes as an exchange of
shards (sends and recvs over the DCN links above, then an add), so the
DCN's bandwidth and contention time it.
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


def all_reduce_seconds(nbytes: int, devices: int, spec: LinkSpec) -> float:
    """Returns the time of a ring all-reduce of `nbytes` per device among `devices` devices over `spec`."""
    if devices < 2:
        return 0.0
    steps = 2 * (devices - 1)
    return spec.serialise_seconds(nbytes * steps / devices) + steps * spec.latency_us * 1e-6

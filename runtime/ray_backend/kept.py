"""Results kept on their island actors and passed to later runs: what the driver sends in their place.

A handle passed for an input on the island that keeps its result goes as a
`StoreRef`; for an input on another island, as a `PeerRef`, which the
receiving island pulls from the keeping one over the data plane
(`data_plane.py`), while the keeping island is told to offer it (a `Lend`)
in the same start message, so before any later release reaches it. Where the
data plane cannot carry it (an island without a transfer server) the driver
fetches the value and sends it with the start, as before.

A reference is pinned from the call that takes it until the start message
carrying it is sent (or its run fails before that): a release of the result
meanwhile (its handle dropped while the run waits for admission) is held
back and leaves after that message, so a release never overtakes the start
that reads the object; if the run is cancelled while queued, it leaves at
once (`RayIslands.unpin`). A run taking a result whose island was lost
meanwhile (and maybe restored, fresh) is not sent: it fails with the
`IslandLost` that reading the result raises (`lost`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from pathways_mlir.dialect.plan import ProgramPlan

from ..island_work import REFERENCES, IslandWork, PeerRef
from ..run import Run
from .data_plane import Lend, carries, slice_devices, transfer_layout

if TYPE_CHECKING:
    from .cluster import RayIslands
    from .proxy import RayIsland


class KeptArguments:
    """A Ray runtime's references to kept results: how each goes, and the pins that hold their releases."""

    def __init__(self, islands: "RayIslands"):
        self._islands = islands
        self._lock = threading.Lock()
        self._pins: dict[tuple[int, int], list[Run]] = {}      # result -> the runs whose start is not sent yet
        self._held_back: dict[tuple[int, int], "RayIsland"] = {}   # pinned results released meanwhile

    def peer_reference(self, run: Run, buffer: int, plan: ProgramPlan, input_buffer: int) -> PeerRef | None:
        """A `PeerRef` to buffer `buffer` of `run` for `plan`'s input `input_buffer` on another island; None
        where the data plane cannot carry it, or the keeping island's actor is dead or lost the result
        (the driver's fetch then raises why)."""
        holder = self._islands[run.island_of(buffer)]
        receiver = self._islands[plan.island_of(input_buffer)]
        if not (holder.transfers and receiver.transfers) or holder.lost_result(run.id) is not None or \
                not carries(run.plan.buffers[buffer].shape):
            return None
        layout = transfer_layout(run.plan, buffer, slice_devices(plan, input_buffer))
        info = run.plan.buffers[buffer]
        return PeerRef(run.id, buffer, run.key, holder.name, info.dtype, layout.mesh_shape, layout.axes,
                       info.sharding)

    def pin(self, run: Run, keys) -> None:
        """`run` takes the kept results `keys` ((run id, buffer) pairs): their releases wait for its start."""
        with self._lock:
            for key in keys:
                self._pins.setdefault(key, []).append(run)

    def sent(self, run: Run) -> bool:
        """`run`'s start message left (or never will): its pins go, and the releases they held back are queued
        on their islands. Returns whether there were any."""
        if not self._pins:
            return False
        released = []
        with self._lock:
            for key, runs in list(self._pins.items()):
                runs[:] = [r for r in runs if r is not run]
                if not runs:
                    del self._pins[key]
                    if key in self._held_back:
                        released.append((self._held_back.pop(key), key))
        for island, (run_id, buffer) in released:
            island.release(run_id, buffer)
        return bool(released)

    def lost(self, works: dict[str, IslandWork]) -> BaseException | None:
        """The error of a kept result that `works` take by reference and whose island lost it (its actor died,
        maybe restored since), else None: such a run is not sent (`RayIslands.start`)."""
        if self._pins:
            for name, work in works.items():
                for _, value in work.inputs:
                    if isinstance(value, REFERENCES):
                        holder = self._islands[value.island if isinstance(value, PeerRef) else name]
                        error = holder.lost_result(value.run_id)
                        if error is not None:
                            return error
        return None

    def hold_back(self, island: "RayIsland", key: tuple[int, int]) -> bool:
        """Whether the release of `key` on `island` waits (a run whose start is not sent takes it)."""
        if not self._pins:
            return False
        with self._lock:
            if key not in self._pins:
                return False
            self._held_back[key] = island
            return True

    def lends(self, run: Run, works: dict[str, IslandWork]) -> dict[str, list[Lend]]:
        """What each keeping island is told to offer for `run`'s `PeerRef` arguments, by island."""
        lends: dict[str, list[Lend]] = {}
        if self._pins:
            for name, work in works.items():
                for buffer, value in work.inputs:
                    if isinstance(value, PeerRef) and self._islands[value.island]._dead is None:
                        lends.setdefault(value.island, []).append(
                            Lend(value.run_id, value.buffer, value.plan_key, run.id, buffer, name, value.mesh_shape))
        return lends

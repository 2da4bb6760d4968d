"""The results that live handles hold on devices, as the gang scheduler reserves them, and the readers of
shared objects (`runtime/shared.py`).

A result of a run that is over keeps its bytes reserved in the ledger until its handle is released (or
its client closes). A shared object is counted once, for its owner; from its submission until it is
over, a run that reads one is one of the object's readers, and an owner's release of an object still
read takes effect (its bytes go back) when the last reader is over. Every method is called under the
scheduler's lock.
"""

from __future__ import annotations

from .admission import MemoryLedger, Need, result_need
from .run import Run


class HeldResults:
    """The results held on devices by handles, by (run id, buffer), and the runs reading shared ones."""

    def __init__(self, ledger: MemoryLedger):
        self.ledger = ledger
        self.held: dict[tuple[int, int], tuple[int, Need]] = {}   # (run, buffer) -> (client, need)
        self.gone: set[int] = set()       # closed clients: results of their runs are not kept
        self._readers: dict[tuple[int, int], int] = {}   # shared object -> its runs submitted and not over
        self.unshared: set[tuple[int, int]] = set()      # shared objects released while read: kept till then

    def check_shareable(self, run: Run, buffer: int) -> None:
        """Raises ValueError unless the result is held on devices (a run that is over, not released)."""
        key = (run.id, buffer)
        if run.island_of(buffer) is None:
            raise ValueError(f"buffer {buffer} of run {run.id} of {run.plan.program} cannot be shared: the host "
                             f"keeps it (a pw.cond's result that the program returns as it is; pass it through a "
                             f"placed function to keep it on an island)")
        if key not in self.held or key in self.unshared:
            raise ValueError(f"buffer {buffer} of run {run.id} of {run.plan.program} cannot be shared: it is "
                             f"not held on devices (released, its run failed, or its run is not over)")

    def release(self, run: Run, buffer: int, donated: bool = False) -> bool:
        """A result's handle was released (`GangScheduler.release_result` marked it in `run.released` first);
        returns whether bytes went back to the ledger now."""
        key = (run.id, buffer)
        if key not in self.held:         # never held, or gone (with its island): nothing to give back, now or later
            return False
        if self._readers.get(key):
            self.unshared.add(key)
            return False
        if donated:
            return False
        self.ledger.give(self.held.pop(key)[1])
        return True

    def release_client(self, client_id: int) -> None:
        """A client closed: the bytes of every result it held go back (those still read, once they are not)."""
        self.gone.add(client_id)
        for key in [k for k, (c, _) in self.held.items() if c == client_id]:
            if self._readers.get(key):
                self.unshared.add(key)
            else:
                self.ledger.give(self.held.pop(key)[1])

    def forget_island(self, island: str) -> None:
        """An island was lost: the results it held are gone (their handles raise `IslandLost`), and their bytes
        go back, so that the island restored in its place starts empty."""
        for key in [k for k, (_, need) in self.held.items() if island in need]:
            self.ledger.give(self.held.pop(key)[1])
            self.unshared.discard(key)

    def donated_needs(self, run: Run) -> list[Need]:
        """Returns the needs of the held results donated to `run`."""
        return [self.held[k][1] for k in run.donations if k in self.held]

    def hand_over(self, run: Run) -> None:
        """The results donated to `run` stop being held: admitted, its peak counts them; failed, they are gone."""
        for key in run.donations:
            held = self.held.pop(key, None)
            if held is not None:
                self.ledger.give(held[1])

    def keep(self, run: Run) -> None:
        """`run` is over: reserves the bytes of each of its results that a live handle still holds (a cond's
        result that the host kept on an island's devices too: `Run.on_devices`). A cond's branch run
        (`run.parent`) keeps nothing: its results lie within its parent's reservation, and its cond's thread
        releases them before the parent goes on."""
        if run.error is not None or run.client_id in self.gone or run.parent is not None:
            return
        on_devices = run.on_devices or {}
        for buffer in run.plan.distinct_outputs:
            if buffer in run.released:
                continue
            need = on_devices[buffer][1] if buffer in on_devices else result_need(run.plan, buffer)
            if need:
                self.ledger.take(need)
                self.held[(run.id, buffer)] = (run.client_id, need)

    def read(self, run: Run) -> None:
        """Counts `run` as a reader of the shared objects it reads; raises ValueError if one was released."""
        for key in run.reads:
            if key not in self.held or key in self.unshared:
                raise ValueError(f"program {run.plan.program} reads a shared object (buffer {key[1]} of run "
                                 f"{key[0]}) that its owner has released")
        for key in run.reads:
            self._readers[key] = self._readers.get(key, 0) + 1

    def unread(self, run: Run) -> None:
        """`run` is over (or never ran): an object it read that its owner released, read by no other run in
        flight, gives its bytes back now."""
        for key in run.reads:
            left = self._readers.get(key, 0) - 1
            if left > 0:
                self._readers[key] = left
                continue
            self._readers.pop(key, None)
            if key in self.unshared:
                self.unshared.discard(key)
                self.ledger.give(self.held.pop(key)[1])
        run.reads = ()

"""Per-run admission: the device memory ledger the gang scheduler admits runs against.

A run needs, on each island it uses, its plan's static peak (`pw.peak_bytes`:
bytes per device over device ranges). The ledger reserves that whole peak
when the run is admitted and gives it back once the run's device work is
over, keeping only the bytes of the results still held by handles, which
it gives back when they are released. Admission happens in ticket order on
the scheduler's side, so every island agrees, and no step ever waits for
memory on an island. A run that would not fit even once every run in flight
is over fails at once (see `runtime/scheduler.py`).
"""

from __future__ import annotations

from pathways_mlir.dialect.memory_plan import peak
from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.dialect.topology import Topology

# island -> (begin, end, bytes per device) ranges
Need = dict[str, list[tuple[int, int, int]]]
NEVER_CACHED = 1024      # needs whose verdict (`MemoryLedger.never_fits`) is kept at most


class OutOfDeviceMemory(MemoryError):
    """A run whose static peak can never fit a device's memory, or not while results held by handles stay."""


def run_need(plan: ProgramPlan, stored: frozenset[int] = frozenset()) -> Need:
    """Returns a run's static peak per island, from its plan (with frees and peaks); with `stored`, the peak
    of a run whose input buffers `stored` are objects the store already holds where the run reads them (a
    shared object), which the ledger counts once, for their owner.

    A plan with host conds needs, beside its own peak, the largest need of its branch plans (theirs with
    their own conds'): a branch run is admitted within its parent's reservation (`Dispatcher.start`). A
    parent waiting for its branch's memory while it holds its own could wait for ever on another parent
    doing the same."""
    if not stored:
        need = {island: plan.peak(island) for island in plan.islands if plan.peak(island)}
    else:
        need = {}
        for island, steps in plan.islands.items():
            flat = peak(plan, island, steps, stored)
            if flat:
                need[island] = [tuple(flat[i:i + 3]) for i in range(0, len(flat), 3)]
    branches = [run_need(branch) for cond in plan.host_steps for branch in (cond.then_plan, cond.else_plan)]
    return beside_largest(need, branches) if branches else need


def by_device_range(need: Need) -> dict[str, int]:
    """Returns a need's bytes per device keyed by the device range they are needed on ("island0 devices 0-3")."""
    return {f"{island} devices {b}-{e - 1}": nbytes for island, ranges in need.items() for b, e, nbytes in ranges}


def beside_largest(need: Need, others: list[Need]) -> Need:
    """Returns `need` plus, on every device, the largest of `others` there (in ranges that do not overlap)."""
    combined: Need = {}
    for island in sorted({*need, *(i for other in others for i in other)}):
        every = (need, *others)
        points = sorted({p for n in every for begin, end, _ in n.get(island, ()) for p in (begin, end)})
        ranges: list[tuple[int, int, int]] = []
        for begin, end in zip(points, points[1:]):
            def on(n: Need) -> int:
                return sum(nbytes for b, e, nbytes in n.get(island, ()) if b <= begin and end <= e)
            nbytes = on(need) + max(map(on, others), default=0)
            if nbytes:
                add_range(ranges, begin, end, nbytes)
        if ranges:
            combined[island] = ranges
    return combined


def add_range(ranges: list[tuple[int, int, int]], begin: int, end: int, nbytes: int) -> None:
    """Appends devices `[begin, end)` of `nbytes` each to an island's `ranges` (in device order), extending the
    last range if it ends at `begin` with as many bytes per device."""
    if ranges and ranges[-1][1] == begin and ranges[-1][2] == nbytes:
        ranges[-1] = (ranges[-1][0], end, nbytes)
    else:
        ranges.append((begin, end, nbytes))


def result_need(plan: ProgramPlan, buffer: int) -> Need:
    """Returns what one result keeps on its devices once the run is over."""
    info = plan.buffers[buffer]
    if info.slice is None:
        return {}
    placement = plan.slices[info.slice]
    return {placement.island: [(b, e, info.bytes_per_device) for b, e in placement.ranges]}


class MemoryLedger:
    """Bytes reserved on every device of every island. Not thread-safe: the scheduler locks around it."""

    def __init__(self, topology: Topology, device_memory_bytes: int | None = None):
        self.capacity = {i.name: device_memory_bytes or i.device_memory_bytes for i in topology.islands}
        # Plain lists: a slice's max is one C call, and the few devices of a range are cheap to add to.
        self.used = {i.name: [0] * i.num_devices for i in topology.islands}
        self._never: dict[int, tuple[Need, str | None]] = {}   # id(need) -> (need, its verdict)

    def never_fits(self, need: Need) -> str | None:
        """Returns why `need` could never fit, even on empty devices, or None if it could. Cached per need
        object (a plan's need is one object for all its runs): the entry keeps the need, so that no other need
        made at its address once it is gone takes its verdict, and the cache is emptied at `NEVER_CACHED`
        entries (a cond's branch runs each have a need of their own)."""
        cached = self._never.get(id(need))
        if cached is not None and cached[0] is need:
            return cached[1]
        if len(self._never) >= NEVER_CACHED:
            self._never.clear()
        verdict = self._never_fits(need)
        self._never[id(need)] = (need, verdict)
        return verdict

    def _never_fits(self, need: Need) -> str | None:
        for island, ranges in need.items():
            for begin, end, nbytes in ranges:
                if nbytes > self.capacity[island]:
                    return (f"needs {nbytes} bytes on device {begin} of {island}, which has only "
                            f"{self.capacity[island]} bytes: it can never fit")
        return None

    def fits(self, need: Need) -> bool:
        """Returns whether `need` fits next to what is reserved now."""
        for island, ranges in need.items():
            used, capacity = self.used[island], self.capacity[island]
            for begin, end, nbytes in ranges:
                if max(used[begin:end]) + nbytes > capacity:
                    return False
        return True

    def within(self, need: Need) -> bool:
        """Returns whether what is reserved now on the devices of `need` is within their capacity: whether
        `need`, reserved among it, would fit again once given back (a need's ranges do not overlap)."""
        for island, ranges in need.items():
            used, capacity = self.used[island], self.capacity[island]
            for begin, end, _ in ranges:
                if max(used[begin:end]) > capacity:
                    return False
        return True

    def take(self, need: Need) -> None:
        """Reserves `need`."""
        for island, ranges in need.items():
            used = self.used[island]
            for begin, end, nbytes in ranges:
                used[begin:end] = [u + nbytes for u in used[begin:end]]

    def rows(self, need: Need) -> dict[str, list[int]]:
        """Returns a copy of what is reserved on the islands of `need`, which `restore` puts back: a caller
        interrupted (Ctrl-C) between `take` and recording what it took undoes it exactly, wherever in `take` the
        interrupt landed."""
        return {island: self.used[island][:] for island in need}

    def restore(self, rows: dict[str, list[int]]) -> None:
        """Puts back the reservations `rows` copied."""
        self.used.update(rows)

    def give(self, need: Need) -> None:
        """Gives `need` back."""
        for island, ranges in need.items():
            used = self.used[island]
            for begin, end, nbytes in ranges:
                used[begin:end] = [u - nbytes for u in used[begin:end]]

    def fits_beside(self, need: Need, other: Need) -> bool:
        """Returns whether `need` fits next to what is reserved now plus `other`."""
        combined = self.copy()
        combined.take(other)
        return combined.fits(need)

    def first_short(self, need: Need) -> tuple[str, int, int, int] | None:
        """Returns (island, device, bytes needed, bytes reserved) of the first device where `need` does not
        fit now, or None if it fits everywhere."""
        for island, ranges in need.items():
            used, capacity = self.used[island], self.capacity[island]
            for begin, end, nbytes in ranges:
                device = max(range(begin, end), key=lambda d: used[d])
                if used[device] + nbytes > capacity:
                    return island, device, nbytes, used[device]
        return None

    def copy(self) -> "MemoryLedger":
        """Returns a ledger with the same capacities and reservations, to reason about without changing this one."""
        other = MemoryLedger.__new__(MemoryLedger)
        other.capacity = self.capacity
        other.used = {island: list(used) for island, used in self.used.items()}
        other._never = self._never
        return other

    def usage(self) -> dict[tuple[str, int], int]:
        """Returns the bytes reserved on each device, by (island, device)."""
        return {(island, d): int(n) for island, used in self.used.items() for d, n in enumerate(used)}

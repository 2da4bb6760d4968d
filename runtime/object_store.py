"""The object store: the results runs leave on an island's devices, with owners.

Buffers stay on their devices; a client holds opaque handles to them. The
store keeps each result's array under (run id, buffer id) with its owner (a
client); releasing an owner releases everything it owns. Memory is not
accounted here: the gang scheduler's ledger (`admission.py`) reserves a
run's whole static peak before it starts and keeps a result's bytes until
its handle is released.
"""

from __future__ import annotations

from typing import Any, Hashable

ObjectKey = tuple[int, int]   # (run id, buffer id)


class ObjectStore:
    """Arrays by key, and each one's owner. Not thread-safe: the island locks around it.

    An array and its owner are kept in two dicts by the same key, not as a pair: a pair is one more object
    per result for Python's garbage collector, and a step over a pytree keeps hundreds of results. No index
    of each owner's keys is kept: a step over a pytree adds and releases hundreds of results a call, and
    keeping the index was about a sixth of a result's bookkeeping on each side, where an owner's keys are
    looked for only when it closes or is asked about (`release_owner`, `owned_by`), which look at every
    object here, as `Island.status` and the scheduler's release of a closed client's bytes do."""

    def __init__(self):
        self._objects: dict[ObjectKey, Any] = {}
        self._owners: dict[ObjectKey, Hashable] = {}
        self.get = self._objects.get
        """get(key) returns the array under `key`, or None if there is none (released, or not produced)."""

    def add(self, key: ObjectKey, owner: Hashable, array: Any) -> None:
        """Keeps `array` under `key` for `owner`."""
        self._objects[key] = array
        self._owners[key] = owner

    def release(self, key: ObjectKey) -> bool:
        """Drops an object; returns whether there was one."""
        if self._owners.pop(key, None) is None:
            return False
        del self._objects[key]
        return True

    def release_run(self, run_id: int) -> int:
        """Releases every object of one run (it failed); returns how many there were."""
        keys = [key for key in self._objects if key[0] == run_id]
        for key in keys:
            self.release(key)
        return len(keys)

    def release_owner(self, owner: Hashable) -> int:
        """Releases every object of `owner`; returns how many there were."""
        keys = [key for key, held_by in self._owners.items() if held_by == owner]
        for key in keys:
            del self._objects[key]
            del self._owners[key]
        return len(keys)

    def owned_by(self, owner: Hashable) -> list[ObjectKey]:
        """Returns the keys of the objects `owner` holds."""
        return sorted(key for key, held_by in self._owners.items() if held_by == owner)

    def keys(self) -> list[ObjectKey]:
        """Returns the key of every object."""
        return list(self._objects)

    def owners(self) -> list[tuple[Hashable, Any]]:
        """Returns (owner, array) for every object."""
        return [(self._owners[key], array) for key, array in self._objects.items()]

    def __len__(self) -> int:
        return len(self._objects)

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
    """Arrays by key, and the keys of each owner. Not thread-safe: the island locks around it.

    An array and its owner are kept in two dicts by the same key, not as a pair: a pair is one more object
    per result for Python's garbage collector, and a step over a pytree keeps hundreds of results."""

    def __init__(self):
        self._objects: dict[ObjectKey, Any] = {}
        self._owners: dict[ObjectKey, Hashable] = {}
        self._by_owner: dict[Hashable, set[ObjectKey]] = {}
        self.get = self._objects.get
        """get(key) returns the array under `key`, or None if there is none (released, or not produced)."""

    def add(self, key: ObjectKey, owner: Hashable, array: Any) -> None:
        """Keeps `array` under `key` for `owner`."""
        self._objects[key] = array
        self._owners[key] = owner
        keys = self._by_owner.get(owner)         # (no `setdefault(owner, set())`: a set made per result)
        if keys is None:
            keys = self._by_owner[owner] = set()
        keys.add(key)

    def release(self, key: ObjectKey) -> bool:
        """Drops an object; returns whether there was one."""
        owner = self._owners.pop(key, None)
        if owner is None:
            return False
        del self._objects[key]
        self._by_owner[owner].discard(key)
        return True

    def release_run(self, run_id: int) -> int:
        """Releases every object of one run (it failed); returns how many there were."""
        keys = [key for key in self._objects if key[0] == run_id]
        for key in keys:
            self.release(key)
        return len(keys)

    def release_owner(self, owner: Hashable) -> int:
        """Releases every object of `owner`; returns how many there were."""
        keys = self._by_owner.pop(owner, set())
        for key in keys:
            self._objects.pop(key, None)
            self._owners.pop(key, None)
        return len(keys)

    def owned_by(self, owner: Hashable) -> list[ObjectKey]:
        """Returns the keys of the objects `owner` holds."""
        return sorted(self._by_owner.get(owner, ()))

    def keys(self) -> list[ObjectKey]:
        """Returns the key of every object."""
        return list(self._objects)

    def owners(self) -> list[tuple[Hashable, Any]]:
        """Returns (owner, array) for every object."""
        return [(self._owners[key], array) for key, array in self._objects.items()]

    def __len__(self) -> int:
        return len(self._objects)

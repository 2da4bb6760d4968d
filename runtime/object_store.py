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
    """Arrays by key, and the keys of each owner. Not thread-safe: the island locks around it."""

    def __init__(self):
        self._objects: dict[ObjectKey, tuple[Hashable, Any]] = {}
        self._by_owner: dict[Hashable, set[ObjectKey]] = {}

    def add(self, key: ObjectKey, owner: Hashable, array: Any) -> None:
        """Keeps `array` under `key` for `owner`."""
        self._objects[key] = (owner, array)
        keys = self._by_owner.get(owner)         # (no `setdefault(owner, set())`: a set made per result)
        if keys is None:
            keys = self._by_owner[owner] = set()
        keys.add(key)

    def get(self, key: ObjectKey) -> Any:
        """Returns the array under `key`, or None if there is none (released, or not produced)."""
        found = self._objects.get(key)
        return None if found is None else found[1]

    def release(self, key: ObjectKey) -> bool:
        """Drops an object; returns whether there was one."""
        found = self._objects.pop(key, None)
        if found is None:
            return False
        keys = self._by_owner.get(found[0])
        if keys is not None:
            keys.discard(key)
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
        return len(keys)

    def owned_by(self, owner: Hashable) -> list[ObjectKey]:
        """Returns the keys of the objects `owner` holds."""
        return sorted(self._by_owner.get(owner, ()))

    def keys(self) -> list[ObjectKey]:
        """Returns the key of every object."""
        return list(self._objects)

    def owners(self) -> list[tuple[Hashable, Any]]:
        """Returns (owner, array) for every object."""
        return list(self._objects.values())

    def __len__(self) -> int:
        return len(self._objects)

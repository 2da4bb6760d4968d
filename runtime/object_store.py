"""The object store: device buffers behind opaque handles, with owners.

Buffers stay on their devices; the store keeps, for every object, a future of
its JAX array, the devices it occupies and its size per device, and its
owner (a client, or a client's program run for intermediates). Releasing an
owner releases everything it owns.

Memory is accounted per device from the sizes the plan knows up front.
`reserve` implements back-pressure: a launch whose outputs would exceed a
device's memory waits until other objects are released; one that could never
fit fails at once with `OutOfDeviceMemory`.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Hashable, Iterable

DeviceKey = tuple[str, int]   # (island, island-local device id)
ObjectKey = Hashable


class OutOfDeviceMemory(MemoryError):
    """An object larger than a device's whole memory."""


@dataclass
class StoredObject:
    """One logical (possibly sharded) buffer."""

    key: ObjectKey
    owner: Hashable
    devices: tuple[DeviceKey, ...]
    bytes_per_device: int
    future: Future | None = field(default_factory=Future)


class ObjectStore:
    """Buffers by key, their owners, and per-device memory accounting."""

    def __init__(self, capacity: dict[DeviceKey, int]):
        self._capacity = dict(capacity)
        self._used = {d: 0 for d in capacity}
        self._objects: dict[ObjectKey, StoredObject] = {}
        self._by_owner: dict[Hashable, set[ObjectKey]] = {}
        self._changed = threading.Condition()

    # -- memory ------------------------------------------------------------

    def reserve(self, devices: Iterable[DeviceKey], nbytes: int, timeout: float | None = None,
                what: str = "a buffer") -> None:
        """Takes `nbytes` on each device, waiting for frees if needed (back-pressure)."""
        devices = tuple(devices)
        for d in devices:
            if nbytes > self._capacity[d]:
                raise OutOfDeviceMemory(
                    f"{what} needs {nbytes} bytes on device {d[1]} of {d[0]}, which has only "
                    f"{self._capacity[d]} bytes: it can never fit")
        with self._changed:
            fits = lambda: all(self._used[d] + nbytes <= self._capacity[d] for d in devices)  # noqa: E731
            if not self._changed.wait_for(fits, timeout):
                raise TimeoutError(f"{what} waited {timeout} s for {nbytes} bytes of device memory")
            for d in devices:
                self._used[d] += nbytes

    def usage(self) -> dict[DeviceKey, int]:
        """Returns the bytes in use on each device."""
        with self._changed:
            return dict(self._used)

    # -- objects -----------------------------------------------------------

    def add(self, key: ObjectKey, owner: Hashable, devices: Iterable[DeviceKey], bytes_per_device: int,
            future: Future | None = None, timeout: float | None = None) -> StoredObject:
        """Registers an object whose array `future` will hold, reserving its memory first.

        Blocks while the devices lack room (back-pressure).
        """
        devices = tuple(devices)
        self.reserve(devices, bytes_per_device, timeout, what=f"buffer {key}")
        obj = StoredObject(key, owner, devices, bytes_per_device, future or Future())
        with self._changed:
            self._objects[key] = obj
            self._by_owner.setdefault(owner, set()).add(key)
        return obj

    def get(self, key: ObjectKey) -> StoredObject:
        """Returns the object stored under `key` (KeyError if released)."""
        with self._changed:
            return self._objects[key]

    def release(self, key: ObjectKey) -> None:
        """Drops an object and frees its memory; releasing twice is a no-op."""
        with self._changed:
            obj = self._objects.pop(key, None)
            if obj is None:
                return
            self._by_owner.get(obj.owner, set()).discard(key)
            for d in obj.devices:
                self._used[d] -= obj.bytes_per_device
            self._changed.notify_all()
        obj.future = None  # drop the array: its device memory goes back to JAX

    def release_owner(self, owner: Hashable) -> int:
        """Releases every object of `owner`; returns how many there were."""
        with self._changed:
            keys = list(self._by_owner.pop(owner, ()))
        for key in keys:
            self.release(key)
        return len(keys)

    def owned_by(self, owner: Hashable) -> list[ObjectKey]:
        """Returns the keys of the objects `owner` holds."""
        with self._changed:
            return sorted(self._by_owner.get(owner, ()), key=repr)

    def __len__(self) -> int:
        with self._changed:
            return len(self._objects)

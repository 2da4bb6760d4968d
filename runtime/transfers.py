"""Data movement between devices: ICI copies inside an island, DCN between islands.

Inside an island a move is a device-to-device copy (`jax.device_put` to the
destination sharding, which also reshards), or none at all when every
destination device already holds its shard (its array is then assembled
from those shards). Between islands the embedded
backend emulates the datacenter network: the move waits until the source
buffer is ready, sleeps for the DCN link's modelled time (latency plus bytes
over bandwidth) when emulation is on, then makes the real copy. DCN moves run
on a transport thread pool, never on an island's dispatch thread, and end in
the receiving island's `deliver` message.
"""

from __future__ import annotations

import functools
import time
from typing import Callable

from pathways_mlir.dialect.topology import Link

from .workers import Workers


def copy_to(array, sharding):
    """Returns `array` on the devices and in the layout of `sharding` (ICI move)."""
    import jax

    if getattr(array, "sharding", None) == sharding:
        return array
    return jax.device_put(array, sharding)


def fresh_copy(array, sharding):
    """Returns `array` on the devices and in the layout of `sharding` in buffers of its own: `copy_to` returns
    an array already there as it is, and JAX 0.10's move reuses a shard already on its device even when told
    not to alias (`may_alias=False`), which it honours for a copy onto an array's own sharding."""
    import jax

    return jax.device_put(copy_to(array, sharding), sharding, may_alias=False)


def shards_in_place(src, dst, shape) -> bool:
    """Whether every device of sharding `dst` already holds, under sharding `src`, the shard `dst` puts there:
    a move from `src` to `dst` then copies nothing (`assemble_in_place`)."""
    have = src.devices_indices_map(tuple(shape))
    return all(have.get(device) == index for device, index in dst.devices_indices_map(tuple(shape)).items())


def through_host(src, dst, shape) -> bool:
    """Whether `jax.device_put` moves an array from sharding `src` to `dst` through the host: in jax 0.10,
    an array on several devices is fetched whole and put again when some shard `dst` puts on a device is
    none of `src`'s shards (`shard_sharded_device_array_slow_path`)."""
    if len(src.device_set) == 1:
        return False
    have = {_bounds(index) for index in src.devices_indices_map(tuple(shape)).values()}
    return any(_bounds(index) not in have for index in dst.devices_indices_map(tuple(shape)).values())


def _bounds(index: tuple[slice, ...]) -> tuple:
    """A shard's index (slices, unhashable before Python 3.12) as a hashable tuple."""
    return tuple((s.start, s.stop, s.step) for s in index)


def assemble_in_place(array, sharding):
    """Returns the array of `sharding` made of `array`'s own shards on its devices, without copying them
    (`shards_in_place` must hold); shards on other devices are left to `array`."""
    return in_place_assembly(array.sharding, sharding, array.shape, array.dtype)(array)


@functools.lru_cache(maxsize=256)
def in_place_assembly(src, dst, shape: tuple, dtype) -> Callable:
    """Returns the function that makes, out of an array of sharding `src` (of `shape` and `dtype`), the array
    of sharding `dst` from the shards it already has on `dst`'s devices (`shards_in_place` must hold). Built
    once per move: a call picks the shards by position and makes the array without JAX's checks of them,
    which hold by construction; on an array just computed that is about 40 us less than
    `jax.make_array_from_single_device_arrays` on these machines (it checks each shard's device, shape and
    dtype, and `addressable_shards` builds a `Shard` per device). JAX's array constructor and its shards in
    device order (`_arrays`) are not public: jax is pinned below 0.11."""
    from jax._src import core as jax_core           # the aval of an array of `dst`, as JAX builds it
    from jax._src.array import ArrayImpl

    position = {device: i for i, device in enumerate(src._addressable_device_assignment)}
    picks = tuple(position[device] for device in dst._addressable_device_assignment)
    aval = jax_core.update_aval_with_sharding(jax_core.ShapedArray(tuple(shape), dtype, weak_type=False), dst)

    def assemble(array):
        shards = array._arrays
        return ArrayImpl(aval, dst, [shards[i] for i in picks], committed=True, _skip_checks=True)
    return assemble


class DcnTransport:
    """Moves buffers between islands, emulating the DCN link when asked."""

    def __init__(self, emulate: bool = False, workers: int = 4, always: bool = False):
        self.emulate = emulate
        # Inline: hand the array over at once (JAX copies asynchronously); else on a transport thread.
        self.inline = not (emulate or always)
        self._pool = Workers(workers, "pw-dcn")

    def send(self, array, nbytes: int, link: Link, deliver: Callable[[object], None],
             fail: Callable[[BaseException], None]) -> None:
        """On a transport thread, waits until `array` is computed and the link's time has passed
        (if emulating), then hands it to `deliver`; if computing it failed, `fail` tells the receiver.
        """
        def move():
            try:
                if self.emulate:
                    array.block_until_ready()
                    time.sleep(link.transfer_seconds(nbytes))
            except BaseException as error:  # noqa: BLE001  (delivered to the receiver)
                fail(error)
                return
            deliver(array)
        self._pool.submit(move)

    def close(self) -> None:
        """Stops the transport's threads after the moves under way."""
        self._pool.close()

"""Data movement between devices: ICI copies inside an island, DCN between islands.

Inside an island a move is a device-to-device copy (`jax.device_put` to the
destination sharding, which also reshards). Between islands the embedded
backend emulates the datacenter network: the move waits until the source
buffer is ready, sleeps for the DCN link's modelled time (latency plus bytes
over bandwidth) when emulation is on, then makes the real copy. DCN moves run
on a transport thread pool, never on an island's dispatch thread.
"""

from __future__ import annotations

import time
from concurrent.futures import Future

from pathways_mlir.dialect.topology import Link

from .workers import Workers


def copy_to(array, sharding):
    """Returns `array` on the devices and in the layout of `sharding` (ICI move)."""
    import jax

    if getattr(array, "sharding", None) == sharding:
        return array
    return jax.device_put(array, sharding)


class DcnTransport:
    """Moves buffers between islands, emulating the DCN link when asked."""

    def __init__(self, emulate: bool = False, workers: int = 4):
        self.emulate = emulate
        self._pool = Workers(workers, "pw-dcn")

    def send(self, source: Future, sharding, nbytes: int, link: Link, destination: Future,
             on_arrival=None) -> None:
        """Moves the array of `source` to `sharding`, then resolves `destination`."""
        def move():
            try:
                array = source.result()
                if self.emulate:
                    array.block_until_ready()
                    time.sleep(link.transfer_seconds(nbytes))
                moved = copy_to(array, sharding)
                if on_arrival is not None:
                    on_arrival(moved)
                if not destination.done():
                    destination.set_result(moved)
            except BaseException as error:  # noqa: BLE001  (delivered to the receiver)
                if not destination.done():
                    destination.set_exception(error)
        self._pool.submit(move)

    def close(self) -> None:
        """Stops the transport's threads after the moves under way."""
        self._pool.close()

"""The Ray backend: each island is a long-running Ray actor that owns its devices.

The driver holds a proxy per island (`RayIsland`) that turns island
messages into actor calls: plans travel as JSON, arrays as NumPy arrays
through Ray's object store, and replies come back as futures. A send
between islands goes straight from one actor to the other, never through
the driver. One concept per module:

    names.py          the namespace, each island's actor name and node resource
    actor.py          the island actor (`IslandActor`) and its senders to peers
    proxy.py          the driver's proxy of an island actor (`RayIsland`)
    start_channel.py  start messages in ticket order: a Compiled Graph, or numbered calls
    data_plane.py     arrays island to island over JAX's transfer server
    kept.py           handles passed to later runs: references instead of values, and their pins
    monitor.py        notices dead actors and joining nodes (`IslandMonitor`)
    cluster.py        connecting to Ray, launching actors, a runtime's islands (`RayIslands`)

`RayIsland.calls` counts the messages sent, by kind.
"""

from .cluster import RayIslands, cluster_status, connect, start_islands, use_loopback
from .names import NAMESPACE, island_name
from .proxy import RayIsland
from .start_channel import CalledStarts, CompiledStarts

__all__ = ["NAMESPACE", "CalledStarts", "CompiledStarts", "RayIsland", "RayIslands", "cluster_status", "connect",
           "island_name", "start_islands", "use_loopback"]

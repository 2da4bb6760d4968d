"""The Ray backend: each island is a long-running Ray actor that owns its devices.

The driver holds a proxy per island (`RayIsland`) that turns island
messages into frames on its TCP connection to the actor (start messages,
fetches, completions and their replies: no Ray call on a run's path) or into
actor calls (plans as JSON, questions about objects). A send between islands goes
straight from one actor to the other, never through the driver. One concept
per module:

    names.py          the namespace, each island's actor name and node resource
    actor.py          the island actor (`IslandActor`) and its senders to peers
    proxy.py          the driver's proxy of an island actor (`RayIsland`)
    connection.py     the driver's TCP connection to an actor, and its frames
    start_channel.py  start messages in ticket order, over the connections
    data_plane.py     arrays island to island over JAX's transfer server
    kept.py           handles passed to later runs: references instead of values, and their pins
    monitor.py        notices dead actors and joining nodes (`IslandMonitor`)
    cluster.py        connecting to Ray, launching actors, a runtime's islands (`RayIslands`)

`RayIsland.calls` counts the messages sent, by kind.
"""

from .cluster import RayIslands, cluster_status, connect, start_islands, use_loopback
from .names import NAMESPACE, island_name
from .proxy import RayIsland
from .start_channel import StartChannel

__all__ = ["NAMESPACE", "RayIsland", "RayIslands", "StartChannel", "cluster_status", "connect",
           "island_name", "start_islands", "use_loopback"]

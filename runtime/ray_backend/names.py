"""What the Ray backend names on a cluster: its namespace, and each island's actor and node resource (and when
a killed actor's name is free again)."""

NAMESPACE = "pathways"


def island_name(island: str) -> str:
    """The Ray name of an island's actor, and the custom resource of the node holding its devices."""
    return f"pw-island-{island}"


def wait_until_free(island: str, deadline: float) -> None:
    """Returns once no actor holds island `island`'s name (a killed one is let go by Ray a little later),
    or at `deadline` (`time.monotonic()`)."""
    import time

    import ray

    while time.monotonic() < deadline:
        try:
            ray.get_actor(island_name(island), namespace=NAMESPACE)
        except ValueError:
            return
        time.sleep(0.05)

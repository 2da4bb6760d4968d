"""What the Ray backend names on a cluster: its namespace, and each island's actor and node resource."""

NAMESPACE = "pathways"


def island_name(island: str) -> str:
    """The Ray name of an island's actor, and the custom resource of the node holding its devices."""
    return f"pw-island-{island}"

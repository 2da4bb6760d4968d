"""The Pathways runtime: resource manager, gang scheduler, islands, object store, clients, backends."""

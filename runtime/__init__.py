"""The Pathways runtime: client, resource manager, schedulers, executors, object store."""

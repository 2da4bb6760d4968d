"""The Ray processes a runtime leaves: on a local Ray instance that outlives it (started here), a runtime
starts no idle worker, and once closed leaves none of its processes (its island actors). Processes are read
from /proc. Skipped where Ray is not installed."""

import os

import numpy as np
import pytest

from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.runtime import Runtime

ray = pytest.importorskip("ray")

from pathways_mlir.benchmarks import ray_backend as workloads  # noqa: E402
from pathways_mlir.runtime.ray_backend import connect  # noqa: E402

from fetching import until  # noqa: E402


def ray_workers() -> list[str]:
    """The titles (`ray::...`) of this process's descendants that are Ray workers."""
    parents, titles = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                titles[int(entry)] = f.read().split(b"\0")[0].decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue                      # gone meanwhile
    mine, grown = {os.getpid()}, True
    while grown:
        found = {pid for pid, parent in parents.items() if parent in mine} - mine
        mine |= found
        grown = bool(found)
    return sorted(titles[pid] for pid in mine - {os.getpid()}
                  if titles.get(pid, "").startswith("ray::") and "Agent" not in titles[pid])


def test_a_closed_runtime_leaves_no_worker_on_a_ray_that_outlives_it():
    connect(None)
    try:
        runtime = Runtime(backend="ray", islands=2, per_island=4)
        try:
            with Client(runtime) as client:
                (x,), _ = workloads.inputs()
                np.asarray(workloads.three_blocks.run(x, client=client))
            assert sorted(title.split(".")[0] for title in ray_workers()) == ["ray::IslandActor", "ray::IslandActor"]
        finally:
            runtime.close()
        until(lambda: not ray_workers(), "the runtime's Ray workers exit", timeout=60)
    finally:
        ray.shutdown()

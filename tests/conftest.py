"""Shared pytest fixtures."""

import os

# The embedded backend's devices: 8 CPU devices, set before JAX starts.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest  # noqa: E402

from pathways_mlir.dialect.context import make_context  # noqa: E402


@pytest.fixture
def context():
    """A fresh MLIR context with the pw dialect, entered with an unknown location."""
    from mlir import ir

    ctx = make_context()
    with ctx, ir.Location.unknown():
        yield ctx


def _client_of_new_runtime(islands: int, per_island: int, emulate_dcn: bool = False):
    """Yields a client of a fresh embedded runtime of `islands` x `per_island` devices; closes both."""
    from pathways_mlir.runtime.client import Client
    from pathways_mlir.runtime.cluster import embedded_device_map
    from pathways_mlir.runtime.runtime import Runtime

    runtime = Runtime(embedded_device_map(islands, per_island), emulate_dcn=emulate_dcn)
    try:
        with Client(runtime) as client:
            yield client
    finally:
        runtime.close()


@pytest.fixture(scope="module")
def two_islands():
    """A client of a 2 x 4 embedded runtime of its own."""
    yield from _client_of_new_runtime(2, 4)


@pytest.fixture(scope="module")
def three_islands():
    """A client of a 3 x 2 embedded runtime of its own, DCN emulated."""
    yield from _client_of_new_runtime(3, 2, emulate_dcn=True)


@pytest.fixture(scope="module")
def four_islands():
    """A client of a 4 x 2 embedded runtime of its own."""
    yield from _client_of_new_runtime(4, 2)

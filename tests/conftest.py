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

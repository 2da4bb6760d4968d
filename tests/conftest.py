"""Shared pytest fixtures: an MLIR context, `plan_builder` for hand-built program plans, and embedded
runtimes (`device_map`: 2 islands of 4 CPU devices, `runtime` on it, one per test; `two_islands`, ...)."""

import base64
import math
import os

# The embedded backend's devices: 8 CPU devices, set before JAX starts.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402

from pathways_mlir.dialect.context import make_context  # noqa: E402
from pathways_mlir.dialect.memory_plan import with_memory_plan  # noqa: E402
from pathways_mlir.dialect.plan import BufferInfo, ProgramPlan, SlicePlacement, Subgraph  # noqa: E402
from pathways_mlir.dialect.plan_steps import STEP_KINDS, Step  # noqa: E402
from pathways_mlir.dialect.topology import Topology  # noqa: E402


@pytest.fixture
def context():
    """A fresh MLIR context with the pw dialect, entered with an unknown location."""
    from mlir import ir

    ctx = make_context()
    with ctx, ir.Location.unknown():
        yield ctx


@pytest.fixture
def plan_builder():
    """The `PlanBuilder` class: program plans built by hand, for runtime tests that skip the compiler."""
    return PlanBuilder


def export(fn, *avals) -> str:
    """Returns the base64 jax.export serialisation of `fn` at `avals`."""
    return base64.b64encode(jax.export.export(jax.jit(fn))(*avals).serialize()).decode()


class PlanBuilder:
    """Builds a ProgramPlan step by step; buffer and step ids are allocated in order."""

    def __init__(self, topology: Topology, program: str = "main"):
        self.topology = topology
        self.program = program
        self.slices: dict[str, SlicePlacement] = {}
        self.buffers: dict[int, BufferInfo] = {}
        self.executables: dict[str, str] = {}
        self.islands: dict[str, list[Step]] = {i.name: [] for i in topology.islands}
        self.host_steps: list[Step] = []
        self.inputs: list[int] = []
        self._steps = 0

    def slice(self, name, shape, axes, island, devices):
        self.slices[name] = SlicePlacement(name, tuple(shape), tuple(axes), island, tuple(devices))
        return name

    def buffer(self, shape, dtype="f32", slice=None, sharding=None, per_device_bytes=None):
        b = len(self.buffers)
        sharding = tuple(tuple(a) for a in (sharding or [()] * len(shape)))
        size = 4 if dtype in ("f32", "i32") else 1
        ways = 1
        if slice is not None:
            axis_sizes = dict(zip(self.slices[slice].axes, self.slices[slice].shape))
            ways = math.prod(axis_sizes[a] for axes in sharding for a in axes)
        nbytes = per_device_bytes if per_device_bytes is not None else size * math.prod(shape) // ways
        self.buffers[b] = BufferInfo(b, tuple(shape), dtype, slice, sharding, nbytes)
        return b

    def input(self, shape, slice, sharding=None, dtype="f32"):
        """A program argument, put by the runtime on `slice` with `sharding` (its home)."""
        b = self.buffer(shape, dtype, slice, sharding)
        self.inputs.append(b)
        return b

    def _step(self, island, kind, **fields):
        step = STEP_KINDS[kind](self._steps, **fields)
        self._steps += 1
        (self.host_steps if island is None else self.islands[island]).append(step)
        return step.id

    def launch(self, fn, inputs, out_slice, out_sharding, name=None, out_dtype="f32", out_shape=None):
        name = name or fn.__name__
        avals = [jax.ShapeDtypeStruct(self.buffers[b].shape, _np(self.buffers[b].dtype)) for b in inputs]
        self.executables.setdefault(name, export(fn, *avals))
        shape = out_shape or jax.eval_shape(fn, *avals).shape
        out = self.buffer(shape, out_dtype, out_slice, out_sharding)
        island = self.slices[out_slice].island
        self._step(island, kind="launch", executable=name, slice=out_slice, inputs=tuple(inputs),
                   outputs=(out,), label=f"{name}#{self._steps}")
        return out

    def copy(self, src, dst_slice, sharding):
        dst = self.buffer(self.buffers[src].shape, self.buffers[src].dtype, dst_slice, sharding)
        self._step(self.slices[dst_slice].island, kind="copy", src_buffer=src, dst_buffer=dst, link="ici",
                   bytes=self.buffers[dst].bytes_per_device)
        return dst

    def dcn(self, src, dst_slice, sharding):
        info = self.buffers[src]
        src_island, dst_island = self.slices[info.slice].island, self.slices[dst_slice].island
        dst = self.buffer(info.shape, info.dtype, dst_slice, sharding)
        moved = self.buffers[dst].bytes_per_device          # what each device receives, as pw-emit-plans writes
        send = self._step(src_island, kind="send", src_buffer=src, dst_buffer=dst, link="dcn",
                          peer=dst_island, bytes=moved)
        self._step(dst_island, kind="recv", after=(send,), src_buffer=src, dst_buffer=dst, link="dcn",
                   peer=src_island, bytes=moved)
        return dst

    def cond(self, pred, inputs, then_plan, else_plan, out_shapes):
        outs = tuple(self.buffer(s) for s in out_shapes)
        self._step(None, kind="cond", pred_buffer=pred, inputs=tuple(inputs), outputs=outs,
                   then_plan=then_plan, else_plan=else_plan)
        return outs

    def build(self, outputs) -> ProgramPlan:
        plan = ProgramPlan(self.program, self.topology, dict(self.slices), dict(self.buffers),
                           dict(self.executables), tuple(self.inputs), tuple(outputs),
                           {k: tuple(v) for k, v in self.islands.items()},
                           (Subgraph(0, True, tuple(self.islands)),), tuple(self.host_steps))
        # Frees and peaks as pw-plan-memory adds them; then what another process would load.
        return ProgramPlan.from_json(with_memory_plan(plan).to_json())


def _np(dtype):
    return {"f32": jnp.float32, "i32": jnp.int32, "i1": jnp.bool_}[dtype]


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


@pytest.fixture(scope="module")
def device_map():
    """2 islands of 4 embedded CPU devices."""
    from pathways_mlir.runtime.cluster import embedded_device_map

    return embedded_device_map(2, 4)


@pytest.fixture
def runtime(device_map):
    """A fresh runtime on `device_map`, closed after the test."""
    from pathways_mlir.runtime.runtime import Runtime

    rt = Runtime(device_map)
    yield rt
    rt.close()

"""Running traced programs on runtimes: plans per runtime, placed functions over pytrees."""

import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime


def test_each_runtime_lowers_for_its_own_topology():
    a, b = pw.virtual_slice(2, axes="x"), pw.virtual_slice(2, axes="x", island="island1")
    first = pw.jit(jnp.tanh, slice=a, in_specs=P("x"), out_specs=P("x"))
    second = pw.jit(jnp.negative, slice=b, in_specs=P("x"), out_specs=P("x"))

    @pw.program
    def chain(x):
        return second(first(x))

    x = np.arange(4, dtype=np.float32)
    two_islands, four_islands = Runtime(embedded_device_map(2, 4)), Runtime(embedded_device_map(4, 2))
    try:
        plans = [chain.compiled(x, runtime=rt).plan for rt in (two_islands, four_islands, two_islands)]
        assert [len(p.topology.islands) for p in plans] == [2, 4, 2]
        assert plans[2] is plans[0]                       # still cached per runtime
        for rt in (two_islands, four_islands):
            with Client(rt) as client:
                np.testing.assert_allclose(np.asarray(chain.run(x, client=client)), -np.tanh(x), rtol=1e-6)
    finally:
        two_islands.close()
        four_islands.close()


def test_placed_functions_take_and_return_pytrees():
    s = pw.virtual_slice(2, axes="x")
    scale = pw.jit(lambda params, x: {"y": params["w"] * x + params["b"], "w": params["w"]},
                   slice=s, in_specs=(None, P("x")), out_specs=None)
    params = {"w": np.float32(3.0) * np.ones(4, np.float32), "b": np.ones(4, np.float32)}
    x = np.arange(4, dtype=np.float32)
    rt = Runtime(embedded_device_map(2, 4))
    try:
        with Client(rt) as client:
            out = scale.run(params, x, client=client)
            np.testing.assert_allclose(np.asarray(out["y"]), 3 * x + 1)
            np.testing.assert_allclose(np.asarray(out["w"]), params["w"])
    finally:
        rt.close()


def test_a_program_runs_a_placed_function_named_as_its_host_plan_was():
    """A program `step` calling a placed function `step_host` stopped with PlacementError "redefinition of symbol
    named 'step_host'": pw-emit-plans named the program's host plan @step_host, beside the function's own."""
    s = pw.virtual_slice(2, axes="x")

    def step_host(x):
        return jnp.tanh(x)

    placed = pw.jit(step_host, slice=s, in_specs=P("x"), out_specs=P("x"))

    @pw.program
    def step(x):
        return placed(x)

    x = np.arange(4, dtype=np.float32)
    rt = Runtime(embedded_device_map(2, 4))
    try:
        with Client(rt) as client:
            np.testing.assert_allclose(np.asarray(step.run(x, client=client)), np.tanh(x), rtol=1e-6)
    finally:
        rt.close()


def test_repeat_calls_trace_and_lower_once():
    s = pw.virtual_slice(2, axes="x")
    double = pw.jit(lambda x: x * 2.0, slice=s, in_specs=P("x"), out_specs=P("x"))
    traced = []

    @pw.program
    def twice(x):
        traced.append(x.shape)                  # runs only while tracing
        return double(double(x))

    rt = Runtime(embedded_device_map(2, 4))
    try:
        with Client(rt) as client:
            x = np.arange(4, dtype=np.float32)
            results = [np.asarray(twice.run(x * k, client=client)) for k in range(3)]
            stage = twice.compiled(x, runtime=rt)
            plan = stage.plan
            assert traced == [(4,)] and twice.compiled(x * 5, runtime=rt) is stage
            for k, r in enumerate(results):
                np.testing.assert_allclose(r, x * k * 4.0)
            # A new topology lowers the same trace again on the next call; it never traces again.
            [placement] = plan.slices.values()
            removed = (placement.island, placement.device_ids()[0])
            rt.resources.remove_device(*removed)
            np.testing.assert_allclose(np.asarray(twice.run(x, client=client)), x * 4.0)
            assert traced == [(4,)] and stage.plan is not plan
            rt.resources.add_device(*removed)
            # Another signature is another stage.
            twice.run(np.arange(6, dtype=np.float32), client=client)
            assert traced == [(4,), (6,)]
    finally:
        rt.close()

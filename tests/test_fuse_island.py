"""pw-fuse-island on the runtime: an island's computations across slices run as one launch, equal to plain JAX."""

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.dialect.plan import PlanError, ProgramPlan
from pathways_mlir.dialect.plan_steps import Copy, Launch
from pathways_mlir.passes import lower, program_plans
from pathways_mlir.runtime.client import Client

ROOT = pathlib.Path(__file__).resolve().parents[1]
X = np.random.default_rng(0).normal(size=(8, 16)).astype(np.float32)


def three_blocks_example():
    spec = importlib.util.spec_from_file_location("three_blocks_example", ROOT / "examples" / "three_blocks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plan_of(program, runtime, fuse: bool, *args) -> ProgramPlan:
    lowered = program.lower(*[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args])
    return program_plans(lower(lowered.module, runtime.resources.topology, fuse=fuse))[lowered.program]


def launches(plan: ProgramPlan) -> list[Launch]:
    return [s for steps in plan.islands.values() for s in steps if isinstance(s, Launch)]


def test_three_blocks_run_as_one_launch_equal_to_plain_jax(runtime):
    example = three_blocks_example()
    expected = jax.jit(example.block_c.fn)(jax.jit(example.block_b.fn)(jax.jit(example.block_a.fn)(X)))
    fused, unfused = (plan_of(example.three_blocks, runtime, fuse, X) for fuse in (True, False))
    [launch] = launches(fused)
    assert launch.executable in fused.fused and launch.label == "block_a#0+block_b#0+block_c#0"
    assert [c.callee for c in fused.fused[launch.executable].calls] == ["block_a", "block_b", "block_c"]
    # On slice_b's 2x2 mesh, slice_a's and slice_c's "data" axis is "model": at each of their devices the
    # coordinate on it is theirs, so every device keeps the shards its own slice gives it.
    assert [c.in_shardings for c in fused.fused[launch.executable].calls] == [
        ((("model",), ()),), ((("data",), ("model",)),), ((("model",), ()),)]
    assert launch.slice == "slice_b"                                  # the slice covering the three
    [back] = [s for s in fused.islands["island0"] if isinstance(s, Copy)]   # the result back to slice_c
    assert fused.buffers[back.src_buffer].sharding == (("model",), ())
    assert len(launches(unfused)) == 3 and not unfused.fused
    runtime.start_tracing()
    with Client(runtime) as client:
        [ours] = client.run(fused, [X])
        [plain] = client.run(unfused, [X])
        np.testing.assert_allclose(np.asarray(ours), np.asarray(expected), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(plain), np.asarray(expected), rtol=1e-6)
        assert ours.slice == plain.slice == "slice_c"                    # back on its home slice
        assert ours.result().sharding == plain.result().sharding
    names = {e.name for e in runtime.stop_tracing().events}
    assert "block_a#0+block_b#0+block_c#0" in names                   # the trace names what the launch ran
    assert {"block_a#0", "block_b#0", "block_c#0"} <= names


def test_the_memory_plan_counts_intermediates_on_every_covering_device(runtime):
    example = three_blocks_example()
    fused, unfused = (plan_of(example.three_blocks, runtime, fuse, X) for fuse in (True, False))
    [launch] = launches(fused)
    scratch = fused.fused[launch.executable].scratch_bytes
    # block_a's result and the copy to slice_c (256 bytes a device, split 2 ways), block_b's input and
    # result (128, split 4 ways)
    assert scratch == 256 + 128 + 128 + 256
    # The input and the fused result (256 each per device of slice_b) and the scratch, on all four devices.
    assert fused.peak("island0") == [(0, 4, 256 + 256 + scratch)]
    assert unfused.peak("island0") == [(0, 4, 512)]
    assert ProgramPlan.from_json(fused.to_json()) == fused


def test_a_plan_constraining_to_axes_its_slice_lacks_is_refused(runtime):
    example = three_blocks_example()
    fused = plan_of(example.three_blocks, runtime, True, X)
    value = fused.to_python()
    [name] = value["fused"]
    value["fused"][name]["calls"][1]["in_shardings"] = [[["data"], ["nope"]]]
    with pytest.raises(PlanError, match=f"fused executable '{name}' constrains @block_b's operands to shardings "
                                        f"that slice 'slice_b' cannot hold"):
        ProgramPlan.from_python(value)


@pytest.mark.parametrize("change, error", [
    (lambda call: call.update(callee="slice0"), "fused executable '{name}' calls unknown executable 'slice0'"),
    (lambda call: call.update(in_shardings=[[["model"], ["model"]]]),
     "fused executable '{name}' constrains @block_b's operands to shardings that slice 'slice_b' cannot hold"),
    (lambda call: call.update(in_shardings=[[["model"]]]),
     "fused @{name} constrains argument 0 of @block_b: sharding \\[\\[\"model\"\\]\\] has rank 1 but the "
     "tensor has rank 2"),
])
def test_a_fused_call_no_launch_could_make_is_refused_when_loaded(runtime, change, error):
    """A fused executable's call of an executable the plan lacks, or that constrains an operand to a sharding
    that cannot lay it out (an axis twice, another rank: `Sharding.problems`), is one `PlanError`
    when the plan is loaded (found by mutating plans sent to `pw-serve`): XLA refused them only when the launch
    compiled, at the run, and the call of no executable failed there as a missing export."""
    from pathways_mlir.runtime.plan_check import check_plan

    fused = plan_of(three_blocks_example().three_blocks, runtime, True, X)
    value = fused.to_python()
    [name] = value["fused"]
    change(value["fused"][name]["calls"][1])
    with pytest.raises(PlanError, match=error.format(name=name)):
        check_plan(ProgramPlan.from_python(value))


def test_a_plan_whose_buffer_sharding_names_an_axis_twice_or_whose_input_is_listed_twice_is_refused(runtime):
    plan = plan_of(three_blocks_example().three_blocks, runtime, False, X)
    value = plan.to_python()
    value["buffers"][0]["sharding"] = [["data"], ["data"]]
    with pytest.raises(PlanError, match="buffer 0: sharding .* uses axis 'data' more than once"):
        ProgramPlan.from_python(value)
    value = plan.to_python()
    value["inputs"] = value["inputs"] * 2
    with pytest.raises(PlanError, match="input buffer 0 is listed twice"):
        ProgramPlan.from_python(value)


wide = pw.virtual_slice((2, 2), axes=("data", "model"), name="wide")
left = pw.virtual_slice(2, axes="data", name="left")


@pw.jit(slice=left, in_specs=P("data"), out_specs=P("data"))
def scale(x):
    return x * 3.0


@pw.jit(slice=wide, in_specs=P("data", "model"), out_specs=P("data", "model"))
def shift(x, y):
    return jnp.sin(x) + y


@pw.program
def scale_then_shift(x):
    a = scale(x)
    b = shift(a, a)
    return shift(b, a), a


def test_values_used_after_the_run_come_back_home_equal_to_plain_jax(runtime):
    plan = plan_of(scale_then_shift, runtime, True, X)
    [launch] = launches(plan)
    assert launch.label == "scale#0+shift#0+shift#1"
    a = X * 3.0
    b = np.sin(a) + a
    with Client(runtime) as client:
        result, scaled = client.run(plan, [X])
        np.testing.assert_allclose(np.asarray(result), np.sin(b) + a, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(scaled), a, rtol=1e-6)
        assert scaled.slice == "left" and len(scaled.result().sharding.device_set) == 2   # back home


def test_a_move_whose_shards_are_in_place_assembles_them_without_a_copy():
    from jax.sharding import Mesh, NamedSharding

    from pathways_mlir.runtime.transfers import assemble_in_place, shards_in_place

    devices = np.array(jax.devices()[:4])
    cover = Mesh(devices.reshape(2, 2), ("data", "model"))
    home = NamedSharding(Mesh(devices[2:4], ("data",)), P("data"))
    assert shards_in_place(NamedSharding(cover, P("model")), home, X.shape)
    assert not shards_in_place(NamedSharding(cover, P("data")), home, X.shape)   # device 2 holds rows 4-7
    array = jax.device_put(X, NamedSharding(cover, P("model")))
    moved = assemble_in_place(array, home)
    assert moved.sharding == home
    np.testing.assert_array_equal(np.asarray(moved), X)
    for shard in moved.addressable_shards:          # the very buffers of `array` on devices 2 and 3
        [same] = [s for s in array.addressable_shards if s.device == shard.device]
        assert shard.data.unsafe_buffer_pointer() == same.data.unsafe_buffer_pointer()
    assert moved.aval == jax.device_put(X, home).aval
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: v + 1)(moved)), X + 1)
    everywhere = jax.device_put(X, NamedSharding(cover, P()))          # every shard the whole array
    replicated = NamedSharding(home.mesh, P())
    assert shards_in_place(everywhere.sharding, replicated, X.shape)
    moved = assemble_in_place(everywhere, replicated)
    assert moved.sharding == replicated and [s.device for s in moved.addressable_shards] == list(devices[2:4])
    np.testing.assert_array_equal(np.asarray(moved), X)


def test_a_copy_shares_shards_only_of_the_runs_own_launch_results(runtime):
    import dataclasses

    from pathways_mlir.runtime.island_program import CopyInstruction, IslandLayout, compile_steps

    example = three_blocks_example()
    fused = plan_of(example.three_blocks, runtime, True, X)
    [back] = [s for s in fused.islands["island0"] if isinstance(s, Copy)]
    island = runtime.islands["island0"]

    def copies(plan):
        return [i for i in compile_steps(island, plan, IslandLayout.build(island, plan), plan.islands["island0"])
                if isinstance(i, CopyInstruction)]
    assert [c.in_place is not None for c in copies(fused)] == [True]
    # Were the fused result a program result too, the caller could donate it later: a real copy then.
    returned = dataclasses.replace(fused, outputs=(*fused.outputs, back.src_buffer))
    assert [c.in_place is not None for c in copies(returned)] == [False]


def test_a_result_shares_no_shard_with_an_intermediate_another_step_still_reads(runtime, plan_builder):
    """A handle reads a result while its run still executes (parked on a recv, say), and its caller may delete
    it: a result assembled in place of an intermediate that a later launch reads deleted some of that
    launch's shards, and XLA crashed the process. Such a result is copied into buffers of its own; one of an
    intermediate the copy alone reads still shares its shards."""
    from jax.sharding import Mesh, NamedSharding

    from pathways_mlir.runtime.island_program import CopyInstruction, IslandLayout, compile_steps
    from pathways_mlir.runtime.transfers import fresh_copy

    def in_place_copies(read_again: bool) -> list[tuple[bool, bool]]:
        p = plan_builder(runtime.resources.topology, program="shares")
        both = p.slice("both", (2,), ("x",), "island0", (0, 2))
        second = p.slice("second", (1,), ("x",), "island0", (1, 2))
        made = p.launch(lambda x: x * 2.0, [p.input((8,), both)], both, [()], name="double")
        result = p.copy(made, second, [()])                 # device 1's shard of `made`: in place
        later = [p.launch(lambda x: x + 1.0, [made], both, [()], name="plus_one")] if read_again else []
        plan = p.build([result, *later])
        island = runtime.islands["island0"]
        program = compile_steps(island, plan, IslandLayout.build(island, plan), plan.islands["island0"])
        return [(i.in_place is not None, i.fresh) for i in program if isinstance(i, CopyInstruction)]

    assert in_place_copies(read_again=False) == [(True, False)]
    assert in_place_copies(read_again=True) == [(False, True)]
    # JAX's move to one device of a replicated array takes that device's shard, even told not to alias.
    devices = jax.devices()[:2]
    everywhere = jax.device_put(X, NamedSharding(Mesh(np.array(devices), ("x",)), P()))
    fresh_copy(everywhere, NamedSharding(Mesh(np.array(devices[1:]), ("x",)), P())).delete()
    assert not any(shard.data.is_deleted() for shard in everywhere.addressable_shards)


def test_a_host_argument_read_by_one_launch_is_placed_by_that_launch(runtime, monkeypatch):
    import dataclasses

    from pathways_mlir.runtime import island_executor

    example = three_blocks_example()
    expected = jax.jit(example.block_c.fn)(jax.jit(example.block_b.fn)(jax.jit(example.block_a.fn)(X)))
    fused, unfused = (plan_of(example.three_blocks, runtime, fuse, X) for fuse in (True, False))
    assert fused.launch_placed("island0") == set(fused.inputs)
    copied = {s.dst_buffer for s in unfused.islands["island0"] if isinstance(s, Copy)}
    assert unfused.launch_placed("island0") == set(unfused.inputs) | copied and len(copied) == 2
    # An input that is a program result too, or that is donated, is placed first, as before.
    assert not dataclasses.replace(fused, outputs=(*fused.outputs, *fused.inputs)).launch_placed("island0")
    assert not dataclasses.replace(fused, donated=fused.inputs).launch_placed("island0")
    placed = []

    def counted(array, sharding):
        placed.append(type(array))
        return jax.device_put(array, sharding)
    monkeypatch.setattr(island_executor, "copy_to", counted)
    with Client(runtime) as client:
        for plan in (fused, unfused):
            [ours] = client.run(plan, [X])             # NumPy: handed to the launch, which puts it on its slice
            np.testing.assert_allclose(np.asarray(ours), np.asarray(expected), rtol=1e-6)
            assert placed == []
            [ours] = client.run(plan, [jax.device_put(X, jax.devices()[7])])   # an array elsewhere: moved first
            np.testing.assert_allclose(np.asarray(ours), np.asarray(expected), rtol=1e-6)
            assert placed.pop() is not np.ndarray and placed == []
            del ours
    assert runtime.object_count() == 0


def test_computations_that_name_their_slices_axes_are_not_fused(runtime):
    """Block A centres its rows with `jax.shard_map` and a psum over slice_a's "data"; block B constrains its
    result to P("data", "model"). Each runs only on its own slice's mesh (on slice_b's, XLA refuses block
    A's all-reduce: its replica groups are slice_a's two devices), so island fusion leaves both out, and
    the three blocks equal plain JAX fused or not."""
    slice_a = pw.virtual_slice(2, axes="data", name="slice_a")
    slice_b = pw.virtual_slice((2, 2), axes=("data", "model"), name="slice_b")
    slice_c = pw.virtual_slice(2, axes="data", name="slice_c")

    def centred(x):
        return jax.shard_map(lambda rows: rows - jax.lax.psum(rows.sum(0), "data") / x.shape[0],
                             in_specs=P("data"), out_specs=P("data"))(x)

    def projected(x):
        return jax.lax.with_sharding_constraint(jnp.tanh(x) @ jnp.ones((16, 16)), P("data", "model"))

    block_a = pw.jit(centred, slice=slice_a, in_specs=P("data"), out_specs=P("data"))
    block_b = pw.jit(projected, slice=slice_b, in_specs=P("data", "model"), out_specs=P("data", "model"))
    block_c = pw.jit(lambda x: 2 * x, slice=slice_c, in_specs=P("data"), out_specs=P("data"))

    @pw.program
    def three_blocks(x):
        return block_c(block_b(block_a(x)))

    expected = 2 * (jnp.tanh(X - X.mean(0)) @ jnp.ones((16, 16)))
    for fuse in (True, False):
        plan = plan_of(three_blocks, runtime, fuse, X)
        assert [launch.label for launch in launches(plan)] == ["centred#0", "projected#0", "lambda#0"]
        with Client(runtime) as client:
            [result] = client.run(plan, [X])
            np.testing.assert_allclose(np.asarray(result), expected, rtol=1e-5, atol=1e-5)

"""The lowering pipeline from Python: plans, re-lowering, the cost model."""

import json
import pathlib

import pytest
from mlir import ir

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.dialect.topology import Topology
from pathways_mlir.benchmarks.lowering_scale import chain_program
from pathways_mlir.dialect.diagnostics import DiagnosticEngine
from pathways_mlir.dialect.element_types import ELEMENT_BYTES
from pathways_mlir.passes import LoweringError, lower, program_plans
from pathways_mlir.passes.cost import Cost, executable_cost
from pathways_mlir.passes.pipeline import run_passes
from pathways_mlir.passes.registry import Pass

ROOT = pathlib.Path(__file__).resolve().parents[1]
THREE_BLOCKS = (ROOT / "examples" / "three_blocks.mlir").read_text()

BRANCHY = """
"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
"pw.virtual_slice"() {sym_name = "b", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable, pw.export = "RVhQT1JU"} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
module @positive attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<i1> {
    %0 = "stablehlo.constant"() {value = dense<true> : tensor<i1>} : () -> tensor<i1>
    return %0 : tensor<i1>
  }
}
func.func @then(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @b, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "then#0"} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
func.func @else(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  return %x : tensor<8xf32>
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %p = "pw.compute"(%x) {callee = @positive, slice = @a, in_shardings = [[["x"]]], out_shardings = [[]], label = "p#0"} : (tensor<8xf32>) -> tensor<i1>
  %y = "pw.cond"(%p, %x) {then_program = @then, else_program = @else, label = "k#0"} : (tensor<i1>, tensor<8xf32>) -> tensor<8xf32>
  %z = "pw.compute"(%y) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]], label = "after#0"} : (tensor<8xf32>) -> tensor<8xf32>
  return %z : tensor<8xf32>
}
"""


def test_three_blocks_plans_round_trip_through_json():
    # Spread places B on island1, so the plan has DCN sends and receives (auto keeps all on island0).
    plan = program_plans(lower(THREE_BLOCKS, Topology.uniform(2, 4), strategy="spread"))["three_blocks"]
    assert ProgramPlan.from_json(plan.to_json()) == plan
    assert {s.island for s in plan.slices.values()} == {"island0", "island1"}
    kinds = {island: [s.kind for s in steps] for island, steps in plan.islands.items()}
    assert kinds == {"island0": ["launch", "free", "send", "free", "recv", "launch", "free"],
                     "island1": ["recv", "launch", "free", "send", "free"]}
    # Every island runs its compute and transfer steps in increasing id (frees are numbered after
    # them); a recv waits for its send.
    steps = {s.id: s for ss in plan.islands.values() for s in ss}
    for ss in plan.islands.values():
        ids = [s.id for s in ss if s.kind != "free"]
        assert ids == sorted(ids)
    # Each island's static peak: slice_a holds the argument and block_a's result, slice_c block_b's
    # result (received) and the program's result; island1 block_b's input and output, 4-way.
    assert plan.peak_bytes == {"island0": (0, 4, 512), "island1": (0, 4, 256)}
    for s in steps.values():
        if s.kind == "recv":
            [send] = s.after
            assert steps[send].kind == "send" and steps[send].dst_buffer == s.dst_buffer
    # The input is put by the runtime on the first consumer's slice, sharded as it uses it.
    [arg] = plan.inputs
    assert (plan.buffers[arg].slice, plan.buffers[arg].sharding) == ("slice_a", (("data",), ()))
    assert plan.subgraphs[0].static and set(plan.subgraphs[0].islands) == {"island0", "island1"}
    # The example was exported from JAX: every executable carries its jax.export serialisation.
    assert set(plan.executables) == {"block_a", "block_b", "block_c"} and all(plan.executables.values())


def test_branch_programs_are_nested_plans():
    plans = program_plans(lower(BRANCHY, Topology.uniform(2, 4)))
    main = plans["main"]
    [cond] = main.host_steps
    assert cond.kind == "cond" and cond.then_plan == plans["then"] and cond.else_plan == plans["else"]
    assert plans["then"].executables == {"f": "RVhQT1JU"}
    # What follows the branch is a second, non-static subgraph.
    assert [(g.id, g.static) for g in main.subgraphs] == [(0, True), (1, False)]
    after = next(s for ss in main.islands.values() for s in ss if s.label == "after#0")
    assert after.subgraph == 1 and cond.id in after.after
    assert ProgramPlan.from_json(main.to_json()) == main


def test_relowering_avoids_a_removed_device_and_leaves_the_source_alone(context):
    source = ir.Module.parse(THREE_BLOCKS)
    before = str(source)
    topology = Topology.uniform(2, 4)
    first = lower(source, topology, strategy="spread")
    used = {(p["island"], p["devices"]) for p in
            (ops.attr(op, ops.PLACEMENT) for op in ops.top_level_ops(first) if op.name == "pw.virtual_slice")}
    assert ("island1", (0, 4)) in used
    again = lower(source, topology.without_device("island1", 2), strategy="spread")
    assert str(source) == before
    plan = program_plans(again)["three_blocks"]
    for placement in plan.slices.values():
        assert not (placement.island == "island1" and 2 in placement.device_ids())
    slice_b = plan.slices["slice_b"]
    assert (slice_b.island, slice_b.devices) != ("island1", (0, 4))


def test_lower_keeps_module_attributes_and_replaces_the_topology(context):
    # (the example's own `module { ... }` taken off: a program in a nested module is refused)
    body = THREE_BLOCKS[THREE_BLOCKS.index("module {") + len("module {"):THREE_BLOCKS.rindex("}")]
    source = ir.Module.parse(f"module attributes {{pw.origin = \"jax\", pw.topology = "
                             f"{{islands = [], dcn = {{}}}}}} {{\n{body}\n}}")
    lowered = lower(source, Topology.uniform(2, 4))
    assert "three_blocks" in program_plans(lowered), "the program was lowered"
    assert ops.attr(lowered.operation, "pw.origin") == "jax"
    assert ops.module_topology(lowered) == Topology.uniform(2, 4)


def test_lowering_errors_carry_diagnostics():
    with pytest.raises(LoweringError, match="cannot place slice @slice_b: it needs 4 devices in one island"):
        lower(THREE_BLOCKS, Topology.uniform(2, 2))


# One placed computation: the smallest program the cases below change one thing of.
ONE_STEP = """"pw.virtual_slice"() {sym_name = "a", shape = array<i64: 2>, axes = ["x"], constraints = {}} : () -> ()
module @f attributes {pw.executable} {
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }
}
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> attributes {pw.program} {
  %0 = "pw.compute"(%x) {callee = @f, slice = @a, in_shardings = [[["x"]]], out_shardings = [[["x"]]],
                         label = "f#0"} : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
"""


@pytest.mark.parametrize("old, new, message", [
    ("constraints = {}", "constraints = 7",
     "-:1:1: error: 'pw.virtual_slice' op attribute 'constraints' must be a #builtin.dictionary, not 7 : i64"),
    ("shape = array<i64: 2>, ", "",
     "-:1:1: error: 'pw.virtual_slice' op attribute 'shape' is expected but not provided"),
    ('sym_name = "a"', "sym_name = 7",
     "-:1:1: error: 'pw.virtual_slice' op attribute 'sym_name' must be a #builtin.string, not 7 : i64"),
    (", slice = @a", "", "-:6:8: error: 'pw.compute' op attribute 'slice' is expected but not provided"),
    ("return %0", "}", "-:8:4: error: expected operation name in quotes")])
def test_lower_refuses_what_pw_opt_refuses_before_any_pass(context, old, new, message):
    """lower() ran the passes on IR it had not checked against the pw ops' definitions, as pw-opt and
    load_plans do first: a pass's AttributeError, TypeError or ValueError escaped, a missing `slice` was
    "'slice' refers to @None", and text that does not parse raised ParseError, not LoweringError."""
    text = ONE_STEP.replace(old, new, 1)
    with pytest.raises(LoweringError) as raised:
        lower(text, Topology.uniform(1, 4))
    assert str(raised.value) == message
    if new != "}":                              # a module given is checked too
        with pytest.raises(LoweringError, match="^-:"):
            lower(ir.Module.parse(text), Topology.uniform(1, 4))


def test_pw_verify_accepts_exactly_the_element_types_plans_hold():
    """pw-verify asked for an element type with a bit width; plans hold those of `ELEMENT_BYTES`: i128, i2, i0,
    si32 and tf32 passed it and pw-emit-plans, and only pw-lower's last pass refused them, at a 'pw.buffer' op
    the user never wrote."""
    for element in ELEMENT_BYTES:
        plan = program_plans(lower(ONE_STEP.replace("xf32>", f"x{element}>"), Topology.uniform(1, 4)))["main"]
        assert {b.dtype for b in plan.buffers.values()} == {element}
    for element in ("i128", "i2", "i0", "si32", "tf32"):
        with pytest.raises(LoweringError) as raised:
            lower(ONE_STEP.replace("xf32>", f"x{element}>"), Topology.uniform(1, 4))
        assert str(raised.value).startswith(
            f"-:3:3: error: 'func.func' op argument 0 is tensor<8x{element}>, whose element type {element} is not "
            f"a pw element type (known: i1, i4, "), str(raised.value)


def test_plan_names_are_new_beside_the_modules_symbols_and_an_island_named_host():
    """Plans were named @<program>_<island> and @<program>_host whatever the module held: an executable named
    @three_blocks_host (a placed function `step_host` called by a program `step`), or an island named "host",
    stopped lowering with MLIR's "redefinition of symbol"; the island's buffers and steps and the host plan's
    were kept under one key too."""
    executable = ('module @three_blocks_host attributes {pw.executable} {\n'
                  '  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> { return %x : tensor<8xf32> }\n}\n')
    source = THREE_BLOCKS.replace("  func.func @three_blocks", executable + "  func.func @three_blocks")
    uniform = Topology.uniform(2, 4)
    named = Topology.from_python({**uniform.to_python(), "islands": [
        {**island, "name": "host" if island["name"] == "island0" else island["name"]}
        for island in uniform.to_python()["islands"]]})
    lowered = lower(source, named, strategy="spread")
    marks = {ops.symbol_name(op): {key: ops.attr(op, key) for key in (ops.ISLAND_PLAN, ops.HOST_PLAN)
                                   if key in op.attributes}
             for op in ops.top_level_ops(lowered) if ops.is_plan(op)}
    assert marks == {
        "three_blocks_host_0": {ops.ISLAND_PLAN: {"island": "host", "program": "three_blocks"}},
        "three_blocks_island1": {ops.ISLAND_PLAN: {"island": "island1", "program": "three_blocks"}},
        "three_blocks_host_1": {ops.HOST_PLAN: marks["three_blocks_host_1"][ops.HOST_PLAN]}}
    # The plan is the one of the module without the executable on islands island0 and island1, renamed.
    plan = program_plans(lowered)["three_blocks"]
    expected = program_plans(lower(THREE_BLOCKS, uniform, strategy="spread"))["three_blocks"]
    assert json.loads(plan.to_json()) == json.loads(expected.to_json().replace('"island0"', '"host"'))


@pytest.mark.parametrize("source, strategy, fuse", [
    (THREE_BLOCKS, "spread", True), (THREE_BLOCKS, "auto", False), (BRANCHY, "auto", True),
    (chain_program(4), "auto", True)])
def test_checks_between_passes_change_nothing(source, strategy, fuse):
    # lower() leaves out the checks between passes; with them every phase boundary is checked, and the
    # lowered module is the same.
    checked = lower(source, Topology.uniform(2, 4), strategy=strategy, fuse=fuse, verify_each=True)
    unchecked = lower(source, Topology.uniform(2, 4), strategy=strategy, fuse=fuse)
    assert str(unchecked) == str(checked)


def test_without_verify_each_only_the_ends_are_checked(context):
    ran = []

    class Check(Pass):
        name, summary, changes_ir, boundary_check = "test-check", "records that it ran", False, True

        def run(self, op, diagnostics):
            ran.append("check")

    class Change(Pass):
        name, summary = "test-change", "records that it ran"

        def run(self, op, diagnostics):
            ran.append("change")

    passes = [Check(), Change(), Check(), Change(), Check(), Change(), Check()]
    for verify_each, expected in ((True, ["check", "change"] * 3 + ["check"]),
                                  (False, ["check", "change", "change", "change", "check"])):
        ran.clear()
        assert run_passes(ir.Module.parse(THREE_BLOCKS), passes, DiagnosticEngine(), verify_each=verify_each)
        assert ran == expected


@pytest.mark.parametrize("body, cost", [
    # dot_general: 2 * (2*3*5) results * 4 contracted, batched.
    ('%0 = "stablehlo.dot_general"(%a, %b) <{dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0], '
     'rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]>}> '
     ': (tensor<2x3x4xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32>', Cost(240, 96 + 160 + 120)),
    ('%0 = "stablehlo.dot"(%a, %b) : (tensor<2x3x4xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32>',
     Cost(240, 96 + 160 + 120)),
    ('%0 = "stablehlo.constant"() {value = dense<1.0> : tensor<2x3x5xf32>} : () -> tensor<2x3x5xf32>',
     Cost(0, 96 + 160 + 120)),
])
def test_cost_model(context, body, cost):
    module = ir.Module.parse(
        "module @f attributes {pw.executable} {\n"
        "  func.func @main(%a: tensor<2x3x4xf32>, %b: tensor<2x4x5xf32>) -> tensor<2x3x5xf32> {\n"
        f"    {body}\n    return %0 : tensor<2x3x5xf32>\n  }}\n}}")
    assert executable_cost(module.operation) == cost


def test_cost_model_counts_a_loop_of_unknown_trip_count_once_and_says_so(context):
    module = ir.Module.parse("""
module @f attributes {pw.executable} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = "stablehlo.while"(%a) ({
    ^bb0(%x: tensor<4xf32>):
      %c = "stablehlo.constant"() {value = dense<true> : tensor<i1>} : () -> tensor<i1>
      "stablehlo.return"(%c) : (tensor<i1>) -> ()
    }, {
    ^bb0(%x: tensor<4xf32>):
      %y = "stablehlo.multiply"(%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
      "stablehlo.return"(%y) : (tensor<4xf32>) -> ()
    }) : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}""")
    assert executable_cost(module.operation) == Cost(4, 32, unknown_trip_counts=1)
    assert Cost(4, 32, 1).to_python() == {"flops": 4, "bytes": 32, "unknown_trip_counts": 1}


def test_cost_model_multiplies_static_loops_and_repeated_calls(context):
    """A fori_loop(0, 10) as JAX writes it, whose body calls a function twice: 10 x 2 x 4 flops."""
    module = ir.Module.parse("""
module @f attributes {pw.executable} {
  func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = "stablehlo.constant"() <{value = dense<0> : tensor<i32>}> : () -> tensor<i32>
    %1:2 = "stablehlo.while"(%0, %a) ({
    ^bb0(%i: tensor<i32>, %x: tensor<4xf32>):
      %n = "stablehlo.constant"() <{value = dense<10> : tensor<i32>}> : () -> tensor<i32>
      %c = "stablehlo.compare"(%i, %n) <{compare_type = #stablehlo<comparison_type SIGNED>, comparison_direction = #stablehlo<comparison_direction LT>}> : (tensor<i32>, tensor<i32>) -> tensor<i1>
      "stablehlo.return"(%c) : (tensor<i1>) -> ()
    }, {
    ^bb0(%i: tensor<i32>, %x: tensor<4xf32>):
      %y = "func.call"(%x) <{callee = @square}> : (tensor<4xf32>) -> tensor<4xf32>
      %z = "func.call"(%y) <{callee = @square}> : (tensor<4xf32>) -> tensor<4xf32>
      %one = "stablehlo.constant"() <{value = dense<1> : tensor<i32>}> : () -> tensor<i32>
      %j = "stablehlo.add"(%i, %one) : (tensor<i32>, tensor<i32>) -> tensor<i32>
      "stablehlo.return"(%j, %z) : (tensor<i32>, tensor<4xf32>) -> ()
    }) : (tensor<i32>, tensor<4xf32>) -> (tensor<i32>, tensor<4xf32>)
    return %1#1 : tensor<4xf32>
  }
  func.func private @square(%x: tensor<4xf32>) -> tensor<4xf32> {
    %0 = "stablehlo.multiply"(%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}""")
    # Per trip: the compare (1 flop), two calls of 4 flops, the counter's add (1 flop).
    assert executable_cost(module.operation) == Cost(10 * (1 + 2 * 4 + 1), 32)


def test_lowered_ir_and_plans_do_not_grow_with_the_shard_count():
    from pathways_mlir.benchmarks.lowering_scale import lower_chain, per_shard_baseline

    sizes = (8, 512, 65536)
    lowered = [lower_chain(n) for n in sizes]
    assert len({count for count, _ in lowered}) == 1
    # Plans differ only in the digits of N (shapes, device ranges, topology).
    plan_bytes = [nbytes for _, nbytes in lowered]
    assert max(plan_bytes) - min(plan_bytes) < 64
    # The per-shard baseline materialises 2N nodes and N edges.
    assert per_shard_baseline(64)[:2] == (128, 64)


def test_lowering_scale_rows_say_how_spread_their_times_are():
    # The README says a row's spread is null when fewer than 4 repetitions were timed; these rows had none at all.
    from pathways_mlir.benchmarks.lowering_scale import rows

    assert [row["spread"] for row in rows(sizes=(8,), reps=3)] == [None]
    [row] = rows(sizes=(8,), reps=4)
    assert row["spread"] >= 0


def test_ctrl_c_while_lowering_raises_keyboard_interrupt():
    """Ctrl-C inside a pass went into MLIR's pass manager, which made it a RuntimeError ("Exception raised in
    callback") or dropped it, the lowering going on to its end. Now the pass fails and the lowering raises
    KeyboardInterrupt once the pass manager returns."""
    from test_islands_on_their_own import _interrupted

    from pathways_mlir.dialect.context import make_context, parse_module

    t = "tensor<4x128xf32>"
    computes = "".join(f'  %{i + 1} = "pw.compute"(%{i}) {{callee = @layer, slice = @v{i % 2}, '
                       f'in_shardings = [[["x"], []]], out_shardings = [[["x"], []]], label = "l#{i}"}} '
                       f': ({t}) -> {t}\n' for i in range(4000))
    text = ("".join(f'"pw.virtual_slice"() {{sym_name = "v{s}", shape = array<i64: 4>, axes = ["x"], '
                    f'constraints = {{}}}} : () -> ()\n' for s in range(2))
            + f'module @layer attributes {{pw.executable}} {{\n  func.func @main(%x: {t}) -> {t} {{\n'
            + f'    %0 = "stablehlo.tanh"(%x) : ({t}) -> {t}\n    return %0 : {t}\n  }}\n}}\n'
            + f'func.func @chain(%0: {t}) -> {t} attributes {{pw.program}} {{\n{computes}  return %4000 : {t}\n}}\n')
    with make_context():
        module = parse_module(text, ir.Context.current)       # the passes take the time, not the parsing
        assert _interrupted(lambda: lower(module, Topology.uniform(2, 4)), after=0.2) == "raised by the call"

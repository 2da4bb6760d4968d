"""The pw dialect's Python helpers: attributes, shardings, builders, accessors."""

import pytest
from mlir import ir

from pathways_mlir.dialect import ops, plan_ops
from pathways_mlir.dialect.attributes import Symbol, to_attribute, to_python
from pathways_mlir.dialect.diagnostics import DiagnosticEngine
from pathways_mlir.dialect.sharding import Sharding
from pathways_mlir.passes.verify import VerifyPass


def test_attribute_round_trip(context):
    value = {"s": "x", "i": 3, "b": True, "f": 1.5, "arr": (1, 2), "list": [[["a"], []]],
             "sym": Symbol("v0"), "unit": None, "nested": {"k": [1, "two"]}}
    assert to_python(to_attribute(value)) == value
    assert isinstance(to_python(to_attribute(Symbol("v0"))), Symbol)
    assert str(to_attribute((4, 8))) == "array<i64: 4, 8>"
    assert str(to_attribute([])) == "[]"


def test_attribute_rejects_unknown_values(context):
    with pytest.raises(TypeError, match="cannot make a builtin attribute of object"):
        to_attribute(object())


def test_sharding_shapes_and_problems():
    sizes = {"data": 2, "model": 4}
    s = Sharding.from_python([["data"], ["model"]])
    assert s.ways(sizes) == 8
    assert s.shard_shape((8, 16), sizes) == (4, 4)
    assert s.problems((8, 16), sizes) == []
    assert "does not divide" in s.problems((8, 6), sizes)[0]
    assert "rank 2 but the tensor has rank 1" in s.problems((8,), sizes)[0]
    assert "names axis 'x'" in Sharding((("x",), ())).problems((8, 8), sizes)[0]
    assert "more than once" in Sharding((("data",), ("data",))).problems((8, 8), sizes)[0]
    assert Sharding.replicated(2).ways(sizes) == 1
    assert str(s) == '[["data"], ["model"]]'
    # Two axes on one dimension multiply.
    assert Sharding((("data", "model"),)).dim_ways(sizes) == (8,)


def _program_module(context, n_devices: int):
    """Builds slice + executable + program with the Python builders."""
    t = ir.RankedTensorType.get([8, 4], ir.F32Type.get())
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        ops.VirtualSlice("v0", (n_devices,), ("x",), {"device_kind": "cpu"}).build()
        exe = ir.Module.parse(
            "module @double attributes {pw.executable} {\n"
            "  func.func public @main(%a: tensor<8x4xf32>) -> tensor<8x4xf32> {\n"
            '    %0 = "stablehlo.add"(%a, %a) : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>\n'
            "    return %0 : tensor<8x4xf32>\n  }\n}")
        module.body.append(exe.operation.clone())
        ftype = ir.FunctionType.get([t], [t])
        func = ops.create("func.func", attributes={"sym_name": "main", "function_type": ftype,
                                                    ops.PROGRAM: None}, regions=1)
        func.regions[0].blocks.append(t)
        block = func.regions[0].blocks[0]
        with ir.InsertionPoint(block):
            x = Sharding(((), ()))
            compute = ops.build_compute("double", "v0", [block.arguments[0]], [t], [x], [x], "double#0")
            ops.create("func.return", [compute.results[0]])
    return module


@pytest.mark.parametrize("n_devices", [8, 2048])
def test_builders_make_a_verified_module(context, n_devices):
    module = _program_module(context, n_devices)
    assert module.operation.verify()
    diagnostics = DiagnosticEngine()
    VerifyPass().run(module.operation, diagnostics)
    assert diagnostics.diagnostics == []
    # Accessors read back what the builders wrote.
    slices = ops.virtual_slices(module)
    assert slices["v0"].size == n_devices and slices["v0"].axis_sizes == {"x": n_devices}
    assert set(ops.executables(module)) == {"double"}
    program = ops.programs(module)["main"]
    compute = next(iter(ops.program_body(program).operations))
    assert ops.attr(compute, "callee") == "double" and ops.attr(compute, "slice") == "v0"
    assert ops.in_shardings(compute) == [Sharding(((), ()))]
    # The printed module parses again to the same text.
    text = str(module)
    assert str(ir.Module.parse(text)) == text


def test_ir_size_does_not_depend_on_device_count(context):
    small, large = str(_program_module(context, 8)), str(_program_module(context, 65536))
    assert small.count("\n") == large.count("\n")
    assert small.replace("array<i64: 8>", "") == large.replace("array<i64: 65536>", "")


def test_verify_reports_at_the_offending_op(context):
    module = ir.Module.parse(
        '"pw.virtual_slice"() {sym_name = "v0", shape = array<i64: 3>, axes = ["x"], constraints = {}} : () -> ()\n'
        'module @f attributes {pw.executable} {\n'
        '  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }\n}\n'
        'func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> attributes {pw.program} {\n'
        '  %0 = "pw.compute"(%a) {callee = @f, slice = @v0, in_shardings = [[["x"]]], '
        'out_shardings = [[[]]], label = "f#0"} : (tensor<4xf32>) -> tensor<4xf32>\n'
        '  return %0 : tensor<4xf32>\n}\n')
    diagnostics = DiagnosticEngine()
    VerifyPass().run(module.operation, diagnostics)
    [d] = diagnostics.diagnostics
    assert (d.severity, d.location.line, d.location.column) == ("error", 6, 8)
    assert "dimension 0 of size 4 is split 3 ways" in d.message


def test_tensor_bytes(context):
    assert ops.tensor_bytes(ir.Type.parse("tensor<8x4xf32>")) == 128
    assert ops.tensor_bytes(ir.Type.parse("tensor<3xbf16>")) == 6
    assert ops.tensor_bytes(ir.Type.parse("tensor<5xi1>")) == 5
    assert ops.tensor_bytes(ir.Type.parse("tensor<i64>")) == 8


def test_every_pw_op_has_a_typed_builder_that_makes_it_well_formed(context):
    from pathways_mlir.dialect.structure import check_op, definitions

    t = ir.RankedTensorType.get([8], ir.F32Type.get())
    pred = ir.RankedTensorType.get([], ir.IntegerType.get_signless(1))
    x, s = Sharding.from_python([["x"]]), Sharding.replicated(1)
    holder = ops.create("func.func", regions=1)   # a detached op whose block gives the operands
    block = holder.regions[0].blocks.append(t, pred)
    a, p = block.arguments
    with ir.InsertionPoint(block):
        step = {"step": 0, "after": (), "subgraph": 0}
        built = [
            ops.VirtualSlice("v", (2,), ("x",)).build(),
            ops.build_compute("f", "v", [a], [t], [x], [x], "f#0"),
            ops.build_cond(p, [a], [t], "then", "else", "k#0"),
            ops.build_transfer(a, "v", "w", x, "dcn"),
            ops.build_scatter(a, "v", "w", s, x, 2, (4,), "ici"),
            ops.build_gather(a, "v", "w", x, s, 2, (4,), "ici"),
            plan_ops.build_buffer(id=0, type=t, home={}, bytes_per_device=32),
            plan_ops.build_launch(**step, executable="f", slice="v", devices=(0, 2), inputs=(0,), outputs=(1,),
                             output_bytes=(16,), label="f#0"),
            plan_ops.build_copy(**step, src_buffer=0, dst_buffer=1, bytes=16, link="ici"),
            plan_ops.build_send(**step, buffer=0, peer_buffer=1, peer="island1", bytes=16, link="dcn", devices=(0, 2)),
            plan_ops.build_recv(**step, buffer=1, peer_buffer=0, peer="island0", bytes=16, link="dcn", devices=(0, 2)),
            plan_ops.build_branch(**step, pred=0, inputs=(1,), outputs=(2,), then_program="t", else_program="e",
                             label="k#0"),
            plan_ops.build_free(**step, buffers=(0, 1)),
        ]
    assert sorted(op.name for op in built) == sorted(definitions())
    assert {op.name: check_op(op) for op in built} == {op.name: [] for op in built}
    assert str(built[7].attributes["after"]) == "array<i64>"


def test_structure_wants_i64_dense_arrays(context):
    # Passes read every dense array of a pw op as integers; f32 once escaped as a TypeError.
    from pathways_mlir.dialect.structure import verify_structure

    module = ir.Module.parse('"pw.virtual_slice"() {sym_name = "a", shape = array<f32: 2.0>, axes = ["x"], '
                             'constraints = {}} : () -> ()')
    [problem] = verify_structure(module)
    assert problem.message == ("'pw.virtual_slice' op attribute 'shape' must be a #builtin.dense_array of i64, "
                               "not array<f32: 2.000000e+00>")


def test_a_topology_bounds_its_islands_and_devices_in_either_form():
    """`<islands>x<devices>` had no bound (one Island object per island: 10**20 islands ran without end; 2**63
    devices an internal error); the JSON form bounds them as the option does, the product of hosts and devices
    per host included."""
    import json

    from pathways_mlir.dialect.topology import MAX_ISLANDS, Topology, TopologyError

    assert len(Topology.from_option(f"{MAX_ISLANDS}x2").islands) == MAX_ISLANDS
    for text, message in ((f"{MAX_ISLANDS + 1}x2", "more than the 4096 islands"),
                          ("9" * 5000 + "x2", "more than the 4096 islands"),
                          (f"1x{1 << 63}", "more devices an island than a 64-bit integer holds")):
        with pytest.raises(TopologyError, match=message):
            Topology.from_option(text)
    value = Topology.uniform(MAX_ISLANDS + 1, 2).to_python()
    with pytest.raises(TopologyError, match="'islands' has 4097 entries, more than the 4096"):
        Topology.from_json(json.dumps(value))
    value = Topology.uniform(1, 2).to_python()
    value["islands"][0].update(hosts=1 << 62, devices_per_host=4)
    with pytest.raises(TopologyError, match="islands\\[0\\]: 4611686018427387904 hosts of 4 devices are more devices"):
        Topology.from_json(json.dumps(value))

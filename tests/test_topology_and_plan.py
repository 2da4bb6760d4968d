"""The topology description and the plan data model: parsing, errors, round trips."""

import json

import pytest

from pathways_mlir.dialect.plan import BufferInfo, PlanError, ProgramPlan, SlicePlacement, Subgraph
from pathways_mlir.dialect.plan_steps import Branch, Copy, Launch
from pathways_mlir.dialect.topology import Link, Topology, TopologyError


def test_uniform_topology_round_trips_through_json():
    topo = Topology.uniform(2, 4).without_device("island1", 2)
    again = Topology.from_json(topo.to_json())
    assert again == topo
    assert again.island("island1").unavailable == (2,)
    assert again.link("island0", "island0")[0] == "ici"
    assert again.link("island0", "island1")[0] == "dcn"


@pytest.mark.parametrize("text, message", [
    ("{", "invalid JSON"),
    ('{"dcn": {"latency_us": 1, "bandwidth_gbps": 1}}', "missing 'islands'"),
    ('{"islands": [], "dcn": {}}', "'islands' is empty"),
    ('{"islands": [{"name": "a", "device_kind": "cpu", "hosts": 0, "devices_per_host": 4,'
     ' "device_memory_bytes": 1, "ici": {"latency_us": 1, "bandwidth_gbps": 1}}],'
     ' "dcn": {"latency_us": 1, "bandwidth_gbps": 1}}', "islands[0]: 'hosts' must be positive"),
    ('{"islands": [{"name": "a", "device_kind": "cpu", "hosts": 1, "devices_per_host": 4,'
     ' "device_memory_bytes": 1, "ici": {"latency_us": 1, "bandwidth_gbps": 0}}],'
     ' "dcn": {"latency_us": 1, "bandwidth_gbps": 1}}', "islands[0].ici: 'bandwidth_gbps' must be positive"),
    ('{"islands": [{"name": "a", "device_kind": "cpu", "hosts": 1, "devices_per_host": 4,'
     ' "device_memory_bytes": 1, "ici": {"latency_us": 1, "bandwidth_gbps": 1}, "unavailable": [9]}],'
     ' "dcn": {"latency_us": 1, "bandwidth_gbps": 1}}', "unavailable device 9 is not in 0..3"),
    ('{"islands": [{"name": "a", "device_kind": "cpu", "hosts": 1, "devices_per_host": 4,'
     ' "device_memory_bytes": 9223372036854775808, "ici": {"latency_us": 1, "bandwidth_gbps": 1}}],'
     ' "dcn": {"latency_us": 1, "bandwidth_gbps": 1}}', "'device_memory_bytes' is 9223372036854775808, more than"),
    # Python's JSON reads NaN and Infinity: a link of NaN latency was lowered and simulated as if it were a number.
    ('{"islands": [{"name": "a", "device_kind": "cpu", "hosts": 1, "devices_per_host": 4,'
     ' "device_memory_bytes": 1, "ici": {"latency_us": NaN, "bandwidth_gbps": 1}}],'
     ' "dcn": {"latency_us": 1, "bandwidth_gbps": 1}}',
     "islands[0].ici: 'latency_us' must be a finite number, not nan"),
    ('{"islands": [{"name": "a", "device_kind": "cpu", "hosts": 1, "devices_per_host": 4,'
     ' "device_memory_bytes": 1, "ici": {"latency_us": 1, "bandwidth_gbps": 1}}],'
     ' "dcn": {"latency_us": 1, "bandwidth_gbps": Infinity}}',
     "cluster.json: dcn: 'bandwidth_gbps' must be a finite number, not inf"),
    # Quoted by every message about the island: a newline in it made pw-run's error two lines.
    ('{"islands": [{"name": "x\\ny", "device_kind": "cpu", "hosts": 1, "devices_per_host": 4,'
     ' "device_memory_bytes": 1, "ici": {"latency_us": 1, "bandwidth_gbps": 1}}],'
     ' "dcn": {"latency_us": 1, "bandwidth_gbps": 1}}', "islands[0]: 'name' must be a non-empty printable name, not 'x"),
    ('{"islands": [{"name": "a", "device_kind": "cpu", "hosts": 1, "devices_per_host": 4,'
     ' "device_memory_bytes": 1, "ici": {"latency_us": 1, "bandwidth_gbps": 1}}],'
     ' "dcn": {"latency_us": 1' + "0" * 400 + ', "bandwidth_gbps": 1}}',
     "cluster.json: dcn: 'latency_us' must be a finite number"),
])
def test_topology_errors_name_the_problem(text, message):
    with pytest.raises(TopologyError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        Topology.from_json(text, "cluster.json")


def test_link_model():
    assert Link(100.0, 8.0).transfer_seconds(1_000_000) == pytest.approx(100e-6 + 1e-3)


def _plan():
    topo = Topology.uniform(2, 4)
    inner = ProgramPlan("branch", topo, {}, {}, {}, (), (), {})
    return ProgramPlan(
        program="main", topology=topo,
        slices={"v0": SlicePlacement("v0", (2,), ("x",), "island0", (0, 2))},
        buffers={0: BufferInfo(0, (8, 4), "f32", "v0", (("x",), ()), 64),
                 1: BufferInfo(1, (8, 4), "f32", "v0", (("x",), ()), 64),
                 2: BufferInfo(2, (8, 4), "f32", "v0", (("x",), ()), 64),
                 3: BufferInfo(3, (), "i1", "v0", (), 1)},
        executables={"f": "AAAA"}, inputs=(0,), outputs=(1,),
        islands={"island0": (Copy(0, src_buffer=0, dst_buffer=2, link="ici", bytes=64),
                             Launch(1, after=(0,), executable="f", slice="v0", inputs=(2,), outputs=(1, 3),
                                    label="f#0"))},
        subgraphs=(Subgraph(0, True, ("island0",)),),
        host_steps=(Branch(2, after=(1,), pred_buffer=3, then_plan=inner, else_plan=inner),), flops={"f": 512})


def test_plan_round_trips_through_json():
    plan = _plan()
    text = plan.to_json()
    assert ProgramPlan.from_json(text) == plan
    # Default fields are left out: the JSON stays compact.
    assert '"pred_buffer"' not in json.dumps(json.loads(text)["islands"])
    assert plan.slices["v0"].device_ids() == [0, 1]
    assert [s.kind for s in plan.islands["island0"]] == ["copy", "launch"]
    assert plan.islands["island0"][1].consumed() == (2,) and plan.host_steps[0].produced() == ()


def _mutated(change):
    value = _plan().to_python()
    change(value)
    return json.dumps(value)


def _deep(depth):
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("text, message", [
    ("{", "not JSON"),
    (_deep(100_000), "nested too deeply"),
    (_mutated(lambda v: v["buffers"][0].update(shape=[1 << 40, 16])), "larger than"),
    (_mutated(lambda v: v["buffers"][0].update(shape=[-8, 4])), "negative"),
    (_mutated(lambda v: v["buffers"][0].update(shape=[0, 4], bytes_per_device=0)),
     "buffer 0: shape [0, 4] has no elements but is sharded: a zero-size buffer is replicated"),
    (_mutated(lambda v: v["buffers"][0].update(dtype="f7")), "unknown element type 'f7'"),
    (_mutated(lambda v: v["buffers"][0].update(bytes_per_device=-1)), "bytes_per_device is -1"),
    (_mutated(lambda v: v["islands"]["island0"][1].update(inputs=[42])), "names buffer 42, which is not declared"),
    (_mutated(lambda v: (v["islands"]["island0"][1].pop("after"), v["islands"]["island0"].pop(0))),
     "reads buffer 2, which nothing writes"),
    (_mutated(lambda v: v["islands"]["island0"].reverse()), "ordered before step 0"),
    (_mutated(lambda v: v["islands"]["island0"][0].update(kind="teleport")), "unknown step kind 'teleport'"),
    (_mutated(lambda v: v["slices"]["v0"].update(devices=[0, 9])), "not within island0's 4 devices"),
    (_mutated(lambda v: v["islands"]["island0"][1].update(executable="g")), "unknown executable 'g'"),
    (_mutated(lambda v: v["islands"]["island0"][1].update(inputs="2")), "expected a list"),
    (_mutated(lambda v: v["islands"]["island0"].append({"kind": "recv", "id": 9, "dst_buffer": 0,
                                                         "peer": "island1"})), "written twice"),
    (_mutated(lambda v: v["islands"]["island0"].insert(1, {"kind": "free", "id": 9, "after": [0], "buffers": [2]})),
     "step 9 \\(free\\) frees buffer 2 without waiting for step 1, which reads it"),
    (_mutated(lambda v: v["islands"]["island0"].append({"kind": "free", "id": 9, "after": [1, 2], "buffers": [1]})),
     "frees buffer 1 of the program's results"),
    (_mutated(lambda v: (v["slices"].update(v1={"name": "v1", "shape": [2], "axes": ["x"], "island": "island1",
                                                "devices": [0, 2]}), v["buffers"][2].update(slice="v1"))),
     "step 0 \\(copy\\) on island0 writes buffer 2, which lives on island1"),
    (_mutated(lambda v: v.update(peak_bytes={"island0": [3, 1, 64]})),
     "peak_bytes of 'island0' name devices 3..1, not a range of its 4 devices"),
    (_mutated(lambda v: v.update(peak_bytes={"island0": [0, 9, 64]})),
     "peak_bytes of 'island0' name devices 0..9, not a range of its 4 devices"),
    (_mutated(lambda v: v["islands"]["island0"].append({"kind": "send", "id": 9, "after": [1], "src_buffer": 1,
                                                         "dst_buffer": 2, "peer": "island1", "link": "dcn",
                                                         "bytes": 64})),
     "step 9 \\(send\\) of buffer 1 has no matching recv of buffer 2 on island1"),
    # A copy into a buffer of another dtype or shape ran: its values converted (int32 zeros), or failed halfway.
    (_mutated(lambda v: v["buffers"][2].update(dtype="i32")),
     "step 0 \\(copy\\) moves buffer 0 \\(f32[8, 4]\\) into buffer 2 \\(i32[8, 4]\\): a move keeps its "
     "shape and dtype"),
    # A program argument with no home (pw-lower's passes without pw-insert-transfers) passed every check, and
    # its run failed with an internal KeyError.
    (_mutated(lambda v: v["buffers"][0].update(slice=None, sharding=[], bytes_per_device=128)),
     "step 0 \\(copy\\) on island0 reads buffer 0, which lives on the host: a program argument with no home "
     "slice \\(pw-insert-transfers gives each one\\)"),
    # A move's bytes were never checked: 10**15 made pw-run --emulate-dcn sleep for days, a negative count failed
    # the run halfway, and pw-sim simulated either.
    (_mutated(lambda v: v["islands"]["island0"][0].update(bytes=10 ** 15)),
     "step 0 \\(copy\\): its 'bytes' is 1000000000000000, but buffer 2 has 64 bytes per device"),
    (_mutated(lambda v: v["islands"]["island0"][0].update(bytes=-64)), "step 0 \\(copy\\): its 'bytes' is -64"),
    (_mutated(lambda v: v["islands"]["island0"][0].update(bytes=10 ** 400)),
     "its 'bytes' is a 401-digit number, but buffer 2"),
    # Flops of 10**400 were an OverflowError in pw-sim and in pw-run's admission; negative or boolean ones passed.
    (_mutated(lambda v: v["flops"].update(f=10 ** 400)),
     "flops of executable 'f' are a 401-digit number, not an integer from 0 to 2\\*\\*63 - 1"),
    (_mutated(lambda v: v["flops"].update(f=-1)), "flops of executable 'f' are -1, not an integer"),
    (_mutated(lambda v: v["flops"].update(f=True)), "flops of executable 'f' are True, not an integer"),
    # A cond that reads a tensor as its predicate passed, and failed only at the run with NumPy's message.
    (_mutated(lambda v: v["host_steps"][0].update(pred_buffer=1)),
     "step 2 \\(cond\\) reads buffer 1 \\(f32[8, 4]\\) as its predicate, which must be a scalar of a boolean, "
     "integer or float type"),
])
def test_hostile_plan_json_is_one_clear_error(text, message):
    with pytest.raises(PlanError, match=message.replace("[", r"\[").replace("'", "'")):
        ProgramPlan.from_json(text)


@pytest.mark.parametrize("dtype, size", [("i32", 4), ("f16", 2), ("ui8", 1)])
def test_a_conds_predicate_may_be_an_integer_or_a_float_scalar(dtype, size):
    value = _plan().to_python()
    value["buffers"][3].update(dtype=dtype, bytes_per_device=size)
    assert ProgramPlan.from_json(json.dumps(value)).buffers[3].dtype == dtype


def test_dcn_pairs_limit_connectivity_and_round_trip():
    text = Topology.uniform(3, 2).to_json()[:-2] + ',\n  "dcn_pairs": [["island0", "island1"]]\n}'
    topo = Topology.from_json(text)
    assert topo.connected("island1", "island0") and topo.connected("island2", "island2")
    assert not topo.connected("island0", "island2")
    assert topo.link("island0", "island1")[0] == "dcn"
    with pytest.raises(TopologyError, match="no DCN link joins island0 and island2"):
        topo.link("island0", "island2")
    assert Topology.from_json(topo.to_json()) == topo
    assert Topology.from_python(topo.without_device("island2", 1).to_python()).dcn_pairs == topo.dcn_pairs
    with pytest.raises(TopologyError, match="'dcn_pairs' names unknown island 'island9'"):
        Topology.from_json(text.replace('"island1"]]', '"island9"]]'))


def test_topology_from_option(tmp_path):
    assert Topology.from_option("2x4") == Topology.uniform(2, 4)
    path = tmp_path / "cluster.json"
    path.write_text(Topology.uniform(1, 8).to_json())
    assert Topology.from_option(str(path)) == Topology.uniform(1, 8)
    for shape in ("0x4", "2x", "x4", "-1x4", "2x-4"):   # (a negative count said "No such file")
        with pytest.raises(TopologyError, match=f"topology '{shape}': expected ISLANDSxDEVICES, two positive "
                                                "integers such as 2x4, or a topology JSON file"):
            Topology.from_option(shape)
    with pytest.raises(TopologyError, match="cannot read topology"):
        Topology.from_option(str(tmp_path / "missing.json"))

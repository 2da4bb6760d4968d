"""The topology description and the plan data model: parsing, errors, round trips."""

import json

import pytest

from pathways_mlir.dialect.plan import BufferInfo, ProgramPlan, SlicePlacement, Step, Subgraph
from pathways_mlir.dialect.topology import Link, Topology, TopologyError


def test_uniform_topology_round_trips_through_json():
    topo = Topology.uniform(2, 4).without_device("island1", 2)
    again = Topology.from_json(topo.to_json())
    assert again == topo
    assert again.island("island1").available() == [0, 1, 3]
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
])
def test_topology_errors_name_the_problem(text, message):
    with pytest.raises(TopologyError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        Topology.from_json(text, "cluster.json")


def test_link_model():
    assert Link(100.0, 8.0).transfer_seconds(1_000_000) == pytest.approx(100e-6 + 1e-3)


def test_plan_round_trips_through_json():
    topo = Topology.uniform(2, 4)
    inner = ProgramPlan("branch", topo, {}, {}, {}, (), (), {})
    plan = ProgramPlan(
        program="main", topology=topo,
        slices={"v0": SlicePlacement("v0", (2,), ("x",), "island0", (0, 2))},
        buffers={0: BufferInfo(0, (8, 4), "f32", None, ((), ()), 128),
                 1: BufferInfo(1, (8, 4), "f32", "v0", (("x",), ()), 64)},
        executables={"f": "AAAA"}, inputs=(0,), outputs=(1,),
        islands={"island0": (Step(0, "copy", src_buffer=0, dst_buffer=2, link="ici"),
                             Step(1, "launch", after=(0,), executable="f", slice="v0", inputs=(2,),
                                  outputs=(1,), label="f#0"))},
        subgraphs=(Subgraph(0, True, ("island0",)),),
        host_steps=(Step(2, "cond", after=(1,), pred_buffer=1, then_plan=inner, else_plan=inner),))
    text = plan.to_json()
    assert ProgramPlan.from_json(text) == plan
    # Default fields are left out: the JSON stays compact.
    assert '"pred_buffer"' not in json.dumps(json.loads(text)["islands"])
    assert plan.slices["v0"].device_ids() == [0, 1]

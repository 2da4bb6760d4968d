"""The topology description and the plan data model: parsing, errors, round trips."""

import json

import pytest

from pathways_mlir.dialect.plan import BufferInfo, ProgramPlan, SlicePlacement, Step, Subgraph
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
    with pytest.raises(TopologyError, match="cannot read topology"):
        Topology.from_option("0x4")

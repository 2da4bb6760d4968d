"""pw-place: device windows without per-device state, strategy=auto's choices, memory checks."""

import pathlib

import numpy as np
import pytest

from pathways_mlir.dialect import ops
from pathways_mlir.dialect.topology import Island, Link, Topology
from pathways_mlir.passes import LoweringError, lower
from pathways_mlir.passes.placement_cost import Devices, Loads, Window

ROOT = pathlib.Path(__file__).resolve().parents[1]
THREE_BLOCKS = (ROOT / "examples" / "three_blocks.mlir").read_text()


def _island(devices: int, down: tuple[int, ...]) -> Island:
    return Island("i", "cpu", 1, devices, 1 << 30, Link(1.0, 100.0), down)


@pytest.mark.parametrize("seed", range(20))
def test_windows_match_a_per_device_search(seed):
    """Loads and Devices agree with the per-device arrays they replace."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 40))
    down = tuple(sorted(set(int(d) for d in rng.integers(0, n, size=int(rng.integers(0, n // 3 + 1))))))
    island = _island(n, down)
    topology = Topology((island,), Link(100.0, 25.0))
    loads, devices = Loads(topology), Devices(island)
    available = np.array([d for d in range(n) if d not in down])
    per_device = np.zeros(len(available), dtype=np.int64)
    for _ in range(6):
        size = int(rng.integers(1, len(available) + 1))
        sums = np.convolve(per_device, np.ones(size, dtype=np.int64), "valid")
        load, window = loads.best_window("i", size)
        assert (load, window.start) == (int(sums.min()), int(np.argmin(sums)))
        ids = available[window.start:window.end]
        ranges = devices.ranges(window)
        assert [d for b, e in zip(ranges[::2], ranges[1::2]) for d in range(b, e)] == list(ids)
        assert devices.position(int(ids[0])) == window.start
        loads.add(window)
        per_device[window.start:window.end] += 1


def _links(lowered) -> list[str]:
    return [ops.attr(op, "link") for program in ops.programs(lowered).values()
            for op in ops.program_body(program).operations if op.name in ops.DATA_MOVEMENT_OPS]


def test_auto_keeps_the_three_blocks_off_the_dcn():
    spread = lower(THREE_BLOCKS, Topology.uniform(2, 4), strategy="spread")
    auto = lower(THREE_BLOCKS, Topology.uniform(2, 4), fuse=False)      # the two moves placement chose
    assert _links(spread) == ["dcn", "dcn"]
    assert _links(auto) == ["ici", "ici"]


def test_lower_explains_only_when_asked():
    def costs(lowered):
        return [ops.attr(op, ops.PLACEMENT_COST) for op in ops.top_level_ops(lowered) if op.name == "pw.virtual_slice"]
    assert set(costs(lower(THREE_BLOCKS, Topology.uniform(2, 4)))) == {None}
    explained = costs(lower(THREE_BLOCKS, Topology.uniform(2, 4), strategy="spread", explain=True))
    assert len({c["step_ns"] for c in explained}) == 1 and all(c["step_ns"] > 0 for c in explained)


def test_a_long_chain_is_placed_greedily_and_stays_in_one_island():
    """Twelve 2-device stages on four islands: too many combinations to try, so greedy and local search."""
    slices = "\n".join(f'"pw.virtual_slice"() {{sym_name = "s{i}", shape = array<i64: 2>, axes = ["x"], '
                       f'constraints = {{}}}} : () -> ()' for i in range(12))
    calls = "\n".join(f'  %{i + 1} = "pw.compute"(%{i}) {{callee = @f, slice = @s{i}, in_shardings = [[["x"]]], '
                      f'out_shardings = [[["x"]]], label = "s{i}#0"}} : (tensor<8xf32>) -> tensor<8xf32>'
                      for i in range(12))
    text = f"""{slices}
module @f attributes {{pw.executable}} {{
  func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {{
    %0 = "stablehlo.tanh"(%x) : (tensor<8xf32>) -> tensor<8xf32>
    return %0 : tensor<8xf32>
  }}
}}
func.func @chain(%0: tensor<8xf32>) -> tensor<8xf32> attributes {{pw.program}} {{
{calls}
  return %12 : tensor<8xf32>
}}"""
    assert "dcn" in _links(lower(text, Topology.uniform(4, 4), strategy="spread"))
    assert set(_links(lower(text, Topology.uniform(4, 4)))) <= {"ici"}


def test_placement_never_walks_the_devices():
    """10^12 devices per island: anything per device would never finish."""
    lowered = lower(THREE_BLOCKS, Topology.uniform(2, 10 ** 12))
    placements = [ops.attr(op, ops.PLACEMENT) for op in ops.top_level_ops(lowered) if op.name == "pw.virtual_slice"]
    assert [(p["island"], p["devices"]) for p in placements] == [
        ("island0", (0, 2)), ("island0", (2, 6)), ("island0", (6, 8))]


def test_buffers_larger_than_any_device_are_a_placement_error():
    huge = THREE_BLOCKS.replace("8x16xf32", "1099511627776x16xf32")
    with pytest.raises(LoweringError, match=r"cannot place slice @slice_a: computation 'block_a#0' needs "
                                            r"70368744177664 bytes per device .*value %arg0 "):
        lower(huge, Topology.uniform(2, 4))


def test_a_pin_to_devices_too_small_says_what_the_buffers_need():
    big = THREE_BLOCKS.replace("8x16xf32", "8192x16384xf32")  # 512 MiB, 256 MiB per device of slice_a
    topology = Topology((Island("small", "cpu", 1, 4, 1 << 28, Link(1.0, 100.0)),
                         Island("large", "cpu", 1, 4, 1 << 30, Link(1.0, 100.0))), Link(100.0, 25.0))
    with pytest.raises(LoweringError, match=r"slice @slice_a is pinned to small, which cannot hold it: its devices "
                                            r"have 268435456 bytes, but computation 'block_a#0' needs 536870912 bytes"):
        lower(big, topology, pin="slice_a=small")
    placed = lower(big, topology)
    assert {ops.attr(op, ops.PLACEMENT)["island"] for op in ops.top_level_ops(placed)
            if op.name == "pw.virtual_slice"} == {"large"}

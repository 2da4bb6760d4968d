"""Elastic slices (embedded backend): a range of sizes, placed at the largest that fits, and a training
loop that shrinks onto fewer devices and grows back, matching plain JAX run on the same schedule of meshes."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.dialect.topology import Island, Topology
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import EMBEDDED_DCN, EMBEDDED_ICI, DeviceMap, embedded_device_map
from pathways_mlir.runtime.runtime import Runtime
from fetching import fetch, settled
from training import (assert_same_training, batch, elastic_step, mesh_sizes, on_the_same_meshes, preemption,
                      train_elastic)

WAIT = 60          # seconds: every wait is bounded
X = np.arange(16, dtype=np.float32).reshape(16, 1)

double = pw.jit(lambda x: x * 2.0, slice=pw.virtual_slice("2..8", axes="data", name="elastic_double"),
                in_specs=P("data"), out_specs=P("data"))


@pw.program
def doubled(x):
    return double(x)


def test_a_range_of_sizes_is_a_slice_at_its_largest_with_a_min_shape():
    s = pw.virtual_slice(("4..8", 2), axes=("data", "model"))
    assert (s.shape, s.constraints, s.elastic) == ((8, 2), {"min_shape": (4, 2)}, True)
    assert repr(s) == "Slice(unnamed: data=4..8, model=2)"
    keyword = pw.virtual_slice((8, 2), axes=("data", "model"), min_shape=(4, 2))
    assert (keyword.shape, keyword.constraints) == (s.shape, s.constraints)
    assert not pw.virtual_slice(("4..4", 2), axes=("data", "model")).elastic
    with pytest.raises(ValueError, match=r"slice 'd': a range of sizes is 'lo..hi' with 0 < lo <= hi, not '8..4'"):
        pw.virtual_slice("8..4", axes="data", name="d")
    with pytest.raises(ValueError, match="give its range once, as 'lo..hi' sizes or as min_shape, not both"):
        pw.virtual_slice("2..8", axes="data", min_shape=(2,))
    with pytest.raises(ValueError, match=r"constraint 'min_shape' must be 2 positive integers, not \[4\]"):
        pw.virtual_slice((8, 2), axes=("data", "model"), min_shape=(4,))
    with pytest.raises(ValueError, match=r"shape \[8\] is not between min_shape \[9\] and max_shape \[8\]"):
        pw.virtual_slice(8, axes="data", min_shape=(9,))
    with pytest.raises(TypeError, match="unknown slice constraint 'max_shape'"):
        pw.virtual_slice(8, axes="data", max_shape=(16,))


def test_placement_picks_the_largest_shape_that_fits_and_divides_and_grows_back():
    rt = Runtime(embedded_device_map(1, 8))
    try:
        with Client(rt) as client:
            assert doubled.compiled(X, runtime=rt).plan.slices["elastic_double"].shape == (8,)
            for device in range(3, 8):                  # 3 devices left: 3 does not divide 16 rows
                rt.resources.remove_device("island0", device)
            np.testing.assert_allclose(fetch(doubled.run(X, client=client)), X * 2)
            assert doubled.compiled(X, runtime=rt).plan.slices["elastic_double"].shape == (2,)
            rt.resources.remove_device("island0", 2)
            rt.resources.remove_device("island0", 1)    # 1 device: below the range
            with pytest.raises(ValueError, match="cannot place slice @elastic_double: it needs 2 to 8 devices"):
                doubled.run(X, client=client)
            for device in range(1, 8):
                rt.resources.add_device("island0", device)
            np.testing.assert_allclose(fetch(doubled.run(X, client=client)), X * 2)
            assert doubled.compiled(X, runtime=rt).plan.slices["elastic_double"].shape == (8,)
        assert settled(rt, WAIT)
    finally:
        rt.close()


# -- training that shrinks and grows -----------------------------------------------------------------------

DATA = pw.virtual_slice("1..4", axes="x", name="elastic_train")
train_step = elastic_step(DATA)


def train(rt, steps, at, **options):
    with Client(rt) as client:
        return train_elastic(client, train_step, steps, at, WAIT, **options)


def sizes(trainer, steps):
    return mesh_sizes(trainer, steps, "elastic_train")


def test_training_shrinks_when_devices_go_and_grows_back_splitting_the_same_batch():
    rt = Runtime(embedded_device_map(1, 4))
    try:
        params, losses, trainer = train(rt, 8, preemption(rt, (2, 3), at=3, back_at=5))
        assert sizes(trainer, 8) == [4, 4, 4, 2, 2, 4, 4, 4]
        assert trainer.recoveries == []
        assert_same_training((params, losses), on_the_same_meshes(sizes(trainer, 8), batch))
        assert settled(rt, WAIT)
    finally:
        rt.close()


def test_training_shrinks_its_global_batch_when_the_user_chooses():
    rt = Runtime(embedded_device_map(1, 4))
    try:
        asked = []

        def per_shard(step, shards):
            asked.append((step, shards))
            return batch(step, rows=2 * shards)

        params, losses, trainer = train(rt, 6, preemption(rt, (1, 2, 3), at=2, back_at=4), batch=per_shard,
                                        shrink="batch", data_slice=DATA)
        assert sizes(trainer, 6) == [4, 4, 1, 1, 4, 4]
        assert asked == [(i, n) for i, n in enumerate(sizes(trainer, 6))]
        assert_same_training((params, losses), on_the_same_meshes(sizes(trainer, 6),
                                                                 lambda i: batch(i, rows=2 * sizes(trainer, 6)[i])))
        assert settled(rt, WAIT)
    finally:
        rt.close()


def test_training_loses_its_island_carries_on_smaller_and_grows_back_when_it_returns():
    # island0 has 4 devices, island1 2: the step runs on island0 until it is lost, on island1's 2 devices
    # while it is away (recovered from a host snapshot), and on island0's 4 again once it is back.
    devices = jax.devices()
    topology = Topology((Island("island0", "cpu", 1, 4, 1 << 30, EMBEDDED_ICI),
                         Island("island1", "cpu", 1, 2, 1 << 30, EMBEDDED_ICI)), EMBEDDED_DCN)
    rt = Runtime(DeviceMap(topology, {"island0": tuple(devices[:4]), "island1": tuple(devices[4:6])}))
    try:
        params, losses, trainer = train(rt, 9, {3: lambda: rt.lose_island("island0"),
                                                6: lambda: rt.restore_island("island0")})
        shrunk = sizes(trainer, 9)
        # The lost step's run may have been over before the loss (no recovery). A recovery replays from the latest
        # snapshot: step 2's, or step 0's if step 2's copy was still reading island0 when it was lost (a busy
        # machine), and the steps it replays run on 2 devices.
        assert len(trainer.recoveries) <= 1
        on_island0 = trainer.recoveries[0].snapshot_step if trainer.recoveries else 4
        assert shrunk[:on_island0] == [4] * on_island0 and shrunk[-1] == 4 and set(shrunk) == {2, 4}
        assert_same_training((params, losses), on_the_same_meshes(shrunk, batch))
        assert settled(rt, WAIT)
    finally:
        rt.close()


def test_shrink_options_are_checked_in_one_line():
    with pytest.raises(ValueError, match="shrink must be one of 'split', 'batch', not 'halve'"):
        pw.ElasticTrainer(train_step, batch, snapshot_every=1, shrink="halve")
    with pytest.raises(ValueError, match="shrink='batch' needs data_slice="):
        pw.ElasticTrainer(train_step, batch, snapshot_every=1, shrink="batch")
    with pytest.raises(ValueError, match="data_slice must be an elastic pw.virtual_slice"):
        pw.ElasticTrainer(train_step, batch, snapshot_every=1, shrink="batch",
                          data_slice=pw.virtual_slice(4, axes="x"))


def test_a_trace_whose_values_no_one_shape_divides_names_the_slice():
    pair = pw.virtual_slice("2..3", axes="x", name="elastic_pair")
    two = pw.jit(lambda x: x, slice=pair, in_specs=P("x"), out_specs=P("x"))

    @pw.program
    def both(x, y):
        return two(x), two(y)

    with pytest.raises(pw.PlacementError, match=r"test_elastic_shapes.py:\d+: no shape of slice @elastic_pair "
                                                r"between \[2\] and \[3\] divides every value sharded over it"):
        both.lower(np.ones(2, np.float32), np.ones(3, np.float32))

"""A client process of a `pw-serve` service, for tests/test_service.py.

    python service_client.py SERVICE_FILE ROLE

Every role connects with `pw.connect(SERVICE_FILE)`, runs programs across both islands (pytree outputs,
a result passed back in, `f.compiled`, a placed function alone) and checks each result against plain JAX
in this process, then prints one JSON line per stage and:

- `close`: disconnects by `pw.configure()`;
- `hold`: runs `big` (half of island0's device memory) and keeps its result until it is killed;
- `park`: runs `big` while a `hold` client keeps its result, which only that handle holds, so that the run is
  refused at once with `OutOfDeviceMemory` naming the holder; says so, then after a line on stdin (the `hold`
  client has been killed meanwhile) runs `big` again and checks it;
- `cancel`: starts a long computation on island1 and cancels it with `pw.cancel`: its handle raises
  `RunCancelled`;
- `spin`: starts a computation of about a minute on island1, says so, and holds on until it is killed;
- `stuck`: after a line on stdin (island0 has been closed meanwhile), runs `step`, whose island1 part
  then waits forever for island0's send; says so once `result(timeout)` times out, and holds on until
  it is killed.

Every wait is bounded.
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.admission import OutOfDeviceMemory
from pathways_mlir.runtime.remote_client import RemoteHandle

TIMEOUT = 120.0
BIG = (2, 32768)       # float32, split over island0's 2 devices: 128 KiB per device in, 128 KiB out

island0 = pw.virtual_slice(2, axes="d", island="island0")
island1 = pw.virtual_slice(2, axes="d", island="island1")


@pw.jit(slice=island0, in_specs=P("d"), out_specs=P("d"))
def encode(x):
    return jnp.tanh(x) * 2.0


@pw.jit(slice=island1, in_specs=P("d"), out_specs=({"square": P("d"), "total": None}, None))
def summarize(x):
    return {"square": x * x, "total": jnp.sum(x)}, jnp.mean(x, axis=0)


@pw.program
def step(x):
    return summarize(encode(x))


@pw.jit(slice=island0, in_specs=P("d"), out_specs=P("d"))
def big(x):
    return x * 3.0 + 1.0


@pw.jit(slice=island1, in_specs=(P(), P()), out_specs=P())
def spin(x, n):
    return jax.lax.fori_loop(0, n, lambda _, y: jnp.sin(y) * 0.5 + 0.25, x)


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def check(got, want) -> None:
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert isinstance(g, RemoteHandle), type(g)
        np.testing.assert_allclose(np.asarray(g.result(TIMEOUT)), np.asarray(w), rtol=1e-6)


def main(service_file: str, role: str) -> None:
    client = pw.connect(service_file, timeout=TIMEOUT)
    seed = int.from_bytes(role.encode(), "little") % 1000
    x = np.random.default_rng(seed).normal(size=(8, 4)).astype(np.float32)
    reference = jax.jit(lambda v: summarize.fn(encode.fn(v)))

    out = step(x)                                            # a program over both islands; a pytree of handles
    assert jax.tree.structure(out) == jax.tree.structure(reference(x))
    check(out, reference(x))
    total, want = out[0]["total"], reference(x)[0]["total"]                # a remote handle is array-like too
    assert abs(float(total) - float(want)) <= 1e-5 * abs(float(want)) and len(out[1]) == 4
    np.testing.assert_allclose(out[1] * 2 - 1, reference(x)[1] * 2 - 1, rtol=1e-5, atol=1e-6)
    again = step.compiled(x)(x)                              # the cached stage, lowered for the service
    check(again, reference(x))
    twice = encode(encode(x))                                # op by op; a result passed back stays there
    check(twice, jnp.tanh(jnp.tanh(x) * 2.0) * 2.0)
    assert twice.shape == (8, 4) and twice.dtype == np.float32
    twice.delete()
    del again                                                # dropped: released with the next request
    status = pw.status()
    mine = client.object_count()
    assert mine == 3 and mine in [c["objects"] for c in status["clients"].values()]
    say(stage="checked", objects=mine)

    if role == "close":
        pw.configure()                                       # back to an embedded runtime: disconnects
        assert client.closed
        say(stage="closed")
    elif role == "hold":
        held = big(np.ones(BIG, np.float32))
        check(held, np.full(BIG, 4.0, np.float32))
        say(stage="holding", objects=client.object_count())
        sys.stdin.read()                                     # holds its results until it is killed
    elif role == "park":
        value = np.arange(np.prod(BIG), dtype=np.float32).reshape(BIG)
        try:
            big(value).result(timeout=TIMEOUT)
            raise AssertionError("the run was admitted although memory is held")
        except OutOfDeviceMemory as error:
            say(stage="refused", message=str(error))
        sys.stdin.readline()
        check(big(value), value * 3.0 + 1.0)
        client.close()
        say(stage="done")
    elif role == "cancel":
        v = np.ones(1024, np.float32)
        spin(v, np.int32(1)).result(timeout=TIMEOUT)
        long = spin(v, np.int32(1_000_000))
        assert pw.cancel(long)
        try:
            long.result(timeout=TIMEOUT)
            raise AssertionError("a cancelled run's handle returned its value")
        except pw.RunCancelled as error:
            say(stage="cancelled", message=str(error))
    elif role == "spin":
        v = np.ones(1024, np.float32)
        spin(v, np.int32(1)).result(timeout=TIMEOUT)
        long = spin(v, np.int32(30_000_000))
        say(stage="spinning")
        sys.stdin.read()
        del long
    elif role == "stuck":
        sys.stdin.readline()
        stuck = step(x)
        try:
            jax.tree.leaves(stuck)[0].result(timeout=1.0)
            raise AssertionError("island1 got island0's value although island0 is closed")
        except TimeoutError:
            say(stage="stuck")
        sys.stdin.read()


if __name__ == "__main__":
    main(*sys.argv[1:])

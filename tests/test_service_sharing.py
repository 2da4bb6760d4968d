"""Shared objects through a real `pw-serve` process, with two real client processes (tests/shared_client.py).

The owner shares a base; the reader, given its token, reads it (plain JAX's values) while a guessed token
is refused in one line, its donation is refused and its release of handle keys touches only its own; the
service's ledger holds the base once; once the owner releases it the bytes come back and the token is
refused. Every wait has a timeout; every process started here is stopped.
"""

import contextlib
import gc
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_service import TIMEOUT, procs, read_json, serve, wait_status  # noqa: F401  (procs: a fixture)

import pathways_mlir as pw
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.endpoint import Endpoint
from pathways_mlir.runtime.remote_client import RemoteClient, RemoteError
from pathways_mlir.runtime.runtime import Runtime
from pathways_mlir.runtime.service import open_connection
from pathways_mlir.runtime.session import Session

SHARING_CLIENT = str(Path(__file__).with_name("shared_client.py"))
BASE_BYTES = 64 * 16 * 4                  # on each of island0's 2 devices


def sharing_client(service_file, procs, *args):
    proc = subprocess.Popen([sys.executable, SHARING_CLIENT, str(service_file), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(proc)
    return proc


def reserved(status) -> dict:
    return {island: list(per_device) for island, per_device in status["reserved"].items()}


def test_a_shared_base_is_a_capability_read_once_and_reclaimed_after_its_owner(tmp_path, procs):
    directory = tmp_path / "service"
    directory.mkdir(mode=0o700)
    service_file = directory / "service.json"
    serve(procs, "--service-file", str(service_file))
    observer = open_connection(str(service_file), timeout=TIMEOUT)
    try:
        owner = sharing_client(service_file, procs, "owner")
        token = read_json(owner)["token"]
        assert isinstance(token, str) and len(token) >= 43          # 256 random bits
        reader = sharing_client(service_file, procs, "reader", token)
        guessed = read_json(reader)
        for refusal in guessed.values():
            assert refusal.startswith("RemotePermissionError: no shared object has the reference 'AAAAAA'...")
            assert "\n" not in refusal
        assert read_json(reader) == {"read": True}
        donated = read_json(reader)["donated"]
        assert donated == ("ValueError: argument leaf 1 of program @head is a shared object, which is read-only: "
                           "it cannot be donated (leave it out of donate_argnums/donate_argnames)")
        assert read_json(reader) == {"read_again": True, "objects": 0}
        status = wait_status(observer, lambda s: reserved(s)["island0"] == [BASE_BYTES, BASE_BYTES])
        assert reserved(status) == {"island0": [BASE_BYTES, BASE_BYTES], "island1": [0, 0]}   # once, the owner's
        owner.stdin.write("\n")
        owner.stdin.flush()
        assert read_json(owner) == {"released": True}
        status = wait_status(observer, lambda s: not any(n for v in s["reserved"].values() for n in v))
        assert reserved(status) == {"island0": [0, 0], "island1": [0, 0]}
        reader.stdin.write("\n")
        reader.stdin.flush()
        after = read_json(reader)["after_release"]
        assert after.startswith("RemotePermissionError: no shared object has the reference ")
        for proc in (owner, reader):
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.wait(TIMEOUT) == 0, proc.stderr.read()[-3000:]
        status = wait_status(observer, lambda s: s["clients"] == {})
        assert status["clients"] == {} and np.sum([v for v in status["reserved"].values()]) == 0
    finally:
        observer.close()


double = pw.jit(lambda x: x * 2.0, slice=pw.virtual_slice(1, axes="d", island="island0"), in_specs=None,
                out_specs=None)


@contextlib.contextmanager
def owner_and_reader():
    """An endpoint in this process on a fresh runtime, and two connections to it: (endpoint, owner, reader)."""
    runtime = Runtime(embedded_device_map(2, 2))
    try:
        with Endpoint(runtime) as endpoint, \
                RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as owner, \
                RemoteClient(endpoint.address, key_path=endpoint.key_path, timeout=TIMEOUT) as reader:
            yield endpoint, owner, reader
    finally:
        runtime.close()


def test_an_owner_that_shares_and_releases_again_and_again_leaves_no_tokens_behind():
    """A long-lived owner's released shared objects take their tokens with them: the endpoint's table and the
    connection's own list keep only the objects still shared (they had kept one entry per share ever made,
    until the owner left or the token was looked up)."""
    x = np.ones((8, 16), np.float32)
    with owner_and_reader() as (endpoint, owner, reader):
        kept = double.compiled(x, runtime=owner)(x)
        kept_ref = owner.share(kept)
        for _ in range(20):
            held = double.compiled(x, runtime=owner)(x)
            ref = owner.share(held)
            assert reader.shared(ref.token).shape == (8, 16)
            held.delete()
        assert owner.object_count() == 1
        assert list(endpoint._shared) == [kept_ref.token]      # the released objects' tokens are gone
        sessions = [o for o in gc.get_objects() if isinstance(o, Session) and o.endpoint is endpoint]
        assert len(sessions) == 2 and [t for s in sessions for t in s.tokens.values()] == [kept_ref.token]
        del sessions
        with pytest.raises(RemoteError, match="^no shared object has the reference"):
            reader.shared(ref.token)
        np.testing.assert_array_equal(np.asarray(double.compiled(x, runtime=reader)(reader.shared(
            kept_ref.token))), np.full((8, 16), 4.0, np.float32))


def test_a_reader_fetches_a_shared_objects_value_by_its_token_until_its_owner_releases_it():
    """`fetch` takes a shared object's token instead of a handle (what `RemoteSharedRef.result` sends), for any
    connection given the token; one naming both is refused in one line, and a token whose object was released
    is refused as a run taking it is."""
    x = np.arange(128, dtype=np.float32).reshape(8, 16)
    with owner_and_reader() as (endpoint, owner, reader):
        held = double.compiled(x, runtime=owner)(x)
        ref = reader.shared(owner.share(held).token)
        _, [value] = reader._call({"op": "fetch", "token": ref.token, "timeout": TIMEOUT})
        np.testing.assert_array_equal(value, 2 * x)
        np.testing.assert_array_equal(np.asarray(ref), 2 * x)
        with pytest.raises(RemoteError, match="^request 'fetch' names a handle or a shared object's token, not "
                                              "both$"):
            reader._call({"op": "fetch", "token": ref.token, "handle": 0})
        held.delete()
        assert owner.object_count() == 0                # its release, sent alone, is taken by now
        with pytest.raises(PermissionError, match="^no shared object has the reference"):
            ref.result(TIMEOUT)
        assert ref.is_deleted() and reader.object_count() == 0
        kept = reader.shared(owner.share(double.compiled(x, runtime=owner)(x)).token)
        assert not kept.is_deleted()
        endpoint.close()                 # the service goes: a reference read through it is gone, no error
        assert kept.is_deleted() and kept.is_deleted()     # (it raised ServiceError, found by a review)


def test_a_reader_reads_a_shared_typed_key_or_weakly_typed_value_as_its_owner_does():
    """Through a service too, a shared reference reads as the owner's handle does, the owner's and the one a
    reader makes of its token: typed PRNG keys as keys of their implementation, a weakly typed value weakly
    typed. The token carried only its data's shape and dtype: a reader's `split` of a shared key computed on its
    uint32 key data, and `bf16 * lr` of a shared weakly typed `lr` was float32. A value type that is not one is
    refused in one line."""
    s = pw.virtual_slice(1, axes="d", island="island0")
    make = pw.jit(lambda seed: jax.random.key(seed, impl="rbg"), slice=s)
    split = pw.jit(jax.random.split, slice=s)
    half = pw.jit(lambda lr: lr * 0.5, slice=s)
    scale = pw.jit(lambda x, lr: x * lr, slice=s)
    x = jnp.ones(2, jnp.bfloat16)
    seed = np.int32(0)
    with owner_and_reader() as (endpoint, owner, reader):
        key = make.compiled(seed, runtime=owner)(seed)
        ref = owner.share(key)
        for client, shared in ((owner, ref), (reader, reader.shared(ref.token))):
            assert (shared.shape, shared.dtype) == (key.shape, key.dtype)
            got = split.compiled(shared, runtime=client)(shared)
            assert (got.shape, got.dtype) == ((2,), key.dtype)
            np.testing.assert_array_equal(jax.random.key_data(got.result(TIMEOUT)),
                                          jax.random.key_data(jax.random.split(key.result(TIMEOUT))))
        lr = half.compiled(0.1, runtime=owner)(0.1)
        ref = owner.share(lr)
        want = jax.jit(lambda x, lr: x * lr)(x, lr.result(TIMEOUT))
        for client, shared in ((owner, ref), (reader, reader.shared(ref.token))):
            assert shared.weak_type and shared.result(TIMEOUT).weak_type
            got = scale.compiled(x, shared, runtime=client)(x, shared)
            assert got.dtype == want.dtype == jnp.bfloat16
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        with pytest.raises(RemoteError, match="^request 'share' needs 'weak_type' as a bool, not 1$"):
            owner._call({"op": "share", "handle": lr.owned()._key, "weak_type": 1})

"""A client process that shares a base, or reads one, on a `pw-serve` service, for
tests/test_service_sharing.py.

    python shared_client.py SERVICE_FILE owner
    python shared_client.py SERVICE_FILE reader TOKEN

- `owner`: puts the base on island0 (replicated on its 2 devices), shares it and prints its token; after a
  line on stdin, releases it and says so; after another, disconnects.
- `reader`: tries a guessed token (checked, then as a run's argument), reads the base with the token it was
  given and checks the result against plain JAX, tries to donate it and to release the owner's handles,
  reads it again (it is still there), says each outcome; after a line on stdin (the owner has released
  it meanwhile), tries once more and says why it was refused; after another, disconnects.

Every outcome is one JSON line; every wait is bounded.
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import pathways_mlir as pw
from pathways_mlir.runtime.remote_client import RemoteError, RemoteSharedRef

TIMEOUT = 120.0
BASE = np.random.default_rng(0).normal(size=(64, 16)).astype(np.float32)
X = np.random.default_rng(1).normal(size=(4, 64)).astype(np.float32)

island0 = pw.virtual_slice(2, axes="d", island="island0")


@pw.jit(slice=island0, in_specs=None, out_specs=None)
def place(b):
    return b * 1.0


def head(x, b):
    return jnp.tanh(x @ b)


read = pw.jit(head, slice=island0, in_specs=(None, None), out_specs=None)
donating = pw.jit(head, slice=island0, in_specs=(None, None), out_specs=None, donate_argnums=1)


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def refusal(call) -> str:
    """Returns the error `call` raises (it must raise one)."""
    try:
        call()
    except (RemoteError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    raise AssertionError("the call was not refused")


def check(out) -> None:
    np.testing.assert_allclose(np.asarray(out.result(TIMEOUT)), np.asarray(jax.jit(head)(X, BASE)),
                               rtol=1e-4, atol=1e-5)
    out.delete()


def main(service_file: str, role: str, token: str | None = None) -> None:
    client = pw.connect(service_file, timeout=TIMEOUT)
    if role == "owner":
        base = place(BASE)
        ref = client.share(base)
        say(token=ref.token)
        sys.stdin.readline()
        np.testing.assert_array_equal(np.asarray(base.result(TIMEOUT)), BASE)     # the readers changed nothing
        base.delete()
        say(released=client.object_count() == 0)
        sys.stdin.readline()
    else:
        guessed = "A" * len(token)
        say(guessed=refusal(lambda: client.shared(guessed)),
            guessed_run=refusal(lambda: read(X, RemoteSharedRef(guessed, BASE.shape, "float32")).result(TIMEOUT)))
        ref = client.shared(token)
        assert ref.shape == BASE.shape and ref.dtype == np.float32
        check(read(X, ref))
        say(read=True)
        say(donated=refusal(lambda: donating(X, ref)))
        client._call({"op": "release"}, release=list(range(8)))   # the owner's handle keys: this connection's
        check(read(X, ref))                                          # still the owner's, still there
        say(read_again=True, objects=client.object_count())
        sys.stdin.readline()
        say(after_release=refusal(lambda: read(X, ref).result(TIMEOUT)))
        sys.stdin.readline()
    client.close()


if __name__ == "__main__":
    main(*sys.argv[1:])

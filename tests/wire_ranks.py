"""The rank limit of arrays that cross a connection, as each backend whose arrays do keeps it (pw-serve's, Ray's)."""

import jax.numpy as jnp
import numpy as np
import pytest

import pathways_mlir as pw


def check_ranks_cross(slice_, client, result_error: type, result_message: str) -> None:
    """Checks that arrays of up to NumPy's 64 dimensions cross as an argument and a result of a run on `slice_`
    by `client`; that a JAX argument of 65 is refused at its call, and a result of 65 fails its own read (as
    `result_error`, matching `result_message`) while its sibling reads, each in one line; and that the connection
    goes on."""
    add_one = pw.jit(lambda a: a + 1.0, slice=slice_)
    deepen = pw.jit(lambda a: (a.reshape((1,) * 64 + a.shape), a * 2.0), slice=slice_)
    assert np.asarray(add_one.run(np.ones((1,) * 64, np.float32), client=client).result(60)).shape == (1,) * 64
    with pytest.raises(ValueError, match=r"^argument leaf 0 of program @lambda \(argument\[0\]\) has 65 "
                                         r"dimensions, over the limit of 64 of an array sent"):
        add_one.run(jnp.ones((1,) * 65, np.float32), client=client)
    deep, doubled = deepen.run(np.ones(2, np.float32), client=client)
    deep.copy_to_host_async()        # asked for with its sibling's value, which leaves it out
    assert np.asarray(doubled).tolist() == [2.0, 2.0]
    with pytest.raises(result_error, match=result_message):
        np.asarray(deep)
    assert np.asarray(add_one.run(np.ones(2, np.float32), client=client).result(60)).tolist() == [2.0, 2.0]

"""The client front end: JAX functions placed on virtual slices, traced into pw IR.

    slice_a = virtual_slice((2,), axes=("data",))        # slices.py
    block_a = jit(fn, slice=slice_a, in_specs=P("data"))  # placed.py
    @program                                              # tracer.py
    def step(x): return block_b(block_a(x))
    step.lower(x).as_text()                               # lowered.py

Arguments follow `jax.jit`: static, donated and keyword arguments
(signature.py), Python scalars' weak types and typed PRNG keys (avals.py;
keys cross the runtime as their key data, wire.py).

`cond` (cond.py) adds data-dependent steps; `pipeline` (pipeline.py) builds
a pipelined training step from per-stage forward functions, and draws its
schedule (schedule_picture.py); `ElasticTrainer`
(elastic.py) runs a training loop that snapshots its state and survives a
lost island; `PlacementError` (errors.py) names the Python call of a
placement that cannot work.
"""

from .cond import cond
from .elastic import ElasticTrainer
from .errors import PlacementError
from .pipeline import pipeline
from .placed import jit
from .slices import virtual_slice
from .tracer import program

__all__ = ["ElasticTrainer", "PlacementError", "cond", "jit", "pipeline", "program", "virtual_slice"]

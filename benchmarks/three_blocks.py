"""The README's three-block program against plain JAX doing the same.

The program is `examples/three_blocks.py`: block A (tanh) on a 2-device
slice, block B (a square) on a 2x2 slice, block C (a negation) on a second
2-device slice, run on the default embedded cluster (2 islands of 4 CPU
devices, no emulated DCN) from a host array of 8x16 floats, as
`three_blocks(x)` would be: pw-lower's default, where pw-fuse-island runs
the three blocks and their copies as one launch on slice B's devices. It is
measured beside the same program lowered with `fuse=false` (three launches
and two copies). The baseline is what a JAX user writes for the
same work: the same three functions, each `jax.jit`ted on its own devices
(2, 2x2 and 2 of the 8), `jax.device_put` between them, from the same host
array, waiting for the last result. The headlines are our runs per second
over JAX's (above 1: ours is faster), fused and unfused; the results are
checked to be equal.

Where JAX's default backend has fewer than 8 devices (a one-GPU machine),
the same three blocks run on 1-device slices that share its first device,
ours and JAX's alike; the record's `slices` says which.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

from . import harness

NAME = "three-blocks"
HEADLINE = ("three_blocks_over_jax", "three_blocks_unfused_over_jax")
EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "three_blocks.py"
SHAPE = (8, 16)


def load_example():
    """Imports `examples/three_blocks.py` (shipped with the checkout, not as a package)."""
    if not EXAMPLE.is_file():
        raise FileNotFoundError(f"{EXAMPLE}: the example is not here (run pw-bench from a checkout)")
    spec = importlib.util.spec_from_file_location("three_blocks_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def blocks_of(example) -> tuple:
    """The example's three placed functions, in program order."""
    return example.block_a, example.block_b, example.block_c


def own_shapes(example) -> tuple:
    """The example's slice shapes, (2, 2x2, 2)."""
    return tuple(block.slice.shape for block in blocks_of(example))


def slice_shapes(example) -> tuple:
    """The blocks' slice shapes: the example's own where JAX has enough devices (8), else one device each."""
    shapes = own_shapes(example)
    return shapes if len(jax.devices()) >= sum(map(math.prod, shapes)) else tuple((1,) * len(s) for s in shapes)


def program_on(example, shapes: tuple):
    """The example's program where `shapes` are its own; else the same blocks, specs and calls on
    slices of `shapes`."""
    if shapes == own_shapes(example):
        return example.three_blocks
    block_a, block_b, block_c = (
        pw.jit(block.fn, slice=pw.virtual_slice(shape, axes=block.slice.axes),
               in_specs=block.in_specs, out_specs=block.out_specs)
        for block, shape in zip(blocks_of(example), shapes))

    @pw.program
    def three_blocks(x):
        return block_c(block_b(block_a(x)))
    return three_blocks


def jax_three_blocks(example, shapes: tuple):
    """Returns the baseline: the example's three functions each jitted on its own devices (the next
    ones of JAX's devices, wrapping round: 2, 2x2 and 2 of 8, or one shared device), with
    `jax.device_put` between them."""
    devices, start, layouts = np.array(jax.devices()), 0, []
    for block, shape in zip(blocks_of(example), shapes):
        size = math.prod(shape)
        mesh = Mesh(devices[start:start + size].reshape(shape), block.slice.axes)
        layouts.append(NamedSharding(mesh, block.in_specs))
        start = (start + size) % len(devices)
    blocks = [jax.jit(block.fn, in_shardings=layout, out_shardings=layout)
              for block, layout in zip(blocks_of(example), layouts)]

    def run(x):
        for block, layout in zip(blocks, layouts):
            x = block(jax.device_put(x, layout))
        return x
    return run


def run(quick: bool) -> dict:
    """Measures runs per second of the three-block program, ours and plain JAX, interleaved."""
    runs, repetitions = (20, 5) if quick else (100, 15)
    example = load_example()
    x = np.random.default_rng(0).normal(size=SHAPE).astype(np.float32)
    shapes = slice_shapes(example)
    program = program_on(example, shapes)
    baseline = jax_three_blocks(example, shapes)
    runtime = Runtime(embedded_device_map(2, 4))
    client = Client(runtime)
    unfused = harness.compile_program(program, (x,), runtime, fuse=False)

    def ours():
        for _ in range(runs):
            program.run(x, client=client).block_until_ready()

    def ours_unfused():
        for _ in range(runs):
            unfused(client, x).block_until_ready()

    def theirs():
        for _ in range(runs):
            baseline(x).block_until_ready()

    try:
        times = harness.measure({"ours": ours, "ours, fuse=false": ours_unfused, "JAX": theirs}, repetitions)
        same = harness.same_results(program.run(x, client=client), baseline(x)) and \
            harness.same_results(unfused(client, x), baseline(x))
    finally:
        client.close()
        runtime.close()
    rows = [{"case": case, "runs_per_s": runs / harness.median(times[case]),
             "ms_per_run": harness.median(times[case]) / runs * 1e3, "spread": harness.spread(times[case])}
            for case in ("ours", "ours, fuse=false", "JAX")]
    headline = {"three_blocks_over_jax": harness.median(times["JAX"]) / harness.median(times["ours"]),
                "three_blocks_unfused_over_jax":
                    harness.median(times["JAX"]) / harness.median(times["ours, fuse=false"])}
    return harness.record(NAME, {"shape": SHAPE, "runs_per_case": runs, "repetitions": repetitions,
                                 "islands": len(runtime.resources.snapshot()[1].islands), "slices": shapes,
                                 "baseline_matches_ours": same},
                          rows, headline)


def plot(record: dict, ax) -> None:
    """Milliseconds per run of the three-block program, ours (fused, unfused) and plain JAX (bars)."""
    rows = record["rows"]
    ax.bar([r["case"] for r in rows], [r["ms_per_run"] for r in rows],
           color=["tab:blue", "tab:cyan", "tab:orange"][:len(rows)])
    ax.set(ylabel="ms per run", title="The README's three-block program")

"""Small real programs for calibrating and validating the simulator (in-repo drivers).

Each builds a `@pw.program` and its example inputs for the embedded 2 x 4
cluster; `plan_of` lowers it for the runtime's topology, giving the plan
both the runtime runs and the simulator times (with its executables' flops).

- chain: `k` elementwise computations on one slice of `n` devices (the
  dispatch chain, lowered without fusion so that each is its own launch);
- matmul: one sharded matrix product (flops);
- hop: two computations on two slices, of one island (an ICI copy, which
  reshards, or keeps the layout on other devices) or two (a DCN send and
  recv), on one input or several at once;
- three_blocks: the README's example, slices of 2, 2x2 and 2 devices;
- route: a `pw.cond` between a matrix product and an add (a host step);
- pipeline: `stages` stages of 2 devices over both islands, `micro`
  microbatches, each stage `tanh(x @ w)`;
- training_pipeline: a `pw.pipeline` training step (forward, backward),
  4 stages of 2 devices, with `schedule="auto"`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class Program:
    """A named real program: builds (traced program, example inputs)."""

    name: str
    build: Callable[[], tuple[Any, tuple]]
    fuse: bool = True          # False keeps a chain's launches apart (pw-lower fuse=false)
    strategy: str = "auto"     # pw-place strategy; "spread" gives pipeline stages devices of their own
    predicates: tuple[bool, ...] = ()   # what its conds' predicates are on its example inputs, in order


def _rng():
    return np.random.default_rng(0)


def chain(k: int, n: int, shape: tuple[int, int]) -> Program:
    """Returns the chain of `k` computations `x * 0.5 + 1` on a slice of `n` devices."""
    def build():
        import pathways_mlir as pw
        from jax.sharding import PartitionSpec as P

        s = pw.virtual_slice(n, axes="data", name=f"chain{n}", island="island0")
        step = pw.jit(lambda x: x * 0.5 + 1.0, slice=s, in_specs=P("data"), out_specs=P("data"))

        @pw.program
        def run(x):
            for _ in range(k):
                x = step(x)
            return x
        return run, (_rng().normal(size=shape).astype(np.float32),)
    return Program(f"chain{k}_n{n}_{shape[0]}x{shape[1]}", build, fuse=False)


def matmul(size: int, n: int = 4) -> Program:
    """Returns one `x @ w` of `size`-square matrices, rows split over `n` devices."""
    def build():
        import pathways_mlir as pw
        from jax.sharding import PartitionSpec as P

        s = pw.virtual_slice(n, axes="data", name=f"mm{n}", island="island0")
        mm = pw.jit(lambda x, w: x @ w, slice=s, in_specs=(P("data"), P()), out_specs=P("data"))

        @pw.program
        def run(x, w):
            return mm(x, w)
        rng = _rng()
        return run, (rng.normal(size=(size, size)).astype(np.float32),
                     rng.normal(size=(size, size)).astype(np.float32))
    return Program(f"matmul{size}_n{n}", build)


def hop(shape: tuple[int, int], cross_island: bool, count: int = 1, reshard: bool = True) -> Program:
    """Returns `tanh` on one slice of 2 devices, then `-x` on another (island1 if `cross_island`), on each
    of `count` independent inputs (several hops in flight at once); lowered without fusion, so that an ICI
    hop keeps its copy (pw-fuse-island would make it one launch, and leave copies out of calibration). An
    ICI hop goes to a 2 x 2 slice (the copy reshards), or with `reshard=False` to 2 other devices of the
    same layout (the copy moves each shard as it is)."""
    def build():
        import jax.numpy as jnp
        import pathways_mlir as pw
        from jax.sharding import PartitionSpec as P

        square = not cross_island and reshard
        a = pw.virtual_slice(2, axes="data", name="hop_a", island="island0")
        b = pw.virtual_slice((2, 2) if square else 2, axes=("data", "model") if square else "data", name="hop_b",
                             island="island1" if cross_island else "island0")
        spec_b = P("data", "model") if square else P("data")
        first = pw.jit(jnp.tanh, slice=a, in_specs=P("data"), out_specs=P("data"))
        second = pw.jit(lambda x: -x, slice=b, in_specs=spec_b, out_specs=spec_b)

        @pw.program
        def run(*xs):
            outs = tuple(second(first(x)) for x in xs)
            return outs if count > 1 else outs[0]
        return run, tuple(_rng().normal(size=shape).astype(np.float32) for _ in range(count))
    name = f"{'dcn' if cross_island else 'ici'}_hop{count}{'' if reshard else '_same'}_{shape[0]}x{shape[1]}"
    return Program(name, build, fuse=False, strategy="auto" if reshard else "spread")


def three_blocks() -> Program:
    """Returns the README's three-block program on an 8 x 16 input."""
    def build():
        import importlib.util
        import pathlib

        path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "three_blocks.py"
        spec = importlib.util.spec_from_file_location("pw_sim_three_blocks", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.three_blocks, (_rng().normal(size=(8, 16)).astype(np.float32),)
    return Program("three_blocks", build)


def route(width: int = 256) -> Program:
    """Returns `x + 1` after a `pw.cond` on `sum(x) > 0` (true for the example input) between a matrix
    product on 4 devices and `x + 1` on the predicate's 2."""
    def build():
        import jax.numpy as jnp
        import pathways_mlir as pw
        from jax.sharding import PartitionSpec as P

        small = pw.virtual_slice(2, axes="data", name="route_small", island="island0")
        large = pw.virtual_slice(4, axes="data", name="route_large", island="island0")
        positive = pw.jit(lambda x: jnp.sum(x) > 0, slice=small, in_specs=P("data"), out_specs=P())
        heavy = pw.jit(lambda x: jnp.tanh(x @ x), slice=large, in_specs=P("data"), out_specs=P("data"))
        light = pw.jit(lambda x: x + 1.0, slice=small, in_specs=P("data"), out_specs=P("data"))

        @pw.program
        def run(x):
            return light(pw.cond(positive(x), heavy, light, x))
        return run, (np.abs(_rng().normal(size=(width, width))).astype(np.float32) / width,)
    return Program(f"route{width}", build, predicates=(True,))


def forward_pipeline(stages: int, per_stage: int, islands: int, layer: Callable):
    """Returns a `@pw.program` taking (microbatches, weights): each microbatch through every stage.

    Stage `s` is `layer(x, w_s)` on a slice `stage<s>` of `per_stage` devices (rows split), on
    island `s * islands // stages`.
    """
    import pathways_mlir as pw
    from jax.sharding import PartitionSpec as P

    fns = []
    for s in range(stages):
        sl = pw.virtual_slice(per_stage, axes="x", name=f"stage{s}", island=f"island{s * islands // stages}")
        fns.append(pw.jit(layer, slice=sl, in_specs=(P("x"), P()), out_specs=P("x")))

    @pw.program
    def step(xs, ws):
        outs = []
        for x in xs:
            for fn, w in zip(fns, ws):
                x = fn(x, w)
            outs.append(x)
        return outs
    return step


def pipeline(stages: int, micro: int, width: int) -> Program:
    """Returns a forward pipeline: `stages` stages of 2 devices (half on each island), `micro` microbatches."""
    def build():
        import jax.numpy as jnp

        rng = _rng()
        xs = [rng.normal(size=(16, width)).astype(np.float32) for _ in range(micro)]
        ws = [(rng.normal(size=(width, width)) / np.sqrt(width)).astype(np.float32) for _ in range(stages)]
        return forward_pipeline(stages, 2, 2, lambda x, w: jnp.tanh(x @ w)), (xs, ws)
    return Program(f"pipeline{stages}x{micro}_w{width}", build, strategy="spread")


def training_pipeline(profile=None, stages: int = 4, micro: int = 8, width: int = 128, rows: int = 256) -> Program:
    """Returns a `pw.pipeline` step of `stages` stages `tanh(x @ w + b)`, mean squared error, its schedule
    picked by simulation on `profile` (`schedule="auto"`); stage s on a slice of 2 devices of its own, on
    island s * 2 // stages."""
    def build():
        import jax.numpy as jnp
        import pathways_mlir as pw

        slices = [pw.virtual_slice(2, axes="x", name=f"pipe{s}", island=f"island{s * 2 // stages}")
                  for s in range(stages)]
        step = pw.pipeline([lambda p, x: jnp.tanh(x @ p["w"] + p["b"])] * stages, slices,
                           loss=lambda y, t: jnp.mean((y - t) ** 2), schedule="auto", micro_batches=micro,
                           profile=profile)
        rng = _rng()
        params = [{"w": (rng.normal(size=(width, width)) / np.sqrt(width)).astype(np.float32),
                   "b": np.zeros(width, np.float32)} for _ in range(stages)]
        return step, (params, rng.normal(size=(rows, width)).astype(np.float32),
                      rng.normal(size=(rows, width)).astype(np.float32))
    return Program("training_pipeline_auto", build)


def plan_of(program: Program, topology):
    """Lowers `program` for `topology`; returns (plan, flat inputs)."""
    import jax

    from pathways_mlir.passes import lower_to_plans

    traced, args = program.build()
    lowered = traced.lower(*args)
    plans = lower_to_plans(lowered.module, topology, strategy=program.strategy, fuse=program.fuse)
    return plans[lowered.program], jax.tree_util.tree_leaves(args)


# Calibration and validation use different programs or sizes (issue 13).
CALIBRATION = (
    ("chain2_parallel", chain(2, 2, (8, 16)), "parallel"),
    ("chain8_parallel", chain(8, 2, (8, 16)), "parallel"),
    ("chain8_sequential", chain(8, 2, (8, 16)), "sequential"),
    ("chain4_n4_parallel", chain(4, 4, (64, 64)), "parallel"),
    ("chain8_n4_parallel", chain(8, 4, (8, 16)), "parallel"),
    ("chain2_big", chain(2, 4, (1024, 1024)), "parallel"),
    ("matmul128", matmul(128), "parallel"),
    ("matmul384", matmul(384), "parallel"),
    ("ici_hop", hop((8, 16), cross_island=False), "parallel"),
    ("ici_hop_big", hop((512, 512), cross_island=False), "parallel"),
    ("matmul384_sequential", matmul(384), "sequential"),
    ("dcn_hop", hop((8, 16), cross_island=True), "parallel"),
    ("dcn_hop_sequential", hop((8, 16), cross_island=True), "sequential"),
    ("dcn_hops4", hop((8, 16), cross_island=True, count=4), "parallel"),
    ("ici_hops4", hop((8, 16), cross_island=False, count=4), "parallel"),
    ("ici_hop_same", hop((8, 16), cross_island=False, reshard=False), "parallel"),   # a copy that keeps its layout
    ("route16_parallel", route(16), "parallel"),
    ("route16_sequential", route(16), "sequential"),   # tells the parallel cond thread from the predicate's read
)
VALIDATION = (
    ("chain16_parallel", chain(16, 4, (16, 32)), "parallel"),
    ("chain16_sequential", chain(16, 4, (16, 32)), "sequential"),
    ("three_blocks_parallel", three_blocks(), "parallel"),
    ("three_blocks_sequential", three_blocks(), "sequential"),
    ("pipeline4x4_parallel", pipeline(4, 4, 64), "parallel"),
    ("pipeline4x4_sequential", pipeline(4, 4, 64), "sequential"),
    ("matmul256_parallel", matmul(256), "parallel"),
    ("route_parallel", route(), "parallel"),
    ("route_sequential", route(), "sequential"),
)

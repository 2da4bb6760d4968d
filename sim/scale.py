"""The paper's results at scale, simulated (never measured) on TPU-v4 islands.

Every program here is a real `@pw.program`, traced with abstract inputs and
lowered by `pw-lower` for a topology built from the profile (pipeline
stages and replicas pinned to devices of their own, in order); the
simulator then times the plans. Figures the seed does not state are
assumptions, named here and in the record; none is fitted to the paper.

- Figure 6: one computation on all N devices of an island, called back to
  back (OpByOp, parallel dispatch); the smallest computation that reaches
  95% of the device-bound throughput, at 128 and 2,048 devices.
- Table 2: a 3B decoder-only transformer trained on 128 devices, pipelined
  in 4, 8 or 16 stages (`models.pipeline_step`: a synchronous step, so
  the pipeline fills and flushes every step, then each stage's update).
  The model is GPT-3 2.7B's shape and batch (Brown et al. 2020, Table 2.1:
  32 layers, width 2,560, 1M tokens per batch), as the seed names no
  shape; 64 micro-batches of 16,384 tokens (assumed: the seed gives no
  count; with fewer rows per device the 4-stage pipeline's launches turn
  memory-bound on their replicated weights on this roofline). Weights
  stay on the devices between steps (resident inputs). Throughput is
  tokens per step time. Also 16 stages over 4 islands of 32 devices
  (stage hops between islands cross the DCN) against 1 island of 128.
- Two islands against one (Section 5.3, Figure 12): the 64B and 136B
  decoders data parallel over two islands (512 and 1,024 devices in all),
  each replica sharded over its island, gradients exchanged over DCN in 16
  chunks as the backward pass makes them (`models.data_parallel_step`);
  against the same two replicas on one island of twice the devices, the
  exchange on ICI. Gradient bytes are the seed's DCN figures (457 GB and
  1,030 GB per step, both directions); the batch, 1M tokens per step, and
  the 16 chunks are assumed.
- Parallel against sequential dispatch: a chain of K stages, each on its
  own host (4 devices), one step.
- Speed: one step of a pipeline over 16 islands of 4,096 devices (65,536).
"""

from __future__ import annotations

import sys
import time

from .engine import SimError, Simulator, Submission
from .inputs import profile_topology
from .profile import Profile
from .programs import forward_pipeline

LABEL = "SIMULATED with pw-sim (not a measurement)"
# Table 2's model: GPT-3 2.7B (Brown et al. 2020, Table 2.1), 128 devices.
LAYERS, WIDTH, BATCH_TOKENS, DEVICES, MICRO = 32, 2560, 1 << 20, 128, 64
PAPER_TOKENS_PER_S = {"4": 133700, "16": 131400, "16 over 4 islands": 131400}
# Section 5.3: (parameters, devices in all, DCN bytes of the gradient reduction per step, both ways).
LARGE_MODELS = {"64B": (64e9, 512, 457e9), "136B": (136e9, 1024, 1030e9)}
GRADIENT_CHUNKS = 16
MAX_TRIPS = 1 << 24        # Figure 6's crossover search gives up at this many loop trips (an int32 bounds them)


def _layer(trips: int):
    import jax
    import jax.numpy as jnp

    return lambda x, w: jax.lax.fori_loop(0, trips, lambda i, y: jnp.tanh(y @ w), x)


def _lowered(traced, args, topology, pin: str = ""):
    from pathways_mlir.passes import LoweringError, lower_to_plans

    lowered = traced.lower(*args)
    # pw-place's exhaustive search recurses once per slice; a 1,000-stage pipeline (1,000 pinned
    # slices) needs more than Python's default depth (reported; passes/place.py is not ours to change).
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20 * len(pin.split(","))))
    try:
        plans = lower_to_plans(lowered.module, topology, pin=pin)
    except LoweringError as error:
        island = topology.islands[0]
        raise SimError(f"@{lowered.program} cannot be lowered onto {len(topology.islands)} island(s) of "
                       f"{island.num_devices} {island.device_kind} devices: "
                       f"{error.diagnostics[0].message.splitlines()[0]}") from None
    finally:
        sys.setrecursionlimit(limit)
    return plans[lowered.program]


def _bf16(*shape):
    import jax
    import jax.numpy as jnp

    return jax.ShapeDtypeStruct(shape, jnp.bfloat16)


def one_computation(devices: int, trips: int, profile: Profile, rows: int = 128, width: int = 1024):
    """Returns the plan of one `trips`-layer computation on an island of `devices` devices."""
    import pathways_mlir as pw
    from jax.sharding import PartitionSpec as P

    s = pw.virtual_slice(devices, axes="x", name="all")
    fn = pw.jit(_layer(trips), slice=s, in_specs=(P("x"), P()), out_specs=P("x"))

    @pw.program
    def op_by_op(x, w):
        return fn(x, w)
    return _lowered(op_by_op, (_bf16(rows * devices, width), _bf16(width, width)),
                    profile_topology(f"1x{devices}", profile))


def pipeline(stages: int, devices: int, islands: int, profile: Profile, micro: int,
             tokens: int = 8192, width: int = 8192, layers: int = 64):
    """Returns the plan of a forward pipeline (no backward) of `stages` stages over `islands` islands."""
    per_island, per_stage = devices // islands, devices // stages
    step = forward_pipeline(stages, per_stage, islands, _layer(layers // stages))
    args = ([_bf16(tokens, width)] * micro, [_bf16(width, width)] * stages)
    return _lowered(step, args, profile_topology(f"{islands}x{per_island}", profile),
                    pin=_stage_pins(stages, per_stage, islands))


def _stage_pins(slices: int, per_slice: int, islands: int, name: str = "stage") -> str:
    """Returns the pins of slices `<name>0..` in order, `slices / islands` to an island."""
    per_island = slices // islands
    return ",".join(f"{name}{d}=island{d // per_island}:{(d % per_island) * per_slice}" for d in range(slices))


def training_pipeline(stages: int, islands: int, profile: Profile, micro: int = MICRO,
                      schedule: str = "gpipe", slices: int | None = None, devices: int = DEVICES,
                      layers: int = LAYERS, width: int = WIDTH, batch_tokens: int = BATCH_TOKENS):
    """Returns the plan of one synchronous pipelined training step (Table 2's setup by default)."""
    from . import models

    slices = slices or stages
    per_slice = devices // slices
    step, args = models.pipeline_step(stages, per_slice, islands, micro, batch_tokens // micro, width, layers,
                                      schedule, slices)
    return _lowered(step, args, profile_topology(f"{islands}x{devices // islands}", profile),
                    pin=_stage_pins(slices, per_slice, islands))


def data_parallel(model: str, islands: int, profile: Profile, batch_tokens: int = BATCH_TOKENS,
                  chunks: int = GRADIENT_CHUNKS):
    """Returns the plan of one data-parallel step of `model` (64B or 136B) on 2 islands or 1."""
    from . import models

    params, devices, dcn_bytes = LARGE_MODELS[model]
    step, args = models.data_parallel_step(islands, devices // 2, params, batch_tokens // 2, dcn_bytes / 2, chunks)
    return _lowered(step, args, profile_topology(f"{islands}x{devices // islands}", profile),
                    pin=_stage_pins(2, devices // 2, islands, name="replica"))


def weights_resident(plan, micro: int) -> frozenset[int]:
    """Returns the inputs of a training step that stay on the devices between steps: all but the
    last `micro` (the batch)."""
    return frozenset(plan.inputs[:len(plan.inputs) - micro])


def throughput(plan, profile: Profile, runs: int, dispatch: str = "parallel") -> float:
    """Returns simulated runs per second with `runs` calls made back to back."""
    return Simulator(profile).simulate([Submission(plan, dispatch) for _ in range(runs)]).throughput()


def latency(plan, profile: Profile, dispatch: str = "parallel", resident: frozenset[int] = frozenset()) -> float:
    """Returns the simulated latency of one run (the step time of a synchronous step)."""
    return Simulator(profile).simulate([Submission(plan, dispatch, resident=resident)], closed_loop=True).latency()


def one_launch_seconds(plan, profile: Profile) -> float:
    """Returns the device time of a one-launch plan's launch on its slice's devices (as the simulator times it:
    devices that share cores take turns)."""
    from pathways_mlir.dialect.device_time import launch_costs

    (cost,) = launch_costs(plan).values()
    return profile.accelerator.launch_seconds(cost.flops, cost.bytes, cost.devices)


def crossover(devices: int, profile: Profile, runs: int = 40, target: float = 0.95) -> dict:
    """Returns the smallest computation (ms of device time) reaching `target` of ideal throughput."""
    def efficiency(trips):
        plan = one_computation(devices, trips, profile)
        seconds = one_launch_seconds(plan, profile)
        if not seconds > 0:
            raise SimError(f"profile {profile.name}: a computation on {devices} devices takes no device time, so "
                           f"there is no ideal throughput to reach")
        return throughput(plan, profile, runs) * seconds, seconds
    low, high = 0, 1
    while (eff := efficiency(high)[0]) < target:
        if high >= MAX_TRIPS:
            raise SimError(f"profile {profile.name}: no computation of up to {MAX_TRIPS} loop trips reaches "
                           f"{target:.0%} of the ideal throughput on {devices} devices (it reaches {eff:.1%})")
        low, high = high, high * 2
    while high - low > max(1, low // 50):
        middle = (low + high) // 2
        low, high = (middle, high) if efficiency(middle)[0] < target else (low, middle)
    eff, seconds = efficiency(high)
    return {"devices": devices, "hosts": devices // profile.accelerator.devices_per_host,
            "computation_ms": seconds * 1e3, "efficiency": eff}


def table2(profile: Profile, quick: bool = False) -> dict:
    """Returns Table 2's tokens per second by configuration, simulated, with the paper's beside
    (`quick`: without the 8-stage configuration, which the paper does not report)."""
    def tokens_per_s(stages, islands):
        plan = training_pipeline(stages, islands, profile)
        return BATCH_TOKENS / latency(plan, profile, resident=weights_resident(plan, MICRO))
    by = {str(s): tokens_per_s(s, 1) for s in ((4, 16) if quick else (4, 8, 16))}
    by["16 over 4 islands"] = tokens_per_s(16, 4)
    return {"devices": DEVICES, "layers": LAYERS, "width": WIDTH, "batch_tokens": BATCH_TOKENS,
            "microbatches": MICRO, "schedule": "gpipe", "tokens_per_s": by, "paper_tokens_per_s": PAPER_TOKENS_PER_S}


def two_islands(profile: Profile) -> dict:
    """Returns each large model's step time on two islands and on one, simulated."""
    out = {}
    for model, (params, devices, dcn_bytes) in LARGE_MODELS.items():
        times = {n: latency(plan, profile, resident=weights_resident(plan, 2))
                 for n, plan in ((n, data_parallel(model, n, profile)) for n in (1, 2))}
        out[model] = {"params": params, "devices": devices, "dcn_bytes_per_step": dcn_bytes,
                      "step_s": {"one island": times[1], "two islands": times[2]},
                      "two_over_one": times[1] / times[2]}
    return {"batch_tokens": BATCH_TOKENS, "gradient_chunks": GRADIENT_CHUNKS, "models": out, "paper": 0.97}


def run_scale(profile: Profile, quick: bool = False) -> dict:
    """Runs every experiment; returns the simulated record with the paper's figures beside."""
    record: dict = {"kind": LABEL, "profile": profile.name, "headline": {}, "experiments": {}}
    head, exps = record["headline"], record["experiments"]

    small, large = crossover(128, profile), crossover(2048, profile)
    exps["figure6_crossover"] = {"128": small, "2048": large,
                                 "paper_ms": {"128": 2.3, "2048": 35.0}}
    head["crossover_2048_over_128"] = {"value": large["computation_ms"] / small["computation_ms"], "paper": 15.2,
                                       "kind": LABEL}

    exps["table2"] = t2 = table2(profile, quick)
    by = t2["tokens_per_s"]
    head["stages16_over_stages4"] = {"value": by["16"] / by["4"], "paper": round(131400 / 133700, 3), "kind": LABEL}
    head["islands4_over_one"] = {"value": by["16 over 4 islands"] / by["16"], "paper": 1.0,
                                 "kind": LABEL + "; 16 stages, 4 islands of 32 against 1 of 128"}

    exps["two_islands"] = dp = two_islands(profile)
    head["two_islands_over_one_sim"] = {"value": min(m["two_over_one"] for m in dp["models"].values()),
                                        "paper": 0.97, "kind": LABEL + "; worst of the 64B and 136B models"}

    k = 100 if quick else 1000
    plan = pipeline(k, 4 * k, 1, profile, micro=1, tokens=4 * 128, width=1024, layers=k)
    par, seq = latency(plan, profile), latency(plan, profile, "sequential")
    exps["dispatch_stages"] = {"stages": k, "parallel_ms": par * 1e3, "sequential_ms": seq * 1e3}
    head[f"parallel_over_sequential_{k}_stages"] = {"value": seq / par, "kind": LABEL + "; step-time ratio"}

    plan = pipeline(16, 65536, 16, profile, micro=4)
    start = time.perf_counter()
    latency(plan, profile)
    head["seconds_to_simulate_65536_devices"] = {"value": time.perf_counter() - start,
                                                 "kind": "wall time of the simulator (measured)"}
    return record

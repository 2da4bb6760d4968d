"""Pipelining a training step across islands (the paper's Table 2).

The model is an MLP of 8 tanh layers (width 256) trained with SGD on a mean
squared error, a batch of 256. SPMD: one computation on an 8-device slice,
the batch split over the devices, run by us and, as the baseline, by plain
`jax.jit` on the same 8 devices; the same on a slice of an `Explicit` axis
(JAX's explicit sharding mode: the batch's sharding in its type), against
plain `jax.jit` in explicit mode on a mesh of an `Explicit` axis over the
same devices. Pipelines of S = 2, 4, 8 stages: stage s
holds 8/S layers on its own slice of 8/S devices, on its own island of a
cluster of S islands (so stage hops cross the emulated DCN, 100 us + bytes
at 25 Gb/s); the batch is cut into 8 micro-batches that flow forward through
the stages and back (GPipe), then each stage sums its gradients and updates
its layers, all traced into one program and run with parallel dispatch. The
pipeline baseline is plain JAX dispatching the same 4-stage GPipe schedule
op by op: the same jitted stage functions, each on its own 2 of the 8
devices, `jax.device_put` between stages. Ours against it runs on 1 island
(no emulated DCN, as JAX has none). Every variant does the same arithmetic
(the backward pass reuses the forward activations; no recomputation) from the
same host parameters and data, made once outside the timed region.
Throughput is training steps per second; ratios are ours over the baseline
(above 1: ours is faster), and the loss per added stage is the throughput
lost divided by the stages added. Last, the 4-stage pipeline on 1 island of
8 devices against 2 islands of 4.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.runtime import Runtime

from . import harness

NAME = "pipeline"
HEADLINE = ("pipeline4_over_jax_pipeline4", "spmd_over_jax_spmd", "spmd_explicit_over_jax_spmd_explicit",
            "pipeline4_over_jax_spmd", "pipeline8_over_pipeline4", "two_islands_over_one")
DEVICES = 8
LAYERS = 8
WIDTH = 256
BATCH = 256
MICRO_BATCHES = 8
LEARNING_RATE = 0.01
STAGES = (2, 4, 8)


def forward(params, x):
    """Runs layers `params` on `x`; returns the input and every layer's output."""
    activations = [x]
    for w, b in params:
        activations.append(jnp.tanh(activations[-1] @ w + b))
    return activations


def backward(params, activations, grad_out, weight_grads_sharding=None):
    """Backpropagates `grad_out` through layers `params`; returns their gradients and the input's.

    `weight_grads_sharding` lays out the weights' gradients, which contract the batch: JAX's explicit sharding
    mode asks for it (`P()`) when the batch is sharded in the types."""
    grads = []
    for (w, _), x, y in reversed(list(zip(params, activations[:-1], activations[1:]))):
        grad_z = grad_out * (1.0 - y * y)
        grads.append((jnp.matmul(x.T, grad_z, out_sharding=weight_grads_sharding), grad_z.sum(0)))
        grad_out = grad_z @ w.T
    return grads[::-1], grad_out


def loss_grad(output, target):
    """The gradient of the mean squared error over the whole batch, for one micro-batch's output."""
    return 2.0 * (output - target) / (BATCH * WIDTH)


def add(a, b):
    """Sums two gradient pytrees."""
    return jax.tree.map(jnp.add, a, b)


def update(params, grads):
    """One SGD step."""
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)


def spmd_step(params, x, target, weight_grads_sharding=None):
    """The whole training step as one computation (`weight_grads_sharding`: see `backward`)."""
    activations = forward(params, x)
    grads, _ = backward(params, activations, loss_grad(activations[-1], target), weight_grads_sharding)
    return update(params, grads)


def spmd_step_explicit(params, x, target):
    """`spmd_step` written for JAX's explicit sharding mode: the weights' gradients replicated."""
    return spmd_step(params, x, target, P())


def init_params(seed: int = 0):
    """The model's layers: (weight, bias) pairs."""
    rng = np.random.default_rng(seed)
    return [(rng.normal(0, WIDTH ** -0.5, (WIDTH, WIDTH)).astype(np.float32), np.zeros(WIDTH, np.float32))
            for _ in range(LAYERS)]


def spmd_program(axis_type: AxisType = AxisType.Auto):
    """Returns the SPMD training step: one computation on all devices, whose axis is of `axis_type` (on an
    `Explicit` axis the batch's sharding is in its type, as in JAX's explicit sharding mode)."""
    s = pw.virtual_slice(DEVICES, axes="data", axis_types=axis_type)
    fn = spmd_step if axis_type == AxisType.Auto else spmd_step_explicit
    step = pw.jit(fn, slice=s, in_specs=(None, P("data"), P("data")), out_specs=None)
    return pw.program(lambda params, x, target: step(params, x, target))


def _shardings(devices) -> tuple[NamedSharding, NamedSharding]:
    """The replicated and the batch-split layouts on `devices`."""
    mesh = Mesh(np.array(devices), ("data",))
    return NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))


def jax_spmd():
    """Returns the SPMD training step as plain `jax.jit` on the first `DEVICES` devices."""
    replicated, split = _shardings(jax.devices()[:DEVICES])
    return jax.jit(spmd_step, in_shardings=(replicated, split, split), out_shardings=replicated)


def jax_spmd_explicit():
    """Returns the SPMD training step as plain `jax.jit` in JAX's explicit sharding mode, on a mesh of an
    `Explicit` axis over the first `DEVICES` devices: it lays out its arguments itself (`jax.device_put`, a
    no-op for parameters already there) as `jax_spmd`'s `in_shardings` say, and its results land where their
    types say. (`in_shardings` given host arrays took twice as long a step in explicit mode, JAX 0.10.2.)"""
    mesh = jax.make_mesh((DEVICES,), ("data",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:DEVICES])
    jitted = jax.jit(spmd_step_explicit)

    def step(params, x, target):
        with jax.set_mesh(mesh):
            return jitted(jax.device_put(params, P()), jax.device_put(x, P("data")),
                          jax.device_put(target, P("data")))
    return step


def jax_pipeline(stages: int):
    """Returns the GPipe training step of `pipeline_program`, dispatched op by op by plain JAX: the
    same stage functions jitted on devices of their own, `jax.device_put` between stages."""
    per_stage = DEVICES // stages
    layouts = [_shardings(jax.devices()[s * per_stage:(s + 1) * per_stage]) for s in range(stages)]
    fwd = [jax.jit(forward, in_shardings=(rep, split), out_shardings=split) for rep, split in layouts]
    bwd = [jax.jit(backward, in_shardings=(rep, split, split), out_shardings=(rep, split))
           for rep, split in layouts]
    grad = jax.jit(loss_grad, in_shardings=(layouts[-1][1],) * 2, out_shardings=layouts[-1][1])
    acc = [jax.jit(add, out_shardings=rep) for rep, _ in layouts]
    upd = [jax.jit(update, out_shardings=rep) for rep, _ in layouts]
    layers = LAYERS // stages

    def step(params, xs, targets):
        params = [jax.device_put(params[s * layers:(s + 1) * layers], layouts[s][0]) for s in range(stages)]
        xs = [jax.device_put(x, layouts[0][1]) for x in xs]
        targets = [jax.device_put(t, layouts[-1][1]) for t in targets]
        activations = []
        for x in xs:
            per_stage_acts = []
            for s in range(stages):
                per_stage_acts.append(fwd[s](params[s], jax.device_put(x, layouts[s][1])))
                x = per_stage_acts[-1][-1]
            activations.append(per_stage_acts)
        sums = [None] * stages
        for acts, target in zip(activations, targets):
            g = grad(acts[-1][-1], target)
            for s in reversed(range(stages)):
                grads, g = bwd[s](params[s], acts[s], jax.device_put(g, layouts[s][1]))
                sums[s] = grads if sums[s] is None else acc[s](sums[s], grads)
        return [layer for s in range(stages) for layer in upd[s](params[s], sums[s])]
    return step


def pipeline_program(stages: int, islands: int):
    """Returns the GPipe training step over `stages` stages spread evenly over `islands` islands."""
    per_stage = DEVICES // stages
    slices = [pw.virtual_slice(per_stage, axes="data", island=f"island{s * islands // stages}")
              for s in range(stages)]
    fwd = [pw.jit(forward, slice=s, in_specs=(None, P("data")), out_specs=P("data")) for s in slices]
    bwd = [pw.jit(backward, slice=s, in_specs=(None, P("data"), P("data")), out_specs=(None, P("data")))
           for s in slices]
    grad = pw.jit(loss_grad, slice=slices[-1], in_specs=P("data"), out_specs=P("data"))
    acc = [pw.jit(add, slice=s, in_specs=None, out_specs=None) for s in slices]
    upd = [pw.jit(update, slice=s, in_specs=None, out_specs=None) for s in slices]
    layers = LAYERS // stages

    def step(params, xs, targets):
        params = [params[s * layers:(s + 1) * layers] for s in range(stages)]
        activations = []
        for x in xs:                                      # forward, micro-batch by micro-batch
            per_stage_acts = []
            for s in range(stages):
                per_stage_acts.append(fwd[s](params[s], x))
                x = per_stage_acts[-1][-1]
            activations.append(per_stage_acts)
        sums = [None] * stages
        for acts, target in zip(activations, targets):    # backward
            g = grad(acts[-1][-1], target)
            for s in reversed(range(stages)):
                grads, g = bwd[s](params[s], acts[s], g)
                sums[s] = grads if sums[s] is None else acc[s](sums[s], grads)
        return [layer for s in range(stages) for layer in upd[s](params[s], sums[s])]
    return pw.program(step)


def run(quick: bool) -> dict:
    """Measures training steps per second of SPMD, each pipeline and the plain JAX baselines,
    interleaved."""
    steps, repetitions = (1, 3) if quick else (4, 11)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(BATCH, WIDTH)).astype(np.float32)
    target = np.tanh(rng.normal(size=(BATCH, WIDTH))).astype(np.float32)
    xs, targets = np.split(x, MICRO_BATCHES), np.split(target, MICRO_BATCHES)
    params = init_params()                                # host arrays, made once, outside the timing
    variants = {"SPMD": (spmd_program(), 1, (x, target)),
                "SPMD, Explicit axes": (spmd_program(AxisType.Explicit), 1, (x, target))}
    variants.update({f"{s} stages": (pipeline_program(s, s), s, (xs, targets)) for s in STAGES})
    variants["4 stages, 2 islands"] = (pipeline_program(4, 2), 2, (xs, targets))
    variants["4 stages, 1 island"] = (pipeline_program(4, 1), 1, (xs, targets))
    baselines = {"JAX SPMD": (jax_spmd(), (x, target)),
                 "JAX SPMD, Explicit axes": (jax_spmd_explicit(), (x, target)),
                 "JAX 4 stages": (jax_pipeline(4), (xs, targets))}
    runtimes = {islands: Runtime(embedded_device_map(islands, DEVICES // islands), emulate_dcn=True)
                for islands in sorted({v[1] for v in variants.values()})}
    clients = {islands: Client(rt) for islands, rt in runtimes.items()}

    def train(step):
        def case():
            p = params
            for _ in range(steps):
                p = step(p)
            for leaf in jax.tree.leaves(p):
                leaf.block_until_ready()
        return case

    cases = {name: train(lambda p, program=program, islands=islands, data=data:
                         program.run(p, *data, client=clients[islands]))
             for name, (program, islands, data) in variants.items()}
    cases.update({name: train(lambda p, fn=fn, data=data: fn(p, *data)) for name, (fn, data) in baselines.items()})
    try:
        times = harness.measure(cases, repetitions)
        same = {"pipeline": harness.same_results(variants["4 stages, 1 island"][0].run(
                    params, xs, targets, client=clients[1]), baselines["JAX 4 stages"][0](params, xs, targets)),
                "spmd": harness.same_results(variants["SPMD"][0].run(params, x, target, client=clients[1]),
                                             baselines["JAX SPMD"][0](params, x, target)),
                "spmd_explicit": harness.same_results(
                    variants["SPMD, Explicit axes"][0].run(params, x, target, client=clients[1]),
                    baselines["JAX SPMD, Explicit axes"][0](params, x, target))}
    finally:
        for islands in runtimes:
            clients[islands].close()
            runtimes[islands].close()
    rate = {name: steps / harness.median(t) for name, t in times.items()}
    islands_of = {name: v[1] for name, v in variants.items()} | dict.fromkeys(baselines)
    rows = [{"variant": name, "islands": islands_of[name], "steps_per_s": rate[name],
             "over_jax_spmd": rate[name] / rate["JAX SPMD"], "spread": harness.spread(times[name])}
            for name in cases]
    for row in rows:
        if row["variant"] in ("4 stages", "8 stages"):
            previous = {"4 stages": "2 stages", "8 stages": "4 stages"}[row["variant"]]
            added = int(row["variant"][0]) - int(previous[0])
            row["loss_per_added_stage"] = (1 - rate[row["variant"]] / rate[previous]) / added
    headline = {"pipeline4_over_jax_pipeline4": rate["4 stages, 1 island"] / rate["JAX 4 stages"],
                "spmd_over_jax_spmd": rate["SPMD"] / rate["JAX SPMD"],
                "spmd_explicit_over_jax_spmd_explicit": rate["SPMD, Explicit axes"] / rate["JAX SPMD, Explicit axes"],
                "pipeline4_over_jax_spmd": rate["4 stages"] / rate["JAX SPMD"],
                "pipeline8_over_pipeline4": rate["8 stages"] / rate["4 stages"],
                "two_islands_over_one": rate["4 stages, 2 islands"] / rate["4 stages, 1 island"]}
    return harness.record(NAME, {"devices": DEVICES, "layers": LAYERS, "width": WIDTH, "batch": BATCH,
                                 "micro_batches": MICRO_BATCHES, "steps_per_case": steps,
                                 "repetitions": repetitions, "baselines_match_ours": same}, rows, headline)


def plot(record: dict, ax) -> None:
    """Table 2 as bars: training throughput of each variant relative to plain JAX SPMD."""
    names = [r["variant"] for r in record["rows"]]
    ax.bar(names, [r["over_jax_spmd"] for r in record["rows"]],
           color=["tab:orange" if name.startswith("JAX") else "tab:blue" for name in names])
    ax.axhline(1.0, color="grey", linestyle=":")
    ax.set(ylabel="steps / s relative to JAX SPMD", title=f"Training step on {DEVICES} devices: SPMD vs pipelines")
    ax.tick_params(axis="x", labelrotation=20, labelsize="small")

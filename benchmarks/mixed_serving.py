"""Serving interleaved into training: inference latency and training throughput under each policy.

One island of 4 CPU devices serves two clients of one runtime. The training
client runs a loop of training steps on all 4 devices, in one of two forms:
`accumulate`, an MLP (4 tanh layers of width 256, mean squared error, SGD)
whose step is 4 micro-batch runs (each the gradient of 64 rows, the rows
split over the devices) and one update run that averages the 4 gradients and
applies them, the next step's micro-batches reading the updated parameters
(gradient accumulation: the gaps between micro-batches are run boundaries);
and `pipeline`, a `pw.pipeline` step of the same layers in 2 stages of 2
devices, 4 micro-batches (GPipe, SGD), one run per step. The loop never
waits for a loss, as a JAX loop with asynchronous dispatch: XLA computes
after dispatch returns, so under `fifo` (every run that fits is admitted at
once) its runs queue up on the devices ahead of whatever comes next. The
serving client's inference requests (a 2-layer MLP on 8 rows, a fraction of a
millisecond, on the same 4 devices) arrive at Poisson times
(`REQUESTS_PER_S`) from another thread; a request's latency runs from its
arrival time (not its submission, so a late submission counts) until its
result is computed. Under `deadline` each request has `timeout=`
`REQUEST_TIMEOUT_S` (a request late by that much would be cancelled; the
record counts them) and training runs have none. `share`, `sjf` and
`deadline` use their default windows (`runtime/policies.py`).

Each repetition runs one session of `SESSION_S` seconds per policy (fifo,
share, sjf, deadline) and training form, in a shuffled order; every policy
has its own runtime, compiled and warmed up (device times measured) before
the first session. Per session: inference p50 and p99 latency, training
steps per second. Ratios against fifo are taken within each repetition
(fifo's session of the same repetition and training form); rows give their
medians over repetitions and spreads (interquartile range over median).
Headlines are the worst over the two training forms: `sjf_p99_over_fifo_p99`
(the largest; below 1: sjf's tail latency is shorter) and
`sjf_training_over_fifo` (the smallest; steps/s, above 1: sjf trains
faster), and the same for `deadline`.
"""

from __future__ import annotations

import random
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.cluster import embedded_device_map
from pathways_mlir.runtime.policies import POLICIES
from pathways_mlir.runtime.runtime import Runtime

from . import harness

NAME = "mixed-serving"
HEADLINE = ("sjf_p99_over_fifo_p99", "sjf_training_over_fifo", "deadline_p99_over_fifo_p99",
            "deadline_training_over_fifo")
# Headlines that read lower is better (times, bytes, errors; `pw-bench report` marks them).
LOWER_IS_BETTER = ("sjf_p99_over_fifo_p99", "deadline_p99_over_fifo_p99")
DEVICES = 4
WIDTH = 256
LAYERS = 4
MICRO_BATCHES = 4
MICRO_ROWS = 64
REQUEST_ROWS = 8
LEARNING_RATE = 0.01
REQUESTS_PER_S = 25.0
REQUEST_TIMEOUT_S = 5.0
SESSION_S = 4.0
VARIANTS = ("accumulate", "pipeline")


def layers(params, x):
    """The model: tanh layers `params` applied to `x`."""
    for w, b in params:
        x = jnp.tanh(x @ w + b)
    return x


def mse(y, target):
    """The mean squared error."""
    return jnp.mean((y - target) ** 2)


def micro_batch_grads(params, x, target):
    """One micro-batch's gradients of the mean squared error."""
    return jax.grad(lambda p: mse(layers(p, x), target))(params)


def update(params, *grads):
    """Sums the micro-batches' gradients and takes one SGD step."""
    total = jax.tree.map(lambda *g: sum(g) / len(g), *grads)
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, total)


def init_params(seed: int, count: int):
    """`count` (weight, bias) layers drawn from `seed`."""
    rng = np.random.default_rng(seed)
    return [(rng.normal(0, WIDTH ** -0.5, (WIDTH, WIDTH)).astype(np.float32), np.zeros(WIDTH, np.float32))
            for _ in range(count)]


class Accumulate:
    """The gradient-accumulation training step: 4 micro-batch runs and an update run."""

    def __init__(self):
        s = pw.virtual_slice(DEVICES, axes="data")
        self.grads = pw.jit(micro_batch_grads, slice=s, in_specs=(None, P("data"), P("data")), out_specs=None)
        self.update = pw.jit(update, slice=s, in_specs=None, out_specs=None)
        rng = np.random.default_rng(1)
        self.batches = [(rng.normal(size=(MICRO_ROWS, WIDTH)).astype(np.float32),
                         rng.normal(size=(MICRO_ROWS, WIDTH)).astype(np.float32) * 0.1)
                        for _ in range(MICRO_BATCHES)]

    def initial(self):
        """The parameters before the first step."""
        return init_params(0, LAYERS)

    def step(self, state, client):
        """Starts one training step (4 micro-batch runs, one update run); returns the new parameters."""
        grads = [self.grads.run(state, x, t, client=client) for x, t in self.batches]
        return self.update.run(state, *grads, client=client)

    @staticmethod
    def ready(state):
        """Waits until `state` is computed."""
        jax.block_until_ready(jax.tree.leaves(state)[-1])


class Pipeline:
    """The `pw.pipeline` training step: 2 stages, 4 micro-batches, one run."""

    def __init__(self):
        slices = [pw.virtual_slice(DEVICES // 2, axes="data") for _ in range(2)]
        stage = lambda p, x: layers(p, x)            # noqa: E731
        self.tx = optax.sgd(LEARNING_RATE)
        self.program = pw.pipeline([stage, stage], slices, loss=mse, micro_batches=MICRO_BATCHES,
                                   optimizer=self.tx, schedule="gpipe")
        rng = np.random.default_rng(1)
        rows = MICRO_BATCHES * MICRO_ROWS
        self.batch = (rng.normal(size=(rows, WIDTH)).astype(np.float32),
                      rng.normal(size=(rows, WIDTH)).astype(np.float32) * 0.1)

    def initial(self):
        """The stages' parameters and optimizer states before the first step."""
        params = [init_params(0, LAYERS // 2), init_params(1, LAYERS // 2)]
        return params, [self.tx.init(p) for p in params]

    def step(self, state, client):
        """Starts one pipelined training step (one run); returns the new parameters and optimizer states."""
        params, opt, _ = self.program.run(*state, *self.batch, client=client)
        return params, opt

    @staticmethod
    def ready(state):
        """Waits until `state` is computed."""
        jax.block_until_ready(jax.tree.leaves(state)[-1])


def inference_program():
    """The inference request: `layers` on a few rows, split over the same 4 devices."""
    s = pw.virtual_slice(DEVICES, axes="data")
    return pw.jit(layers, slice=s, in_specs=(None, P("data")), out_specs=P("data"))


def session(runtime: Runtime, trainer, infer, weights, seconds: float, seed: int, deadlines: bool) -> dict:
    """Trains for `seconds` while requests arrive at Poisson times; returns the latencies (s) and steps/s."""
    training, serving = Client(runtime), Client(runtime)
    rng = random.Random(seed)
    query = np.ones((REQUEST_ROWS, WIDTH), np.float32)
    stop = threading.Event()
    steps = [0, 0.0]
    submitted: list = []
    latencies: list[float] = []
    failures = [0]
    cond = threading.Condition()

    def train():
        state = trainer.initial()
        began = time.perf_counter()
        while not stop.is_set():
            state = trainer.step(state, training)
            steps[0] += 1
        trainer.ready(state)
        steps[1] = time.perf_counter() - began

    def submit(start: float):
        arrival = start
        try:
            while True:
                arrival += rng.expovariate(REQUESTS_PER_S)
                if arrival - start >= seconds:
                    break
                pause = arrival - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                handle = infer.run(weights, query, client=serving,
                                   timeout=REQUEST_TIMEOUT_S if deadlines else None)
                with cond:
                    submitted.append((arrival, handle))
                    cond.notify()
        finally:
            with cond:
                submitted.append(None)       # the collector stops here, whatever happened
                cond.notify()

    def collect():
        index = 0
        while True:
            with cond:
                cond.wait_for(lambda: len(submitted) > index)
                item = submitted[index]
            if item is None:
                return
            arrival, handle = item
            try:
                handle.block_until_ready()
                latencies.append(time.perf_counter() - arrival)
            except Exception:  # noqa: BLE001  (a request cancelled at its deadline: counted)
                failures[0] += 1
            index += 1

    trainer_thread = threading.Thread(target=train)
    collector = threading.Thread(target=collect)
    trainer_thread.start()
    collector.start()
    time.sleep(0.2)                                       # training under way before the first request
    submit(time.perf_counter())
    collector.join(120)
    stop.set()
    trainer_thread.join(120)
    training.close()
    serving.close()
    return {"latencies": latencies, "steps_per_s": steps[0] / steps[1], "steps": steps[0],
            "cancelled": failures[0]}


def percentile(values, q: float) -> float:
    """The `q`-th percentile of `values`."""
    return float(np.percentile(np.asarray(values), q))


def check_samples(results: dict[tuple[str, str], list[dict]], seconds: float) -> None:
    """Raises RuntimeError, naming the session, if a session (`session`'s dict) of `results` (by training
    variant and policy) completed no inference request (its percentiles need one) or, under fifo, started no
    training step (the other policies' rates are ratios to fifo's)."""
    for (variant, policy), sessions in results.items():
        for s in sessions:
            if not s["latencies"] or (policy == "fifo" and not s["steps"]):
                raise RuntimeError(f"{variant} training under {policy}: a {seconds:g} s session completed "
                                   f"{len(s['latencies'])} inference requests ({s['cancelled']} cancelled) and "
                                   f"started {s['steps']} training steps: too few to measure")


def run(quick: bool) -> dict:
    """Runs the sessions, interleaved, and reports each policy's latencies and steps/s."""
    repetitions, seconds = (2, 1.0) if quick else (5, SESSION_S)      # quick: that it runs, not a figure
    trainers = {"accumulate": Accumulate(), "pipeline": Pipeline()}
    infer = inference_program()
    weights = init_params(2, 2)
    runtimes = {policy: Runtime(embedded_device_map(1, DEVICES), policy=policy) for policy in POLICIES}
    results: dict[tuple[str, str], list[dict]] = {(v, p): [] for v in VARIANTS for p in POLICIES}
    try:
        for policy, runtime in runtimes.items():             # compiled, and device times measured
            with Client(runtime) as client:
                for trainer in trainers.values():
                    state = trainer.initial()
                    for _ in range(3):
                        state = trainer.step(state, client)
                    trainer.ready(state)
                for _ in range(5):
                    infer.run(weights, np.ones((REQUEST_ROWS, WIDTH), np.float32), client=client).block_until_ready()
        order = [(v, p) for v in VARIANTS for p in POLICIES]
        shuffle = random.Random(0)
        for rep in range(repetitions):
            shuffle.shuffle(order)
            for variant, policy in order:
                results[variant, policy].append(session(runtimes[policy], trainers[variant], infer, weights,
                                                        seconds, seed=rep, deadlines=policy == "deadline"))
    finally:
        for runtime in runtimes.values():
            runtime.close()
    check_samples(results, seconds)
    rows = []
    for (variant, policy), sessions in results.items():
        p50 = [percentile(s["latencies"], 50) for s in sessions]
        p99 = [percentile(s["latencies"], 99) for s in sessions]
        rate = [s["steps_per_s"] for s in sessions]
        fifo = results[variant, "fifo"]
        p99_ratio = [a / percentile(f["latencies"], 99) for a, f in zip(p99, fifo)]
        p50_ratio = [a / percentile(f["latencies"], 50) for a, f in zip(p50, fifo)]
        rate_ratio = [a / f["steps_per_s"] for a, f in zip(rate, fifo)]
        rows.append({"training": variant, "policy": policy, "p50_ms": harness.median(p50) * 1e3,
                     "p99_ms": harness.median(p99) * 1e3, "steps_per_s": harness.median(rate),
                     "p50_over_fifo": harness.median(p50_ratio), "p99_over_fifo": harness.median(p99_ratio),
                     "p99_over_fifo_spread": harness.spread(p99_ratio),
                     "training_over_fifo": harness.median(rate_ratio),
                     "training_over_fifo_spread": harness.spread(rate_ratio),
                     "p99_ms_spread": harness.spread(p99), "steps_per_s_spread": harness.spread(rate),
                     "requests": sum(len(s["latencies"]) for s in sessions),
                     "cancelled": sum(s["cancelled"] for s in sessions)})
    by = {(r["training"], r["policy"]): r for r in rows}
    headline = {}
    for policy in ("sjf", "deadline"):
        headline[f"{policy}_p99_over_fifo_p99"] = max(by[v, policy]["p99_over_fifo"] for v in VARIANTS)
        headline[f"{policy}_training_over_fifo"] = harness.worst(by[v, policy]["training_over_fifo"]
                                                                 for v in VARIANTS)
    return harness.record(NAME, {"devices": DEVICES, "micro_batches": MICRO_BATCHES, "micro_rows": MICRO_ROWS,
                                 "width": WIDTH, "layers": LAYERS, "requests_per_s": REQUESTS_PER_S,
                                 "session_s": seconds, "repetitions": repetitions,
                                 "request_timeout_s": REQUEST_TIMEOUT_S,
                                 "windows": {p: runtimes[p].scheduler.window for p in POLICIES}},
                          rows, headline)


def plot(record: dict, ax) -> None:
    """Inference p99 latency against training steps/s, one point per policy and training loop."""
    for variant, marker in zip(VARIANTS, ("o", "s")):
        points = [(r["steps_per_s"], r["p99_ms"], r["policy"]) for r in record["rows"] if r["training"] == variant]
        ax.scatter([p[0] for p in points], [p[1] for p in points], marker=marker, label=variant)
        for x, y, policy in points:
            ax.annotate(policy, (x, y), fontsize="small")
    ax.set(xlabel="training steps/s", ylabel="inference p99 latency (ms)", yscale="log",
           title="Inference requests beside a training loop")
    ax.legend(fontsize="small")

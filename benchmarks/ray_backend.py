"""The Ray backend against a hand-written chain of Ray actors, the embedded backend, and one node.

Two workloads, each on 2 islands of 4 CPU devices: the three-block program
(A on island0, B on island1, C on island0: two DCN hops, actor to actor),
and a 4-stage forward pipeline (stage s on a 2-device slice of island s % 2,
4 micro-batches flowing through all stages). Each is timed per run (start
one run, fetch its result) and in flight (start 8 runs, then fetch them
all), as milliseconds per run.

- `ray_three_blocks_over_handwritten`: a hand-written chain of Ray actors
  (one actor per block or stage, each holding its jitted function; object
  references passed from actor to actor, the driver only fetching the end)
  against our Ray backend on the same local Ray instance. Each actor has
  `PER_ISLAND` CPU devices, as an island actor does, and its function is
  jitted over the devices of the block's slice, sharded as the program
  shards it (`BLOCK_MESHES`, `STAGE_MESH`): the same work on the same
  devices.
- `ray_three_blocks_over_handwritten_1dev`: the three-block chain with each
  block jitted on one device instead, which is faster for these 8x16 arrays
  (a multi-device CPU launch costs more than the work): the chain a user
  might write who shards nothing.
- `ray_three_blocks_over_handwritten_cgraph`: the same chains of actors
  compiled into a Ray Compiled Graph, executed once per run (per
  micro-batch for the pipeline), against our Ray backend. The graphs are
  built on the chains' own actors and torn down after their block (the
  actors then serve the chains' calls again).
- `ray_handle_arg_over_handwritten_refs`: `CHAIN` op-by-op calls of block A,
  each taking the previous call's handle, then one fetch, against a
  hand-written actor applying block A `CHAIN` times to the previous call's
  object reference; and the same alternating block A (island0) and block B
  (island1, its result sharded by rows), so each handle goes to the other
  island, against the hand-written A and B actors alternating.
- `ray_over_embedded`: our embedded backend (every island in this process)
  against our Ray backend.
- `ray_two_nodes_over_one`: our Ray backend on a `ray.cluster_utils.Cluster`
  of 2 nodes (one island each) against one node holding both islands. Only
  one cluster can be connected at a time, so they alternate in blocks.
- `actor_call_over_pull`: the mechanism under the data plane. Two
  hand-written actors, each with a `jax.experimental.transfer` server: the
  receiver takes `MOVES` arrays from the sender one after another, by a pull
  over the transfer server (the sender offered them beforehand) or by an actor
  call returning the array (`ray.get`), timed inside the receiver, for a
  small array (three blocks' 8x16 f32) and a 256 KiB one; worst over sizes.

What is timed beside what. Island actors have unique names, so one runtime
of ours lives at a time, and the local instance is timed in rounds of
two blocks:
- our runtime interleaved with the hand-written actor chains and the
  embedded backend (all of whose actors and threads sleep while idle);
- the hand-written compiled graphs, alone. The actors of a compiled graph
  spin while they wait (Ray 2.60 polls its channels with `sched_yield`: an
  idle actor of a graph takes most of a core), which changes how fast
  everything else on these cores runs: beside an idle compiled graph of
  ours (a start channel we had until 2026-12-05) the hand-written chain
  took 6.3 ms per run against 9.1 ms with nothing of ours alive, so no
  other case is timed while a graph is alive, and the graphs' spinning is
  their own cost.

Ratios are speeds (the other case's time over ours: above 1 means ours is
faster) and each headline is the worst case over the workloads and modes.
Everything binds to 127.0.0.1.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pathways_mlir as pw
from pathways_mlir.runtime.client import Client
from pathways_mlir.runtime.runtime import Runtime

from . import harness

NAME = "ray"
HEADLINE = ("ray_three_blocks_over_handwritten", "ray_three_blocks_over_handwritten_1dev",
            "ray_three_blocks_over_handwritten_cgraph",
            "ray_handle_arg_over_handwritten_refs", "ray_over_embedded", "ray_two_nodes_over_one",
            "actor_call_over_pull")
ISLANDS, PER_ISLAND = 2, 4
IN_FLIGHT = 8
CHAIN = 8                # op-by-op calls in the handle-argument chain
STAGES, MICRO_BATCHES, WIDTH, MICRO_BATCH = 4, 4, 64, 16
LOOPBACK = "127.0.0.1"
MOVES, MOVED_SHAPES = 16, ((8, 16), (256, 256))     # arrays per timed move case, and their shapes (f32)

slice_a = pw.virtual_slice(2, axes="data", name="ray_a", island="island0")
slice_b = pw.virtual_slice((2, 2), axes=("data", "model"), name="ray_b", island="island1")
slice_c = pw.virtual_slice(2, axes="data", name="ray_c", island="island0")


def _block_a(x):
    return jnp.tanh(x)


def _block_b(x):
    return x * x


def _block_c(x):
    return -x


BLOCKS = (_block_a, _block_b, _block_c)
# Each block's mesh and sharding in the program below, which the hand-written actors use too.
BLOCK_MESHES = (((2,), P("data")), ((2, 2), P("data", "model")), ((2,), P("data")))
STAGE_MESH = ((2,), (P(), P("data")), P("data"))
block_a = pw.jit(_block_a, slice=slice_a, in_specs=P("data"), out_specs=P("data"))
block_b = pw.jit(_block_b, slice=slice_b, in_specs=P("data", "model"), out_specs=P("data", "model"))
block_c = pw.jit(_block_c, slice=slice_c, in_specs=P("data"), out_specs=P("data"))


@pw.program
def block_a_alone(x):
    """Block A alone, called op by op on the previous call's result."""
    return block_a(x)


block_b_rows = pw.jit(_block_b, slice=slice_b, in_specs=P("data", "model"), out_specs=P("data"))


@pw.program
def block_b_alone(x):
    """Block B alone on island1, its result sharded by rows (which island0's 2-device slice can take)."""
    return block_b_rows(x)


@pw.program
def three_blocks(x):
    """The three-block program across both islands."""
    return block_c(block_b(block_a(x)))


def stage(w, h):
    """One pipeline stage: a tanh layer."""
    return jnp.tanh(h @ w)


stage_slices = [pw.virtual_slice(2, axes="data", name=f"ray_stage{s}", island=f"island{s % ISLANDS}")
                for s in range(STAGES)]
stages = [pw.jit(stage, slice=s, in_specs=(P(), P("data")), out_specs=P("data")) for s in stage_slices]


@pw.program
def pipeline4(weights, micro_batches):
    """A 4-stage forward pipeline: every micro-batch through every stage, stages alternating islands."""
    outputs = []
    for h in micro_batches:
        for s in range(STAGES):
            h = stages[s](weights[s], h)
        outputs.append(h)
    return outputs


def inputs(seed: int = 0):
    """Returns the arguments of the two workloads: `(x,)` and `(weights, micro_batches)`."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(8, 16)).astype(np.float32)
    weights = [rng.normal(0, WIDTH ** -0.5, (WIDTH, WIDTH)).astype(np.float32) for _ in range(STAGES)]
    micro_batches = [rng.normal(size=(MICRO_BATCH, WIDTH)).astype(np.float32) for _ in range(MICRO_BATCHES)]
    return (x,), (weights, micro_batches)


def expected(three_args, pipeline_args):
    """Returns what plain JAX computes for both workloads."""
    (x,), (weights, micro_batches) = three_args, pipeline_args
    y = x
    for fn in BLOCKS:
        y = jax.jit(fn)(y)
    outs = []
    for h in micro_batches:
        for w in weights:
            h = jax.jit(stage)(w, h)
        outs.append(np.asarray(h))
    return np.asarray(y), outs


def start_cluster(nodes: int, num_cpus: int = 1, spare_head: bool = False):
    """Starts a `ray.cluster_utils.Cluster` on 127.0.0.1: one island per node, or both on one node.

    With `spare_head`, the head node (the one this process connects to) holds no island, so every
    island's node can be removed.
    """
    from ray.cluster_utils import Cluster

    from pathways_mlir.runtime.ray_backend import island_name, use_loopback

    use_loopback()
    per_node = [[f"island{i}"] for i in range(ISLANDS)] if nodes == ISLANDS else [[f"island{i}" for i in
                                                                                     range(ISLANDS)]]
    per_node = [[]] * spare_head + per_node
    cluster = Cluster()
    try:
        for names in per_node:
            cluster.add_node(num_cpus=num_cpus, node_ip_address=LOOPBACK, include_dashboard=False,
                             resources={island_name(n): 1 for n in names})
        cluster.wait_for_nodes(timeout=60)
    except BaseException:
        cluster.shutdown()
        raise
    return cluster


class _Actor:
    """A hand-written Ray actor: holds one jitted function (and its constant operand) and applies it. With
    `mesh_shape`, the function is jitted over that many of the actor's devices, its operands and result
    sharded by `in_specs` and `out_spec` (as our program shards the block); without, on one device."""

    def __init__(self, fn, constant=None, mesh_shape=None, in_specs=None, out_spec=None):
        import math

        import jax as actor_jax
        from jax.sharding import Mesh, NamedSharding

        if mesh_shape is None:
            self._fn = actor_jax.jit(fn)
        else:
            devices = np.array(actor_jax.devices()[:math.prod(mesh_shape)]).reshape(mesh_shape)
            mesh = Mesh(devices, ("data", "model")[:len(mesh_shape)])
            self._fn = actor_jax.jit(fn, in_shardings=tuple(NamedSharding(mesh, s) for s in in_specs),
                                     out_shardings=NamedSharding(mesh, out_spec))
        self._constant = constant

    def apply(self, x):
        """Applies the function to `x` (after the constant, if any); returns a NumPy array."""
        args = (x,) if self._constant is None else (self._constant, x)
        return np.asarray(self._fn(*args))


class _Peer:
    """A hand-written Ray actor with a JAX transfer server, taking arrays from a peer by pull or by actor call."""

    def __init__(self):
        import jax as actor_jax
        from jax.experimental import transfer

        self._jax = actor_jax
        self._server = transfer.start_transfer_server(actor_jax.devices()[0].client, f"{LOOPBACK}:0",
                                                      [f"{LOOPBACK}:0"])
        self._arrays: dict = {}

    def address(self) -> str:
        return self._server.address()

    def offer(self, shape: tuple, first: int, count: int) -> None:
        """Offers one array of `shape` under transfer ids first..first+count-1 (sender)."""
        x = self._jax.device_put(np.ones(shape, np.float32))
        self._arrays[shape] = np.asarray(x)
        for uuid in range(first, first + count):
            self._server.await_pull(uuid, [x])

    def array(self, shape: tuple) -> np.ndarray:
        """The offered array of `shape`, as an actor call returns it (sender)."""
        return self._arrays[shape]

    def connect(self, peer, address: str) -> None:
        """Connects to the sender's transfer server (receiver)."""
        self._peer, self._connection = peer, self._server.connect(address)

    def pulls(self, shape: tuple, first: int, count: int) -> float:
        """Pulls ids first..first+count-1 one after another, each until its array is here; returns seconds."""
        spec = self._jax.ShapeDtypeStruct(shape, np.float32,
                                          sharding=self._jax.sharding.SingleDeviceSharding(self._jax.devices()[0]))
        began = time.perf_counter()
        for uuid in range(first, first + count):
            [x] = self._connection.pull(uuid, [spec])
            x.block_until_ready()
        return time.perf_counter() - began

    def calls(self, shape: tuple, count: int) -> float:
        """Takes the array by `count` actor calls, one after another; returns seconds."""
        import ray

        began = time.perf_counter()
        for _ in range(count):
            ray.get(self._peer.array.remote(shape), timeout=120)
        return time.perf_counter() - began


def moves(ray, repetitions: int) -> list[dict]:
    """Times moves between two `_Peer` actors by pull and by actor call, interleaved; returns the rows."""
    peer = ray.remote(_Peer).options(num_cpus=0, runtime_env={"env_vars": {"JAX_PLATFORMS": "cpu"}})
    sender, receiver = peer.remote(), peer.remote()
    pool = MOVES * (repetitions + 2)                       # ids for the warm-ups and every repetition
    ray.get([sender.offer.remote(shape, n * pool, pool) for n, shape in enumerate(MOVED_SHAPES)], timeout=120)
    ray.get(receiver.connect.remote(sender, ray.get(sender.address.remote(), timeout=120)), timeout=120)
    used = {shape: n * pool for n, shape in enumerate(MOVED_SHAPES)}
    seconds: dict[tuple, list[float]] = {}

    def case(how, shape):
        def timed():
            if how == "pull":
                took = receiver.pulls.remote(shape, used[shape], MOVES)
                used[shape] += MOVES
            else:
                took = receiver.calls.remote(shape, MOVES)
            seconds.setdefault((how, shape), []).append(ray.get(took, timeout=120))
        return timed

    harness.measure({f"{how} {shape}": case(how, shape) for how in ("pull", "actor call") for shape in MOVED_SHAPES},
                    repetitions, warmup=2)
    for actor in (sender, receiver):
        ray.kill(actor)
    return [{"move": how, "bytes": 4 * int(np.prod(shape)), "ms_per_move": harness.median(s[2:]) * 1e3 / MOVES,
             "spread": harness.spread(s[2:])} for (how, shape), s in sorted(seconds.items())]


def handwritten_chains(ray, pipeline_args):
    """Returns the hand-written actor chains of both workloads, each actor with `PER_ISLAND` CPU devices and
    its block or stage sharded over them as our program shards it: (three-block chain, pipeline chain)."""
    flags = f"--xla_force_host_platform_device_count={PER_ISLAND}"
    actor = ray.remote(_Actor).options(num_cpus=0, runtime_env={"env_vars": {"JAX_PLATFORMS": "cpu",
                                                                             "XLA_FLAGS": flags}})
    blocks = [actor.remote(fn, None, mesh, (spec,), spec) for fn, (mesh, spec) in zip(BLOCKS, BLOCK_MESHES)]
    weights, _ = pipeline_args
    pipeline = [actor.remote(stage, w, *STAGE_MESH) for w in weights]
    ray.get([a.apply.remote(np.zeros((8, 16), np.float32)) for a in blocks] +
            [a.apply.remote(np.zeros((MICRO_BATCH, WIDTH), np.float32)) for a in pipeline], timeout=120)
    return blocks, pipeline


def one_device_chain(ray):
    """Returns the hand-written three-block chain with each block jitted on one device of its actor."""
    actor = ray.remote(_Actor).options(num_cpus=0, runtime_env={"env_vars": {"JAX_PLATFORMS": "cpu"}})
    blocks = [actor.remote(fn) for fn in BLOCKS]
    ray.get([a.apply.remote(np.zeros((8, 16), np.float32)) for a in blocks], timeout=120)
    return blocks


def handwritten_graphs(blocks, pipeline):
    """Returns the hand-written chains of both workloads compiled into Ray graphs on the chains' actors, which
    serve nothing else until the graphs are torn down: (three-block graph, pipeline graph)."""
    from ray.dag import InputNode

    graphs = []
    for actors, inflight in ((blocks, 2 * IN_FLIGHT), (pipeline, 2 * IN_FLIGHT * MICRO_BATCHES)):
        with InputNode() as x:
            node = x
            for a in actors:
                node = a.apply.bind(node)
        graphs.append(node.experimental_compile(_max_inflight_executions=inflight))
    return graphs


def _chain(actors, x):
    ref = x
    for a in actors:
        ref = a.apply.remote(ref)
    return ref


def cases(ray, runtime: Runtime | None, client: Client | None, chains, three_args, pipeline_args,
          prefix: str = "", graphs=None):
    """Returns the timed cases (per run and in flight) of both workloads on `runtime`, the chains and the
    compiled graphs of the chains, and the handle-argument chain on `runtime` and on the first chain."""
    def ours(program, args, count):
        def case():
            outs = [program.run(*args, client=client) for _ in range(count)]
            for out in outs:
                jax.tree.map(np.asarray, out)
        return case

    def chained(workload, count):
        blocks, pipeline, one_device = chains

        def case():
            if workload == "pipeline":
                refs = [_chain(pipeline, h) for _ in range(count) for h in pipeline_args[1]]
            else:
                refs = [_chain(one_device if workload == "one device" else blocks, three_args[0])
                        for _ in range(count)]
            ray.get(refs, timeout=120)
        return case

    def compiled(three, count):
        three_graph, pipeline_graph = graphs

        def case():
            if three:
                refs = [three_graph.execute(three_args[0]) for _ in range(count)]
            else:
                refs = [pipeline_graph.execute(h) for _ in range(count) for h in pipeline_args[1]]
            for ref in refs:
                ref.get(timeout=120)
        return case

    def handle_chain(programs):
        def case():
            h = programs[0].run(*three_args, client=client)
            for i in range(1, CHAIN):
                h = programs[i % len(programs)].run(h, client=client)
            np.asarray(h)
        return case

    def ref_chain(actors):
        def case():
            ref = three_args[0]
            for i in range(CHAIN):
                ref = actors[i % len(actors)].apply.remote(ref)
            ray.get(ref, timeout=120)
        return case

    out = {}
    for mode, count in (("per run", 1), ("in flight", IN_FLIGHT)):
        if runtime is not None:
            out[(prefix, "three blocks", mode)] = ours(three_blocks, three_args, count)
            out[(prefix, "4-stage pipeline", mode)] = ours(pipeline4, pipeline_args, count)
        if chains is not None:
            out[("handwritten", "three blocks", mode)] = chained("three blocks", count)
            out[("handwritten", "4-stage pipeline", mode)] = chained("pipeline", count)
            out[("handwritten, 1 device", "three blocks", mode)] = chained("one device", count)
        if graphs is not None:
            out[("handwritten cgraph", "three blocks", mode)] = compiled(True, count)
            out[("handwritten cgraph", "4-stage pipeline", mode)] = compiled(False, count)
    if runtime is not None and prefix == "ray":
        out[(prefix, "handle-argument chain", "per run")] = handle_chain((block_a_alone,))
        out[(prefix, "handle-argument chain across islands", "per run")] = handle_chain((block_a_alone, block_b_alone))
    if chains is not None:
        out[("handwritten refs", "handle-argument chain", "per run")] = ref_chain(chains[0][:1])
        out[("handwritten refs", "handle-argument chain across islands", "per run")] = ref_chain(chains[0][:2])
    return out


def _times(cases_: dict, repetitions: int) -> dict:
    """Times cases keyed by (backend, workload, mode), interleaved; returns their seconds by key."""
    names = {" / ".join(key): key for key in cases_}
    times = harness.measure({name: cases_[key] for name, key in names.items()}, repetitions, warmup=2)
    return {names[name]: values for name, values in times.items()}


def run(quick: bool) -> dict:
    """Measures both workloads on our Ray backend, the hand-written chains, embedded, and 1 vs 2 nodes; see the
    module docstring for what is timed beside what."""
    import ray

    from pathways_mlir.runtime.ray_backend import connect

    repetitions, blocks = (5, 1) if quick else (21, 3)
    three_args, pipeline_args = inputs()
    times: dict[tuple, list[float]] = {}

    def add(block):
        for key, values in block.items():
            times.setdefault(key, []).extend(values)

    connect(None, num_cpus=ISLANDS)      # one local Ray for our runtimes and the hand-written chains
    embedded = Runtime(islands=ISLANDS, per_island=PER_ISLAND)
    try:
        with Client(embedded) as embedded_client:
            chains = (*handwritten_chains(ray, pipeline_args), one_device_chain(ray))
            baselines = cases(ray, None, None, chains, three_args, pipeline_args)
            baselines.update(cases(ray, embedded, embedded_client, None, three_args, pipeline_args, "embedded"))
            for _ in range(blocks):
                our_ray = Runtime(backend="ray", islands=ISLANDS, per_island=PER_ISLAND)
                try:
                    with Client(our_ray) as client:
                        block = cases(ray, our_ray, client, None, three_args, pipeline_args, "ray")
                        add(_times({**block, **baselines}, repetitions))
                finally:
                    our_ray.close()
                graphs = handwritten_graphs(*chains[:2])
                try:
                    add(_times(cases(ray, None, None, None, three_args, pipeline_args, graphs=graphs), repetitions))
                finally:
                    for graph in graphs:
                        graph.teardown()
            moved = moves(ray, repetitions)
    finally:
        embedded.close()
        ray.shutdown()
    for _ in range(blocks):
        for nodes in (ISLANDS, 1):
            cluster = start_cluster(nodes)
            try:
                runtime = Runtime(backend="ray", islands=ISLANDS, per_island=PER_ISLAND, address=cluster.address)
                prefix = f"ray, {nodes} node{'s' if nodes > 1 else ''}"
                try:
                    with Client(runtime) as client:
                        block = _times(cases(ray, runtime, client, None, three_args, pipeline_args, prefix),
                                       repetitions)
                finally:
                    runtime.close()
            finally:
                cluster.shutdown()
            add(block)
    ms = {key: harness.median(v) * 1e3 / (1 if key[2] == "per run" else IN_FLIGHT) for key, v in times.items()}
    rows = [{"backend": b, "workload": w, "mode": m, "ms_per_run": t, "spread": harness.spread(times[(b, w, m)])}
            for (b, w, m), t in sorted(ms.items())]
    ours_on_ray = ("ray",)
    pairs = {"ray_three_blocks_over_handwritten": ("handwritten", ours_on_ray),
             "ray_three_blocks_over_handwritten_1dev": ("handwritten, 1 device", ours_on_ray),
             "ray_three_blocks_over_handwritten_cgraph": ("handwritten cgraph", ours_on_ray),
             "ray_handle_arg_over_handwritten_refs": ("handwritten refs", ours_on_ray),
             "ray_over_embedded": ("embedded", ours_on_ray),
             "ray_two_nodes_over_one": ("ray, 1 node", ("ray, 2 nodes",))}
    rows += moved
    by = {(r["move"], r["bytes"]): r["ms_per_move"] for r in moved}
    headline = {}
    for name, (other, ours_) in pairs.items():
        ratios = {(b, w, m): ms[(other, w, m)] / ms[(b, w, m)] for (b, w, m) in ms
                  if b in ours_ and (other, w, m) in ms}
        worst = min(ratios, key=ratios.get)
        if name in HEADLINE:
            headline[name] = ratios[worst]
        for (b, w, m), r in ratios.items():
            rows.append({"ratio": name, "ours": b, "workload": w, "mode": m, "value": r, "worst": (b, w, m) == worst})
    headline["actor_call_over_pull"] = min(by[("actor call", n)] / by[("pull", n)] for _, n in by)
    return harness.record(NAME, {"islands": ISLANDS, "per_island": PER_ISLAND, "in_flight": IN_FLIGHT,
                                 "repetitions": repetitions, "cluster_blocks": blocks}, rows, headline)


def plot(record: dict, ax) -> None:
    """Milliseconds per run of each backend, per workload and mode."""
    rows = [r for r in record["rows"] if "ms_per_run" in r]
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    groups = list(dict.fromkeys((r["workload"], r["mode"]) for r in rows))
    width = 0.8 / len(backends)
    for i, backend in enumerate(backends):
        values = {(r["workload"], r["mode"]): r["ms_per_run"] for r in rows if r["backend"] == backend}
        ax.bar([g + i * width for g in range(len(groups))], [values.get(k, 0) for k in groups], width,
               label=backend)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], [f"{w}\n{m}" for w, m in groups],
                  fontsize="small")
    ax.set(ylabel="ms per run", title="Ray backend: ours, hand-written actor chains, embedded, 1 vs 2 nodes")
    ax.legend(fontsize="small")

"""Four clients fine-tune their own heads on one frozen base, held once on the devices.

The base is a small frozen MLP (two layers, about 1.3 MB); each client's
task is to predict the class a teacher of its own gives the base's
features, by training a linear head (with optax adam, about 50 KB of head
and optimizer state). One client places the base and shares it
(`client.share`); every client passes the shared references to its
training step, which reads the base where it lives. The runtime's memory
ledger holds the base once: four clients hold little more than one.
The baseline is four plain-JAX jobs, each holding its own copy of the base,
running the same steps on the same device; the heads and losses are equal.

    python examples/shared_base_finetune.py      # embedded, CPU devices, about half a minute
"""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import pathways_mlir as pw

INPUTS, HIDDEN, CLASSES, BATCH = 128, 512, 8, 64
CLIENTS = 4
OPTIMIZER = optax.adam(1e-2)


def init_base(seed: int = 0) -> dict:
    """Returns the frozen base's parameters."""
    rng = np.random.default_rng(seed)
    return {"w1": rng.normal(0, INPUTS ** -0.5, (INPUTS, HIDDEN)).astype(np.float32),
            "b1": np.zeros(HIDDEN, np.float32),
            "w2": rng.normal(0, HIDDEN ** -0.5, (HIDDEN, HIDDEN)).astype(np.float32),
            "b2": np.zeros(HIDDEN, np.float32)}


def init_head() -> dict:
    """Returns a client's head before fine-tuning."""
    return {"w": np.zeros((HIDDEN, CLASSES), np.float32), "b": np.zeros(CLASSES, np.float32)}


def features(base, x):
    """The frozen base: two ReLU layers."""
    return jax.nn.relu(jax.nn.relu(x @ base["w1"] + base["b1"]) @ base["w2"] + base["b2"])


def batches(tasks: int, steps: int, base_values: dict, size: int = BATCH) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Returns each task's `steps` batches of `size`: inputs, and the class the task's teacher gives their
    features."""
    data = []
    for task in range(tasks):
        teacher = np.random.default_rng(task + 1).normal(size=(HIDDEN, CLASSES)).astype(np.float32)
        x = np.random.default_rng(1000 * (task + 1)).normal(size=(steps, size, INPUTS)).astype(np.float32)
        y = np.asarray(jnp.argmax(jax.jit(features)(base_values, x) @ teacher, axis=-1), np.int32)
        data.append(list(zip(x, y)))
    return data


def train_step(base, head, opt_state, x, y):
    """One adam step of the head on a batch; the base is only read. Returns head, state and loss."""
    feats = features(base, x)

    def loss(head):
        logits = feats @ head["w"] + head["b"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    value, grads = jax.value_and_grad(loss)(head)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, head)
    return optax.apply_updates(head, updates), opt_state, value


def placed(island: str = "island0"):
    """Returns the base's placement and the training step, on one device of `island`."""
    s = pw.virtual_slice(1, axes="x", island=island)
    return (pw.jit(lambda tree: jax.tree.map(lambda a: a * 1.0, tree), slice=s, in_specs=None, out_specs=None),
            pw.jit(train_step, slice=s, in_specs=None, out_specs=None))


def share_base(place, owner, base_values: dict) -> tuple[dict, dict]:
    """Places the base for `owner` and shares it; returns the owner's handles and the shared references."""
    handles = place.run(base_values, client=owner)
    return handles, jax.tree.map(lambda h: owner.share(h, timeout=60), handles)


def finetune(step, bases: list, clients: list, data: list) -> list[tuple[dict, object, list]]:
    """Fine-tunes one head per client on its task's batches `data[k]`, each client in its own thread,
    reading `bases[k]` (shared references, or a client's own handles); returns (head, opt_state, losses)
    per client."""
    results = [None] * len(clients)

    def one(k):
        head = init_head()
        opt_state = OPTIMIZER.init(head)
        losses = []
        for x, y in data[k]:
            head, opt_state, value = step.run(bases[k], head, opt_state, x, y, client=clients[k])
            losses.append(value)
        results[k] = head, opt_state, [float(np.asarray(v.result(60))) for v in losses]

    threads = [threading.Thread(target=one, args=(k,)) for k in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert all(r is not None for r in results), "a client's fine-tuning did not finish"
    return results


def plain_jax_jobs(base_values: dict, data: list, device=None) -> list[tuple[dict, object, list]]:
    """The baseline: one plain-JAX job per task's batches in `data`, each in its own thread holding its
    own copy of the base on `device`; returns (head, opt_state, losses) per job."""
    device = device or jax.devices()[0]
    step = jax.jit(train_step)
    jobs = len(data)
    results = [None] * jobs

    def one(k):
        base = jax.device_put(base_values, device)             # each job holds the base
        head = jax.device_put(init_head(), device)
        opt_state = OPTIMIZER.init(head)
        losses = []
        for x, y in data[k]:
            head, opt_state, value = step(base, head, opt_state, x, y)
            losses.append(value)
        results[k] = head, opt_state, [float(v) for v in losses]

    threads = [threading.Thread(target=one, args=(k,)) for k in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert all(r is not None for r in results), "a plain-JAX job did not finish"
    return results


def held_bytes(runtime, timeout: float = 60.0) -> int:
    """The device bytes the runtime's memory ledger holds once no run is under way: the results that handles
    hold. A run gives its reservation back when its islands are done with it, which may be just after its
    results have been read (its frees after them), so this waits for that, `timeout` seconds at most."""
    deadline = time.monotonic() + timeout
    while runtime.status()["scheduler"]["admitted"] and time.monotonic() < deadline:
        time.sleep(0.01)
    return sum(runtime.usage().values())


if __name__ == "__main__":
    steps = 40
    runtime = pw.get_runtime()
    base_values = init_base()
    data = batches(CLIENTS, steps, base_values)
    place, step = placed()
    clients = [pw.Client(runtime) for _ in range(CLIENTS)]
    _, shared = share_base(place, clients[0], base_values)
    one = finetune(step, [shared], clients[:1], data)          # compiles the step, too
    held_one = held_bytes(runtime)
    del one
    start = time.perf_counter()
    ours = finetune(step, [shared] * CLIENTS, clients, data)
    ours_s = time.perf_counter() - start
    held_four = held_bytes(runtime)
    plain_jax_jobs(base_values, [d[:1] for d in data])        # compiled first
    start = time.perf_counter()
    plain = plain_jax_jobs(base_values, data)
    plain_s = time.perf_counter() - start
    for k, ((_, _, losses), (_, _, expected)) in enumerate(zip(ours, plain)):
        print(f"client {k}: loss {losses[0]:.4f} -> {losses[-1]:.4f} (plain JAX {expected[0]:.4f} -> "
              f"{expected[-1]:.4f})")
    print("matches plain JAX:", all(np.allclose(a, b, rtol=1e-4, atol=1e-5)
                                    for (_, _, a), (_, _, b) in zip(ours, plain)))
    print(f"device bytes held: 1 client {held_one}, {CLIENTS} clients {held_four} ({held_four / held_one:.2f}x; "
          f"{CLIENTS} plain-JAX jobs hold {CLIENTS} bases)")
    print(f"{CLIENTS} x {steps} steps: {ours_s:.2f} s sharing the base, {plain_s:.2f} s as plain-JAX jobs")
    for c in clients:
        c.close()

"""homegpu's built-in JAX demo: data parallel over jax.distributed on synthetic data, one process per node.

`homegpu init --framework jax` writes a job that runs it, so a JAX user's first `homegpu run` trains across
their machines at once, with no download: an MLP learns to tell ten Gaussian clusters apart (loss falls from
about 2.3 within an epoch or two), the same problem as the PyTorch demo's. One jitted step runs over a mesh of
every process's devices: each process holds its own `--batch-size` slice of every step's global batch (process
p's slice right after process p-1's), XLA averages the gradients over the whole global batch, and the
parameters, replicated, stay identical everywhere. gloo on a CPU, NCCL on GPUs. Progress goes out as the metric
line protocol (trainer/PROTOCOL.md) from every process, as worker `jax.process_index()`.

State survives a restart: after each epoch every process writes `backup/snapshot.npz` in its output dir
(parameters, momentum, epochs done). A restarted job resumes from the fewest epochs any process finished, with
the state of the first process that finished exactly that many (none finished one: every process starts afresh
from the same seed), so a process whose snapshot is ahead goes back to it and the replicas stay identical.
`DONE` once all are trained; process 0 also writes `model.npz`.

Needs only jax, NumPy and the standard library: `python -m homegpu.trainer.jax_demo --epochs 5 --output OUT`
on each node, with homegpu's variables (trainer/jax_cluster.py), or alone on one machine without them.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np

from homegpu.trainer import jax_cluster
from homegpu.trainer.demo_args import parse_demo_args
from homegpu.trainer.gpu_budget import hold_to_budget
from homegpu.trainer.metrics import format_metric

CLASSES = 10
FEATURES = 32
HIDDEN = 64
EXAMPLES = 8192
DATA_SEED = 0
INIT_SEED = 1
LEARNING_RATE = 0.05
MOMENTUM = 0.9
BATCH_AXIS = "batch"
SNAPSHOT = Path("backup") / "snapshot.npz"
PARAMS = ("w1", "b1", "w2", "b2")


def synthetic_set() -> tuple[np.ndarray, np.ndarray]:
    """Ten Gaussian clusters in 32 dimensions, the same on every process (a fixed seed)."""
    rng = np.random.default_rng(DATA_SEED)
    centers = rng.standard_normal((CLASSES, FEATURES)) * 0.6
    labels = rng.integers(0, CLASSES, EXAMPLES)
    inputs = centers[labels] + rng.standard_normal((EXAMPLES, FEATURES))
    return inputs.astype(np.float32), labels.astype(np.int32)


def initial_params() -> dict[str, np.ndarray]:
    """An MLP 32→64→10, initialised as torch.nn.Linear is (uniform in ±1/√fan_in), the same on every process."""
    rng = np.random.default_rng(INIT_SEED)

    def uniform(fan_in: int, *shape: int) -> np.ndarray:
        bound = 1 / np.sqrt(fan_in)
        return rng.uniform(-bound, bound, shape).astype(np.float32)

    return {"w1": uniform(FEATURES, FEATURES, HIDDEN), "b1": uniform(FEATURES, HIDDEN),
            "w2": uniform(HIDDEN, HIDDEN, CLASSES), "b2": uniform(HIDDEN, CLASSES)}


def load_snapshot(path: Path) -> tuple[dict, dict, int] | None:
    """(params, momentum, epochs done) from this process's snapshot, or None when it has none."""
    if not path.exists():
        return None
    with np.load(path) as saved:
        return ({name: saved[name] for name in PARAMS}, {name: saved["momentum_" + name] for name in PARAMS},
                int(saved["epochs"]))


def write_atomically(path: Path, write) -> None:
    """`write(file)` into a temp file beside `path`, then renamed over it: a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # per process: two may share an output dir
    with open(temp, "wb") as handle:
        write(handle)
    os.replace(temp, path)


def save_state(path: Path, params: dict, momentum: dict, epochs: int) -> None:
    arrays = {**params, **{"momentum_" + name: value for name, value in momentum.items()}}
    write_atomically(path, lambda handle: np.savez(handle, epochs=np.int64(epochs), **arrays))


def local(array) -> np.ndarray:
    """A replicated global array's value, read from this process's own copy."""
    return np.asarray(array.addressable_data(0))


def device_batch(batch_size: int, most_devices: int) -> int:
    """Examples per device a step: `batch_size` split over the most devices a process has, at least one each (a
    process with fewer devices takes a smaller slice)."""
    return max(1, batch_size // most_devices)


def step_rows(order: np.ndarray, step: int, global_batch: int) -> np.ndarray:
    """The global batch of step `step`: the next `global_batch` of the epoch's order, wrapping past its end."""
    return np.take(order, np.arange(step * global_batch, (step + 1) * global_batch), mode="wrap")


def main(argv: list[str] | None = None) -> int:
    args = parse_demo_args("homegpu.trainer.jax_demo", "homegpu's JAX demo: data parallel on synthetic data", argv)
    hold_to_budget()  # before the framework's import: it holds it once loaded
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    jax_cluster.register()
    if jax_cluster.in_run():  # alone, with no homegpu variables, it trains on its own
        jax.distributed.initialize()
    worker, workers = jax.process_index(), jax.process_count()

    def say(**fields) -> None:
        print(format_metric(worker=worker, workers=workers, time=time.time(), **fields), flush=True)

    # process p's devices first after process p-1's: its slice of every global batch is the p-th
    devices = sorted(jax.devices(), key=lambda device: (device.process_index, device.id))
    mesh = Mesh(np.array(devices), (BATCH_AXIS,))
    replicated = NamedSharding(mesh, PartitionSpec())
    by_batch = NamedSharding(mesh, PartitionSpec(BATCH_AXIS))
    # the same on every device of every process, from the most devices any process has: one global batch shape
    per_device = device_batch(args.batch_size, max(Counter(device.process_index for device in devices).values()))
    local_batch, global_batch = per_device * jax.local_device_count(), per_device * len(devices)

    def spread(value: np.ndarray):
        """A global array of one row per device, each row this process's `value`."""
        return jax.make_array_from_callback((len(devices), *value.shape), by_batch, lambda index: value[None])

    def sliced(data: np.ndarray, rows: np.ndarray):
        """`data[rows]` as a global array split over the devices: this process fills only its own devices' rows."""
        return jax.make_array_from_callback((len(rows), *data.shape[1:]), by_batch, lambda index: data[rows[index[0]]])

    def from_row(row: int, tree):
        """`tree` as the process of the mesh's device `row` holds it, replicated on every process."""
        return jax.jit(lambda spread_tree: jax.tree.map(lambda rows: rows[row], spread_tree),
                       out_shardings=replicated)(jax.tree.map(spread, tree))

    output = Path(args.output)
    snapshot = output / SNAPSHOT
    params, momentum, done = load_snapshot(snapshot) or (
        initial_params(), {name: np.zeros_like(value) for name, value in initial_params().items()}, 0)
    # every process resumes from the same epoch, the fewest any finished, with the state of one that finished it
    dones = local(jax.jit(lambda rows: rows, out_shardings=replicated)(spread(np.array(done, np.int32))))
    initial = int(dones.min())
    params, momentum = from_row(int(np.argmax(dones == initial)), (params, momentum))

    def loss_of(params, inputs, labels):
        hidden = jax.nn.relu(inputs @ params["w1"] + params["b1"])
        logits = hidden @ params["w2"] + params["b2"]
        picked = jnp.take_along_axis(logits, labels[:, None], axis=1)[:, 0]
        return jnp.mean(jax.nn.logsumexp(logits, axis=1) - picked), logits

    @partial(jax.jit, out_shardings=replicated)
    def train_step(params, momentum, totals, inputs, labels):
        # the mean over the global batch, sharded over every process: XLA all-reduces the gradient
        (loss, logits), grads = jax.value_and_grad(loss_of, has_aux=True)(params, inputs, labels)
        momentum = jax.tree.map(lambda buffer, grad: MOMENTUM * buffer + grad, momentum, grads)  # as torch's SGD
        params = jax.tree.map(lambda param, buffer: param - LEARNING_RATE * buffer, params, momentum)
        correct = jnp.sum(jnp.argmax(logits, axis=1) == labels)
        return params, momentum, totals + jnp.stack([loss * len(labels), correct, len(labels)]).astype(jnp.float32)

    inputs, labels = synthetic_set()
    steps = max(1, EXAMPLES // global_batch)
    steps = min(steps, args.steps_per_epoch) if args.steps_per_epoch else steps
    gpu = jax.default_backend() == "gpu"
    say(event="start", initial_epoch=initial, resumed=initial > 0, epochs=args.epochs, data="synthetic",
        model="mlp", steps_per_epoch=steps, collective="nccl" if gpu else "gloo", replicas=len(devices),
        batch_size=local_batch, global_batch_size=global_batch)
    started = time.time()
    loss_sum = correct = seen = 0.0
    for epoch in range(initial, args.epochs):
        began = time.time()
        order = np.random.default_rng((DATA_SEED, epoch)).permutation(EXAMPLES)  # the same on every process
        # loss sum, correct, examples: summed on the devices, read once an epoch
        totals = jax.make_array_from_callback((3,), replicated, lambda index: np.zeros(3, np.float32))
        for step in range(steps):
            rows = step_rows(order, step, global_batch)
            params, momentum, totals = train_step(params, momentum, totals, sliced(inputs, rows), sliced(labels, rows))
        loss_sum, correct, seen = (float(value) for value in local(totals))  # waits for the epoch's last step
        seconds = time.time() - began
        save_state(snapshot, jax.tree.map(local, params), jax.tree.map(local, momentum), epoch + 1)
        say(event="epoch", epoch=epoch + 1, epochs=args.epochs, loss=loss_sum / seen, accuracy=correct / seen,
            examples_per_sec=local_batch * steps / seconds if seconds > 0 else None, seconds=seconds)
    if worker == 0:
        write_atomically(output / "model.npz", lambda handle: np.savez(handle, **jax.tree.map(local, params)))
    done_text = json.dumps({"epochs": args.epochs, "time": time.time()}).encode()
    write_atomically(output / "DONE", lambda handle: handle.write(done_text))
    say(event="end", epoch=args.epochs, epochs=args.epochs, initial_epoch=initial,
        loss=loss_sum / seen if seen else None, accuracy=correct / seen if seen else None,
        seconds=time.time() - started)
    if jax_cluster.in_run():
        jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Train a small MLP in JAX on scikit-learn's digits, fed by a torch DataLoader through dlinspect.

The data ships inside scikit-learn (1797 8x8 images of the digits 0-9, no
download). A torch Dataset and DataLoader batch them (in worker processes with
``--workers N``, whose batches arrive in shared memory), a plain loop converts each
batch with ``dlinspect.to_jax`` (zero-copy where the memory allows; with JAX's
asynchronous dispatch the next batch is converted while the step runs), and a jitted
JAX step trains the MLP with plain SGD. With ``--devices N``
the batch is split over N devices along its batch axis (data parallel; on a CPU
machine through ``XLA_FLAGS=--xla_force_host_platform_device_count=N``) and the
same jitted step runs SPMD, with the same result. With ``--processes N`` the script
starts N JAX processes on this machine (``jax.distributed`` on 127.0.0.1, CPU
collectives "gloo"): each loads its own part of every batch (a DistributedSampler)
and ``to_jax(..., sharding=...)`` assembles the global batch across the processes,
data parallel over all of their devices.

Run: python examples/train_digits.py [--epochs 15] [--workers 0] [--devices 1] [--processes 1]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

BATCH = 64
HIDDEN = 128
CLASSES = 10


class Digits(Dataset):
    """scikit-learn's digits as float32 (64,) images in [0, 1] and int32 labels, in memory
    torch allocates (64-byte aligned, which XLA:CPU views without a copy)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images = torch.tensor(images / 16.0, dtype=torch.float32)
        self.labels = torch.tensor(labels, dtype=torch.int32)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.labels[i]


def load_digits_split(seed: int = 0) -> tuple[Digits, Digits]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        data.data, data.target, test_size=0.2, random_state=seed, stratify=data.target)
    return Digits(x_train, y_train), Digits(x_test, y_test)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--devices", type=int, default=1,
                        help="data-parallel over this many devices (forced CPU devices here)")
    parser.add_argument("--processes", type=int, default=1,
                        help="JAX processes on this machine (jax.distributed on 127.0.0.1)")
    parser.add_argument("--lr", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--process-id", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", default=None, help=argparse.SUPPRESS)
    return parser.parse_args()


def launch(args: argparse.Namespace) -> None:
    """Start --processes copies of this script, one JAX process each; wait for all."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [a for a in sys.argv[1:]]
    procs = [subprocess.Popen([sys.executable, __file__, *argv, "--process-id", str(i),
                               "--coordinator", f"127.0.0.1:{port}"],
                              stdout=None if i == 0 else subprocess.DEVNULL)
             for i in range(args.processes)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a process failed: exit codes {codes}")


def main() -> None:
    args = parse_args()
    if BATCH % (args.devices * args.processes):
        raise SystemExit(f"--devices times --processes must divide the batch size {BATCH}")
    if args.processes > 1 and args.process_id is None:
        return launch(args)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.devices > 1:  # must be set before JAX starts its CPU backend
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_force_host_platform_device_count={args.devices}")
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import dlinspect

    if args.processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(args.coordinator, num_processes=args.processes,
                                   process_id=args.process_id)
    total = args.devices * args.processes
    if len(jax.devices()) < total:
        raise SystemExit(f"asked for {total} devices, JAX has {len(jax.devices())}")
    mesh = Mesh(np.array(jax.devices()[:total]), ("data",))
    batch_sharding = NamedSharding(mesh, PartitionSpec("data"))
    replicated = NamedSharding(mesh, PartitionSpec())

    train, test = load_digits_split(args.seed)
    torch.manual_seed(args.seed)
    # Workers are started with "spawn": JAX runs threads, and fork()ing a process with
    # threads may deadlock (JAX warns about it).
    workers = dict(num_workers=args.workers, persistent_workers=args.workers > 0,
                   multiprocessing_context="spawn" if args.workers else None)
    if args.processes > 1:   # each process loads its own rows of every global batch
        from torch.utils.data.distributed import DistributedSampler
        sampler = DistributedSampler(train, num_replicas=args.processes, rank=args.process_id,
                                     shuffle=True, seed=args.seed, drop_last=True)
        loader = DataLoader(train, batch_size=BATCH // args.processes, sampler=sampler,
                            drop_last=True, **workers)
    else:
        sampler = None
        loader = DataLoader(train, batch_size=BATCH, shuffle=True, drop_last=True, **workers)

    def init(key: jax.Array) -> dict[str, jax.Array]:
        k1, k2 = jax.random.split(key)
        return {"w1": jax.random.normal(k1, (64, HIDDEN)) * (2.0 / 64) ** 0.5,
                "b1": jnp.zeros(HIDDEN),
                "w2": jax.random.normal(k2, (HIDDEN, CLASSES)) * (1.0 / HIDDEN) ** 0.5,
                "b2": jnp.zeros(CLASSES)}

    def logits_of(params: dict[str, jax.Array], images: jax.Array) -> jax.Array:
        hidden = jax.nn.relu(images @ params["w1"] + params["b1"])
        return hidden @ params["w2"] + params["b2"]

    def loss_of(params: dict[str, jax.Array], images: jax.Array, labels: jax.Array) -> jax.Array:
        logp = jax.nn.log_softmax(logits_of(params, images))
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    @jax.jit
    def step(params: dict[str, jax.Array], images: jax.Array, labels: jax.Array):
        loss, grads = jax.value_and_grad(loss_of)(params, images, labels)
        params = jax.tree_util.tree_map(lambda p, g: p - args.lr * g, params, grads)
        return params, loss

    # Made replicated by a jitted init: jax.device_put to a sharding over several
    # processes' devices needs jax >= 0.4.31.
    params = jax.jit(init, out_shardings=replicated)(jax.random.PRNGKey(args.seed))
    first = next(iter(loader))
    print(f"devices: {total} ({args.processes} process(es)), DataLoader workers: "
          f"{args.workers}, {len(train)} train / {len(test)} test images")
    print("route of the first batch of images:")
    print("  " + dlinspect.explain(first[0], sharding=batch_sharding).replace("\n", "\n  "))

    # A plain to_jax loop: with JAX's asynchronous dispatch the next batch is loaded and
    # converted while the step runs, the fastest end to end on a CPU-only JAX (the loader
    # suite of BENCHMARKS.md); prefetch_to_jax(loader, sharding=...) converts on a thread.
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        if sampler is not None:
            sampler.set_epoch(epoch)
        losses = []
        for images, labels in loader:
            images, labels = dlinspect.to_jax((images, labels), sharding=batch_sharding)
            params, loss = step(params, images, labels)
            losses.append(loss)
        if epoch == 1 or epoch % 5 == 0 or epoch == args.epochs:
            print(f"epoch {epoch:3d}  mean loss {float(jnp.mean(jnp.stack(losses))):.4f}")
    train_s = time.perf_counter() - start

    if args.processes > 1:   # every process holds the whole test set: replicate it
        test_images = jax.make_array_from_process_local_data(
            replicated, dlinspect.to_jax(test.images), test.images.shape)
        test_labels = jax.make_array_from_process_local_data(
            replicated, dlinspect.to_jax(test.labels), test.labels.shape)
    else:
        test_images = dlinspect.to_jax(test.images, sharding=replicated)
        test_labels = dlinspect.to_jax(test.labels, sharding=replicated)
    predicted = jnp.argmax(logits_of(params, test_images), axis=1)
    accuracy = float(jnp.mean(predicted == test_labels))
    print(f"trained {args.epochs} epochs in {train_s:.1f} s")
    print(f"test accuracy: {accuracy:.4f} (chance: {1 / CLASSES:.2f})")


if __name__ == "__main__":
    main()

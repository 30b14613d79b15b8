"""Batches per second from a torch DataLoader into JAX: prefetch_to_jax against the usual loops.

The DataLoader serves (256, 3, 32, 32) float32 images and (256,) int64 labels
(a TensorDataset of 2048 random images, batch 256, no workers). Conversion
throughput is measured on batches the loader already produced (a list of 8),
so that the loader's own collate time (the same for every method) does not
hide the conversion; each method converts all 8 batches, waits for every
array (``block_until_ready``), and the median over ``--repeat`` runs gives
batches per second:

    prefetch_to_jax     for b in dlinspect.prefetch_to_jax(batches): ... (size=2, the default)
    ... size=8          the same, up to 8 batches ahead
    to_jax loop         dlinspect.to_jax(b) per batch, no thread
    from_dlpack loop    jax.dlpack.from_dlpack on each leaf
    asarray loop        jnp.asarray(leaf.numpy()) on each leaf (the common idiom)

With x64 off (JAX's default) the int64 labels become int32 on every method.
Then, end to end (the loader iterated inside the timing, one pass of 8
batches), the same methods, for reference. Last, in a subprocess with 4
forced CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=4``),
``prefetch_to_jax(..., sharding=NamedSharding(mesh, P("data")))`` against
from_dlpack followed by ``jax.device_put(leaf, sharding)``, and the bytes each
leaf's sharded route copies (``plan(leaf, sharding=...).copy_bytes``).

The consumer there does nothing but wait for each batch, so prefetch_to_jax's
rows include the cost of handing every batch from its worker thread to the
consumer under the GIL (on two cores, tens of µs per batch, and noisy); the
to_jax loop is the same conversion without a thread. Prefetching pays off
beside a training step that leaves the host free (an accelerator computing):
the second table measures, per batch, how long the loop waits for its next
batch (conversion included for the loops) when each step is a 1 ms
``time.sleep``.

Targets, from this run (conversion throughput, batches/s; the to_jax loop
judged on the first table, prefetch_to_jax and size=8 on the second):

    >= 2 x from_dlpack loop
    >= 3 x asarray loop
    sharded over 4 devices: the float32 image leaf copies 0 bytes
                            (the int64 labels are copied only to narrow them, x64 off)

This is a report: exit status 0 unless ``--check`` is given and a target fails.

Usage: python benchmarks/bench_loader.py [--json FILE] [--check] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.dlpack
import jax.numpy as jnp
import numpy

import dlinspect
from _bench import print_versions, versions

try:
    import torch
    from torch.utils.data import DataLoader, TensorDataset
except ImportError:
    torch = None

IMAGES = 8192
BATCH = 256
SHAPE = (3, 32, 32)
DEVICES = 4
STEP_S = 0.001  # the host-free training step beside which input waits are measured
TARGETS = [(measured, baseline, limit)
           for measured in ("to_jax loop", "prefetch_to_jax", "prefetch_to_jax size=8")
           for baseline, limit in (("from_dlpack loop", 2.0), ("asarray loop", 3.0))]


def make_loader() -> "DataLoader":
    gen = torch.Generator().manual_seed(0)
    images = torch.rand((IMAGES, *SHAPE), generator=gen)
    labels = torch.randint(0, 10, (IMAGES,), generator=gen)  # int64
    return DataLoader(TensorDataset(images, labels), batch_size=BATCH, drop_last=True)


def block(tree) -> None:
    jax.block_until_ready(tree)


def run_prefetch(batches, **options) -> None:
    for b in dlinspect.prefetch_to_jax(batches, **options):
        block(b)


def run_to_jax(batches) -> None:
    for b in batches:
        block(dlinspect.to_jax(b))


def run_from_dlpack(batches, sharding=None) -> None:
    for b in batches:
        out = [jax.dlpack.from_dlpack(leaf) for leaf in b]
        if sharding is not None:
            out = [jax.device_put(leaf, sharding) for leaf in out]
        block(out)


def run_asarray(batches) -> None:
    for b in batches:
        block([jnp.asarray(leaf.numpy()) for leaf in b])


METHODS = {
    "prefetch_to_jax": run_prefetch,
    "prefetch_to_jax size=8": lambda batches: run_prefetch(batches, size=8),
    "to_jax loop": run_to_jax,
    "from_dlpack loop": run_from_dlpack,
    "asarray loop": run_asarray,
}


def input_wait(method: str, batches, repeat: int) -> dict:
    """Per batch, the time a training loop waits for its next batch when its step
    leaves the host free for STEP_S (``time.sleep``: the host waiting on an
    accelerator); batches/s = 1 / that wait."""
    convert = {"from_dlpack loop": lambda b: [jax.dlpack.from_dlpack(leaf) for leaf in b],
               "asarray loop": lambda b: [jnp.asarray(leaf.numpy()) for leaf in b],
               "to_jax loop": dlinspect.to_jax}

    def iterate():
        if method.startswith("prefetch_to_jax"):
            return dlinspect.prefetch_to_jax(batches, size=8 if "size=8" in method else 2)
        return (convert[method](b) for b in batches)

    rates = []
    for run in range(repeat + 1):  # the first run warms up
        waited = 0.0
        it = iterate()
        while True:
            start = time.perf_counter()
            b = next(it, None)
            if b is None:
                break
            block(b)
            waited += time.perf_counter() - start
            time.sleep(STEP_S)
        if run:
            rates.append(len(batches) / waited)
    return {"median_batches_per_s": statistics.median(rates), "runs": rates}


def batches_per_second(fn, make_batches, repeat: int) -> dict:
    """Median batches/s of ``fn(batches)`` over ``repeat`` runs (one warm-up run first)."""
    fn(make_batches())
    rates = []
    for _ in range(repeat):
        batches = make_batches()
        start = time.perf_counter()
        fn(batches)
        rates.append(len(batches) / (time.perf_counter() - start) if batches else 0.0)
    return {"median_batches_per_s": statistics.median(rates), "runs": rates}


def print_table(title: str, rows: dict) -> None:
    print(f"\n{title}")
    width = max(len(name) for name in rows)
    print(f"{'method':<{width}}  {'batches/s':>10}  {'ms/batch':>9}")
    print(f"{'-' * width}  {'-' * 10}  {'-' * 9}")
    for name, row in rows.items():
        rate = row["median_batches_per_s"]
        print(f"{name:<{width}}  {rate:>10.1f}  {1000 / rate:>9.3f}")


def sharded_report(repeat: int) -> dict:
    """Runs in the subprocess with 4 forced CPU devices."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(numpy.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    loader = make_loader()
    batches = list(loader)
    images, labels = batches[0]
    copies = {}
    for name, leaf in (("images", images), ("labels", labels)):
        route = dlinspect.plan(leaf, sharding=sharding)
        copies[name] = {"kind": route.kind, "copy_bytes": route.copy_bytes,
                        "narrowing": route.warning is not None, "reason": route.reason}
    rows = {
        "prefetch_to_jax (sharded)": batches_per_second(
            lambda b: run_prefetch(b, sharding=sharding), lambda: batches, repeat),
        "from_dlpack + device_put": batches_per_second(
            lambda b: run_from_dlpack(b, sharding=sharding), lambda: batches, repeat),
    }
    return {"devices": len(jax.devices()), "copies": copies, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    parser.add_argument("--repeat", type=int, default=15, help="runs per method (default 15)")
    parser.add_argument("--sharded-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", dlinspect.DLInspectWarning)  # int64 labels narrowed, x64 off

    if torch is None:
        print("bench_loader needs torch (pip install torch==2.13.0)")
        return 1
    if args.sharded_child:
        json.dump(sharded_report(args.repeat), sys.stdout)
        return 0

    found = versions()
    print_versions(found)
    print(f"machine: {os.cpu_count()} CPUs, JAX platform {jax.default_backend()}, "
          f"batch {BATCH}x{'x'.join(map(str, SHAPE))} float32 + {BATCH} int64, "
          f"median of {args.repeat} runs")

    loader = make_loader()
    batches = list(loader)
    conversion = {name: batches_per_second(fn, lambda: batches, args.repeat)
                  for name, fn in METHODS.items()}
    print_table(f"conversion only ({len(batches)} batches already produced by the loader)",
                conversion)
    beside_step = {name: input_wait(name, batches, max(3, args.repeat // 3)) for name in METHODS}
    print_table(f"beside a {STEP_S * 1000:g} ms host-free step: input wait per batch "
                f"(batches/s = 1 / wait)", beside_step)
    end_to_end = {name: batches_per_second(fn, lambda: loader, max(3, args.repeat // 3))
                  for name, fn in METHODS.items()}
    print_table("end to end (the DataLoader iterated inside the timing)", end_to_end)

    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES}",
               JAX_PLATFORMS="cpu")
    child = subprocess.run([sys.executable, __file__, "--sharded-child", "--repeat",
                            str(args.repeat)], env=env, capture_output=True, text=True, check=True)
    sharded = json.loads(child.stdout)
    print_table(f"sharded over {sharded['devices']} forced CPU devices, conversion only",
                sharded["rows"])
    for name, c in sharded["copies"].items():
        print(f"  {name}: plan {c['kind']}, {c['copy_bytes']} B copied"
              + (" (x64 narrowing)" if c["narrowing"] else ""))

    print()
    targets = []
    for measured, baseline, limit in TARGETS:
        # Prefetching is judged where it is meant to work: beside a step.
        table, where = ((beside_step, "beside a step") if measured.startswith("prefetch")
                        else (conversion, "conversion only"))
        ratio = table[measured]["median_batches_per_s"] / table[baseline]["median_batches_per_s"]
        status = "PASS" if ratio >= limit else "FAIL"
        description = f"{measured} >= {limit:g}x {baseline} ({where}, batches/s)"
        print(f"{status}  {description}: {ratio:.2f}x")
        targets.append({"target": description, "ratio": ratio, "limit": limit, "status": status})
    image_bytes = sharded["copies"]["images"]["copy_bytes"]
    status = "PASS" if image_bytes == 0 else "FAIL"
    description = f"sharded over {sharded['devices']} devices: float32 images copy 0 bytes"
    print(f"{status}  {description}: {image_bytes} B")
    targets.append({"target": description, "value": image_bytes, "status": status})

    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"unit": "batches per second", "versions": found, "conversion": conversion,
                       "beside_step": beside_step, "end_to_end": end_to_end, "sharded": sharded, "targets": targets}, f,
                      indent=2)
        print(f"\nwrote {args.json}")
    return 1 if args.check and any(t["status"] == "FAIL" for t in targets) else 0


if __name__ == "__main__":
    sys.exit(main())

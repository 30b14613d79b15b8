"""Suite ``loader``: batches per second from a torch DataLoader into JAX.

The DataLoader serves (256, 3, 32, 32) float32 images and (256,) int64 labels
(a TensorDataset, batch 256, no workers). Methods:

    prefetch_to_jax         ``dlinspect.prefetch_to_jax(batches)`` (size=2, the default)
    prefetch_to_jax size=8  the same, up to 8 batches ahead
    to_jax loop             ``dlinspect.to_jax(b)`` per batch, no thread
    from_dlpack loop        ``jax.dlpack.from_dlpack`` on each leaf
    asarray loop            ``jnp.asarray(leaf.numpy())`` on each leaf (the common idiom)

Three measurements, each the median batches/s over several runs:

- conversion only: batches the loader already produced (32; 8 with ``quick``),
  the consumer only waits for each array; prefetch_to_jax here pays one thread
  hand-off per batch under the GIL;
- beside a 1 ms host-free step (``time.sleep``, the host waiting on an
  accelerator): per batch, how long the loop waits for its next batch;
- end to end: the DataLoader iterated inside the timing (its collate dominates).

Then, in a subprocess with 4 forced CPU devices, ``prefetch_to_jax`` with
``sharding=NamedSharding(mesh, P("data"))`` against from_dlpack then
``jax.device_put(leaf, sharding)``, and the bytes each leaf's sharded route copies.

Targets (with x64 off every method narrows the int64 labels to int32):
the to_jax loop (conversion only) and prefetch_to_jax (beside a step) each
>= 2x the from_dlpack loop and >= 3x the asarray loop; sharded over 4 devices,
the float32 image leaf copies 0 bytes.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.dlpack
import jax.numpy as jnp
import numpy

import dlinspect

from ._common import Tick, optional

BATCH = 256
SHAPE = (3, 32, 32)
DEVICES = 4
STEP_S = 0.001
TARGETS = [("to_jax loop", "conversion"), ("prefetch_to_jax", "beside_step")]


def make_loader(batches: int) -> Any:
    torch = optional("torch")
    from torch.utils.data import DataLoader, TensorDataset
    gen = torch.Generator().manual_seed(0)
    images = torch.rand((batches * BATCH, *SHAPE), generator=gen)
    labels = torch.randint(0, 10, (batches * BATCH,), generator=gen)  # int64
    return DataLoader(TensorDataset(images, labels), batch_size=BATCH, drop_last=True)


def _convert_functions() -> dict[str, Callable[[Any], Any]]:
    return {"to_jax loop": dlinspect.to_jax,
            "from_dlpack loop": lambda b: [jax.dlpack.from_dlpack(leaf) for leaf in b],
            "asarray loop": lambda b: [jnp.asarray(leaf.numpy()) for leaf in b]}


METHODS = ["prefetch_to_jax", "prefetch_to_jax size=8", "to_jax loop", "from_dlpack loop",
           "asarray loop"]


def _iterate(method: str, batches: Any, sharding: Any = None) -> Any:
    if method.startswith("prefetch_to_jax"):
        size = 8 if "size=8" in method else 2
        return iter(dlinspect.prefetch_to_jax(batches, size=size, sharding=sharding))
    convert = _convert_functions()[method]
    return (convert(b) for b in batches)


def _rate(method: str, make_batches: Callable[[], Any], repeat: int, step_s: float = 0.0,
          sharding: Any = None) -> dict[str, Any]:
    """Median batches/s: conversion only (step_s == 0: wall time of the whole pass), or,
    beside a step, 1 / the time per batch spent waiting for the next batch."""
    rates = []
    for run in range(repeat + 1):  # the first run warms up
        batches = make_batches()
        count, waited = 0, 0.0
        start = time.perf_counter()
        it = _iterate(method, batches, sharding)
        while True:
            t0 = time.perf_counter()
            b = next(it, None)
            if b is None:
                break
            if sharding is not None and not method.startswith("prefetch"):
                b = [jax.device_put(leaf, sharding) for leaf in b]
            jax.block_until_ready(b)
            waited += time.perf_counter() - t0
            count += 1
            if step_s:
                time.sleep(step_s)
        total = time.perf_counter() - start
        if run:
            rates.append(count / (waited if step_s else total))
    return {"median": statistics.median(rates), "runs": rates}


def _sharded_child(quick: bool, repeat: int) -> dict[str, Any]:
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    mesh = Mesh(numpy.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    batches = list(make_loader(8 if quick else 32))
    images, labels = batches[0]
    copies = {}
    for name, leaf in (("images", images), ("labels", labels)):
        route = dlinspect.plan(leaf, sharding=sharding)
        copies[name] = {"kind": route.kind, "copy_bytes": route.copy_bytes,
                        "narrowing": route.warning is not None}
    rows = {"prefetch_to_jax (sharded)": _rate("prefetch_to_jax", lambda: batches, repeat,
                                               sharding=sharding),
            "from_dlpack + device_put": _rate("from_dlpack loop", lambda: batches, repeat,
                                              sharding=sharding)}
    return {"devices": len(jax.devices()), "copies": copies, "rows": rows}


def run(quick: bool = False, repeat: int | None = None, tick: Tick | None = None) -> dict[str, Any]:
    repeat = repeat or (3 if quick else 15)
    if optional("torch") is None:
        return {"title": "loader", "unit": "batches/s", "rows": [], "targets": [],
                "notes": ["skipped: torch is not installed (pip install torch)"]}
    warnings.simplefilter("ignore", dlinspect.DLInspectWarning)  # int64 labels, x64 off
    loader = make_loader(8 if quick else 32)
    batches = list(loader)
    tables: dict[str, dict[str, dict[str, Any]]] = {"conversion": {}, "beside_step": {},
                                                     "end_to_end": {}}
    for method in METHODS:
        if tick:
            tick(f"loader: {method}")
        tables["conversion"][method] = _rate(method, lambda: batches, repeat)
        tables["beside_step"][method] = _rate(method, lambda: batches, max(3, repeat // 3), STEP_S)
        tables["end_to_end"][method] = _rate(method, lambda: loader, max(2, repeat // 5))
    if tick:
        tick("loader: sharded (subprocess, 4 devices)")
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES}",
               JAX_PLATFORMS="cpu")
    child = subprocess.run([sys.executable, "-m", "dlinspect.bench.loader", "--sharded-child",
                            str(int(quick)), str(repeat)], env=env, capture_output=True,
                           text=True, check=True)
    sharded = json.loads(child.stdout.strip().splitlines()[-1])

    rows = [{"name": f"{method} [{where}]", "median": row["median"], "runs": row["runs"]}
            for where, table in tables.items() for method, row in table.items()]
    rows += [{"name": f"{name} [sharded, conversion]", **row}
             for name, row in sharded["rows"].items()]
    targets = []
    for measured, where in TARGETS:
        for baseline, limit in (("from_dlpack loop", 2.0), ("asarray loop", 3.0)):
            ratio = tables[where][measured]["median"] / tables[where][baseline]["median"]
            targets.append({"target": f"{measured} >= {limit:g}x {baseline} ({where})",
                            "status": "PASS" if ratio >= limit else "FAIL", "value": ratio,
                            "limit": limit})
    image_bytes = sharded["copies"]["images"]["copy_bytes"]
    targets.append({"target": f"sharded over {sharded['devices']} devices: the float32 image "
                              f"leaf copies 0 bytes", "status": "PASS" if image_bytes == 0 else "FAIL",
                    "value": image_bytes, "limit": 0})
    notes = [f"sharded: {name} leaf planned {c['kind']}, {c['copy_bytes']} B copied"
             + (" (x64 narrowing)" if c["narrowing"] else "")
             for name, c in sharded["copies"].items()]
    return {"title": "loader", "unit": "batches/s", "rows": rows, "repeat": repeat,
            "tables": tables, "sharded": sharded, "targets": targets, "notes": notes,
            "batches": len(batches)}


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--sharded-child":
    warnings.simplefilter("ignore", dlinspect.DLInspectWarning)
    print(json.dumps(_sharded_child(bool(int(sys.argv[2])), int(sys.argv[3]))))

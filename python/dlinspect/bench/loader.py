"""Suite ``loader``: batches per second from a torch DataLoader into a jitted JAX step.

The DataLoader serves (256, 3, 32, 32) float32 images and (256,) int64 labels
(a TensorDataset, batch 256, no workers). Methods:

    to_jax loop               ``dlinspect.to_jax(b)`` per batch, on the consumer's thread
    prefetch_to_jax           ``dlinspect.prefetch_to_jax(batches)`` (the defaults: size=2,
                              thread=None, which decides from the first batches' timings)
    prefetch_to_jax thread    the same with ``thread=True`` (always a worker thread)
    from_dlpack loop          ``jax.dlpack.from_dlpack`` on each leaf
    asarray loop              ``jnp.asarray(leaf.numpy())`` on each leaf (the common idiom)

Measurements, each the median batches/s over several passes (the methods take turns
within each repetition):

- conversion only: batches the loader already produced (32; 8 with ``quick``),
  the consumer only waits for each array;
- end to end, async: the DataLoader iterated inside the timing, each batch fed to a
  jitted MLP training step (3072 -> 64 -> 10, SGD), results left to JAX's
  asynchronous dispatch, one wait at the end;
- end to end, synced: the same, reading the loss back every step (``float(loss)``,
  as a training loop that logs each step does);
- by source, conversion only, with ``dlinspect.to_jax``, ``jnp.asarray`` and
  ``jax.device_put`` per leaf (the NumPy view of each torch tensor): a source that makes a
  new batch each time (the loader's batches, cloned before the pass and handed over one by
  one, as torch's collate hands them over) and one that refills a single staging pair
  (``copy_``) and hands it over again; and, for each, whether batches kept across the pass
  still hold their own values (``jax.device_put`` views the staging memory on CPU: they
  do not; ``to_jax`` copies memory its source keeps, ``jnp.asarray`` copies always).

Then, in a subprocess with 4 forced CPU devices, ``prefetch_to_jax`` with
``sharding=NamedSharding(mesh, P("data"))`` against from_dlpack then
``jax.device_put(leaf, sharding)``, and the bytes each leaf's sharded route copies; and
``to_jax(b, sharding=...)`` against ``jax.device_put(b, sharding)`` of the same batches as
NumPy arrays (``{"image": float32, "label": int32}``: what ``jax.device_put`` takes); and
the share of a data-parallel step that converting its batch costs: the time per batch
of ``to_jax([images, labels], sharding=...)`` of the DataLoader's torch batches over the
time per batch of the jitted step over 4 devices (parameters replicated, the loss read
back every step), each the median of passes that take turns.

Targets (with x64 off every method narrows the int64 labels to int32): the to_jax
loop (conversion only) >= 2x the from_dlpack loop and >= 3x the asarray loop;
prefetch_to_jax (defaults) >= 0.95x the to_jax loop end to end (async and synced:
never meaningfully slower than the plain loop); sharded over 4 devices, the float32
image leaf copies 0 bytes, and ``to_jax(b, sharding=)`` >= 1.0x ``jax.device_put(b,
sharding)`` (batches/s); converting a batch costs at most 5% of the 4-device step.
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

from .._core import aligned_empty
from ._common import Tick, handed_over, optional

BATCH = 256
SHAPE = (3, 32, 32)
HIDDEN = 64
DEVICES = 4
METHODS = ["to_jax loop", "prefetch_to_jax", "prefetch_to_jax thread", "from_dlpack loop",
           "asarray loop"]


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


#: Methods over NumPy batches that place each batch themselves (sharded suite only).
PLACED = {"to_jax(b, sharding)": lambda b, s: dlinspect.to_jax(b, sharding=s),
          "jax.device_put(b, sharding)": lambda b, s: jax.device_put(b, s)}


def _iterate(method: str, batches: Any, sharding: Any = None) -> Any:
    if method in PLACED:
        return (PLACED[method](b, sharding) for b in batches)
    if method.startswith("prefetch_to_jax"):
        return iter(dlinspect.prefetch_to_jax(batches, sharding=sharding,
                                              thread=True if method.endswith("thread") else None))
    convert = _convert_functions()[method]
    return (convert(b) for b in batches)


#: The methods of the by-source table, each converting a (images, labels) batch.
SOURCE_METHODS: dict[str, Callable[[Any], Any]] = {
    "to_jax loop": dlinspect.to_jax,
    "jnp.asarray loop": lambda b: [jnp.asarray(leaf.numpy()) for leaf in b],
    "jax.device_put loop": lambda b: [jax.device_put(leaf.numpy()) for leaf in b]}


class _Staging:
    """A source that refills one staging pair of tensors for every batch and hands that
    same pair over again (a pinned staging buffer's way)."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches
        self.staging = tuple(leaf.clone() for leaf in batches[0])

    def __iter__(self) -> Any:
        for batch in self.batches:
            for dst, src in zip(self.staging, batch):
                dst.copy_(src)
            yield self.staging


def fresh(batches: list[Any]) -> Any:
    """``batches`` as a source of new memory hands them over: cloned now (before a pass is
    timed), then each taken out of the list as it is handed over."""
    return handed_over([tuple(leaf.clone() for leaf in b) for b in batches])


def _sources(batches: list[Any], repeat: int) -> dict[str, Any]:
    """Per source, batches/s of each method's conversion (taking turns round by round) and
    whether the batches it converted, kept over a pass, hold their own values."""
    makes = {"new memory per batch": lambda: fresh(batches),
             "one staging buffer, refilled": lambda: iter(_Staging(batches))}
    methods = list(SOURCE_METHODS)
    out: dict[str, Any] = {}
    for source, make in makes.items():
        runs: dict[str, list[float]] = {m: [] for m in methods}
        for rnd in range(repeat + 1):
            for method in methods[rnd % len(methods):] + methods[:rnd % len(methods)]:
                it, convert = make(), SOURCE_METHODS[method]
                start = time.perf_counter()
                for b in it:
                    jax.block_until_ready(convert(b))
                if rnd:
                    runs[method].append(len(batches) / (time.perf_counter() - start))
        out[source] = {m: {"median": statistics.median(runs[m]), "runs": runs[m],
                           "kept_right": _kept_right(make(), SOURCE_METHODS[m], batches)}
                       for m in methods}
    return out


def _kept_right(it: Any, convert: Callable[[Any], Any], batches: list[Any]) -> bool:
    """Whether every converted batch of ``it``, kept to the end, holds its own images."""
    kept = [convert(b)[0] for b in it]
    return all(numpy.array_equal(numpy.asarray(k), b[0].numpy()) for k, b in zip(kept, batches))


def make_step() -> tuple[Any, Any]:
    """A jitted SGD step of a small MLP (3072 -> HIDDEN -> 10) and its parameters."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = {"w1": jax.random.normal(k1, (3072, HIDDEN)) * 0.02,
              "w2": jax.random.normal(k2, (HIDDEN, 10)) * 0.1}

    def loss_of(p: Any, x: Any, y: Any) -> Any:
        hidden = jax.nn.relu(x.reshape(x.shape[0], -1) @ p["w1"])
        logp = jax.nn.log_softmax(hidden @ p["w2"])
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None].astype(jnp.int32), axis=1))

    @jax.jit
    def step(p: Any, x: Any, y: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_of)(p, x, y)
        return jax.tree_util.tree_map(lambda a, g: a - 0.01 * g, p, grads), loss

    return step, params


def _pass(method: str, batches: Any, step: Any = None, sync: bool = False,
          sharding: Any = None) -> float:
    """Batches/s of one whole pass: conversion only, or each batch through ``step``
    (reading the loss back every step when ``sync``)."""
    count = 0
    start = time.perf_counter()
    params = None if step is None else step[1]
    for b in _iterate(method, batches, sharding):
        if sharding is not None and method in _convert_functions():
            b = [jax.device_put(leaf, sharding) for leaf in b]
        if step is None:
            jax.block_until_ready(b)
        else:
            params, loss = step[0](params, b[0], b[1])
            if sync:
                float(loss)
        count += 1
    jax.block_until_ready(params)
    return count / (time.perf_counter() - start)


def _rates(methods: list[str], make_batches: Callable[[], Any], repeat: int, step: Any = None,
           sync: bool = False, sharding: Any = None) -> dict[str, dict[str, Any]]:
    """Median batches/s of each method over ``repeat`` passes after one warm-up pass.
    The methods take turns within each repetition, each repetition starting one method
    further on, so that the machine's drift over time and whatever a pass leaves behind
    for the next fall on all of them alike."""
    runs: dict[str, list[float]] = {method: [] for method in methods}
    for run in range(repeat + 1):
        for method in methods[run % len(methods):] + methods[:run % len(methods)]:
            rate = _pass(method, make_batches(), step, sync, sharding)
            if run:
                runs[method].append(rate)
    return {method: {"median": statistics.median(rates), "runs": rates}
            for method, rates in runs.items()}


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
    rates = _rates(["prefetch_to_jax", "from_dlpack loop"], lambda: fresh(batches), repeat,
                   sharding=sharding)

    def aligned(values: Any, dtype: Any) -> Any:   # (NumPy's own memory, 64-byte aligned)
        out = aligned_empty(values.shape, dtype, 64)
        out[...] = values
        return out

    def arrays() -> Any:   # (new for every pass)
        return handed_over([{"image": aligned(im.numpy(), numpy.float32),
                             "label": aligned(lb.numpy(), numpy.int32)} for im, lb in batches])
    placed = _rates(list(PLACED), arrays, repeat, sharding=sharding)
    rows = {"prefetch_to_jax (sharded)": rates["prefetch_to_jax"],
            "from_dlpack + device_put": rates["from_dlpack loop"], **placed,
            **_step_share(batches, sharding, mesh, repeat)}
    return {"devices": len(jax.devices()), "copies": copies, "rows": rows}


def _step_share(batches: list[Any], sharding: Any, mesh: Any, repeat: int) -> dict[str, Any]:
    """Batches/s of converting the DataLoader's batches over ``sharding`` and of the
    data-parallel step on batches converted before (the loss read back every step), in
    passes that take turns."""
    from jax.sharding import NamedSharding, PartitionSpec
    step, params = make_step()
    params = jax.device_put(params, NamedSharding(mesh, PartitionSpec()))
    ready = [jax.block_until_ready(dlinspect.to_jax([im, lb], sharding=sharding))
             for im, lb in batches]

    def convert(batches: Any) -> None:
        for im, lb in batches:
            jax.block_until_ready(dlinspect.to_jax([im, lb], sharding=sharding))

    def train(_: Any) -> None:
        p = params
        for x, y in ready:
            p, loss = step(p, x, y)
            float(loss)

    runs: dict[str, list[float]] = {"to_jax(b, sharding) [step share]": [],
                                    "data-parallel step [step share]": []}
    for run in range(repeat + 1):
        for name, work in zip(runs, (convert, train)):
            handed = fresh(batches)   # (made before the clock starts)
            start = time.perf_counter()
            work(handed)
            if run:
                runs[name].append(len(batches) / (time.perf_counter() - start))
    return {name: {"median": statistics.median(r), "runs": r} for name, r in runs.items()}


def run(quick: bool = False, repeat: int | None = None, tick: Tick | None = None) -> dict[str, Any]:
    repeat = repeat or (3 if quick else 15)
    if optional("torch") is None:
        return {"title": "loader", "unit": "batches/s", "rows": [], "targets": [],
                "notes": ["skipped: torch is not installed (pip install torch)"]}
    warnings.simplefilter("ignore", dlinspect.DLInspectWarning)  # int64 labels, x64 off
    loader = make_loader(8 if quick else 32)
    batches = list(loader)
    tables = _in_process(loader, batches, repeat, tick)
    if tick:
        tick("loader: by source")
    sources = _sources(batches, repeat)
    if tick:
        tick("loader: sharded (subprocess, 4 devices)")
    sharded = _sharded(quick, repeat)
    rows = [{"name": f"{method} [{where}]", "median": row["median"], "runs": row["runs"]}
            for where, table in tables.items() for method, row in table.items()]
    rows += [{"name": f"{method} [{source}]", "median": row["median"], "runs": row["runs"]}
             for source, table in sources.items() for method, row in table.items()]
    rows += [{"name": f"{name} [sharded, conversion]", **row}
             for name, row in sharded["rows"].items()]
    return {"title": "loader", "unit": "batches/s", "rows": rows, "repeat": repeat,
            "tables": tables, "sources": sources, "sharded": sharded,
            "targets": _targets(tables, sharded),
            "notes": _notes(tables, sharded), "batches": len(batches)}


def _in_process(loader: Any, batches: list[Any], repeat: int,
                tick: Tick | None) -> dict[str, dict[str, dict[str, Any]]]:
    """Batches per second of every method: conversion alone, and end to end beside a step."""
    step = make_step()
    e2e = max(3, repeat // 3)
    tables: dict[str, dict[str, dict[str, Any]]] = {}
    runs: list[tuple[str, Callable[[], Any], int, dict[str, Any]]] = [
        ("conversion", lambda: fresh(batches), repeat, {}),
        ("end_to_end", lambda: loader, e2e, {"step": step}),
        ("end_to_end_synced", lambda: loader, e2e, {"step": step, "sync": True})]
    for where, make_batches, times, kwargs in runs:
        if tick:
            tick(f"loader: {where}")
        tables[where] = _rates(METHODS, make_batches, times, **kwargs)
    return tables


def _sharded(quick: bool, repeat: int) -> dict[str, Any]:
    """The sharded measurements, in a child process with 4 forced CPU devices."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES}",
               JAX_PLATFORMS="cpu")
    child = subprocess.run([sys.executable, "-m", "dlinspect.bench.loader", "--sharded-child",
                            str(int(quick)), str(repeat)], env=env, capture_output=True,
                           text=True, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1])


def _target(target: str, value: float, limit: float, ok: bool, **names: str) -> dict[str, Any]:
    return {"target": target, "status": "PASS" if ok else "FAIL", "value": value,
            "limit": limit, **names}


def _targets(tables: dict[str, Any], sharded: dict[str, Any]) -> list[dict[str, Any]]:
    targets = []
    for where, measured, baseline, limit in (
            ("conversion", "to_jax loop", "from_dlpack loop", 2.0),
            ("conversion", "to_jax loop", "asarray loop", 3.0),
            ("end_to_end", "prefetch_to_jax", "to_jax loop", 0.95),
            ("end_to_end_synced", "prefetch_to_jax", "to_jax loop", 0.95)):
        ratio = tables[where][measured]["median"] / tables[where][baseline]["median"]
        targets.append(_target(f"{measured} >= {limit:g}x {baseline} ({where})", ratio, limit,
                               ratio >= limit, measured=f"{measured} [{where}]",
                               baseline=f"{baseline} [{where}]"))
    image_bytes = sharded["copies"]["images"]["copy_bytes"]
    targets.append(_target(f"sharded over {sharded['devices']} devices: the float32 image "
                           f"leaf copies 0 bytes", image_bytes, 0, image_bytes == 0))
    measured, baseline = (f"{name} [sharded, conversion]" for name in PLACED)
    rows = sharded["rows"]
    ratio = rows["to_jax(b, sharding)"]["median"] / rows["jax.device_put(b, sharding)"]["median"]
    targets.append(_target("to_jax(b, sharding) >= 1.0x jax.device_put(b, sharding) "
                           "(sharded, conversion)", ratio, 1.0, ratio >= 1.0,
                           measured=measured, baseline=baseline))
    conv, step_rate = (rows[f"{n} [step share]"]["median"]
                       for n in ("to_jax(b, sharding)", "data-parallel step"))
    targets.append(_target(f"converting a batch (to_jax(b, sharding)) <= 5% of a "
                           f"{sharded['devices']}-device step (time per batch)",
                           step_rate / conv, 0.05, step_rate / conv <= 0.05,
                           measured="to_jax(b, sharding) [step share] [sharded, conversion]",
                           baseline="data-parallel step [step share] [sharded, conversion]"))
    return targets


def _fastest(table: dict[str, dict[str, Any]]) -> str:
    """The method with the most batches per second, where its slowest run beats every
    other method's fastest; else that none is faster beyond the spread (a step that bounds
    them all, or a busy machine)."""
    best = max(table, key=lambda m: table[m]["median"])
    floor = min(table[best].get("runs") or [table[best]["median"]])
    if all(floor > max(row.get("runs") or [row["median"]])
           for m, row in table.items() if m != best):
        return best
    return "none beyond the spread of the runs"


def _notes(tables: dict[str, Any], sharded: dict[str, Any]) -> list[str]:
    notes = [f"fastest: {', '.join(f'{where}: {_fastest(t)}' for where, t in tables.items())}"]
    notes += [f"sharded: {name} leaf planned {c['kind']}, {c['copy_bytes']} B copied"
              + (" (x64 narrowing)" if c["narrowing"] else "")
              for name, c in sharded["copies"].items()]
    return notes


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--sharded-child":
    warnings.simplefilter("ignore", dlinspect.DLInspectWarning)
    print(json.dumps(_sharded_child(bool(int(sys.argv[2])), int(sys.argv[3]))))

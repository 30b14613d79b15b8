"""grain pipelines into a jitted JAX step: ``grain.experimental.device_put`` against
``dlinspect.grain.device_put``, and the plain loops.

What is measured: batches per second (batches/s, higher is better), end to end: the
grain pipeline iterated inside the timing, each batch fed to a jitted MLP training step
(3072 -> 64 -> 10, SGD; results left to JAX's asynchronous dispatch, one wait at the end),
as a training loop does. Every batch is 256 images (256, 3, 32, 32) float32 (3 MiB) and
256 int32 labels, made by grain's own batching (``np.stack``) from a source of single
examples. One figure is the rate of one epoch past its first ``--warmup`` batches
(buffers filling are not timed); each reported figure is the median over ``--repeat``
epochs, the methods taking turns within each repetition (as
``dlinspect.bench._common.time_cases`` does), so that the machine's drift falls on every
method alike.

Pipelines, the same for every method in a table:

    in-process   MapDataset.source(src).batch(256).to_iter_dataset()   (np.stack in
                 this process: malloc's memory, 16-byte aligned for sure)
    pre-batched  MapDataset.source(batches).to_iter_dataset(): each element one fresh
                 np.stack of 256 examples, no per-example work in grain (records stored
                 batched), so that the stage after it is most of what is measured
    workers      in-process's, .repeat().to_iter_dataset().mp_prefetch(
                 MultiprocessingOptions(num_workers=2)) (batches in grain's shared memory,
                 page-aligned), iterated once for the whole run: each epoch is the next
                 --batches batches of that one iterator (wrapped as an IterDataset), so
                 that the worker processes start once (seconds here), not per epoch
    DataLoader   grain.DataLoader(worker_count=2, operations=[Batch(256)]), an endless
                 sampler, iterated once for the whole run in the same way: not a dataset,
                 so no device_put stage; its loops only

Methods:

    grain device_put       grain.experimental.device_put(ds, device)  (defaults:
                           cpu_buffer_size=4, device_buffer_size=2)
    dlinspect device_put   dlinspect.grain.device_put(ds, device)     (the same defaults)
    to_jax loop            dlinspect.to_jax(batch) per batch, on the consumer's thread
    device_put loop        jax.device_put(batch, device) per batch, on the consumer's thread
    prefetch_to_jax        dlinspect.prefetch_to_jax(loader)          (DataLoader only)
    with --variants: dlinspect device_put (device_buffer_size=0): no second thread, the
                           conversion on the consumer's; and (no buffers): cpu_buffer_size=0
                           too (to_jax as a plain grain map, no thread at all)

Target: dlinspect device_put >= 1.0x grain device_put on each pipeline: the median over
the repetitions of the paired ratio (the two epochs of one repetition run back to back,
in an order rotated every repetition, so that the machine's drift cancels in the ratio);
its quartiles and the ratio of the two medians are printed beside it. ``--stage-only``
leaves the step out (each batch only waited for): the stage's own cost, which the step
hides end to end. Also printed: the process's CPU time per batch (all its threads; not the
workers'; XLA's thread pool spinning while it waits counts too).

Usage: python benchmarks/bench_grain.py [--repeat N] [--batches N] [--warmup N]
       [--pipelines in-process,pre-batched,workers,DataLoader] [--methods M,...]
       [--variants] [--stage-only] [--json FILE] [--quick]
(about 3.5 min with the defaults and --variants on a 2-core machine; --quick under a
minute, plus the worker processes' start-up)
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import itertools
import json
import os
import platform
import statistics
import sys
import threading
import time
from typing import Any

import numpy as np

BATCH = 256
SHAPE = (3, 32, 32)
POOL = 4096          # distinct examples in the source (50 MB); indices wrap around
WORKERS = 2


class Examples:
    """A grain data source of single examples: ``{"image": (3, 32, 32) float32,
    "label": int32}``. The data are made on first use in each process (workers
    included), so that pickling the source to a worker sends no data."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._data: tuple[np.ndarray, np.ndarray] | None = None
        self._making = threading.Lock()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        data = self._data
        if data is None:      # grain reads with several threads: made once, set at once
            with self._making:
                if self._data is None:
                    rng = np.random.default_rng(0)
                    self._data = (rng.random((POOL, *SHAPE), dtype=np.float32),
                                  rng.integers(0, 10, POOL, dtype=np.int32))
            data = self._data
        j = i % POOL
        return {"image": data[0][j], "label": data[1][j]}

    def __getstate__(self) -> dict[str, Any]:
        return {"n": self.n}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["n"])

    def __repr__(self) -> str:
        return f"Examples({self.n})"


class Batches(Examples):
    """A grain data source of whole batches (as records stored batched are read): each
    element a fresh ``np.stack``-made batch of BATCH examples (one 3 MiB copy, no
    per-example work), so that what differs between the methods, the stage after it,
    is most of the time measured."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        first = (i * BATCH) % (POOL - BATCH + 1)
        examples = [Examples.__getitem__(self, first + k) for k in range(BATCH)]
        return {"image": np.stack([e["image"] for e in examples]),
                "label": np.stack([e["label"] for e in examples])}

    def __repr__(self) -> str:
        return f"Batches({self.n})"


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("numpy", "jax", "jaxlib", "grain", "dlinspect"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15,
                        help="epochs per method (median; DataLoader: a third, at least 3)")
    parser.add_argument("--batches", type=int, default=24, help="batches per epoch")
    parser.add_argument("--warmup", type=int, default=6,
                        help="batches of each epoch not timed (start-up, buffers filling)")
    parser.add_argument("--pipelines", default="in-process,pre-batched,workers,DataLoader",
                        help="comma-separated: in-process, pre-batched, workers, DataLoader")
    parser.add_argument("--methods", default=None,
                        help="comma-separated subset of the methods (default: all but the "
                             "variants)")
    parser.add_argument("--variants", action="store_true",
                        help="also dlinspect device_put with device_buffer_size=0 (no second "
                             "thread: the conversion on the consumer's) and with no buffers "
                             "at all (cpu_buffer_size=0 too)")
    parser.add_argument("--stage-only", action="store_true",
                        help="no step: each batch is only waited for (jax.block_until_ready), "
                             "so that the stage's own cost is what is measured")
    parser.add_argument("--quick", action="store_true",
                        help="--repeat 3 --batches 12 --warmup 4 (noisy; a smoke run)")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.batches, args.warmup = 3, 12, 4
    if args.batches <= args.warmup:
        parser.error("--batches must exceed --warmup")

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import warnings

    import dlinspect
    import dlinspect.grain
    import grain
    import jax
    from absl import flags
    from dlinspect.bench.loader import make_step

    # grain 0.2.18 reads an absl flag in mp_prefetch's workers and raises
    # UnparsedFlagAccessError in a script that never parsed flags (google/grain#1355).
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    warnings.simplefilter("ignore", dlinspect.DLInspectWarning)

    device = jax.devices()[0]
    info = {"versions": versions(), "machine": f"{platform.machine()} {platform.system()}, "
            f"{os.cpu_count()} CPUs", "jax_devices": [str(d) for d in jax.devices()],
            "batch": [BATCH, *SHAPE], "batches_per_epoch": args.batches,
            "warmup": args.warmup, "repeat": args.repeat, "unit": "batches/s"}
    print("versions:", ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
    print(f"machine: {info['machine']}; jax devices: {info['jax_devices']}")
    print(f"{args.batches} batches of {BATCH}x{'x'.join(map(str, SHAPE))} float32 + {BATCH} "
          f"int32 per epoch, first {args.warmup} not timed, median of {args.repeat} epochs; "
          f"batches/s, higher is better")

    step, params0 = make_step()   # the MLP step of `dlinspect bench` (loader rows)

    source = Examples(args.batches * BATCH)

    class Take(grain.IterDataset):
        """``n`` elements per ``iter()`` from one long-lived iterator: a worker pipeline
        whose processes start once, not once per epoch (their start-up, seconds on this
        machine, is the same for every method and no part of what is compared)."""

        def __init__(self, live: Any, n: int) -> None:
            super().__init__()
            self.live, self.n = live, n

        def __iter__(self) -> Any:
            return TakeIterator(self.live, self.n)

    class TakeIterator(grain.DatasetIterator):
        def __init__(self, live: Any, n: int) -> None:
            super().__init__()
            self.live, self.left = live, n

        def __next__(self) -> Any:
            if self.left == 0:      # never touches `live` again: a prefetch thread still
                raise StopIteration  # running ends here, so epochs never share `live`
            self.left -= 1
            return next(self.live)

        def get_state(self) -> dict[str, Any]:
            return {"left": self.left}

        def set_state(self, state: dict[str, Any]) -> None:
            self.left = state["left"]

    def examples() -> Any:
        return grain.MapDataset.source(source).batch(BATCH, drop_remainder=True)

    live: dict[str, Any] = {}

    def dataset(pipeline: str, n: int | None = None) -> Any:
        if pipeline == "in-process":
            return examples().to_iter_dataset()
        if pipeline == "pre-batched":
            return grain.MapDataset.source(Batches(args.batches)).to_iter_dataset()
        if pipeline not in live:
            ds = examples().repeat().to_iter_dataset()
            live[pipeline] = iter(ds.mp_prefetch(
                grain.MultiprocessingOptions(num_workers=WORKERS)))
        return Take(live[pipeline], n or args.batches)

    def loader(n: int | None = None) -> Any:
        if "DataLoader" not in live:
            sampler = grain.samplers.IndexSampler(len(source), shuffle=False, num_epochs=None,
                                                  shard_options=grain.sharding.NoSharding())
            dl = grain.DataLoader(data_source=source, sampler=sampler, worker_count=WORKERS,
                                  operations=[grain.transforms.Batch(BATCH,
                                                                     drop_remainder=True)])
            live["DataLoader"] = iter(dl)
        return itertools.islice(live["DataLoader"], n or args.batches)

    def batches(pipeline: str, method: str) -> Any:
        """An iterator over one epoch of JAX batches."""
        if pipeline == "DataLoader":
            src = loader()
            if method == "prefetch_to_jax":
                return iter(dlinspect.prefetch_to_jax(src))
        else:
            src = dataset(pipeline)
            if method == "grain device_put":
                return iter(grain.experimental.device_put(src, device))
            if method == "dlinspect device_put":
                return iter(dlinspect.grain.device_put(src, device))
            if method == "dlinspect device_put (device_buffer_size=0)":
                return iter(dlinspect.grain.device_put(src, device, device_buffer_size=0))
            if method == "dlinspect device_put (no buffers)":
                return iter(dlinspect.grain.device_put(src, device, cpu_buffer_size=0,
                                                       device_buffer_size=0))
        if method == "to_jax loop":
            return (dlinspect.to_jax(b) for b in src)
        if method == "device_put loop":
            return (jax.device_put(b, device) for b in src)
        raise ValueError(method)

    def epoch(pipeline: str, method: str) -> tuple[float, float]:
        it = batches(pipeline, method)
        params = params0
        count = 0
        start = None
        for b in it:
            if args.stage_only:
                jax.block_until_ready(b)
            else:
                params, _ = step(params, b["image"], b["label"])
            count += 1
            if count == args.warmup:
                jax.block_until_ready(params)
                start, cpu_start = time.perf_counter(), time.process_time()
        jax.block_until_ready(params)
        end, cpu_end = time.perf_counter(), time.process_time()
        close = getattr(it, "close", None)
        if close is not None:
            close()
        del it
        if count != args.batches or start is None:
            raise RuntimeError(f"{pipeline}/{method}: {count} batches, expected {args.batches}")
        timed = count - args.warmup
        return timed / (end - start), (cpu_end - cpu_start) / timed * 1e3

    def census(pipeline: str) -> dict[str, Any]:
        """What the raw batches are, as the stage gets them (made on grain's host
        prefetch thread, as in device_put): per leaf, the batches' types, whether
        writable, their alignments (the largest power of two dividing the pointer, at
        most 4096) and what ``dlinspect.plan`` says (zero-copy or copy). One epoch; for
        the pipelines with worker processes, the first 4 epochs' worth of batches, which
        also warms them up (their first ~70 batches came several times slower here)."""
        n = args.batches if pipeline in ("in-process", "pre-batched") else 4 * args.batches
        if pipeline == "DataLoader":
            raw = loader(n)
        else:
            raw = iter(grain.experimental.ThreadPrefetchIterDataset(
                dataset(pipeline, n), prefetch_buffer_size=4))
        out: dict[str, Any] = {}
        for b in raw:
            routes = dlinspect.plan(b)
            for key in ("image", "label"):
                leaf = b[key]
                ptr = leaf.__array_interface__["data"][0]
                row = out.setdefault(key, {"batches": 0, "types": {}, "writeable": 0,
                                           "alignment": {}, "plan": {}})
                row["batches"] += 1
                row["writeable"] += bool(leaf.flags.writeable)
                for field, value in (("types", type(leaf).__name__),
                                     ("alignment", str(min(ptr & -ptr, 4096))),
                                     ("plan", routes[key].kind)):
                    row[field][value] = row[field].get(value, 0) + 1
        close = getattr(raw, "close", None)
        if close is not None:
            close()
        return out

    # One compile of the step, outside any timing.
    b0 = dlinspect.to_jax(next(iter(dataset("in-process"))))
    jax.block_until_ready(step(params0, b0["image"], b0["label"]))

    variants = ["dlinspect device_put (device_buffer_size=0)", "dlinspect device_put (no buffers)"]
    methods = {"in-process": ["grain device_put", "dlinspect device_put", "to_jax loop",
                              "device_put loop", *variants],
               "pre-batched": ["grain device_put", "dlinspect device_put", "to_jax loop",
                               "device_put loop", *variants],
               "workers": ["grain device_put", "dlinspect device_put", "to_jax loop",
                           "device_put loop", *variants],
               "DataLoader": ["prefetch_to_jax", "to_jax loop", "device_put loop"]}
    chosen = args.methods.split(",") if args.methods else None
    tables: dict[str, dict[str, Any]] = {}
    censuses: dict[str, dict[str, Any]] = {}
    targets = []
    for pipeline in args.pipelines.split(","):
        censuses[pipeline] = census(pipeline)
        names = [m for m in methods[pipeline]
                 if (m in chosen if chosen else m not in variants or args.variants)]
        runs: dict[str, list[float]] = {m: [] for m in names}
        cpu: dict[str, list[float]] = {m: [] for m in names}
        t0 = time.perf_counter()
        repeat = args.repeat if pipeline != "DataLoader" else max(3, args.repeat // 3)
        for r in range(repeat):
            for m in names[r % len(names):] + names[:r % len(names)]:   # order rotated
                rate, cpu_ms = epoch(pipeline, m)
                runs[m].append(rate)
                cpu[m].append(cpu_ms)
        table = {m: {"median": statistics.median(runs[m]), "runs": runs[m],
                     "cpu_ms_per_batch": statistics.median(cpu[m]), "cpu_runs": cpu[m]}
                 for m in names}
        tables[pipeline] = table
        print(f"\n== {pipeline} ({time.perf_counter() - t0:.0f} s)")
        for key, row in censuses[pipeline].items():
            align = ", ".join(f"{a}: {n}" for a, n in sorted(row["alignment"].items(),
                                                              key=lambda kv: int(kv[0])))
            print(f"{key} leaf of {row['batches']} batches: {row['types']}, writable "
                  f"{row['writeable']}; alignment (bytes: batches) {{{align}}}; "
                  f"plan {row['plan']}")
        width = max(len(m) for m in names)
        for m in names:
            row = table[m]
            print(f"{m:<{width}}  {row['median']:8.1f} batches/s  "
                  f"{row['cpu_ms_per_batch']:6.2f} CPU ms/batch   "
                  f"runs {' '.join(f'{r:.0f}' for r in row['runs'])}")
        if "grain device_put" in table and "dlinspect device_put" in table:
            ratio = table["dlinspect device_put"]["median"] / table["grain device_put"]["median"]
            # Paired: the two epochs of one repetition ran next to each other, so that
            # the machine's drift between repetitions cancels in their ratio.
            paired = sorted(a / b for a, b in zip(runs["dlinspect device_put"],
                                                  runs["grain device_put"]))
            q1, _, q3 = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
            status = "PASS" if statistics.median(paired) >= 1.0 else "FAIL"
            why = ""
            if status == "FAIL" and args.quick and q3 >= 1.0:
                # As `dlinspect bench --quick`: a quick run whose paired ratios straddle
                # the target says nothing about it.
                status, why = "NOISY", (" (the paired ratios' quartiles straddle 1.0 in this "
                                        "quick run: run without --quick to judge the target)")
            targets.append({"target": f"dlinspect device_put >= 1.0x grain device_put "
                                      f"({pipeline}; median of paired ratios)",
                            "value": statistics.median(paired), "ratio_of_medians": ratio,
                            "paired_quartiles": [q1, q3], "paired": paired,
                            "status": status})
            print(f"{status:<5} dlinspect device_put / grain device_put: "
                  f"{statistics.median(paired):.3f} (median of {len(paired)} paired ratios; "
                  f"quartiles {q1:.3f}-{q3:.3f}); ratio of the medians {ratio:.3f}{why}")
    for it in live.values():          # stops the worker processes, frees their shared memory
        close = getattr(it, "close", None) or getattr(getattr(it, "_iterator", None),
                                                      "close", None)   # a DataLoaderIterator
        if close is not None:
            close()
    live.clear()
    gc.collect()                      # batches still referenced free (unlink) their memory
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({**info, "tables": tables, "targets": targets, "batches": censuses,
                       "argv": sys.argv[1:] if argv is None else argv}, f, indent=1)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Real data pipelines into a jitted JAX step: dlinspect's way against each ecosystem's own
JAX path, in one run, paired.

Run it in .venv-interop (``bash scripts/interop.sh`` makes it)::

    python benchmarks/bench_loaders.py --json benchmarks/loaders.json [--quick]
        [--only grain torch hf ray tf sharded] [--repeat N] [--warmup N]

A pipeline whose library is missing is skipped, and the JSON says why. Everything is
built in memory; nothing is downloaded. Ray runs locally (2 CPUs, no dashboard,
127.0.0.1, usage stats off). With x64 off (JAX's default) every method narrows int64
to int32.

Workloads:

    images     256 examples per batch: "image" (3, 32, 32) float32 (3 MiB a batch) and
               "label" int32, from a source of single examples (``Examples``); 24
               batches per epoch; step: an SGD step of an MLP 3072 -> 64 -> 10
               (``dlinspect.bench.loader.make_step``)
    table      6144 rows: "x" float32 (784,), "label" int64; batches of 256 (24 per
               epoch); step: an SGD step of an MLP 784 -> 128 -> 10
    tokenized  2048 sentences of a 64-word vocabulary (a WordLevel tokenizer in
               PreTrainedTokenizerFast), padded to 32 tokens; batches of 64 (32 per
               epoch); step: embedding 64 x 32, masked mean, linear 32 -> 2

Pipelines and methods (the first method of each is the ecosystem's own JAX path, the
baseline of its ratios):

    grain, np.stack          MapDataset.source(Examples).batch(256).to_iter_dataset()
        grain.experimental.device_put(ds, device)     dlinspect.grain.device_put(ds, device)
    grain, dlinspect.stack   the same with .batch(256, batch_fn=dlinspect.stack); same methods
    grain, mp_prefetch       the np.stack pipeline, .repeat().to_iter_dataset().mp_prefetch(
                             2 workers), iterated once for the whole run (each epoch is its
                             next 24 batches) so that the workers start once; same methods
    torch DataLoader         DataLoader(Examples, 256, num_workers=2,
                             multiprocessing_context="spawn", persistent_workers=True)
        jax.dlpack.from_dlpack per leaf     jnp.asarray(t.numpy()) per leaf
        prefetch_to_jax(loader)
    torch DataLoader, dlinspect.stack       the same with collate_fn=dlinspect.stack (NumPy
                             batches made in the workers, pickled to this process)
        jax.dlpack.from_dlpack per leaf     jnp.asarray per leaf     prefetch_to_jax(loader)
    hf table                 datasets.Dataset of the table
        with_format("jax").iter(256)        with_format("numpy").iter(256) + jnp.asarray
        prefetch_to_jax(Batches(ds), readonly="share"): the recipe of
            docs/loaders/huggingface.md (Arrow batches: numeric columns viewed, or written
            once by dlinspect.stack where only their alignment stops XLA:CPU viewing them)
        prefetch_to_jax(NumpyBatches(ds)): the same epochs of with_format("numpy") batches
    hf tokenized             the tokenized sentences
        padded Dataset, with_format("jax").iter(64)
        the same padded Dataset, prefetch_to_jax(Batches(padded), readonly="share")
        DataLoader + DataCollatorWithPadding(return_tensors="np") + jnp.asarray
        the same collator + prefetch_to_jax(loader)
        DataCollatorWithPadding(return_tensors="pt") + prefetch_to_jax(loader)
    ray                      ray.data.from_arrow(the table).materialize()
        iter_jax_batches(256)               iter_batches(numpy) + jnp.asarray
        prefetch_to_jax(iter_batches(...))  prefetch_to_jax(iter_batches(...), readonly="share")
    tf.data                  Dataset.from_tensor_slices(the table).batch(256).prefetch(2)
        as_numpy_iterator() + jnp.asarray   prefetch_to_jax(as_numpy_iterator())
        prefetch_to_jax(as_numpy_iterator(), readonly="share")
        prefetch_to_jax(ds): the dataset's EagerTensors
    sharded (a subprocess with 4 CPU devices, XLA_FLAGS=--xla_force_host_platform_device_count=4;
             each batch split along its first axis by NamedSharding(mesh, P("data")), the
             step's parameters replicated)
        grain, dlinspect.stack: grain.experimental.device_put(ds, sharding)
                                dlinspect.grain.device_put(ds, sharding=sharding)
        torch DataLoader (2 workers): from_dlpack + jax.device_put(leaf, sharding) per leaf
                                      prefetch_to_jax(loader, sharding=sharding)

Measured, per pipeline and method:

- end to end, batches/s (higher is better): one epoch per pass, the pipeline iterated
  inside the timing and each batch fed to the jitted step, results left to JAX's
  asynchronous dispatch; the first ``--warmup`` batches of each epoch are not timed
  (threads starting, buffers filling), then one wait at the end. One warm-up round,
  then ``--repeat`` rounds; in each round every method runs one epoch, taking turns
  (the first method rotates every round). Median and quartiles over the rounds, and the
  process's CPU time per batch (all its threads, not worker processes').
- ratio: per round, a method's batches/s over the baseline's in the same round (the
  two epochs ran near each other, so the machine's drift cancels in it); the median of
  these paired ratios and their quartiles (>1: faster than the ecosystem's own path),
  beside the ratio of the two medians.
- conversion only, µs per batch (lower is better): the pipeline's own batches, collected
  anew before each pass (not timed) and handed over one by one, as a loader hands them
  (taken out of the list, so that dlinspect sees memory the batch owns), converted (and
  waited for) by the method's conversion; methods interleaved round by round, median;
  ``ratio`` against the baseline's conversion where it takes the same batches.
  A library's own path is timed as the call it makes on each batch: grain's
  ``device_put`` calls ``jax.device_put(batch, device)``; datasets' JAX formatter
  ``jnp.array`` per column (int to int32, float to float32 with x64 off); Ray's
  ``iter_jax_batches`` its ``ray.data.util.jax_util._convert_batch``.
- bytes per batch imported zero-copy and copied, by reason: for dlinspect's methods,
  from the loader's own ``report`` over the last epoch (``prefetch_to_jax(...).report``,
  ``dlinspect.grain.device_put(...).report``); for the others, measured on the
  conversion's output over the pipeline's collected batches, handed over one by one: a leaf's bytes (each
  shard's, when sharded) count as zero-copy where the output's buffer is at the batch's
  own address, else as copied, with the reasons dlinspect's report gives for that leaf
  of that batch, or "viewable" where dlinspect imports it without a copy. (The same
  measurement of dlinspect's own methods, ``bytes_measured``, agrees with their reports
  on the same batches; where batches are made by ``np.stack`` their alignment, and so
  their copies, differ from epoch to epoch.)
- plan(): per leaf of each pipeline's batches, the types, the read-only count, the
  alignments (largest power of two dividing the address, at most 4096) and how many
  batches ``plan()`` routes zero-copy or copy, by default and with readonly="share".

The JSON: ``command`` (the published run's), ``argv``, ``quick``, ``versions``,
``machine``, ``repeat``, ``warmup``, ``seconds``; ``skipped`` (pipeline: why: a library
not installed, or the exception it failed with); ``pipelines``, by name: ``what``,
``baseline`` (the own path's method), ``devices``, ``batches_per_epoch``, ``leaves``
(dtype and shape), ``seconds`` (per phase), ``plan`` (the census above, per set of
batches) and ``methods``, by name: ``end_to_end`` (batches/s: ``median``, ``q1``, ``q3``,
``runs``), ``cpu_ms_per_batch``, ``ratio`` (the paired ratios: ``median``, ``q1``, ``q3``,
``runs``, and ``of_medians``; None for the baseline), ``conversion`` (``us_per_batch``,
``runs``, ``ratio`` as ``ratio`` against ``against``, ``as``: the call timed where it
stands for a library's own), ``bytes`` and ``bytes_measured`` (``from``: "report" or
"measured", ``zero_copy``, ``copied`` by reason, and the same per leaf in ``leaves``; bytes
per batch, of the batch's tensors as the pipeline made them).

``--quick`` (3 rounds, short conversion loops) is a smoke run: its figures are noisy and
the JSON says ``"quick": true``. A full run took 9 minutes on a shared 2-CPU machine,
two thirds of it in the conversion-only loops (``--quick``: under 2). Every figure of
the Performance page's pipelines table is rendered from the JSON by
``python scripts/figures.py``.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import dlinspect  # noqa: E402
from dlinspect._core import route_reason  # noqa: E402
from dlinspect.bench._common import handed_over, machine, optional  # noqa: E402

BATCH, SHAPE, POOL, WORKERS, DEVICES = 256, (3, 32, 32), 4096, 2, 4
IMAGE_BATCHES = 24
ROWS, FEATURES, HIDDEN = 6144, 784, 128
SENTENCES, TOKENS, TEXT_BATCH, EMBED = 2048, 32, 64, 32
WORDS = [f"w{i}" for i in range(62)]
COMMAND = "python benchmarks/bench_loaders.py --json benchmarks/loaders.json"

DISTS = ("numpy", "jax", "jaxlib", "dlinspect", "grain", "torch", "datasets", "transformers",
         "tokenizers", "ray", "pyarrow", "tensorflow-cpu", "tensorflow")


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in DISTS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


# ---- the sources ----------------------------------------------------------------------

class Examples:
    """A source of single examples, ``{"image": (3, 32, 32) float32, "label": int32}``,
    for grain (a random-access data source) and torch (a map-style dataset). The data
    are made on first use in each process, workers included, so that pickling the
    source to a worker sends no data."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._data: tuple[np.ndarray, np.ndarray] | None = None
        self._making = threading.Lock()

    def __len__(self) -> int:
        return self.n

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        data = self._data
        if data is None:      # grain reads with several threads: made once, set at once
            with self._making:
                if self._data is None:
                    rng = np.random.default_rng(0)
                    self._data = (rng.random((POOL, *SHAPE), dtype=np.float32),
                                  rng.integers(0, 10, POOL, dtype=np.int32))
            data = self._data
        return data

    def __getitem__(self, i: int) -> dict[str, Any]:
        images, labels = self._arrays()
        j = i % POOL
        return {"image": images[j], "label": labels[j]}

    def __getstate__(self) -> dict[str, Any]:
        return {"n": self.n}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["n"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.n})"


class PreBatched(Examples):
    """A source of whole batches (records stored batched): each element one fresh
    ``np.stack`` of BATCH examples, no per-example work in the pipeline."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        images, labels = self._arrays()
        first = (i * BATCH) % (POOL - BATCH + 1)
        return {"image": np.stack([images[first + k] for k in range(BATCH)]),
                "label": np.stack([labels[first + k] for k in range(BATCH)])}


_grain_types: dict[str, Any] = {}


def take(live: Iterable[Any], n: int) -> Any:
    """A grain IterDataset giving the next ``n`` elements of the long-lived iterator
    ``live`` per ``iter()``: a worker pipeline whose processes start once, not once per
    epoch (their start-up is the same for every method and no part of what is compared)."""
    if not _grain_types:
        import grain

        class Take(grain.IterDataset):  # type: ignore[misc,name-defined]
            def __init__(self, live: Any, n: int) -> None:
                super().__init__()
                self.live, self.n = live, n

            def __iter__(self) -> Any:
                return TakeIterator(self.live, self.n)

        class TakeIterator(grain.DatasetIterator):  # type: ignore[misc,name-defined]
            def __init__(self, live: Any, n: int) -> None:
                super().__init__()
                self.live, self.left = live, n

            def __next__(self) -> Any:
                if self.left == 0:      # never touches `live` again: a prefetch thread
                    raise StopIteration  # still running ends here
                self.left -= 1
                return next(self.live)

            def get_state(self) -> dict[str, Any]:
                return {"left": self.left}

            def set_state(self, state: dict[str, Any]) -> None:
                self.left = state["left"]

        _grain_types["Take"] = Take
    return _grain_types["Take"](live, n)


def close(it: Any) -> None:
    """Close an iterator that can be closed (grain's, a generator; a DataLoaderIterator's
    inner one): stops threads and worker processes, frees shared memory."""
    closer = getattr(it, "close", None) or getattr(getattr(it, "_iterator", None), "close", None)
    if closer is not None:
        closer()


# ---- the steps --------------------------------------------------------------------------

def image_step() -> tuple[Callable[[Any, Any], Any], Any]:
    from dlinspect.bench.loader import make_step
    step, params = make_step()
    return (lambda p, b: step(p, b["image"], b["label"])[0]), params


def table_step() -> tuple[Callable[[Any, Any], Any], Any]:
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = {"w1": jax.random.normal(k1, (FEATURES, HIDDEN)) * 0.02,
              "w2": jax.random.normal(k2, (HIDDEN, 10)) * 0.1}

    def loss_of(p: Any, x: Any, y: Any) -> Any:
        logp = jax.nn.log_softmax(jax.nn.relu(x @ p["w1"]) @ p["w2"])
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None].astype(jnp.int32), axis=1))

    @jax.jit
    def step(p: Any, batch: Any) -> Any:
        grads = jax.grad(loss_of)(p, batch["x"], batch["label"])
        return jax.tree_util.tree_map(lambda a, g: a - 0.01 * g, p, grads)

    return (lambda p, b: step(p, dict(b))), params


def text_step() -> tuple[Callable[[Any, Any], Any], Any]:
    k1, k2 = jax.random.split(jax.random.PRNGKey(1))
    params = {"emb": jax.random.normal(k1, (len(WORDS) + 2, EMBED)) * 0.1,
              "out": jax.random.normal(k2, (EMBED, 2)) * 0.1}

    def loss_of(p: Any, ids: Any, mask: Any, y: Any) -> Any:
        mask = mask.astype(jnp.float32)[..., None]
        pooled = (p["emb"][ids] * mask).sum(1) / jnp.maximum(mask.sum(1), 1.0)
        logp = jax.nn.log_softmax(pooled @ p["out"])
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None].astype(jnp.int32), axis=1))

    @jax.jit
    def step(p: Any, batch: Any) -> Any:
        labels = batch["labels"] if "labels" in batch else batch["label"]
        grads = jax.grad(loss_of)(p, batch["input_ids"], batch["attention_mask"], labels)
        return jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p, grads)

    # A BatchEncoding (the collators' batches) is no JAX pytree: dict() first.
    return (lambda p, b: step(p, dict(b))), params


# ---- the rule: pipelines, methods, rounds -------------------------------------------------

@dataclass
class Method:
    """One way from a pipeline into JAX. ``epoch()`` returns what one epoch iterates
    (with a ``report`` attribute where it is dlinspect's loader); ``convert`` is what it
    does to each of the pipeline's batches in ``raw`` (for the conversion-only timing and
    the measured bytes), ``convert_as`` says so where it stands for a library's own code."""

    name: str
    epoch: Callable[[], Iterable[Any]]
    convert: Callable[[Any], Any] | None = None
    raw: str = "batches"
    convert_as: str | None = None
    options: dict[str, Any] = field(default_factory=dict)   # to_jax's, for the reasons


@dataclass
class Pipeline:
    name: str
    what: str
    step: tuple[Callable[[Any, Any], Any], Any]
    methods: list[Method]
    raw: dict[str, Callable[[], list[Any]]]
    batches: int
    devices: int = 1
    close: Callable[[], None] | None = None
    plan_options: dict[str, Any] = field(default_factory=dict)   # plan()'s, for the census


def quartiles(values: list[float]) -> tuple[float, float]:
    """The first and third quartiles of ``values`` (the spread the median hides)."""
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def spread(values: list[float]) -> dict[str, Any]:
    q1, q3 = quartiles(values)
    return {"median": statistics.median(values), "q1": q1, "q3": q3, "runs": values}


def one_epoch(pipeline: Pipeline, method: Method, warmup: int,
              stage_only: bool) -> tuple[float, float, Any]:
    """Batches/s of one epoch past its first ``warmup`` batches, the process's CPU ms per
    batch meanwhile, and the loader's report (or None)."""
    feed, params = pipeline.step
    source = method.epoch()
    report = getattr(source, "report", None)
    it = iter(source)
    count, start, cpu = 0, 0.0, 0.0
    try:
        for b in it:
            if stage_only:
                jax.block_until_ready(b)
            else:
                params = feed(params, b)
            del b
            count += 1
            if count == warmup:
                jax.block_until_ready(params)
                start, cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(params)
        end, cpu_end = time.perf_counter(), time.process_time()
    finally:
        close(it)
    if count != pipeline.batches:
        raise RuntimeError(f"{pipeline.name} / {method.name}: {count} batches in an epoch, "
                           f"expected {pipeline.batches}")
    timed = count - warmup
    return timed / (end - start), (cpu_end - cpu) / timed * 1e3, report


def leaves(batch: Any) -> dict[str, Any]:
    """The batch's leaves by key path (``jax.tree_util.keystr``); a Mapping that is not
    a pytree (transformers' BatchEncoding) walked as a dict."""
    if isinstance(batch, Mapping) and not isinstance(batch, dict):
        batch = dict(batch)
    flat, _ = jax.tree_util.tree_flatten_with_path(batch)
    return {jax.tree_util.keystr(path): leaf for path, leaf in flat}


def report_bytes(report: Any) -> dict[str, Any]:
    """Bytes per batch from a LoaderReport: zero-copy, copied by reason, and per leaf."""
    rows = {key: {"zero_copy": r["zero_copy_bytes"], "copied": r["copied_bytes"]}
            for key, r in report.as_dict().items()}
    return per_batch("report", rows, report.batches)


def per_batch(source: str, rows: dict[str, dict[str, Any]], batches: int) -> dict[str, Any]:
    """Per-leaf byte totals over ``batches`` batches (``{"zero_copy": n, "copied":
    {reason: n}}`` per key path) as bytes per batch: in all, by reason, and per leaf."""
    n = max(batches, 1)
    copied: Counter[str] = Counter()
    for row in rows.values():
        copied.update(row["copied"])
    return {"from": source, "zero_copy": sum(r["zero_copy"] for r in rows.values()) // n,
            "copied": {k: v // n for k, v in copied.items()},
            "leaves": {key: {"zero_copy": r["zero_copy"] // n,
                             "copied": {k: v // n for k, v in r["copied"].items()}}
                       for key, r in rows.items()}}


def by_name(options: dict[str, Any]) -> tuple[Any, Any, str]:
    """``options``' copy, sharding and readonly, to be passed by name: a call with
    ``**options`` holds the batch in a tuple dlinspect cannot tell from a source's, and
    copies what it could view."""
    return options.get("copy"), options.get("sharding"), options.get("readonly", "copy")


def to_jax_by_name(options: dict[str, Any]) -> Callable[[Any], Any]:
    """``to_jax(b, narrow="ok")`` with ``options`` passed by name (by_name)."""
    copy, sharding, readonly = by_name(options)
    return lambda b: dlinspect.to_jax(b, copy=copy, sharding=sharding, readonly=readonly,
                                      narrow="ok")


def measured_bytes(batches: list[Any], convert: Callable[[Any], Any],
                   options: dict[str, Any]) -> dict[str, Any]:
    """Bytes per batch the conversion imported zero-copy, seen on its output: each
    shard of an output leaf whose buffer is at the input leaf's own address (plus the
    shard's offset) counts as zero-copy, the rest of the leaf's bytes as copied, for
    the reasons dlinspect copies that leaf with ``options`` (the words of its
    LoaderReport, from ``plan``), or "viewable" where dlinspect imports it zero-copy.
    The batches are handed over one by one (the list is emptied), as a loader hands
    them: ``convert`` gets each batch as its only holder, this function keeping only
    the leaves' addresses."""
    per_leaf: dict[str, dict[str, Any]] = {}
    count = len(batches)
    copy, sharding, readonly = by_name(options)
    it = handed_over(batches)
    for _ in range(count):
        batch = next(it)
        routes = leaves(dlinspect.plan(batch, copy=copy, sharding=sharding, readonly=readonly,
                                       narrow="ok"))
        why = {key: route_reason(route, copy is True) for key, route in routes.items()
               if route.kind != "untouched"}
        where = {key: _address(dlinspect.peek(leaf)) for key, leaf in leaves(batch).items()
                 if key in why}
        box = [batch]
        del batch, routes
        out = leaves(convert(box.pop()))
        jax.block_until_ready([v for v in out.values() if hasattr(v, "addressable_shards")])
        for key, (base, strides, itemsize, nbytes) in where.items():
            result = out.get(key)
            if result is None or not hasattr(result, "addressable_shards"):
                continue
            zero = _viewed_bytes(result, base, strides, itemsize)
            row = per_leaf.setdefault(key, {"zero_copy": 0, "copied": Counter()})
            row["zero_copy"] += zero
            if nbytes > zero:
                row["copied"][why.get(key) or "viewable"] += nbytes - zero
    return per_batch("measured", per_leaf, count)


def _viewed_bytes(result: Any, base: int, strides: tuple[int, ...], itemsize: int) -> int:
    """The bytes of output leaf ``result`` whose shards' buffers lie where the input's
    (first byte ``base``, byte ``strides``) have those elements: the source's bytes."""
    zero = 0
    for shard in result.addressable_shards:
        offset = sum((s.start or 0) * stride for s, stride in zip(shard.index, strides))
        if shard.data.unsafe_buffer_pointer() == base + offset:
            zero += shard.data.size * itemsize
    return zero


def _address(info: Any) -> tuple[int, tuple[int, ...], int, int]:
    """A leaf's first byte, byte strides, item size and bytes, from its TensorInfo."""
    return info.data_ptr + info.byte_offset, info.byte_strides, info.itemsize, info.nbytes


def census(batches: list[Any], options: dict[str, Any]) -> dict[str, Any]:
    """Per leaf over the batches (handed over one by one: the list is emptied): types,
    read-only count, alignments and plan()'s routes with ``options`` (and
    readonly="share"), with the first copy's reason."""
    out: dict[str, Any] = {}
    copy, sharding, readonly = by_name(options)
    for batch in handed_over(batches):
        routes = leaves(dlinspect.plan(batch, copy=copy, sharding=sharding, readonly=readonly,
                                       narrow="ok"))
        shared = leaves(dlinspect.plan(batch, copy=copy, sharding=sharding, readonly="share",
                                       narrow="ok"))
        for key, leaf in leaves(batch).items():
            row = out.setdefault(key, {"batches": 0, "types": Counter(), "read_only": 0,
                                       "alignment": Counter(), "plan": Counter(),
                                       "plan_share": Counter(), "reason": None})
            row["batches"] += 1
            row["types"][type(leaf).__name__] += 1
            route = routes[key]
            row["plan"][route.kind] += 1
            row["plan_share"][shared[key].kind] += 1
            if route.kind == "copy" and row["reason"] is None:
                row["reason"] = route.reason
            if route.info is not None:
                info = route.info
                ptr = info.data_ptr + info.byte_offset
                row["read_only"] += bool(info.read_only)
                row["alignment"][str(min(ptr & -ptr, 4096) if ptr else 4096)] += 1
    for row in out.values():
        for k in ("types", "alignment", "plan", "plan_share"):
            row[k] = dict(row[k])
    return out


def run_pipeline(p: Pipeline, repeat: int, warmup: int, quick: bool,
                 stage_only: bool = False) -> dict[str, Any]:
    """Every method of ``p``: end to end over rounds (methods taking turns, ratios
    paired by round), conversion only, bytes per batch, and plan() of its batches."""
    progress(f"{p.name}: collecting its batches")
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def phase(name: str) -> None:   # the seconds since the last phase ended
        nonlocal clock
        now = time.perf_counter()
        seconds[name], clock = now - clock, now

    first = next(iter(p.raw.values()))()[0]
    phase("batches")
    runs, cpu, reports = _rounds(p, repeat, warmup, stage_only)
    phase("rounds")
    methods = {m.name: _method_row(p, m, runs, cpu, reports) for m in p.methods}
    phase("bytes")
    for name, make in p.raw.items():           # conversion only, per set of batches
        _conversion(p, name, make, methods, repeat)
    phase("conversion")
    return {"what": p.what, "baseline": p.methods[0].name, "devices": p.devices,
            "batches_per_epoch": p.batches, "warmup": warmup,
            "leaves": {k: f"{getattr(v, 'dtype', '?')} {tuple(getattr(v, 'shape', ()))}"
                       for k, v in leaves(first).items()},
            "methods": methods,
            "plan": {name: census(make(), p.plan_options) for name, make in p.raw.items()},
            "seconds": seconds}


def _rounds(p: Pipeline, repeat: int, warmup: int, stage_only: bool) -> tuple[Any, Any, Any]:
    """Epochs of every method, taking turns round by round (round 0 warms up): batches
    per second and CPU ms per batch per method, and each loader's report."""
    names = [m.name for m in p.methods]
    runs: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    reports: dict[str, Any] = {}
    for rnd in range(repeat + 1):
        progress(f"{p.name}: round {rnd}/{repeat}")
        order = p.methods[rnd % len(names):] + p.methods[:rnd % len(names)]
        for method in order:
            rate, cpu_ms, report = one_epoch(p, method, warmup, stage_only)
            if rnd:
                runs[method.name].append(rate)
                cpu[method.name].append(cpu_ms)
            if report is not None:
                reports[method.name] = report
    return runs, cpu, reports


def _method_row(p: Pipeline, m: Any, runs: dict[str, list[float]], cpu: dict[str, list[float]],
                reports: dict[str, Any]) -> dict[str, Any]:
    """One method's end-to-end figures, its ratio to the baseline (paired by round) and
    its bytes per batch (the loader's report where it has one, else measured)."""
    base = p.methods[0].name
    row: dict[str, Any] = {"end_to_end": spread(runs[m.name]),
                           "cpu_ms_per_batch": statistics.median(cpu[m.name]),
                           "ratio": None, "conversion": None, "bytes": None}
    if m.name != base:
        paired = [a / b for a, b in zip(runs[m.name], runs[base])]
        row["ratio"] = {**spread(paired), "of_medians": statistics.median(runs[m.name])
                        / statistics.median(runs[base])}
    if m.convert is not None:      # on the pipeline's own batches, for every method
        row["bytes_measured"] = measured_bytes(p.raw[m.raw](), m.convert, m.options)
    if m.name in reports:          # dlinspect's loaders count what they imported
        row["bytes"] = report_bytes(reports[m.name])
    elif m.convert is not None:
        row["bytes"] = row["bytes_measured"]
    if m.convert_as:
        row["bytes_as"] = m.convert_as
    return row


def _conversion(p: Pipeline, name: str, make: Callable[[], list[Any]],
                methods: dict[str, Any], repeat: int) -> None:
    """Conversion alone of one set of batches, by every method that converts it: µs per
    batch, paired by round against the baseline (or the first such method). Each pass
    converts batches made anew before it (not timed) and handed over one by one, as a
    loader hands them; the methods take turns, round by round."""
    chosen = [m for m in p.methods if m.convert is not None and m.raw == name]
    if not chosen:
        return
    us: dict[str, list[float]] = {m.name: [] for m in chosen}
    for rnd in range(repeat + 1):          # (round 0 warms up)
        progress(f"{p.name} conversion ({name}): round {rnd}/{repeat}")
        for m in chosen[rnd % len(chosen):] + chosen[:rnd % len(chosen)]:
            batches = make()
            count = len(batches)
            start = time.perf_counter()
            handing = handed_over(batches)
            for _ in range(count):   # (each batch held by the conversion alone)
                jax.block_until_ready(m.convert(next(handing)))
            if rnd:
                us[m.name].append((time.perf_counter() - start) / count * 1e6)
    base = p.methods[0].name
    ref = base if base in us else chosen[0].name
    for m in chosen:
        paired = [a / b for a, b in zip(us[m.name], us[ref])]
        methods[m.name]["conversion"] = {
            "us_per_batch": statistics.median(us[m.name]), "runs": us[m.name],
            "batches": name, "against": ref, "as": m.convert_as,
            "ratio": None if m.name == ref else spread(paired)}


# ---- the pipelines ---------------------------------------------------------------------

def _to_jax_epoch(source: Iterable[Any], **options: Any) -> Callable[[], Any]:
    return lambda: dlinspect.prefetch_to_jax(source, **options)


def grain_pipelines(which: list[str], sharding: Any = None) -> Iterable[Pipeline]:
    """grain in this process (np.stack or dlinspect.stack batches) and with mp_prefetch
    worker processes, into ``grain.experimental.device_put`` and
    ``dlinspect.grain.device_put`` (over ``sharding`` where given)."""
    import grain
    import dlinspect.grain
    from absl import flags

    # grain 0.2.18 reads an absl flag in mp_prefetch's workers and raises
    # UnparsedFlagAccessError in a program that never parsed flags (google/grain#1355).
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    n = IMAGE_BATCHES
    source = Examples(n * BATCH)
    device = jax.devices()[0]
    target = device if sharding is None else sharding
    step = image_step()
    if sharding is not None:
        step = (step[0], jax.device_put(step[1], replicated(sharding)))
    ours_kwargs: dict[str, Any] = ({"device": device} if sharding is None
                                   else {"sharding": sharding})
    options: dict[str, Any] = {} if sharding is None else {"sharding": sharding}

    def methods(make: Callable[[], Any], raw: str = "batches") -> list[Method]:
        return [Method("grain device_put", lambda: grain.experimental.device_put(make(), target),
                       convert=lambda b: jax.device_put(b, target), raw=raw,
                       convert_as=f"jax.device_put(batch, {'sharding' if sharding else 'device'}),"
                                  " as grain's device_put calls it", options=options),
                Method("dlinspect device_put",
                       lambda: dlinspect.grain.device_put(make(), **ours_kwargs),
                       convert=to_jax_by_name(options), raw=raw,
                       options=options)]

    for batching in ("np.stack", "dlinspect.stack"):
        name = f"grain, {batching}"
        if name not in which:
            continue
        fn = dlinspect.stack if batching == "dlinspect.stack" else None

        def make(fn: Any = fn) -> Any:
            ds = grain.MapDataset.source(source)
            ds = ds.batch(BATCH, drop_remainder=True, batch_fn=fn) if fn else \
                ds.batch(BATCH, drop_remainder=True)
            return ds.to_iter_dataset()

        yield Pipeline(name, f"MapDataset.source(Examples).batch(256"
                             f"{', batch_fn=dlinspect.stack' if fn else ''}) in this process",
                       step, methods(make), {"batches": lambda make=make: list(make())}, n,
                       devices=len(jax.devices()), plan_options=options)
    if "grain, mp_prefetch" in which:
        ds = grain.MapDataset.source(source).batch(BATCH, drop_remainder=True).repeat()
        live = iter(ds.to_iter_dataset().mp_prefetch(
            grain.MultiprocessingOptions(num_workers=WORKERS)))

        def warm_batches() -> list[Any]:
            # Its first batches came several times slower (the workers warming up):
            # two epochs' worth are drawn and dropped, the third kept.
            for _ in range(2 * n):
                next(live)
            return [next(live) for _ in range(n)]

        yield Pipeline("grain, mp_prefetch",
                       f"the np.stack pipeline with .mp_prefetch({WORKERS} worker processes)",
                       step, methods(lambda: take(live, n)), {"batches": warm_batches}, n,
                       devices=len(jax.devices()), close=lambda: close(live),
                       plan_options=options)


def replicated(sharding: Any) -> Any:
    from jax.sharding import NamedSharding, PartitionSpec
    return NamedSharding(sharding.mesh, PartitionSpec())


def torch_pipelines(which: list[str], sharding: Any = None) -> Iterable[Pipeline]:
    """A torch DataLoader with worker processes (spawn), default collate or
    ``collate_fn=dlinspect.stack``, into JAX."""
    import torch
    n = IMAGE_BATCHES
    step = image_step()
    if sharding is not None:
        step = (step[0], jax.device_put(step[1], replicated(sharding)))
    options: dict[str, Any] = {} if sharding is None else {"sharding": sharding}

    def place(x: Any) -> Any:
        return x if sharding is None else jax.device_put(x, sharding)

    for collate in ("default collate", "dlinspect.stack"):
        name = "torch DataLoader" + (", dlinspect.stack" if collate != "default collate" else "")
        if name not in which:
            continue
        loader = torch.utils.data.DataLoader(
            Examples(n * BATCH), batch_size=BATCH, num_workers=WORKERS, drop_last=True,
            multiprocessing_context="spawn", persistent_workers=True,
            collate_fn=dlinspect.stack if collate != "default collate" else None)

        def from_dlpack(b: Any) -> Any:
            return {k: place(jax.dlpack.from_dlpack(v)) for k, v in b.items()}

        def asarray(b: Any) -> Any:
            return {k: place(jnp.asarray(v.numpy() if isinstance(v, torch.Tensor) else v))
                    for k, v in b.items()}

        base = "from_dlpack per leaf" + (" + device_put(sharding)" if sharding else "")
        methods = [Method(base, lambda f=from_dlpack, dl=loader: (f(b) for b in dl),
                          convert=from_dlpack, options=options),
                   Method("prefetch_to_jax(loader)", _to_jax_epoch(loader, **options),
                          convert=to_jax_by_name(options), options=options)]
        if sharding is None:
            methods.insert(1, Method("jnp.asarray per leaf",
                                     lambda f=asarray, dl=loader: (f(b) for b in dl),
                                     convert=asarray))

        def batches(dl: Any = loader) -> list[Any]:
            # The workers start here (spawn: seconds), outside any timing.
            list(dl)
            return list(dl)

        collate_text = "" if collate == "default collate" else ", collate_fn=dlinspect.stack"
        yield Pipeline(name, f"DataLoader(Examples, 256, num_workers={WORKERS}, spawn, "
                             f"persistent workers){collate_text}",
                       step, methods, {"batches": batches}, n, devices=len(jax.devices()),
                       close=lambda dl=loader: shutdown_workers(dl), plan_options=options)


def shutdown_workers(loader: Any) -> None:
    """Stop a DataLoader's persistent worker processes now (not at garbage collection)."""
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    loader._iterator = None


def asarray_columns(batch: Any) -> dict[str, Any]:
    """The common idiom: ``jnp.asarray`` on every numeric column (other columns kept)."""
    return {k: jnp.asarray(v) if getattr(v, "dtype", np.dtype(object)).kind in "biuf" else v
            for k, v in batch.items()}


def datasets_columns(batch: Any) -> dict[str, Any]:
    """What datasets' JAX formatter does to each numeric column of a NumPy batch:
    ``jnp.array`` (a copy), int to int32 and float to float32 with x64 off."""
    out = {}
    for k, v in batch.items():
        kind = getattr(v, "dtype", np.dtype(object)).kind
        if kind in "iu":
            out[k] = jnp.array(v, dtype=jnp.int64 if jax.config.jax_enable_x64 else jnp.int32)
        elif kind == "f":
            out[k] = jnp.array(v, dtype=jnp.float32)
        else:
            out[k] = v
    return out


def table_data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.random((ROWS, FEATURES), dtype=np.float32),
            "label": rng.integers(0, 10, ROWS)}


def hf_recipe() -> tuple[type, type]:
    """The recipe of docs/loaders/huggingface.md: the page's own ``Batches`` (one epoch of
    a Dataset's Arrow batches per ``iter()``, each column viewed as NumPy where it can),
    run from the page; and ``NumpyBatches``, the same epochs as ``with_format("numpy")``
    batches (the page's earlier recipe)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from doctest_docs import recipe
    batches = recipe(ROOT / "docs" / "loaders" / "huggingface.md", "Batches")["Batches"]

    class NumpyBatches(batches):  # type: ignore[misc, valid-type]
        def __init__(self, ds: Any, batch_size: int) -> None:
            self.ds, self.batch_size = ds.with_format("numpy"), batch_size

        def __iter__(self) -> Any:
            return self.ds.iter(batch_size=self.batch_size, drop_last_batch=True)

    return batches, NumpyBatches


def hf_pipelines(which: list[str]) -> Iterable[Pipeline]:
    import datasets
    import tokenizers
    import torch
    import transformers
    datasets.disable_progress_bars()
    Batches, NumpyBatches = hf_recipe()
    ok = {"narrow": "ok"}
    share = {"narrow": "ok", "readonly": "share"}
    if "hf table" in which:
        ds = datasets.Dataset.from_dict(table_data())
        np_ds, jax_ds = ds.with_format("numpy"), ds.with_format("jax")
        recipe, numpy_recipe = Batches(ds, BATCH), NumpyBatches(ds, BATCH)
        yield Pipeline(
            "hf table", 'datasets.Dataset of the table (6144 rows), batches of 256',
            table_step(),
            [Method('with_format("jax").iter',
                    lambda: jax_ds.iter(batch_size=BATCH, drop_last_batch=True),
                    convert=datasets_columns, raw="numpy",
                    convert_as="jnp.array per column, as datasets' JAX formatter calls it"),
             Method("numpy iter + jnp.asarray",
                    lambda: (asarray_columns(b) for b in
                             np_ds.iter(batch_size=BATCH, drop_last_batch=True)),
                    convert=asarray_columns, raw="numpy"),
             Method('prefetch_to_jax(Batches(ds), readonly="share")',
                    _to_jax_epoch(recipe, **share), convert=to_jax_by_name(share),
                    raw="arrow", options={"readonly": "share"}),
             Method("prefetch_to_jax(NumpyBatches(ds))", _to_jax_epoch(numpy_recipe, **ok),
                    convert=to_jax_by_name(ok), raw="numpy")],
            {"numpy": lambda: list(numpy_recipe), "arrow": lambda: list(recipe)}, ROWS // BATCH)
    if "hf tokenized" not in which:
        return
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]",
                                                     unk_token="[UNK]")
    rng = np.random.default_rng(1)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(4, TOKENS))) for _ in range(SENTENCES)]
    raw = datasets.Dataset.from_dict({"text": texts, "label": rng.integers(0, 2, SENTENCES)})
    tokenized = raw.map(lambda b: tokenizer(b["text"], truncation=True, max_length=TOKENS),
                        batched=True, remove_columns=["text"])
    padded = raw.map(lambda b: tokenizer(b["text"], truncation=True, max_length=TOKENS,
                                         padding="max_length"),
                     batched=True, remove_columns=["text"])
    padded_jax, padded_recipe = padded.with_format("jax"), Batches(padded, TEXT_BATCH)
    padded_numpy = NumpyBatches(padded, TEXT_BATCH)

    def loader(tensors: str) -> Any:
        collator = transformers.DataCollatorWithPadding(tokenizer, padding="max_length",
                                                        max_length=TOKENS,
                                                        return_tensors=tensors)
        return torch.utils.data.DataLoader(tokenized, batch_size=TEXT_BATCH, collate_fn=collator,
                                           drop_last=True)

    np_loader, pt_loader = loader("np"), loader("pt")
    to_jax = to_jax_by_name(ok)
    yield Pipeline(
        "hf tokenized", "2048 tokenized sentences padded to 32 tokens, batches of 64",
        text_step(),
        [Method('padded with_format("jax").iter',
                lambda: padded_jax.iter(batch_size=TEXT_BATCH, drop_last_batch=True),
                convert=datasets_columns, raw="padded numpy",
                convert_as="jnp.array per column, as datasets' JAX formatter calls it"),
         Method('padded prefetch_to_jax(Batches(ds), readonly="share")',
                _to_jax_epoch(padded_recipe, **share),
                convert=to_jax_by_name(share), raw="padded",
                options={"readonly": "share"}),
         Method('collator("np") + jnp.asarray',
                lambda: ({k: jnp.asarray(v) for k, v in b.items()} for b in np_loader),
                convert=lambda b: {k: jnp.asarray(v) for k, v in b.items()}, raw="collator np"),
         Method('collator("np") + prefetch_to_jax', _to_jax_epoch(np_loader, **ok),
                convert=to_jax, raw="collator np"),
         Method('collator("pt") + prefetch_to_jax', _to_jax_epoch(pt_loader, **ok),
                convert=to_jax, raw="collator pt")],
        {"padded numpy": lambda: list(padded_numpy), "padded": lambda: list(padded_recipe),
         "collator np": lambda: list(np_loader), "collator pt": lambda: list(pt_loader)},
        SENTENCES // TEXT_BATCH)


def ray_pipelines(which: list[str]) -> Iterable[Pipeline]:
    import pyarrow as pa
    import ray
    import ray.data
    from ray.data.extensions import ArrowTensorArray
    progress("ray: starting a local instance")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    data = table_data()
    ds = ray.data.from_arrow(pa.table({"x": ArrowTensorArray.from_numpy(data["x"]),
                                       "label": data["label"]})).materialize()
    try:     # what iter_jax_batches calls on each NumPy batch (Ray's own code)
        from ray.data.util.jax_util import _convert_batch, _create_sharding_1d
        ray_sharding = _create_sharding_1d("batch")
        ray_convert: Callable[[Any], Any] | None = lambda b: _convert_batch(b, ray_sharding)  # noqa: E731
    except ImportError:
        ray_convert = None

    def numpy_batches() -> Any:
        return ds.iter_batches(batch_size=BATCH, batch_format="numpy", drop_last=True)

    ok = {"narrow": "ok"}
    share = {"narrow": "ok", "readonly": "share"}
    yield Pipeline(
        "ray", "ray.data.from_arrow(the table).materialize(), batches of 256", table_step(),
        [Method("iter_jax_batches", lambda: ds.iter_jax_batches(batch_size=BATCH, drop_last=True),
                convert=ray_convert,
                convert_as="ray.data.util.jax_util._convert_batch, as iter_jax_batches calls it"),
         Method("iter_batches + jnp.asarray",
                lambda: (asarray_columns(b) for b in numpy_batches()), convert=asarray_columns),
         Method("prefetch_to_jax(iter_batches)", _to_jax_epoch(numpy_batches(), **ok),
                convert=to_jax_by_name(ok)),
         Method('prefetch_to_jax(iter_batches, readonly="share")',
                _to_jax_epoch(numpy_batches(), **share),
                convert=to_jax_by_name(share), options={"readonly": "share"})],
        {"batches": lambda: list(numpy_batches())}, ROWS // BATCH, close=ray.shutdown)


def tf_pipelines(which: list[str]) -> Iterable[Pipeline]:
    import tensorflow as tf
    ds = tf.data.Dataset.from_tensor_slices(table_data()).batch(BATCH, drop_remainder=True)
    ds = ds.prefetch(2)
    ok = {"narrow": "ok"}
    share = {"narrow": "ok", "readonly": "share"}
    tree_asarray = lambda b: jax.tree_util.tree_map(jnp.asarray, b)  # noqa: E731
    yield Pipeline(
        "tf.data", "Dataset.from_tensor_slices(the table).batch(256).prefetch(2)", table_step(),
        [Method("as_numpy_iterator + jnp.asarray",
                lambda: (tree_asarray(b) for b in ds.as_numpy_iterator()),
                convert=tree_asarray, raw="as_numpy_iterator"),
         Method("prefetch_to_jax(as_numpy_iterator())",
                lambda: dlinspect.prefetch_to_jax(ds.as_numpy_iterator(), **ok),
                convert=to_jax_by_name(ok), raw="as_numpy_iterator"),
         Method('prefetch_to_jax(as_numpy_iterator(), readonly="share")',
                lambda: dlinspect.prefetch_to_jax(ds.as_numpy_iterator(), **share),
                convert=to_jax_by_name(share), raw="as_numpy_iterator",
                options={"readonly": "share"}),
         Method("prefetch_to_jax(ds) (EagerTensors)", _to_jax_epoch(ds, **ok),
                convert=to_jax_by_name(ok), raw="EagerTensor")],
        {"as_numpy_iterator": lambda: list(ds.as_numpy_iterator()),
         "EagerTensor": lambda: list(ds)}, ROWS // BATCH)


def sharded_pipelines(which: list[str]) -> Iterable[Pipeline]:
    """The 4-device data-parallel loops (run in the child with 4 CPU devices)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    for p in grain_pipelines(["grain, dlinspect.stack"], sharding):
        p.name = f"{p.name}, {len(jax.devices())} devices"
        yield p
    for p in torch_pipelines(["torch DataLoader"], sharding):
        p.name = f"{p.name}, {len(jax.devices())} devices"
        yield p


#: Groups of pipelines (``--only``), what each needs installed, and its builder.
GROUPS: dict[str, tuple[tuple[str, ...], list[str], Callable[[list[str]], Iterable[Pipeline]]]] = {
    "grain": (("grain",), ["grain, np.stack", "grain, dlinspect.stack", "grain, mp_prefetch"],
              grain_pipelines),
    "torch": (("torch",), ["torch DataLoader", "torch DataLoader, dlinspect.stack"],
              torch_pipelines),
    "hf": (("datasets", "transformers", "tokenizers", "torch"), ["hf table", "hf tokenized"],
           hf_pipelines),
    "ray": (("ray", "pyarrow"), ["ray"], ray_pipelines),
    "tf": (("tensorflow",), ["tf.data"], tf_pipelines),
    "sharded": (("grain", "torch"), ["grain, dlinspect.stack, 4 devices",
                                     "torch DataLoader, 4 devices"], sharded_pipelines),
}


def failure(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"failed: {type(exc).__name__}" + (f": {text[0][:200]}" if text else "")


def run_group(group: str, repeat: int, warmup: int,
              quick: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """The group's pipelines, built and run one at a time (each one's workers live only
    while it runs): the results by name, and why each one that failed did (its traceback
    on stderr); the others still run."""
    _, names, build = GROUPS[group]
    done: dict[str, Any] = {}
    failed: dict[str, str] = {}
    pipelines = iter(build(names))
    while True:
        try:
            p = next(pipelines)
        except StopIteration:
            break
        except Exception as exc:      # building failed: the group's remaining pipelines
            traceback.print_exc()
            failed.update({n: failure(exc) for n in names if n not in done and n not in failed})
            break
        try:
            done[p.name] = run_pipeline(p, repeat, warmup, quick)
            print(text_report(p.name, done[p.name]), flush=True)
        except Exception as exc:
            traceback.print_exc()
            failed[p.name] = failure(exc)
        finally:
            if p.close is not None:
                p.close()
            gc.collect()   # batches still referenced free (unlink) their shared memory
    return done, failed


def sharded(repeat: int, warmup: int, quick: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """The ``sharded`` group, run in a child process with DEVICES CPU devices."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES}",
               JAX_PLATFORMS="cpu")
    child = subprocess.run([sys.executable, __file__, "--sharded-child", str(repeat),
                            str(warmup), str(int(quick))], env=env, stdout=subprocess.PIPE,
                           text=True)
    lines = child.stdout.strip().splitlines()
    if child.returncode or not lines:
        return {}, {n: f"failed: the {DEVICES}-device child exited with {child.returncode}"
                    for n in GROUPS["sharded"][1]}
    found = json.loads(lines[-1])
    return found["pipelines"], found["failed"]


# ---- report ----------------------------------------------------------------------------

def size(nbytes: float) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def bytes_text(b: dict[str, Any] | None) -> str:
    if b is None:
        return "-"
    copied = "; ".join(f"{size(v)} copied ({k})" for k, v in b["copied"].items() if v)
    return f"{size(b['zero_copy'])} zero-copy" + (f"; {copied}" if copied else "") + \
        f" [{b['from']}]"


def text_report(name: str, result: dict[str, Any]) -> str:
    lines = [f"== {name}: {result['what']} ({result['devices']} device"
             f"{'s' if result['devices'] > 1 else ''})"]
    width = max(len(m) for m in result["methods"])
    for m, row in result["methods"].items():
        e2e, ratio, conv = row["end_to_end"], row["ratio"], row["conversion"]
        rtext = "baseline" if ratio is None else \
            f"x{ratio['median']:.2f} ({ratio['q1']:.2f}-{ratio['q3']:.2f})"
        ctext = ""
        if conv is not None:
            ctext = f"  conv {conv['us_per_batch']:.0f} us"
        if conv is not None and conv["ratio"] is not None:
            ctext += f" (x{conv['ratio']['median']:.2f})"
        lines.append(f"  {m:<{width}}  {e2e['median']:7.1f} batches/s ({e2e['q1']:.0f}-"
                     f"{e2e['q3']:.0f})  {rtext}{ctext}")
        lines.append(f"  {'':<{width}}  {bytes_text(row['bytes'])}")
    for raw, table in result["plan"].items():
        for key, c in table.items():
            align = ", ".join(f"{a}: {k}" for a, k in sorted(c["alignment"].items(),
                                                              key=lambda kv: int(kv[0])))
            lines.append(f"  plan ({raw}) {key}: {c['plan']}, readonly='share' "
                         f"{c['plan_share']}; {c['types']}, read-only {c['read_only']}/"
                         f"{c['batches']}; alignment {{{align}}}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    parser.add_argument("--repeat", type=int, default=None,
                        help="rounds per pipeline (default 15; 3 with --quick)")
    parser.add_argument("--warmup", type=int, default=4,
                        help="batches of each epoch not timed (default 4)")
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds, short conversion loops: a smoke run, noisy")
    parser.add_argument("--only", nargs="+", choices=list(GROUPS), default=list(GROUPS))
    args = parser.parse_args(argv)
    repeat = args.repeat or (3 if args.quick else 15)
    warnings.simplefilter("ignore", DeprecationWarning)
    warnings.simplefilter("ignore", FutureWarning)
    warnings.simplefilter("ignore", dlinspect.DLInspectWarning)   # x64 narrowing, advice
    vers = versions()
    print("versions: " + ", ".join(f"{k} {v}" for k, v in vers.items() if v))
    print(f"machine: {machine()}; JAX devices: {jax.devices()}; x64: "
          f"{jax.config.jax_enable_x64}; {repeat} rounds, {args.warmup} batches of each "
          f"epoch not timed")
    out: dict[str, Any] = {"command": COMMAND, "argv": sys.argv[1:] if argv is None else argv,
                           "quick": args.quick, "versions": vers, "machine": machine(),
                           "repeat": repeat, "warmup": args.warmup, "pipelines": {},
                           "skipped": {}}
    start = time.perf_counter()
    for group in args.only:
        needs, names, _ = GROUPS[group]
        missing = [m for m in needs if optional(m) is None]
        if missing:
            for name in names:
                out["skipped"][name] = f"not installed: {', '.join(missing)}"
            print(f"== {group}: skipped (not installed: {', '.join(missing)})")
            continue
        if group == "sharded":
            results, failed = sharded(repeat, args.warmup, args.quick)
            for name, result in results.items():
                print(text_report(name, result), flush=True)
        else:
            results, failed = run_group(group, repeat, args.warmup, args.quick)
        out["pipelines"].update(results)
        out["skipped"].update(failed)
    out["seconds"] = time.perf_counter() - start
    print(f"({out['seconds']:.0f} s)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1, default=str)
            f.write("\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--sharded-child":
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", dlinspect.DLInspectWarning)
        done, failed = run_group("sharded", int(sys.argv[2]), int(sys.argv[3]),
                                 bool(int(sys.argv[4])))
        print(json.dumps({"pipelines": done, "failed": failed}, default=str))
        sys.exit(0)
    sys.exit(main())

"""Data loaders into a jitted JAX step: dlinspect's recipes against each library's own way.

Standalone (run it in .venv-interop: ``python benchmarks/bench_loaders.py [--json FILE]``);
it needs datasets + transformers + tokenizers + torch, ray[data] and tensorflow-cpu, and
skips a loader whose library is missing. Everything is built in memory; nothing is
downloaded. Ray runs locally (2 CPUs, no dashboard, 127.0.0.1, usage stats off).

Workloads (x64 off, as JAX's default: every method narrows int64 to int32):

    table      6144 rows: "x" float32 (784,), "label" int64; batches of 256 (24 per epoch);
               step: a jitted SGD step of an MLP 784 -> 128 -> 10 (cross-entropy)
    tokenized  2048 sentences of a 64-word vocabulary, a WordLevel tokenizer built with the
               tokenizers library in PreTrainedTokenizerFast; padded to 32 tokens; batches
               of 64 (32 per epoch); step: embedding 64 x 32, masked mean, linear 32 -> 2

Methods (the first of each loader is the library's own way, the baseline):

    hf table      with_format("jax").iter(256)                    (datasets' own)
                  with_format("numpy").iter(256) + jnp.asarray per column
                  prefetch_to_jax(Batches(ds)): a re-iterable over with_format("numpy").iter
    hf tokenized  tokenized Dataset padded to 32, with_format("jax").iter(64)  (datasets' own)
                  the same padded Dataset, prefetch_to_jax(Batches(padded))
                  DataLoader + DataCollatorWithPadding(return_tensors="np") + jnp.asarray
                  the same collator + prefetch_to_jax(loader)
                  DataCollatorWithPadding(return_tensors="pt") + prefetch_to_jax(loader)
    ray           Dataset.iter_jax_batches(batch_size=256)         (Ray's own)
                  iter_batches(batch_format="numpy") + jnp.asarray per column
                  prefetch_to_jax(iter_batches(...))                (readonly="copy")
                  prefetch_to_jax(iter_batches(...), readonly="share")
    tf.data       as_numpy_iterator() + jnp.asarray per leaf      (the usual JAX idiom)
                  prefetch_to_jax(as_numpy_iterator())             (readonly="copy")
                  prefetch_to_jax(as_numpy_iterator(), readonly="share")
                  prefetch_to_jax(ds): the dataset's EagerTensors

Measured:

- end to end, in batches/s (higher is better): one whole epoch per pass, the loader
  iterated inside the timing, each batch fed to the jitted step, results left to JAX's
  asynchronous dispatch, one wait at the end. One warm-up round (compilation, caches),
  then ``--repeat`` rounds; in each round every method of a loader runs one pass, taking
  turns (the starting method rotates each round) so that the machine's drift falls on all
  methods alike, as dlinspect.bench._common.time_cases does. Median over rounds;
  ``ratio`` is a method's median over the baseline's (>1: faster than the library's own).
- conversion only, in µs per batch (lower is better): one epoch's batches collected
  first, then converted (and waited for) with ``dlinspect.bench._common.time_cases``
  (calibrated loops, cases interleaved, median); ``ratio`` against jnp.asarray.
- plan(): over one epoch, per column, how many batches ``plan()`` routes zero-copy / copy
  (default options and readonly="share"), with the read-only flag and 64-byte alignment
  counts of the batches' memory.

A full run took 4 minutes here (2 cores shared with other jobs, imports and Ray's start-up
included); ``--quick`` (2 rounds, short loops) 1.5 minutes, its figures noisy. On a busy
machine the end-to-end figures swing by 2x between rounds (the quartiles are printed
and kept in the JSON with every run); the conversion-only figures are the steadier ones.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import sys
import time
import warnings
from collections import Counter
from typing import Any, Callable

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
from dlinspect.bench._common import machine, optional, time_cases  # noqa: E402

ROWS, FEATURES, BATCH, HIDDEN = 6144, 784, 256, 128
SENTENCES, TOKENS, TEXT_BATCH, EMBED = 2048, 32, 64, 32
WORDS = [f"w{i}" for i in range(62)]

DISTS = ("numpy", "jax", "jaxlib", "dlinspect", "datasets", "transformers", "tokenizers",
         "torch", "ray", "pyarrow", "tensorflow-cpu", "tensorflow")


def versions() -> dict[str, str | None]:
    import platform
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in DISTS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


# ---- the steps --------------------------------------------------------------------------

def mlp_step() -> tuple[Callable[..., Any], Any]:
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = {"w1": jax.random.normal(k1, (FEATURES, HIDDEN)) * 0.02,
              "w2": jax.random.normal(k2, (HIDDEN, 10)) * 0.1}

    def loss_of(p: Any, x: Any, y: Any) -> Any:
        logp = jax.nn.log_softmax(jax.nn.relu(x @ p["w1"]) @ p["w2"])
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None].astype(jnp.int32), axis=1))

    @jax.jit
    def step(p: Any, batch: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_of)(p, batch["x"], batch["label"])
        return jax.tree_util.tree_map(lambda a, g: a - 0.01 * g, p, grads), loss

    return step, params


def text_step() -> tuple[Callable[..., Any], Any]:
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
        loss, grads = jax.value_and_grad(loss_of)(p, batch["input_ids"],
                                                  batch["attention_mask"], labels)
        return jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p, grads), loss

    return step, params


def asarray_columns(batch: Any) -> dict[str, Any]:
    """The common idiom: ``jnp.asarray`` on every numeric column (non-numeric ones left)."""
    return {k: jnp.asarray(v) if getattr(v, "dtype", np.dtype(object)).kind in "biuf" else v
            for k, v in batch.items()}


# ---- timing ----------------------------------------------------------------------------

def one_pass(make: Callable[[], Any], step: Callable[..., Any], params: Any) -> tuple[float, int]:
    count = 0
    start = time.perf_counter()
    for batch in make():
        params, _ = step(params, dict(batch))   # a BatchEncoding is no JAX pytree: dict()
        count += 1
    jax.block_until_ready(params)
    return count / (time.perf_counter() - start), count


def quartiles(runs: list[float]) -> tuple[float, float]:
    """The first and third quartiles of ``runs`` (the spread the median hides)."""
    if len(runs) < 2:
        return runs[0], runs[0]
    q = statistics.quantiles(runs, n=4)
    return q[0], q[2]


def end_to_end(name: str, methods: dict[str, Callable[[], Any]], step: Any, params: Any,
               repeat: int) -> dict[str, Any]:
    """Median batches/s per method, methods taking turns within each round."""
    names = list(methods)
    runs: dict[str, list[float]] = {m: [] for m in names}
    counts: dict[str, int] = {}
    for rnd in range(repeat + 1):                      # round 0: warm-up, not recorded
        progress(f"{name}: round {rnd}/{repeat}")
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for method in order:
            rate, counts[method] = one_pass(methods[method], step, params)
            if rnd:
                runs[method].append(rate)
    baseline = statistics.median(runs[names[0]])
    rows = [{"name": m, "median": statistics.median(runs[m]), "runs": runs[m],
             "quartiles": quartiles(runs[m]), "batches": counts[m],
             "ratio": statistics.median(runs[m]) / baseline}
            for m in names]
    return {"unit": "batches/s (end to end, higher is better)", "baseline": names[0],
            "rows": rows}


def conversion_only(name: str, batches: list[Any], converters: dict[str, Callable[[Any], Any]],
                    repeat: int, quick: bool) -> dict[str, Any]:
    """µs per batch to convert pre-collected batches (and wait for them)."""
    def convert_all(convert: Callable[[Any], Any]) -> None:
        for b in batches:
            jax.block_until_ready(convert(b))

    namespace = {"convert_all": convert_all, **{f"c{i}": c for i, c in enumerate(converters.values())}}
    cases = [(m, f"convert_all(c{i})", False) for i, m in enumerate(converters)]
    rows, _ = time_cases(f"{name} conversion", cases, namespace, repeat, quick, progress, [])
    per_batch = {r["name"]: r["median"] / len(batches) for r in rows}
    base = per_batch[next(iter(converters))]
    return {"unit": "µs per batch (conversion only, lower is better)",
            "baseline": next(iter(converters)),
            "rows": [{"name": m, "median": v, "ratio": v / base} for m, v in per_batch.items()]}


def plan_summary(batches: list[Any]) -> dict[str, Any]:
    """Per column over one epoch: route kinds (default, readonly="share"), read-only and
    64-byte-aligned counts, and the first copy's reason."""
    out: dict[str, Any] = {}
    for batch in batches:
        for key, leaf in batch.items():
            col = out.setdefault(key, {"default": Counter(), "share": Counter(),
                                       "read_only": 0, "aligned_64": 0, "batches": 0,
                                       "reason": None})
            col["batches"] += 1
            route = dlinspect.plan(leaf)
            col["default"][route.kind] += 1
            col["share"][dlinspect.plan(leaf, readonly="share").kind] += 1
            if route.kind == "copy" and col["reason"] is None:
                col["reason"] = route.reason
            if route.kind != "untouched":
                info = dlinspect.peek(leaf)
                col["read_only"] += bool(info.read_only)
                col["aligned_64"] += info.data_ptr % 64 == 0
    for col in out.values():
        col["default"], col["share"] = dict(col["default"]), dict(col["share"])
    return out


# ---- the loaders -----------------------------------------------------------------------

def table_data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.random((ROWS, FEATURES), dtype=np.float32),
            "label": rng.integers(0, 10, ROWS)}


class Batches:
    """``ds.iter(batch_size)`` once per ``iter()`` (Dataset.iter is a generator)."""

    def __init__(self, ds: Any, batch_size: int) -> None:
        self.ds, self.batch_size = ds.with_format("numpy"), batch_size

    def __iter__(self) -> Any:
        return self.ds.iter(batch_size=self.batch_size, drop_last_batch=True)

    def __len__(self) -> int:
        return len(self.ds) // self.batch_size


def bench_hf(repeat: int, quick: bool) -> dict[str, Any]:
    import datasets
    import torch
    import tokenizers
    import transformers
    datasets.disable_progress_bars()
    results: dict[str, Any] = {}

    ds = datasets.Dataset.from_dict(table_data())
    np_ds = ds.with_format("numpy")
    jax_ds = ds.with_format("jax")
    methods = {
        'with_format("jax").iter': lambda: jax_ds.iter(batch_size=BATCH, drop_last_batch=True),
        'numpy iter + jnp.asarray': lambda: (asarray_columns(b) for b in
                                             np_ds.iter(batch_size=BATCH, drop_last_batch=True)),
        'prefetch_to_jax(numpy iter)': lambda: dlinspect.prefetch_to_jax(Batches(ds, BATCH),
                                                                         narrow="ok"),
    }
    step, params = mlp_step()
    results["hf table"] = end_to_end("hf table", methods, step, params, repeat)
    batches = list(Batches(ds, BATCH))
    results["hf table"]["conversion"] = conversion_only(
        "hf table", batches, {"jnp.asarray": asarray_columns,
                              "to_jax": lambda b: dlinspect.to_jax(b, narrow="ok")},
        repeat, quick)
    results["hf table"]["plan"] = plan_summary(batches)

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
    padded_jax = padded.with_format("jax")

    def loader(tensors: str) -> Any:
        collator = transformers.DataCollatorWithPadding(tokenizer, padding="max_length",
                                                        max_length=TOKENS,
                                                        return_tensors=tensors)
        return torch.utils.data.DataLoader(tokenized, batch_size=TEXT_BATCH, collate_fn=collator,
                                           drop_last=True)

    np_loader, pt_loader = loader("np"), loader("pt")
    methods = {
        'padded with_format("jax").iter': lambda: padded_jax.iter(batch_size=TEXT_BATCH,
                                                                  drop_last_batch=True),
        'padded prefetch_to_jax(numpy iter)': lambda: dlinspect.prefetch_to_jax(
            Batches(padded, TEXT_BATCH), narrow="ok"),
        'collator("np") + jnp.asarray': lambda: ({k: jnp.asarray(v) for k, v in b.items()}
                                                 for b in np_loader),
        'collator("np") + prefetch_to_jax': lambda: dlinspect.prefetch_to_jax(np_loader,
                                                                              narrow="ok"),
        'collator("pt") + prefetch_to_jax': lambda: dlinspect.prefetch_to_jax(pt_loader,
                                                                              narrow="ok"),
    }
    step, params = text_step()
    results["hf tokenized"] = end_to_end("hf tokenized", methods, step, params, repeat)
    np_batches, pt_batches = list(np_loader), list(pt_loader)
    results["hf tokenized"]["conversion"] = conversion_only(
        "hf tokenized", np_batches,
        {"jnp.asarray": lambda b: {k: jnp.asarray(v) for k, v in b.items()},
         "to_jax": lambda b: dlinspect.to_jax(b, narrow="ok")}, repeat, quick)
    pt = conversion_only("hf tokenized pt", pt_batches,
                         {"jnp.asarray(t.numpy())": lambda b: {k: jnp.asarray(v.numpy())
                                                               for k, v in b.items()},
                          "to_jax": lambda b: dlinspect.to_jax(b, narrow="ok")}, repeat, quick)
    for row in pt["rows"]:
        results["hf tokenized"]["conversion"]["rows"].append({**row, "name": f"pt: {row['name']}"})
    results["hf tokenized"]["plan"] = {"np": plan_summary(np_batches),
                                       "pt": plan_summary(pt_batches)}
    return results


def bench_ray(repeat: int, quick: bool) -> dict[str, Any]:
    import pyarrow as pa
    import ray
    import ray.data
    from ray.data.extensions import ArrowTensorArray
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        progress("ray: starting a local instance")
        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=False, configure_logging=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        data = table_data()
        ds = ray.data.from_arrow(pa.table({"x": ArrowTensorArray.from_numpy(data["x"]),
                                           "label": data["label"]})).materialize()

        def numpy_batches() -> Any:
            return ds.iter_batches(batch_size=BATCH, batch_format="numpy", drop_last=True)

        methods = {
            "iter_jax_batches": lambda: ds.iter_jax_batches(batch_size=BATCH, drop_last=True),
            "iter_batches + jnp.asarray": lambda: (asarray_columns(b) for b in numpy_batches()),
            "prefetch_to_jax(iter_batches)": lambda: dlinspect.prefetch_to_jax(
                numpy_batches(), narrow="ok"),
            'prefetch_to_jax(iter_batches, readonly="share")': lambda: dlinspect.prefetch_to_jax(
                numpy_batches(), readonly="share", narrow="ok"),
        }
        step, params = mlp_step()
        try:
            result = end_to_end("ray", methods, step, params, repeat)
            batches = list(numpy_batches())
            result["conversion"] = conversion_only(
                "ray", batches, {"jnp.asarray": asarray_columns,
                                 "to_jax": lambda b: dlinspect.to_jax(b, narrow="ok"),
                                 'to_jax(readonly="share")': lambda b: dlinspect.to_jax(
                                     b, readonly="share", narrow="ok")}, repeat, quick)
            result["plan"] = plan_summary(batches)
        finally:
            ray.shutdown()
    return {"ray": result}


def bench_tf(repeat: int, quick: bool) -> dict[str, Any]:
    import tensorflow as tf
    ds = tf.data.Dataset.from_tensor_slices(table_data()).batch(BATCH, drop_remainder=True)
    ds = ds.prefetch(2)
    methods = {
        "as_numpy_iterator + jnp.asarray": lambda: (jax.tree_util.tree_map(jnp.asarray, b)
                                                    for b in ds.as_numpy_iterator()),
        "prefetch_to_jax(as_numpy_iterator())": lambda: dlinspect.prefetch_to_jax(
            ds.as_numpy_iterator(), narrow="ok"),
        'prefetch_to_jax(as_numpy_iterator(), readonly="share")': lambda: dlinspect.prefetch_to_jax(
            ds.as_numpy_iterator(), readonly="share", narrow="ok"),
        "prefetch_to_jax(ds) (EagerTensors)": lambda: dlinspect.prefetch_to_jax(ds, narrow="ok"),
    }
    step, params = mlp_step()
    result = end_to_end("tf.data", methods, step, params, repeat)
    numpy_batches, eager_batches = list(ds.as_numpy_iterator()), list(ds)
    result["conversion"] = conversion_only(
        "tf.data", numpy_batches,
        {"jnp.asarray": lambda b: jax.tree_util.tree_map(jnp.asarray, b),
         "to_jax": lambda b: dlinspect.to_jax(b, narrow="ok"),
         'to_jax(readonly="share")': lambda b: dlinspect.to_jax(b, readonly="share",
                                                                narrow="ok")},
        repeat, quick)
    eager = conversion_only("tf.data eager", eager_batches,
                            {"jnp.asarray(t.numpy())": lambda b: {k: jnp.asarray(v.numpy())
                                                                  for k, v in b.items()},
                             "to_jax": lambda b: dlinspect.to_jax(b, narrow="ok")},
                            repeat, quick)
    for row in eager["rows"]:
        result["conversion"]["rows"].append({**row, "name": f"EagerTensor: {row['name']}"})
    result["plan"] = {"as_numpy_iterator": plan_summary(numpy_batches),
                      "EagerTensor": plan_summary(eager_batches)}
    return {"tf.data": result}


LOADERS = {"hf": (("datasets", "transformers", "tokenizers", "torch"), bench_hf),
           "ray": (("ray", "pyarrow"), bench_ray),
           "tf": (("tensorflow",), bench_tf)}


# ---- report ----------------------------------------------------------------------------

def fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"


def report(name: str, result: dict[str, Any]) -> str:
    lines = [f"== {name}"]
    for part in (result, result.get("conversion")):
        if not part:
            continue
        width = max(len(r["name"]) for r in part["rows"])
        lines.append(f"  {part['unit']}; ratio against {part['baseline']}")
        for r in part["rows"]:
            spread = (f"  (quartiles {fmt(r['quartiles'][0])}-{fmt(r['quartiles'][1])})"
                      if "quartiles" in r else "")
            lines.append(f"    {r['name']:<{width}}  {fmt(r['median']):>9}  ratio "
                         f"{r['ratio']:.2f}{spread}")
    plans = result.get("plan", {})
    nested = plans and all(isinstance(v, dict) and "batches" not in v and
                           all(isinstance(c, dict) and "batches" in c for c in v.values())
                           for v in plans.values())
    for label, table in (plans.items() if nested else [("", plans)]):
        lines.append(f"  plan() over one epoch{f' ({label})' if label else ''}:")
        for col, c in table.items():
            if c["default"].keys() == {"untouched"}:
                lines.append(f"    {col}: untouched (not numeric)")
                continue
            lines.append(f"    {col}: default {c['default']}, readonly='share' {c['share']}; "
                         f"read-only {c['read_only']}/{c['batches']}, 64-byte aligned "
                         f"{c['aligned_64']}/{c['batches']}")
            if c["reason"]:
                lines.append(f"      first copy: {c['reason']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    parser.add_argument("--repeat", type=int, default=None,
                        help="rounds per loader (default 9; 2 with --quick)")
    parser.add_argument("--quick", action="store_true", help="2 rounds, short loops: noisy")
    parser.add_argument("--only", nargs="+", choices=sorted(LOADERS), default=sorted(LOADERS))
    args = parser.parse_args(argv)
    repeat = args.repeat or (2 if args.quick else 9)
    warnings.simplefilter("ignore", DeprecationWarning)
    warnings.simplefilter("ignore", FutureWarning)
    vers = versions()
    print("versions: " + ", ".join(f"{k} {v}" for k, v in vers.items() if v))
    print(f"machine: {machine()}; JAX devices: {jax.devices()}; x64: "
          f"{jax.config.jax_enable_x64}; repeat {repeat}")
    out: dict[str, Any] = {"versions": vers, "machine": machine(), "repeat": repeat,
                           "quick": args.quick, "argv": sys.argv[1:], "loaders": {},
                           "skipped": {}}
    start = time.perf_counter()
    for key in args.only:
        needs, bench = LOADERS[key]
        missing = [m for m in needs if optional(m) is None]
        if missing:
            out["skipped"][key] = f"not installed: {', '.join(missing)}"
            print(f"== {key}: skipped ({out['skipped'][key]})")
            continue
        for name, result in bench(repeat, args.quick).items():
            out["loaders"][name] = result
            print(report(name, result), flush=True)
    out["seconds"] = time.perf_counter() - start
    print(f"({out['seconds']:.0f} s)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

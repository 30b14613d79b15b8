"""grain pipelines into a jitted JAX step, every way in: ``grain.experimental.device_put``
against ``dlinspect.grain.device_put``, its variants, and the plain loops.

The grain pipelines of ``benchmarks/bench_loaders.py`` (the one published run of the
real pipelines) are two methods each; this script times every way into JAX on more
grain pipelines, by the same rule (``bench_loaders.run_pipeline``: epochs past their
first ``--warmup`` batches, methods taking turns within each round, ratios paired by
round, conversion only, bytes per batch from the stage's report or measured on the
output, plan() of the batches), with options to take the step out. Run it in
.venv-interop.

Every batch is 256 images (256, 3, 32, 32) float32 (3 MiB) and 256 int32 labels
(``bench_loaders.Examples``), into the MLP step of ``dlinspect bench`` (3072 -> 64 -> 10).

Pipelines:

    in-process   MapDataset.source(src).batch(256).to_iter_dataset()   (np.stack in
                 this process: malloc's memory, 16-byte aligned for sure)
    stacked      the same with .batch(256, batch_fn=dlinspect.stack)
    pre-batched  MapDataset.source(batches).to_iter_dataset(): each element one fresh
                 np.stack of 256 examples, no per-example work in grain, so that the
                 stage after it is most of what is measured
    workers      in-process's, .repeat().to_iter_dataset().mp_prefetch(
                 MultiprocessingOptions(num_workers=2)), iterated once for the whole run:
                 each epoch is its next --batches batches, so that the worker processes
                 start once
    DataLoader   grain.DataLoader(worker_count=2, operations=[Batch(256)]), an endless
                 sampler, iterated once in the same way: not a dataset, so no device_put
                 stage; its loops only

Methods (the first of each pipeline is the baseline of its ratios):

    grain device_put       grain.experimental.device_put(ds, device)  (defaults:
                           cpu_buffer_size=4, device_buffer_size=2)
    dlinspect device_put   dlinspect.grain.device_put(ds, device)     (the same defaults)
    to_jax loop            dlinspect.to_jax(batch) per batch, on the consumer's thread
    device_put loop        jax.device_put(batch, device) per batch, on the consumer's
                           thread (the DataLoader's baseline)
    prefetch_to_jax        dlinspect.prefetch_to_jax(loader)          (DataLoader only)
    with --variants: dlinspect device_put (device_buffer_size=0): no second thread, the
                           conversion on the consumer's; and (no buffers): cpu_buffer_size=0
                           too (to_jax as a plain grain map, no thread at all)

Target: dlinspect device_put >= 1.0x grain device_put on each pipeline: the median of
the paired ratios (NOISY in a --quick run whose ratios' quartiles straddle 1.0).
``--stage-only`` leaves the step out (each batch only waited for): the stage's own cost,
which the step hides end to end.

Usage: python benchmarks/bench_grain.py [--repeat N] [--batches N] [--warmup N]
       [--pipelines in-process,stacked,pre-batched,workers,DataLoader] [--methods M,...]
       [--variants] [--stage-only] [--json FILE] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import sys
import warnings
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_loaders as bl  # noqa: E402

PIPELINES = ["in-process", "stacked", "pre-batched", "workers", "DataLoader"]
VARIANTS = ["dlinspect device_put (device_buffer_size=0)", "dlinspect device_put (no buffers)"]


def pipelines(names: list[str], chosen: list[str] | None, variants: bool, n: int) -> Any:
    import grain
    import jax
    from absl import flags

    import dlinspect
    import dlinspect.grain

    # grain 0.2.18 reads an absl flag in mp_prefetch's workers (google/grain#1355).
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    device = jax.devices()[0]
    source = bl.Examples(n * bl.BATCH)
    step = bl.image_step()

    def keep(method: str) -> bool:
        return method in chosen if chosen else (method not in VARIANTS or variants)

    def stage_methods(make: Any) -> list[bl.Method]:
        put = lambda b: jax.device_put(b, device)  # noqa: E731
        table = {
            "grain device_put": (lambda: grain.experimental.device_put(make(), device), put),
            "dlinspect device_put": (lambda: dlinspect.grain.device_put(make(), device),
                                     dlinspect.to_jax),
            "to_jax loop": (lambda: (dlinspect.to_jax(b) for b in make()), dlinspect.to_jax),
            "device_put loop": (lambda: (put(b) for b in make()), put),
            VARIANTS[0]: (lambda: dlinspect.grain.device_put(make(), device,
                                                             device_buffer_size=0),
                          dlinspect.to_jax),
            VARIANTS[1]: (lambda: dlinspect.grain.device_put(make(), device, cpu_buffer_size=0,
                                                             device_buffer_size=0),
                          dlinspect.to_jax)}
        return [bl.Method(m, epoch, convert=convert) for m, (epoch, convert) in table.items()
                if keep(m)]

    def examples(fn: Any = None) -> Any:
        ds = grain.MapDataset.source(source)
        return (ds.batch(bl.BATCH, drop_remainder=True, batch_fn=fn) if fn
                else ds.batch(bl.BATCH, drop_remainder=True))

    def batched(name: str) -> bl.Pipeline:
        fn = dlinspect.stack if name == "stacked" else None

        def make() -> Any:
            if name == "pre-batched":
                return grain.MapDataset.source(bl.PreBatched(n)).to_iter_dataset()
            return examples(fn).to_iter_dataset()

        return bl.Pipeline(name, name, step, stage_methods(make),
                           {"batches": lambda: list(make())}, n)

    def workers() -> bl.Pipeline:
        live = iter(examples().repeat().to_iter_dataset().mp_prefetch(
            grain.MultiprocessingOptions(num_workers=bl.WORKERS)))

        def warm() -> list[Any]:
            for _ in range(2 * n):     # the workers' first batches come slower
                next(live)
            return [next(live) for _ in range(n)]

        return bl.Pipeline("workers", "workers", step, stage_methods(lambda: bl.take(live, n)),
                           {"batches": warm}, n, close=lambda: bl.close(live))

    def data_loader() -> bl.Pipeline:
        sampler = grain.samplers.IndexSampler(len(source), shuffle=False, num_epochs=None,
                                              shard_options=grain.sharding.NoSharding())
        dl = grain.DataLoader(data_source=source, sampler=sampler, worker_count=bl.WORKERS,
                              operations=[grain.transforms.Batch(bl.BATCH, drop_remainder=True)])
        endless = iter(dl)

        def put(b: Any) -> Any:
            return jax.device_put(b, device)

        def epoch() -> Any:
            return itertools.islice(endless, n)

        table = {"device_put loop": (lambda: (put(b) for b in epoch()), put),
                 "prefetch_to_jax": (lambda: dlinspect.prefetch_to_jax(epoch()),
                                     dlinspect.to_jax),
                 "to_jax loop": (lambda: (dlinspect.to_jax(b) for b in epoch()),
                                 dlinspect.to_jax)}

        def warm() -> list[Any]:
            list(itertools.islice(endless, 2 * n))   # the workers' first batches come slower
            return list(epoch())

        return bl.Pipeline("DataLoader", "DataLoader", step,
                           [bl.Method(m, e, convert=c) for m, (e, c) in table.items() if keep(m)],
                           {"batches": warm}, n, close=lambda: bl.close(endless))

    made = {"workers": workers, "DataLoader": data_loader}
    for name in names:
        yield made[name]() if name in made else batched(name)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    """The command line, checked; ``--quick`` applied."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="rounds (median, quartiles)")
    parser.add_argument("--batches", type=int, default=24, help="batches per epoch")
    parser.add_argument("--warmup", type=int, default=6,
                        help="batches of each epoch not timed (threads starting, buffers filling)")
    parser.add_argument("--pipelines", default=",".join(PIPELINES),
                        help=f"comma-separated: {', '.join(PIPELINES)}")
    parser.add_argument("--methods", default=None,
                        help="comma-separated subset of the methods (default: all but the "
                             "variants)")
    parser.add_argument("--variants", action="store_true",
                        help="also dlinspect device_put with device_buffer_size=0 and with no "
                             "buffers at all (cpu_buffer_size=0 too)")
    parser.add_argument("--stage-only", action="store_true",
                        help="no step: each batch is only waited for (jax.block_until_ready)")
    parser.add_argument("--quick", action="store_true",
                        help="--repeat 3 --batches 12 --warmup 4 (a smoke run, noisy)")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.batches, args.warmup = 3, 12, 4
    if args.batches <= args.warmup:
        parser.error("--batches must exceed --warmup")
    unknown = set(args.pipelines.split(",")) - set(PIPELINES)
    if unknown:
        parser.error(f"unknown pipelines: {', '.join(sorted(unknown))}")
    return args


def _target(name: str, r: dict[str, Any], quick: bool) -> dict[str, Any] | None:
    """Pipeline ``name``'s target (printed) from its results ``r``: None where its baseline
    is not grain device_put or dlinspect device_put was not run."""
    ratio = r["methods"].get("dlinspect device_put", {}).get("ratio")
    if r["baseline"] != "grain device_put" or ratio is None:
        return None
    status = "PASS" if ratio["median"] >= 1.0 else "FAIL"
    if status == "FAIL" and quick and ratio["q3"] >= 1.0:
        status = "NOISY"   # a quick run whose paired ratios straddle the target
    target = {"target": f"dlinspect device_put >= 1.0x grain device_put "
                        f"({name}; median of paired ratios)",
              "value": ratio["median"], "quartiles": [ratio["q1"], ratio["q3"]],
              "ratio_of_medians": ratio["of_medians"], "status": status}
    print(f"{status:<5} {target['target']}: {ratio['median']:.3f} (quartiles "
          f"{ratio['q1']:.3f}-{ratio['q3']:.3f}; ratio of the medians "
          f"{ratio['of_medians']:.3f})")
    return target


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    import dlinspect
    warnings.simplefilter("ignore", dlinspect.DLInspectWarning)
    print("versions: " + ", ".join(f"{k} {v}" for k, v in bl.versions().items() if v))
    print(f"machine: {bl.machine()}; {args.batches} batches per epoch, the first "
          f"{args.warmup} not timed; {args.repeat} rounds"
          + ("; stage only (no step)" if args.stage_only else ""))
    chosen = args.methods.split(",") if args.methods else None
    results: dict[str, Any] = {}
    targets = []
    built = pipelines(args.pipelines.split(","), chosen, args.variants, args.batches)
    for p in built:
        try:
            results[p.name] = r = bl.run_pipeline(p, args.repeat, args.warmup, args.quick,
                                                  args.stage_only)
        finally:
            if p.close is not None:
                p.close()
            gc.collect()
        print(bl.text_report(p.name, r), flush=True)
        target = _target(p.name, r, args.quick)
        if target is not None:
            targets.append(target)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"versions": bl.versions(), "machine": bl.machine(),
                       "argv": sys.argv[1:] if argv is None else argv, "repeat": args.repeat,
                       "batches": args.batches, "warmup": args.warmup,
                       "stage_only": args.stage_only, "median_of": "rounds",
                       "pipelines": results, "targets": targets}, f, indent=1, default=str)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

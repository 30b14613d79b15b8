"""Per-call cost on a CUDA machine (scripts/gpu_check.sh runs it): median µs per call of
``dlinspect.to_jax`` and ``jax.dlpack.from_dlpack`` on the same tensors, every result
waited for, cases interleaved in each repetition; batches/s of a loop feeding a jitted
GPU step, plain ``to_jax`` against ``prefetch_to_jax(thread=True)``; and µs per batch of
``to_jax(batch, device=gpu)`` of a ``dlinspect.stack`` batch (64 x 3 x 224 x 224 float32)
in pageable and in pinned (``pinned=True``) host memory.

Usage: python scripts/gpu_bench.py [--json FILE] [--cpu]   (--cpu: the same on the CPU,
to try the script where no GPU is)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import timeit

import jax
import numpy as np
import torch

import dlinspect


def times(cases: dict[str, object], repeat: int = 9) -> dict[str, float]:
    timers = {}
    for name, fn in cases.items():
        t = timeit.Timer(fn)
        n = 1
        while t.timeit(n) < 0.05:
            n *= 2
        timers[name] = (t, n)
    runs: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, (t, n) in timers.items():
            runs[name].append(t.timeit(n) / n * 1e6)
    return {name: statistics.median(r) for name, r in runs.items()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    dev = "cpu" if args.cpu else "cuda"
    from_dlpack = jax.dlpack.from_dlpack
    t = torch.ones(32, 32, device=dev)
    d = {f"w{i}": torch.ones(64, device=dev) for i in range(16)}
    cases = {
        "to_jax(t)": lambda: dlinspect.to_jax(t).block_until_ready(),
        "from_dlpack(t)": lambda: from_dlpack(t).block_until_ready(),
        "to_jax(d)": lambda: jax.block_until_ready(dlinspect.to_jax(d)),
        "tree_map(from_dlpack, d)": lambda: jax.block_until_ready(
            jax.tree_util.tree_map(from_dlpack, d)),
    }
    try:
        import cupy as cp
        if not args.cpu:
            a = cp.ones((32, 32), dtype=cp.float32)
            cases["to_jax(cupy)"] = lambda: dlinspect.to_jax(a).block_until_ready()
            cases["from_dlpack(cupy)"] = lambda: from_dlpack(a).block_until_ready()
    except ImportError:
        pass
    per_call = times(cases)
    # A loop feeding a jitted step on the device: plain to_jax vs a prefetch thread.
    w = jax.device_put(jax.numpy.ones((2048, 2048)), jax.devices()[0])
    step = jax.jit(lambda w, x: (x @ w).sum())
    batches = [{"x": torch.randn(1024, 2048, device=dev)} for _ in range(32)]

    def loop(thread: bool | None) -> float:
        start = timeit.default_timer()
        total = None
        if thread is None:
            for b in batches:
                total = step(w, dlinspect.to_jax(b)["x"])
        else:
            for b in dlinspect.prefetch_to_jax(batches, thread=thread):
                total = step(w, b["x"])
        jax.block_until_ready(total)
        return len(batches) / (timeit.default_timer() - start)

    loop(None), loop(True)   # warm (compile)
    rates = {"to_jax loop": [], "prefetch_to_jax(thread=True)": []}
    for _ in range(5):
        rates["to_jax loop"].append(loop(None))
        rates["prefetch_to_jax(thread=True)"].append(loop(True))
    # Host batches into the GPU: dlinspect.stack's pageable and pinned memory, per batch.
    pinned_h2d = {}
    if not args.cpu:
        gpu = jax.devices()[0]
        elements = [np.random.default_rng(i).random((3, 224, 224), np.float32) for i in range(64)]
        for name, pinned in (("stack, pageable", False), ("stack, pinned", True)):
            batch = dlinspect.stack(elements, pinned=pinned)
            pinned_h2d[name] = times({name: lambda b=batch: dlinspect.to_jax(
                b, device=gpu).block_until_ready()}, repeat=5)[name]
    report = {
        "versions": {"python": platform.python_version(), "jax": jax.__version__,
                     "torch": torch.__version__, "dlinspect": dlinspect.__version__},
        "devices": [str(x) for x in jax.devices()],
        "per_call_us": per_call,
        "ratios": {"to_jax(t) / from_dlpack(t)": per_call["to_jax(t)"] / per_call["from_dlpack(t)"],
                   "to_jax(d) / tree_map": per_call["to_jax(d)"]
                   / per_call["tree_map(from_dlpack, d)"]},
        "loop_batches_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "host_to_gpu_us": pinned_h2d,   # a 64 x 3 x 224 x 224 float32 batch (38.5 MB)
    }
    if "to_jax(cupy)" in per_call:
        report["ratios"]["to_jax(cupy) / from_dlpack(cupy)"] = (
            per_call["to_jax(cupy)"] / per_call["from_dlpack(cupy)"])
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

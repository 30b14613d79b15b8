"""Leak soak: N conversions per route kind, deleter calls and resident memory measured.

Routes (every tensor a make_capsule capsule or a FakeProducer, so deleter calls
are counted): zero-copy (aligned float32), copy (strided: one copy into C order),
host-fallback (a Vulkan FakeProducer: host copy asked of the producer) and
error (the same with copy=False: exported, then refused). Each route first runs N/10 warm-up
conversions, then N measured ones; RSS (VmRSS) is read before them, halfway through and
after them, each after a garbage collection. The growth reported is the second half's:
a leak grows in every half, while the allocator's arenas settle in the first (a
host fallback's fresh host copies, viewed by JAX, settled after 1-2 MiB here).

Usage: python tests/soak.py [--n 100000] [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

import dlinspect
from dlinspect import DLDeviceType as D
from dlinspect.bench._common import rss_kib
from dlinspect.testing import DeleterCounter, FakeProducer, aligned_empty, make_capsule


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)

    src = aligned_empty((8, 16), np.float32, 64)
    src[...] = np.arange(128, dtype=np.float32).reshape(8, 16)

    def zero_copy(counter):
        return dlinspect.to_jax(make_capsule(src, counter=counter)), 1

    def copy(counter):
        return dlinspect.to_jax(make_capsule(src[:, ::2], counter=counter)), 1

    def host_fallback(counter):
        p = FakeProducer(src, (D.kDLVulkan, 0), counter=counter)
        return dlinspect.to_jax(p), 2   # the device export, then the host copy

    def error(counter):
        p = FakeProducer(src, (D.kDLVulkan, 0), counter=counter)
        try:
            dlinspect.to_jax(p, copy=False)
        except dlinspect.CopyRequiredError:
            return None, 1
        raise AssertionError("no error")

    report = {"n": args.n, "routes": {}}
    for name, fn in (("zero-copy", zero_copy), ("copy", copy), ("host-fallback", host_fallback),
                     ("error", error)):
        warm = DeleterCounter()
        for _ in range(max(1, args.n // 10)):
            fn(warm)
        counter = DeleterCounter()
        gc.collect()
        before = rss_kib()
        capsules = 0
        for i in range(args.n):
            if i == args.n // 2:
                gc.collect()
                middle = rss_kib()
            y, made = fn(counter)
            capsules += made
            del y
        gc.collect()
        after = rss_kib()
        row = {"conversions": args.n, "capsules": capsules, "deleter_calls": counter.calls,
               "rss_before_kib": before, "rss_middle_kib": middle, "rss_after_kib": after,
               "rss_growth_kib": after - middle}
        report["routes"][name] = row
        print(f"{name:<14} {args.n} conversions, {capsules} capsules, {counter.calls} deleter "
              f"calls, RSS {before} -> {middle} -> {after} KiB (second half {after - middle:+d})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Threads racing for one bare capsule whose memory only the capsule owns.

Run by tests/test_reliability.py in a subprocess (a use-after-free would end the process):
``python tests/race_capsule.py ROUTE THREADS ROUNDS``. Every round, THREADS threads
convert the same fresh capsule at once (behind a barrier) by ROUTE; exactly one wins, each
other one gets CapsuleConsumedError, and the deleter runs exactly once. The memory is
large enough that the allocator returns it to the OS when the deleter frees it, so a read
after that faults even without the sanitizer build. Prints one JSON line of counts.
"""

from __future__ import annotations

import json
import os
import sys
import threading

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

import dlinspect
from dlinspect.testing import DeleterCounter, aligned_empty, make_capsule

N = 1 << 20   # elements: 4-8 MiB a tensor


def _owned(dtype=np.float32, misalign=0):
    """A 1-D array only the capsule will hold (misaligned by ``misalign`` bytes)."""
    a = aligned_empty((N,), dtype, 64, offset=misalign)
    a[...] = 1
    return a


def _capsule(route, counter):
    if route == "misaligned":          # the fast path's copy in C
        return make_capsule(_owned(misalign=16), counter=counter, versioned=False)
    if route == "reversed":            # negative strides: gathered in C
        return make_capsule(_owned()[::-1], counter=counter)
    if route == "narrowed":            # int64 -> int32 with x64 off, cast in C
        return make_capsule(_owned(np.int64), counter=counter)
    return make_capsule(_owned(), counter=counter, versioned=route != "legacy-import")


#: route -> convert(capsule); each copies from the capsule's memory, or imports it.
CONVERT = {
    "misaligned": lambda c: dlinspect.to_jax(c),
    "reversed": lambda c: dlinspect.to_jax(c),
    "narrowed": lambda c: dlinspect.to_jax(c, narrow="ok"),
    "copy=True": lambda c: dlinspect.to_jax(c, copy=True),
    "device=": lambda c: dlinspect.to_jax(c, device=_cpu(), copy=True),
    "to_host copy=True": lambda c: dlinspect.to_host(c, copy=True),
    "batch": lambda c: dlinspect.to_jax({"a": c, "b": 1}, copy=True)["a"],
    "import": lambda c: dlinspect.to_jax(c),
    "legacy-import": lambda c: dlinspect.to_jax(c),
}


def _cpu():
    import jax
    return jax.devices("cpu")[0]


def _round(convert, cap, threads):
    """``threads`` threads convert ``cap`` at once: each one's ("won", first value),
    ("lost", None) or ("raised", what)."""
    barrier = threading.Barrier(threads)
    results = []

    def work():
        barrier.wait()
        try:
            out = convert(cap)
            results.append(("won", float(np.asarray(out)[0])))
        except dlinspect.CapsuleConsumedError:
            results.append(("lost", None))
        except BaseException as exc:   # noqa: BLE001 - reported
            results.append(("raised", f"{type(exc).__name__}: {exc}"))

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return results


def main(route, threads, rounds):
    convert = CONVERT[route]
    wins = losses = 0
    counters = []
    for _ in range(rounds):
        counter = DeleterCounter()
        counters.append(counter)
        cap = _capsule(route, counter)
        results = _round(convert, cap, threads)
        del cap
        won = [r for r in results if r[0] == "won"]
        odd = [r for r in results if r[0] == "raised"]
        if len(won) != 1 or odd or any(v != 1.0 for _, v in won):
            print(json.dumps({"route": route, "results": results}))
            return 1
        wins += 1
        losses += threads - 1
    import gc

    import jax
    jax.device_put(0)   # jaxlib lets go of memory it viewed at its next call
    gc.collect()
    calls = [c.calls for c in counters]
    print(json.dumps({"route": route, "wins": wins, "losses": losses, "deleter_calls": calls}))
    return 0 if all(c == 1 for c in calls) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))

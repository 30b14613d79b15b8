"""The TPU check (scripts/tpu_check.sh runs it on a machine with a TPU as JAX's default device):
every host tensor kind into every target a TPU user names, each result checked by what
computations on it give, against ``jnp.asarray(np.asarray(x))`` on the same device; the plan
agreement (``plan`` says the route ``to_jax`` then takes); and µs per copy of
``to_jax(x, device=tpu)`` against ``jax.device_put(x, tpu)`` at sizes from 4 KiB to 64 MiB.

Usage: python scripts/tpu_check.py [--json FILE] [--cpu]   (--cpu: the same with the CPU as
the accelerator, to try the script where no TPU is)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import dlinspect


def sources() -> dict[str, object]:
    rng = np.random.default_rng(0)
    base = rng.standard_normal((64, 48)).astype(np.float32)
    ro = base.copy()
    ro.flags.writeable = False
    raw = np.zeros(base.nbytes + 64, np.uint8)
    mis = raw[4:4 + base.nbytes].view(np.float32).reshape(base.shape)
    mis[...] = base
    out: dict[str, object] = {
        "f32": base.copy(), "f64": base.astype(np.float64), "readonly": ro, "misaligned": mis,
        "sliced": base[::2, 1::3], "transposed": base.T, "reversed": base[::-1],
        "bool": base > 0, "int8": (base * 10).astype(np.int8), "uint16": (abs(base) * 99).astype(np.uint16),
        "bf16": base.astype(ml_dtypes.bfloat16), "scalar": np.full((), 3.5, np.float32),
        "empty": np.zeros((0, 5), np.float32), "broadcast": np.broadcast_to(base[:1], (64, 48)),
    }
    try:
        import torch
    except ImportError:
        return out
    t = torch.from_numpy(base.copy())
    out.update({"torch f32": t, "torch T": t.T, "torch bf16": t.to(torch.bfloat16),
                "torch f64": t.double(), "torch int64": t.long(), "torch expand": t[:1].expand(64, 48)})
    return out


def reference(x: object) -> np.ndarray:
    """The host values of ``x``, through NumPy (torch's bfloat16 through float32)."""
    if type(x).__module__.startswith("torch"):
        bf16 = str(x.dtype) == "torch.bfloat16"
        return x.float().numpy().astype(ml_dtypes.bfloat16) if bf16 else x.numpy()
    return np.asarray(x)


def computations(a: jax.Array, ref: jax.Array) -> list[str]:
    """What differs between computations on ``a`` and on ``ref`` (same device), as words."""
    bad = []
    checks = {
        "a + 0": lambda v: v + 0,
        "sum": lambda v: v.astype(jnp.float32).sum(),
        "index": lambda v: v[tuple(slice(None, None, -1) for _ in v.shape)] if v.ndim else v,
        "jit with ref": jax.jit(lambda v, r: (v.astype(jnp.float32) - r.astype(jnp.float32)).sum()),
    }
    for name, fn in checks.items():
        got = np.asarray(fn(a, ref) if name == "jit with ref" else fn(a))
        want = np.asarray(jnp.zeros((), jnp.float32) if name == "jit with ref" else fn(ref))
        if got.shape != want.shape or not np.array_equal(got.astype(np.float64), want.astype(np.float64)):
            bad.append(f"{name}: {got.ravel()[:3]} != {want.ravel()[:3]}")
    return bad


def check_one(name: str, x: object, target: str, kw: dict, want_dev: jax.Device) -> dict:
    row: dict = {"source": name, "target": target}
    try:
        route = dlinspect.plan(x, **kw)
        row["plan"] = route.action if route is not None else None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            a = dlinspect.to_jax(x, **kw)
        row["warnings"] = [str(w.message)[:120] for w in caught]
        a.block_until_ready()
        ref = jax.device_put(jnp.asarray(reference(x)), want_dev)
        row["device"] = str(next(iter(a.devices())))
        row["dtype"] = f"{a.dtype} (ref {ref.dtype})"
        if route is not None and route.jax_device is not None and {route.jax_device} != a.devices():
            row.setdefault("problems", []).append(f"plan said {route.jax_device}")
        row["problems"] = row.get("problems", []) + computations(
            a, jax.device_put(ref, next(iter(a.devices()))))
        if a.dtype != ref.dtype:
            row["problems"].append(f"dtype {a.dtype} != {ref.dtype}")
        if set(a.devices()) != {want_dev}:
            row["problems"].append(f"on {a.devices()}, asked {want_dev}")
        moved = jax.device_put(a, want_dev)
        row["problems"] += [f"after device_put: {p}" for p in computations(moved, ref)]
    except Exception as exc:   # the check reports every failure, it does not stop at one
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return row


def placements(accel: jax.Device) -> list[tuple[str, dict, jax.Device]]:
    cpu = jax.devices("cpu")[0]
    mesh = jax.sharding.Mesh(np.array([accel]), ("data",))
    whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return [
        ("default", {}, jax.devices()[0]),
        ("device=accel", {"device": accel}, accel),
        ("device=cpu", {"device": cpu}, cpu),
        ("SingleDeviceSharding", {"sharding": jax.sharding.SingleDeviceSharding(accel)}, accel),
        ("NamedSharding", {"sharding": whole}, accel),
    ]


def timings(accel: jax.Device) -> list[dict]:
    rows = []
    for size in (4 << 10, 1 << 20, 16 << 20, 64 << 20):
        x = np.random.default_rng(1).standard_normal(size // 4).astype(np.float32)
        cases = {"to_jax": lambda x=x: dlinspect.to_jax(x, device=accel).block_until_ready(),
                 "device_put": lambda x=x: jax.device_put(x, accel).block_until_ready(),
                 "to_jax no device": lambda x=x: dlinspect.to_jax(x).block_until_ready(),
                 "jnp.asarray": lambda x=x: jnp.asarray(x).block_until_ready()}
        runs: dict[str, list[float]] = {k: [] for k in cases}
        for fn in cases.values():
            fn()
        for _ in range(7 if size < (16 << 20) else 3):
            for k, fn in cases.items():
                n = max(1, (1 << 24) // size)
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                runs[k].append((time.perf_counter() - t0) / n * 1e6)
        med = {k: statistics.median(v) for k, v in runs.items()}
        rows.append({"bytes": size, **{f"{k} us": round(v, 1) for k, v in med.items()},
                     "ratio": round(med["to_jax"] / med["device_put"], 3),
                     "ratio no device": round(med["to_jax no device"] / med["jnp.asarray"], 3)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    accel = jax.devices("cpu" if args.cpu else "tpu")[0]
    print("jax", jax.__version__, jax.devices(), "default", jax.default_backend())
    rows = [check_one(name, x, target, kw, dev) for name, x in sources().items()
            for target, kw, dev in placements(accel)]
    batch = {k: v for k, v in sources().items() if isinstance(v, np.ndarray)}
    rows.append({"source": "dict", "target": "device=accel", **_batch(batch, accel)})
    rows.append({"source": "prefetch", "target": "device=accel", **_prefetch(batch, accel)})
    bad = [r for r in rows if r.get("error") or r.get("problems")]
    for r in rows:
        print(("BAD " if r in bad else "ok  ") + json.dumps(r))
    times = timings(accel)
    for t in times:
        print(json.dumps(t))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"jax": jax.__version__, "device": str(accel), "rows": rows, "times": times},
                      f, indent=1)
    print(f"tpu_check.py: {len(rows) - len(bad)} of {len(rows)} ok")
    return 1 if bad else 0


def _batch(batch: dict, accel: jax.Device) -> dict:
    try:
        out = dlinspect.to_jax(batch, device=accel)
        probs = []
        for k, v in out.items():
            ref = jax.device_put(jnp.asarray(np.asarray(batch[k])), accel)
            probs += [f"{k}: {p}" for p in computations(v, ref)]
            if set(v.devices()) != {accel}:
                probs.append(f"{k} on {v.devices()}")
        return {"problems": probs}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def _prefetch(batch: dict, accel: jax.Device) -> dict:
    try:
        items = [{k: np.array(v) for k, v in batch.items()} for _ in range(4)]
        probs = []
        for i, out in enumerate(dlinspect.prefetch_to_jax(items, device=accel)):
            for k, v in out.items():
                ref = jax.device_put(jnp.asarray(items[i][k]), accel)
                probs += [f"{i} {k}: {p}" for p in computations(v, ref)]
        return {"problems": probs}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


if __name__ == "__main__":
    sys.exit(main())

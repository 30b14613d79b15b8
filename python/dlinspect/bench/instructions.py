"""Suite ``instructions``: instructions per call, counted by valgrind's callgrind.

Counted instructions do not drift with the machine's load (time on a shared 2-core VM
moves by up to 2x between runs), so these targets hold on a noisy machine. One
valgrind run (JAX on 4 forced CPU devices) measures every case: each runs ``N`` times
between two counter dumps (``callgrind_control -d``), and an empty window measured
right after is subtracted (the cost of asking for a dump).

Rows, instructions per call (every result waited for with ``block_until_ready``). A batch
is new memory in every call, as a loader hands it over (made before the window, taken from
a pool there: the proof that a batch owns its memory sees what it sees in a loop over
torch's collate); a single tensor is the same one each time (DLPack's consumer contract
asks no proof of it):

    to_jax(x)            a 64-byte aligned 32x32 float32 NumPy array
    floor(x)             x.__dlpack__() into jaxlib's own import: the floor any DLPack
                         import of it pays here
    to_jax(t)            a 32x32 float32 torch tensor;  floor(t) torch's own C export
                         (torch.utils.dlpack.to_dlpack, no Python __dlpack__) into
                         jaxlib's import
    to_jax(d)            a dict of 16 new float32 torch tensors of shape (64,)
    16 x floor(d)        each of them through that floor (new tensors too)
    to_jax(b64)          a batch of 256 3x32x32 float32 images and int64 labels (NumPy),
                         x64 off: the labels narrow; to_jax(b64, narrow="ok") quietly
    device_put(b64)      jax.device_put of the same batch: jaxlib's own batched put
    to_jax(b, sharding)  256 images and int32 labels split over 4 CPU devices
    device_put(b, sharding)   jax.device_put of the same batch and sharding
    floor(b, sharding)   the raw floor of that split: jaxlib's batched put of each leaf's
                         row views (NumPy slices) with its abstract value, sharding and
                         devices made beforehand, one call per leaf
    to_jax(x16)          a 16-byte aligned 32x32 float32 array (one copy, in C)
    to_jax(b)            the images and int32 labels alone
    to_jax(b + text)     the same with what a loader's batch carries beside them: 256 str
                         ids (a list, as torch's default_collate gives), a str, an int and
                         None
    stack(eN)            dlinspect.stack of N examples {"image": 3x32x32 float32, "label":
                         an int32 NumPy scalar} (N = 8, 64), as a loader's collate makes a
                         batch; np.stack(eN) the same by np.stack of each key's column

Targets: to_jax(x) <= 1.05x its floor, to_jax(t) <= 1.10x its; to_jax(d) <= 1.10x 16
floors; to_jax(b64) <= 1.0x device_put(b64); to_jax(b, sharding) <= 1.0x device_put(b, sharding)
and <= 1.15x floor(b, sharding); to_jax(b + text) <= 2.0x to_jax(b);
stack(eN) <= 1.10x np.stack(eN).
Needs valgrind (``apt-get install valgrind``); without it the suite is skipped, saying so.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, NamedTuple

__all__ = ["run"]


class Fresh(NamedTuple):
    """A case whose input is new in every call: ``run(take)`` converts ``take()``, the next
    of a pool of ``make()`` results made before the case is counted."""

    make: Any
    run: Any

CASES = ["to_jax(x)", "floor(x)", "to_jax(t)", "floor(t)", "to_jax(d)", "16 x floor(d)",
         "to_jax(b64)", 'to_jax(b64, narrow="ok")', "device_put(b64)", "to_jax(b, sharding)",
         "device_put(b, sharding)", "floor(b, sharding)", "to_jax(x16)", "to_jax(b)",
         "to_jax(b + text)", "stack(e8)", "np.stack(e8)", "stack(e64)", "np.stack(e64)"]
TARGETS = [
    ("to_jax(numpy 32x32) <= 1.05x floor (instructions)", "to_jax(x)", "floor(x)", 1.05),
    ("to_jax(torch 32x32) <= 1.10x floor (instructions)", "to_jax(t)", "floor(t)", 1.10),
    ("to_jax(dict of 16 torch) <= 1.10x 16 floors (instructions)", "to_jax(d)",
     "16 x floor(d)", 1.10),
    ("to_jax(batch, int64 labels) <= 1.0x jax.device_put (instructions)", "to_jax(b64)",
     "device_put(b64)", 1.0),
    ("to_jax(batch, sharding over 4 CPUs) <= 1.0x jax.device_put (instructions)",
     "to_jax(b, sharding)", "device_put(b, sharding)", 1.0),
    ("to_jax(batch, sharding over 4 CPUs) <= 1.15x the batched put of its row views "
     "(instructions)", "to_jax(b, sharding)", "floor(b, sharding)", 1.15),
    ("to_jax(batch + 256 str ids and scalars) <= 2.0x the batch without them (instructions)",
     "to_jax(b + text)", "to_jax(b)", 2.0),
    ("stack(8 examples) <= 1.10x np.stack of each key (instructions)", "stack(e8)",
     "np.stack(e8)", 1.10),
    ("stack(64 examples) <= 1.10x np.stack of each key (instructions)", "stack(e64)",
     "np.stack(e64)", 1.10),
]


def _statements(quick: bool) -> dict[str, Any]:
    """The cases, as zero-argument callables (built in the measured process)."""
    import jax
    import numpy as np

    import dlinspect
    from dlinspect._core import aligned_empty
    from dlinspect._core import jax_target as target

    tg = target()
    imp, cpu = tg.import_fn, tg.cpu_device
    ready = jax.block_until_ready
    to_jax = dlinspect.to_jax
    x = aligned_empty((32, 32), np.float32, 64)
    x[...] = 1
    x16 = aligned_empty((32, 32), np.float32, 64, offset=16)
    x16[...] = 1
    n = 64 if quick else 256

    def images() -> Any:
        out = aligned_empty((n, 3, 32, 32), np.float32, 64)
        out[...] = 1
        return out

    def labels() -> Any:
        out = aligned_empty((n,), np.int32, 64)
        out[...] = 1
        return out

    def b64() -> dict[str, Any]:
        return {"image": images(), "label": np.arange(n, dtype=np.int64)}

    def b() -> dict[str, Any]:
        return {"image": images(), "label": labels()}

    def text() -> dict[str, Any]:
        return dict(image=images(), label=labels(), ids=[f"id{i:05d}" for i in range(256)],
                    source="train", epoch=3, weight=None)

    def arrays(out: dict[str, Any]) -> tuple[Any, Any]:
        return out["image"], out["label"]
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    out: dict[str, Any] = {
        "to_jax(x)": lambda: to_jax(x).block_until_ready(),
        "floor(x)": lambda: imp(x.__dlpack__(), cpu, None, None, 1).block_until_ready(),
        "to_jax(b64)": Fresh(b64, lambda take: ready(to_jax(take()))),
        'to_jax(b64, narrow="ok")': Fresh(b64, lambda take: ready(to_jax(take(), narrow="ok"))),
        "device_put(b64)": Fresh(b64, lambda take: ready(jax.device_put(take()))),
        "to_jax(b, sharding)": Fresh(b, lambda take: ready(to_jax(take(), sharding=sharding))),
        "device_put(b, sharding)": Fresh(b, lambda take: ready(jax.device_put(take(), sharding))),
        "to_jax(x16)": lambda: to_jax(x16).block_until_ready(),
        # (waited for by the arrays alone: jax.block_until_ready of the whole batch would
        # walk the 256 ids itself)
        "to_jax(b)": Fresh(b, lambda take: ready(arrays(to_jax(take())))),
        "to_jax(b + text)": Fresh(text, lambda take: ready(arrays(to_jax(take())))),
    }
    examples = [{"image": images()[i], "label": np.int32(i)} for i in range(64)]
    for size in (8, 64):
        out[f"stack(e{size})"] = lambda e=examples[:size]: dlinspect.stack(e)
        out[f"np.stack(e{size})"] = lambda e=examples[:size]: {
            key: np.stack([x[key] for x in e]) for key in ("image", "label")}
    floor_b = _split_floor(b(), sharding)
    if floor_b is not None:
        out["floor(b, sharding)"] = lambda: ready(floor_b())
    try:
        import torch
    except ImportError:
        return out
    t = torch.ones(32, 32)
    export = torch.utils.dlpack.to_dlpack   # torch's own C export (torch._C._to_dlpack)

    def d() -> dict[str, Any]:
        return {f"w{i:02d}": torch.ones(64) for i in range(16)}
    out.update({
        "to_jax(t)": lambda: to_jax(t).block_until_ready(),
        "floor(t)": lambda: imp(export(t), cpu, None, None, 1).block_until_ready(),
        "to_jax(d)": Fresh(d, lambda take: ready(to_jax(take()))),
        "16 x floor(d)": Fresh(d, lambda take: ready({k: imp(export(v), cpu, None, None, 1)
                                                      for k, v in take().items()})),
    })
    return out


def _split_floor(batch: dict[str, Any], sharding: Any) -> Any:
    """The raw floor of putting ``batch`` over ``sharding``: per leaf, jaxlib's batched put
    of its row views, everything else made beforehand; None without that function."""
    from jax._src import core

    from dlinspect._core import jax_caps as caps
    put = caps()._put_fn
    if put is None:
        return None
    leaves = []
    for leaf in batch.values():
        index = sharding.addressable_devices_indices_map(leaf.shape)
        aval = core.ShapedArray(leaf.shape, leaf.dtype)
        if hasattr(core, "update_aval_with_sharding"):
            aval = core.update_aval_with_sharding(aval, sharding)
        leaves.append((leaf, aval, list(index.values()), list(index)))

    def floor() -> list[Any]:
        return [put(aval, sharding, [leaf[i] for i in rows], devices, True)
                for leaf, aval, rows, devices in leaves]
    return floor


def _child(folder: str, calls: int, quick: bool) -> None:
    """In the measured process: each case between two dumps, then an empty window."""
    import warnings

    from dlinspect.errors import DLInspectWarning
    warnings.simplefilter("ignore", DLInspectWarning)   # shown once; not what is counted
    cases = _statements(quick)
    pid = str(os.getpid())

    def control(*args: str) -> None:
        subprocess.run(["callgrind_control", *args, pid], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)

    only = os.environ.get("DLINSPECT_BENCH_CASES")   # "name|name" to measure a few
    chosen = [n for n in CASES if only is None or n in only.split("|")]
    order = []
    control("-i", "on")
    control("-d")   # a first dump: what came before is not counted
    for name in chosen:
        fn = cases.get(name)
        if fn is None:
            continue
        if isinstance(fn, Fresh):
            pool = [fn.make() for _ in range(10 + calls)]
            fn = functools.partial(fn.run, pool.pop)
        for _ in range(10):
            fn()   # warm: first calls fill caches and compile
        control("-d")
        for _ in range(calls):
            fn()
        control("-d")    # the case, and one request for a dump
        control("-d")    # one request for a dump alone
        order.append(name)
    control("-i", "off")
    with open(os.path.join(folder, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(order, f)


def _total(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise ValueError(f"no instruction total in {path}")


def run(quick: bool = False, repeat: int | None = None, tick: Any = None) -> dict[str, Any]:
    """Count instructions per call of every case in one valgrind run; the suite's dict
    (see :mod:`dlinspect.bench._common`), unit "instructions per call"."""
    from ._common import ratio_target
    calls = 20 if quick else 100
    title = "instructions"
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        return {"title": title, "unit": "instructions per call", "rows": [],
                "targets": [{"target": d, "status": "SKIP", "value": None, "limit": lim,
                             "reason": "valgrind is not installed (apt-get install valgrind)"}
                            for d, _, _, lim in TARGETS],
                "notes": ["skipped: valgrind is not installed (apt-get install valgrind)"]}
    if tick:
        tick("instructions: one valgrind run (about a minute)")
    folder = tempfile.mkdtemp(prefix="dlinspect-cg-")
    try:
        env = dict(os.environ, JAX_PLATFORMS="cpu",
                   XLA_FLAGS="--xla_force_host_platform_device_count=4")
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
               f"--callgrind-out-file={os.path.join(folder, 'cg.out')}", sys.executable, "-m",
               "dlinspect.bench.instructions", "--child", folder, str(calls)]
        if quick:
            cmd.append("--quick")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"the valgrind run failed ({proc.returncode}): "
                               f"{proc.stderr[-2000:]}")
        with open(os.path.join(folder, "cases.json"), encoding="utf-8") as f:
            order = json.load(f)
        # Dumps 1.. in order: the first (before any case), then 3 per case.
        totals = [_total(os.path.join(folder, f"cg.out.{k}")) for k in range(1, 2 + 3 * len(order))]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rows = []
    for i, name in enumerate(order):
        case, dump_only = totals[2 + 3 * i], totals[3 + 3 * i]
        rows.append({"name": name, "median": (case - dump_only) / calls, "number": calls,
                     "stmt": name})
    by_name = {r["name"]: r for r in rows}
    targets = [ratio_target(d, by_name, m, b, lim) for d, m, b, lim in TARGETS]
    return {"title": title, "unit": "instructions per call", "rows": rows, "targets": targets,
            "repeat": 1, "notes": [f"valgrind --tool=callgrind, {calls} calls per case, "
                                   f"JAX on 4 forced CPU devices"]}


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), "--quick" in sys.argv)
    else:
        result = run(quick="--quick" in sys.argv)
        for row in result["rows"]:
            print(f"{row['name']:<28} {row['median']:>14,.0f}")
        for t in result["targets"]:
            print(f"{t['status']:<5} {t['target']}: {t['value']}")

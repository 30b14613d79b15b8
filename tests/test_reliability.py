"""Lifetimes on every route and producer, a leak soak, interpreter shutdown, threads.

Routes: zero-copy, copy (``copy=True``), host-fallback (the producer behind a
wrapper that reports Vulkan memory, so the route asks it for a host copy) and
error (the same with ``fallback="raise"``). Producers: NumPy, PyTorch, JAX and
``dlinspect.testing.make_capsule``. "The deleter ran exactly once" is observed
as: NumPy's reference count of the array back to where it was (a second
deleter call would take one more), torch's ``Tensor._use_count()`` back to
where it was, make_capsule's DeleterCounter at exactly 1 per capsule; for JAX
producers, the values and the leak soak.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install jax)")
import jax.numpy as jnp  # noqa: E402

import dlinspect  # noqa: E402
from dlinspect import DLDeviceType as D  # noqa: E402
from dlinspect import CopyRequiredError, DLInspectError  # noqa: E402
from dlinspect.testing import DeleterCounter, FakeProducer, aligned_empty, make_capsule  # noqa: E402

from _helpers import jax_lets_go  # noqa: E402
from _versions import torch_use_count  # noqa: E402

HERE = Path(__file__).parent
ROUTES = ["zero-copy", "copy", "host-fallback", "error"]


class Elsewhere:
    """A real producer's tensor, presented as Vulkan memory: routes through host memory.

    Its capsules say kDLVulkan, as its ``__dlpack_device__`` does (the header and
    the device must agree); each owns the real producer's export, whose deleter
    runs when the capsule's does. A host copy request goes to the real producer.
    """

    def __init__(self, inner):
        self.inner = inner

    def __dlpack_device__(self):
        return (D.kDLVulkan, 0)

    def __dlpack__(self, **kwargs):
        if "dl_device" in kwargs:   # a host copy, by the real producer where it can
            try:
                return self.inner.__dlpack__(**kwargs)
            except TypeError:       # (NumPy < 2.1, torch < 2.4: no dl_device keyword)
                return make_capsule(dlinspect.to_host(self.inner, copy=True))
        try:
            cap = self.inner.__dlpack__(**kwargs)
        except TypeError:           # (an older producer: no max_version)
            cap = self.inner.__dlpack__()
        view = dlinspect.to_host(cap)   # owns the real export
        return make_capsule(view, device=(D.kDLVulkan, 0))


def values():
    out = aligned_empty((4, 16), np.float32, 64)
    out[...] = np.arange(64, dtype=np.float32).reshape(4, 16)
    return out


def numpy_producer():
    return values(), sys.getrefcount


def torch_producer():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    t = torch.from_numpy(values()).clone()
    return t, (torch_use_count if torch_use_count(t) is not None else None)


def jax_producer():
    return jnp.asarray(values()), None


def capsule_producer():
    counter = DeleterCounter()
    return make_capsule(values(), counter=counter), counter


PRODUCERS = {"numpy": numpy_producer, "torch": torch_producer, "jax": jax_producer}


def convert(route, x):
    if route == "zero-copy":
        return dlinspect.to_jax(x)
    if route == "copy":
        return dlinspect.to_jax(x, copy=True)
    if route == "host-fallback":
        return dlinspect.to_jax(Elsewhere(x))
    with pytest.raises(CopyRequiredError):
        dlinspect.to_jax(Elsewhere(x), copy=False)
    return None


def expected_route(route, x):
    target = Elsewhere(x) if route in ("host-fallback", "error") else x
    # (the error: a host fallback with copy=False, refused after the export was taken;
    # fallback="raise" refuses from __dlpack_device__ alone, before any export)
    kw = {"copy": True} if route == "copy" else {"copy": False} if route == "error" else {}
    return dlinspect.plan(target, **kw).kind


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("producer", list(PRODUCERS))
def test_deleter_runs_once(producer, route):
    x, count = PRODUCERS[producer]()
    assert expected_route(route, x) == route
    base = count(x) if count else None
    y = convert(route, x)
    if y is not None:
        np.testing.assert_array_equal(np.asarray(y), values())
    if count is not None:
        # zero-copy: the export is held by the array; every other route let it go already
        assert count(x) - base == (1 if route == "zero-copy" else 0)
    del y
    jax_lets_go()
    if count is not None:
        assert count(x) == base


@pytest.mark.parametrize("route", ROUTES)
def test_deleter_runs_once_capsules(route):
    if route in ("host-fallback", "error"):
        # A bare capsule has no producer to ask for a host copy: a FakeProducer serves them.
        counter = DeleterCounter()
        p = FakeProducer(values(), (D.kDLVulkan, 0), counter=counter)
        assert dlinspect.plan(p, copy=False if route == "error" else None).kind == route
        if route == "error":
            with pytest.raises(CopyRequiredError):
                dlinspect.to_jax(p, copy=False)
            y = None
        else:
            y = dlinspect.to_jax(p)
            np.testing.assert_array_equal(np.asarray(y), values())
        # Every capsule it served is freed already, but the host copy if JAX views it.
        assert counter.calls in (len(p.calls), len(p.calls) - 1)
        del y
        jax_lets_go()
        assert counter.calls == len(p.calls) > 0
        return
    cap, counter = capsule_producer()
    y = convert(route, cap)
    assert counter.calls == (0 if route == "zero-copy" else 1)
    del y
    jax_lets_go()
    assert counter.calls == 1


@pytest.mark.parametrize("producer", list(PRODUCERS) + ["capsule"])
def test_data_outlives_producer_and_capsule(producer):
    """Zero-copy arrays keep the memory alive after the producer and the capsule are gone."""
    if producer == "capsule":
        x, _ = capsule_producer()
    else:
        x, _ = PRODUCERS[producer]()
    cap = x if producer == "capsule" else x.__dlpack__()
    y_from_cap = dlinspect.to_jax(cap)
    y_from_producer = dlinspect.to_jax(x) if producer != "capsule" else None
    del x, cap
    gc.collect()
    churn = [np.full((4, 16), -1.0, np.float32) for _ in range(64)]  # reuse freed memory
    np.testing.assert_array_equal(np.asarray(y_from_cap), values())
    if y_from_producer is not None:
        np.testing.assert_array_equal(np.asarray(y_from_producer), values())
    del churn


@pytest.mark.slow
def test_interpreter_exit_with_live_arrays():
    code = """
import numpy as np, torch, jax.numpy as jnp, dlinspect
from dlinspect.testing import aligned_empty, make_capsule, DeleterCounter
x = aligned_empty((8,), np.float32, 64); x[:] = 1
keep = [dlinspect.to_jax(x), dlinspect.to_jax(torch.ones(8)), dlinspect.to_jax(jnp.ones(8)),
        dlinspect.to_jax(make_capsule(x, counter=DeleterCounter())), dlinspect.to_jax(x[::2]),
        dlinspect.to_host(torch.ones(3)), dlinspect.peek(x)]
it = iter(dlinspect.prefetch_to_jax(iter([x, x, x])))
next(it)
"""
    pytest.importorskip("torch", reason="torch is not installed")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]


@pytest.mark.slow
def test_leak_soak(tmp_path):
    """100,000 conversions per route kind: deleter calls equal conversions, RSS grows < 5 MiB
    over the second 50,000 (a leak of 105 bytes a conversion would show)."""
    out = tmp_path / "soak.json"
    n = int(os.environ.get("DLINSPECT_SOAK_N", "100000"))
    proc = subprocess.run([sys.executable, str(HERE / "soak.py"), "--n", str(n), "--json", str(out)],
                          capture_output=True, text=True, timeout=1800,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    for route, row in report["routes"].items():
        assert row["conversions"] == n, (route, row)
        assert row["deleter_calls"] == row["capsules"], (route, row)
        if not os.environ.get("DLINSPECT_SANITIZED"):  # ASan's quarantine holds freed memory
            assert row["rss_growth_kib"] < 5 * 1024, (route, row)


def test_threads_race_for_the_first_target():
    """8 threads converting for the first time at once build one JaxTarget (its probes run
    once), and every thread reads that one."""
    code = """
import threading, numpy as np, dlinspect
from dlinspect import _core, _jaxcaps
builds, seen = [], []
default_device = _jaxcaps.JaxCaps._default_device   # called once per JaxTarget built
_jaxcaps.JaxCaps._default_device = lambda self: builds.append(1) or default_device(self)
barrier = threading.Barrier(8)
def work(i):
    a = np.arange(16, dtype=np.float32) + i
    barrier.wait()
    y = dlinspect.to_jax(a[::2], narrow="ok")
    assert np.array_equal(np.asarray(y + 0), a[::2])
    seen.append(id(_core.current_target()))
threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(len(builds), len(seen), len(set(seen)))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["1", "8", "1"], proc.stdout


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_fork_while_another_thread_sets_up_jax():
    """A process forks (torch's DataLoader starting its workers) while another thread is
    inside dlinspect's first-use set-up (JAX's capabilities being probed, under its lock): the
    child's first conversion finishes, its values right by computation."""
    code = """
import os, sys, threading, warnings, numpy as np, dlinspect
from dlinspect import _jaxcaps
parent, inside, release = os.getpid(), threading.Event(), threading.Event()
probe = _jaxcaps.JaxCaps
def held_probe(*args):   # the parent's set-up stops halfway, holding the lock
    if os.getpid() == parent:
        inside.set()
        release.wait()
    return probe(*args)
_jaxcaps.JaxCaps = held_probe
setup = threading.Thread(target=dlinspect.to_jax, args=(np.ones(4, np.float32),))
setup.start()
inside.wait()
warnings.simplefilter("ignore", DeprecationWarning)   # (fork with threads, Python >= 3.12)
pid = os.fork()
if pid == 0:
    x = np.arange(8, dtype=np.float32)
    y = dlinspect.to_jax({"x": x * 2})["x"]
    os._exit(0 if float((y + 0).sum()) == 56.0 and float(y[3]) == 6.0 else 3)
release.set()
setup.join()
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["0"], proc.stdout + proc.stderr[-3000:]


def test_threads():
    """8 threads peek and convert shared and private tensors for a few seconds."""
    shared = values()
    shared_cap = make_capsule(shared, counter=DeleterCounter())
    torch = pytest.importorskip("torch", reason="torch is not installed")
    shared_t = torch.from_numpy(values()).clone()
    errors: list[BaseException] = []
    totals = []
    stop = time.monotonic() + float(os.environ.get("DLINSPECT_THREADS_S", "3"))

    def work(k):
        counter = DeleterCounter()
        made = done = 0
        try:
            while time.monotonic() < stop:
                assert dlinspect.peek(shared_cap).shape == (4, 16)
                assert dlinspect.peek(shared).shape == (4, 16)
                for src in (shared, shared_t, shared[:, ::2]):
                    y = dlinspect.to_jax(src)
                    np.testing.assert_array_equal(np.asarray(y), np.asarray(src))
                mine = values() + k
                y = dlinspect.to_jax(make_capsule(mine, counter=counter))
                h = dlinspect.to_host(make_capsule(mine[::-1], counter=counter))
                made += 2
                assert float(y[0, 0]) == k and float(h[0, 0]) == 48 + k
                del y, h
                done += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        totals.append((made, counter, done))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], errors[:3]
    assert len(totals) == 8 and all(done > 0 for _, _, done in totals)
    jax_lets_go()
    assert all(made == counter.calls for made, counter, _ in totals), totals
    with pytest.raises(DLInspectError):
        dlinspect.to_jax(make_capsule(shared, name="used_dltensor_versioned"))


@pytest.mark.slow
@pytest.mark.parametrize("threads", [2, 8])
@pytest.mark.parametrize("route", ["misaligned", "reversed", "narrowed", "copy=True", "device=",
                                   "to_host copy=True", "batch", "import", "legacy-import"])
def test_threads_race_for_one_bare_capsule(route, threads):
    """Threads converting one bare capsule whose memory only it owns: a route that copies
    takes the capsule before it reads the memory, so exactly one thread wins, every other
    one gets CapsuleConsumedError, nothing is read after the deleter freed it, and the
    deleter runs once (tests/race_capsule.py, in a subprocess: a crash fails the test)."""
    proc = subprocess.run(
        [sys.executable, str(HERE / "race_capsule.py"), route, str(threads), "10"],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["wins"] == 10 and report["losses"] == 10 * (threads - 1), report
    assert report["deleter_calls"] == [1] * 10, report

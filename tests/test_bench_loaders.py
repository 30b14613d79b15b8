"""The measuring rules of benchmarks/bench_loaders.py (the real pipelines' run): bytes seen
on a conversion's output agree with what a loader's report counts; the rounds' pairing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax", reason="jax is not installed (pip install jax)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import dlinspect  # noqa: E402
from dlinspect.testing import aligned_array  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHIFT = 16                                               # bytes past a 64-byte boundary


def shifted_copied():
    """Whether this XLA:CPU copies memory SHIFT bytes past a 64-byte boundary for its
    alignment (jaxlib 0.4.30 views memory of any alignment; later ones 64-byte aligned)."""
    from dlinspect._core import jax_target as target
    return SHIFT % target().cpu_align != 0


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_loaders",
                                                  ROOT / "benchmarks" / "bench_loaders.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_loaders"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("bench_loaders", None)


def batches(n=3):
    """Batches with one leaf of each kind: viewed, misaligned, read-only, narrowed."""
    out = []
    for i in range(n):
        view = aligned_array(np.full((64, 32), i, np.float32))
        padded = aligned_array(np.full(64 * 32 + SHIFT // 4, i, np.float32))
        shifted = padded[SHIFT // 4:].reshape(64, 32)
        frozen = aligned_array(np.full((64, 32), i, np.float32))
        frozen.flags.writeable = False
        out.append({"view": view, "shifted": shifted, "frozen": frozen,
                    "label": aligned_array(np.arange(64), np.int64)})
    return out


def test_measured_bytes_agree_with_the_loader_report(bench):
    """On the same batches, the bytes seen at the output's addresses are what
    prefetch_to_jax's report counts, leaf by leaf and reason by reason."""
    # (each handed over as a loader hands it: a list still holding them would be a source
    # keeping them, and dlinspect copies memory a source keeps)
    loader = dlinspect.prefetch_to_jax(bench.handed_over(batches()), narrow="ok")
    for _ in loader:
        pass
    counted = bench.report_bytes(loader.report)
    seen = bench.measured_bytes(batches(), lambda b: dlinspect.to_jax(b, narrow="ok"), {})
    assert seen["leaves"] == counted["leaves"]
    assert (seen["zero_copy"], seen["copied"]) == (counted["zero_copy"], counted["copied"])
    leaf = 64 * 32 * 4
    assert seen["leaves"]["['view']"] == {"zero_copy": leaf, "copied": {}}
    assert seen["leaves"]["['shifted']"] == ({"zero_copy": 0, "copied": {"alignment": leaf}}
                                             if shifted_copied() else
                                             {"zero_copy": leaf, "copied": {}})
    assert seen["leaves"]["['frozen']"] == {"zero_copy": 0, "copied": {"read-only": leaf}}
    assert seen["leaves"]["['label']"] == {"zero_copy": 0, "copied": {"narrowing": 64 * 8}}
    shared = bench.measured_bytes(batches(), lambda b: dlinspect.to_jax(b, readonly="share",
                                                                        narrow="ok"),
                                  {"readonly": "share"})
    assert shared["leaves"]["['frozen']"] == {"zero_copy": leaf, "copied": {}}


def asarray_views(array):
    """Whether this jax's jnp.asarray imports `array` without a copy (jax 0.4.30 views
    aligned host memory; later ones copy it)."""
    return jnp.asarray(array).unsafe_buffer_pointer() == array.ctypes.data


def test_measured_bytes_name_copies_dlinspect_would_not_make(bench):
    """Where jnp.asarray copies memory JAX could view, the bytes count as copied,
    "viewable"; the misaligned leaf keeps the reason dlinspect gives it."""
    # (asked of another batch of the same layout: a variable of this test holding a leaf
    # of the measured one would make dlinspect copy it)
    probe = batches(1)[0]
    views = {key: asarray_views(probe[key]) for key in ("view", "shifted")}
    del probe
    seen = bench.measured_bytes(batches(1), lambda b: {k: jnp.asarray(v) for k, v in b.items()},
                                {})
    leaf = 64 * 32 * 4
    assert seen["leaves"]["['view']"] == ({"zero_copy": leaf, "copied": {}}
                                          if views["view"] else
                                          {"zero_copy": 0, "copied": {"viewable": leaf}})
    reason = "alignment" if shifted_copied() else "viewable"
    assert seen["leaves"]["['shifted']"] == ({"zero_copy": leaf, "copied": {}}
                                             if views["shifted"] else
                                             {"zero_copy": 0, "copied": {reason: leaf}})
    put = bench.measured_bytes(batches(1), lambda b: jax.device_put(b, jax.devices()[0]), {})
    assert put["leaves"]["['view']"] == {"zero_copy": leaf, "copied": {}}


def test_ratios_are_paired_by_round(bench, monkeypatch):
    """A method's ratio is the median of its per-round ratios to the baseline (a drift
    common to both epochs of a round cancels), not the ratio of the two medians."""
    step = (lambda p, b: p, 0)
    # round 0 (warm-up): base, fast; then the first method rotates: fast, base / base,
    # fast / fast, base
    rates = iter([10.0, 20.0, 100.0, 200.0, 1000.0, 2000.0, 40.0, 10.0])
    monkeypatch.setattr(bench, "one_epoch", lambda *args: (next(rates), 1.0, None))
    pipeline = bench.Pipeline("p", "p", step, [bench.Method("base", lambda: []),
                                               bench.Method("fast", lambda: [])],
                              {"batches": lambda: [{"x": aligned_array(np.ones(16))}]}, 0)
    result = bench.run_pipeline(pipeline, repeat=3, warmup=0, quick=True)
    base, fast = result["methods"]["base"], result["methods"]["fast"]
    assert base["end_to_end"]["runs"] == [200.0, 1000.0, 10.0]
    assert fast["end_to_end"]["runs"] == [100.0, 2000.0, 40.0]
    assert fast["ratio"]["runs"] == [0.5, 2.0, 4.0]
    assert fast["ratio"]["median"] == 2.0 and fast["ratio"]["of_medians"] == 0.5
    assert base["ratio"] is None and result["baseline"] == "base"


def test_a_failing_pipeline_leaves_the_others(bench, monkeypatch, capsys):
    """A pipeline that raises is recorded with its reason and the group goes on; a
    builder that raises marks the group's remaining pipelines failed."""
    monkeypatch.setattr(bench, "one_epoch", lambda *args: (50.0, 1.0, None))
    closed = []

    def pipeline(name, epoch):
        return bench.Pipeline(name, name, (lambda p, b: p, 0), [bench.Method("m", epoch)],
                              {"batches": lambda: [{"x": aligned_array(np.ones(16))}]}, 0,
                              close=lambda: closed.append(name))

    def broken_raw():
        raise RuntimeError("no batches\nsecond line")

    def build(names):
        yield pipeline("a", lambda: [])
        bad = pipeline("b", lambda: [])
        bad.raw = {"batches": broken_raw}
        yield bad
        yield pipeline("c", lambda: [])
        raise OSError("the library cannot start")

    monkeypatch.setitem(bench.GROUPS, "fake", ((), ["a", "b", "c", "d", "e"], build))
    done, failed = bench.run_group("fake", repeat=1, warmup=0, quick=True)
    assert list(done) == ["a", "c"] and closed == ["a", "b", "c"]
    assert failed == {"b": "failed: RuntimeError: no batches",
                      "d": "failed: OSError: the library cannot start",
                      "e": "failed: OSError: the library cannot start"}
    assert "no batches" in capsys.readouterr().err

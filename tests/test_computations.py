"""Right values by computation: every entry point, every layout, every shared dtype.

The differential property of ``tests/_computations.py``: for NumPy and torch views of
every kind, what each entry point returns computes exactly as
``jnp.asarray(np.asarray(x))`` does (elementwise, indexed, reduced along each axis,
flattened, under ``jax.jit``). ``np.asarray(result)`` alone would pass a buffer whose
layout JAX lost. The sharded entry point runs in tests/multidevice/.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")
pytest.importorskip("hypothesis", reason="hypothesis is not installed")
pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")

import jax  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402

import dlinspect  # noqa: E402
from _computations import assert_computes_like, build, quietly, views  # noqa: E402
from _helpers import target  # noqa: E402

#: Drawn views per entry point.
EXAMPLES = int(150 * float(os.environ.get("DLINSPECT_AGREEMENT_SCALE", "1")))
CPU = jax.devices("cpu")[0]
#: This jaxlib gives the uncommitted arrays jnp.asarray gives (dlinspect doctor's SYMBOLS).
UNCOMMITS = target().uncommit is not dlinspect._core._same


def _batch(x, **options):
    return dlinspect.to_jax({"x": x, "label": "a"}, **options)["x"]


def _prefetched(x, **options):
    (batch,) = list(dlinspect.prefetch_to_jax([{"x": x}], **options))
    return batch["x"]


#: Every single-device entry point: name -> convert(x).
ENTRY_POINTS = {
    "to_jax": lambda x: dlinspect.to_jax(x),
    "device=": lambda x: dlinspect.to_jax(x, device=CPU),
    "copy=True": lambda x: dlinspect.to_jax(x, copy=True),
    "readonly=share": lambda x: dlinspect.to_jax(x, readonly="share"),
    "batch": _batch,
    "batch device=": lambda x: _batch(x, device=CPU),
    "prefetch_to_jax": _prefetched,
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_view_computes_right(entry):
    convert = ENTRY_POINTS[entry]

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(h=views())
    def run(h):
        make, reference = build(h)
        result = quietly(convert, make())
        assert_computes_like(result, reference, f"{entry} {h}")
    run()


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(h=views(producers=["numpy", "torch"]))
def test_plan_says_where_the_array_is_committed(h):
    """A route that keeps a permuted order imports the array committed (JAX computes right
    with such a layout only then); every other route with no device asked for gives the
    uncommitted array jnp.asarray gives. (A host fallback's array is committed where the
    producer's host copy keeps a permuted order: its plan cannot see that copy; see
    TestIssueCases.test_host_copy_in_a_permuted_order.)"""
    make, _ = build(h)
    route = dlinspect.plan(make())
    result = quietly(dlinspect.to_jax, make())
    if route.facts.get("keeps_layout"):
        assert result._committed, (route, h)
    elif UNCOMMITS:   # (else this jaxlib's DLPack imports stay committed)
        assert not result._committed, (route, h)


class TestIssueCases:
    """The reported inputs, each standing for its kind (the property above draws the kind)."""

    def test_transpose_of_an_aligned_stack(self):
        a = dlinspect.stack([np.arange(64 * 48, dtype=np.float32).reshape(64, 48)])[0]
        j = dlinspect.to_jax(a.T)   # (copied on a jaxlib that reads it as row-major)
        assert dlinspect.plan(a.T).kind == ("zero-copy" if target().permuted_ok else "copy")
        assert float(j[1, 0]) == a.T[1, 0] == 1.0
        assert_computes_like(j, a.T)

    @pytest.mark.parametrize("perm", [(1, 0), (0, 2, 1), (0, 2, 3, 1)])
    def test_torch_permutes(self, perm):
        import torch
        shape = (2, 3, 4, 5)[:len(perm)]
        t = torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape)
        v = t.permute(*perm)
        for entry, convert in ENTRY_POINTS.items():
            assert_computes_like(convert(v), v.numpy(), entry)

    @pytest.mark.parametrize("copy_into", [False, True])
    def test_host_copy_in_a_permuted_order(self, copy_into):
        """dpnp's transposed tensor: the host copy its producer makes keeps the transposed
        order, 64-byte aligned. JAX views it only committed (the outer host fallback once
        made it uncommitted, and every computation read it row-major)."""
        from dlinspect.testing import DLDeviceType, FakeProducer
        values = np.arange(24, dtype=np.float32).reshape(4, 6) - 5
        x = FakeProducer(values.T, (DLDeviceType.kDLVulkan, 0), copy_into=copy_into)
        assert dlinspect.plan(x).kind == "host-fallback"
        j = quietly(dlinspect.to_jax, x)
        assert_computes_like(j, values.T)
        if not copy_into:   # the copy is the producer's, transposed as the tensor
            assert x.served[-1].strides == values.T.strides
        if UNCOMMITS:   # committed exactly where JAX keeps the host copy's permuted order
            assert j._committed == (not copy_into and target().permuted_ok)
        for entry, convert in ENTRY_POINTS.items():
            x = FakeProducer(values.T, (DLDeviceType.kDLVulkan, 0), copy_into=copy_into)
            assert_computes_like(quietly(convert, x), values.T, entry)

    @pytest.mark.parametrize("shape, strides", [((2, 1), (1, 2)), ((1, 3), (0, 1)),
                                                ((2, 1, 3), (3, 7, 1))])
    def test_extent_one_axes_with_any_stride(self, shape, strides):
        """DLPack allows any stride on an axis of extent 1; a jaxlib that infers a layout
        from it (0.4.30: its jit then refuses the array) gets a row-major copy."""
        from dlinspect.testing import aligned_empty, make_capsule
        values = aligned_empty(shape, np.float32, 64)
        values[...] = np.arange(values.size).reshape(shape)
        route = dlinspect.plan(make_capsule(values, strides=strides))
        assert route.kind == ("zero-copy" if target().unit_strides_ok else "copy"), route
        for entry, convert in ENTRY_POINTS.items():
            assert_computes_like(convert(make_capsule(values, strides=strides)), values, entry)

    def test_permuted_with_another_need_is_copied_row_major(self):
        """Misaligned and permuted: one copy, row-major, uncommitted."""
        from dlinspect.testing import aligned_empty
        base = aligned_empty((3, 4), np.float32, 64, offset=16)
        base[...] = np.arange(12).reshape(3, 4)
        route = dlinspect.plan(base.T)
        assert route.kind == "copy" and not route.facts["keeps_layout"]
        j = dlinspect.to_jax(base.T)
        assert not j._committed
        assert_computes_like(j, base.T)

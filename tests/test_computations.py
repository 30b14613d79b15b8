"""Right values by computation: every entry point, every layout, every shared dtype.

The differential property of ``tests/_computations.py``: for NumPy and torch views of
every kind, what each entry point returns computes exactly as
``jnp.asarray(np.asarray(x))`` does (elementwise, indexed, reduced along each axis,
flattened, under ``jax.jit``), where it stands and moved (through a jitted function with
a ``jnp`` array; to another device and replicated in tests/multidevice/, which runs these
entry points too). ``np.asarray(result)`` alone would pass a buffer whose layout JAX
lost. The sharded entry point runs in tests/multidevice/.
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
from _computations import assert_computes_like, build, entry_points, quietly, views  # noqa: E402
from _helpers import target  # noqa: E402

#: Drawn views per entry point (about 0.5 s each on a quiet 2-core machine, seven entry
#: points: 100 keeps the full run of CI within its time).
EXAMPLES = int(100 * float(os.environ.get("DLINSPECT_AGREEMENT_SCALE", "1")))
CPU = jax.devices("cpu")[0]
#: This jaxlib gives the uncommitted arrays jnp.asarray gives (dlinspect doctor's SYMBOLS).
UNCOMMITS = target().uncommit is not dlinspect._core._same


#: Every single-device entry point: name -> convert(x).
ENTRY_POINTS = entry_points()


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
@given(h=views())
def test_one_layout_out(h):
    """Every result is row-major and, with no device asked for, uncommitted, as
    ``jnp.asarray``'s; with ``device=``, committed, as ``jax.device_put``'s."""
    make, _ = build(h)
    result = quietly(dlinspect.to_jax, make())
    placed = quietly(dlinspect.to_jax, make(), device=CPU)
    assert target().row_major(result) and target().row_major(placed)
    assert placed._committed
    if UNCOMMITS:   # (else this jaxlib's DLPack imports stay committed)
        assert not result._committed, h


def test_one_compile_for_every_layout():
    """One jitted function compiles once for results of one shape and dtype, whatever
    the input's layout (row-major, transposed, permuted, misaligned, read-only)."""
    import torch
    from dlinspect.testing import aligned_empty
    base = aligned_empty((6, 6), np.float32, 64)
    base[...] = np.arange(36).reshape(6, 6)
    odd = aligned_empty((6, 6), np.float32, 64, offset=16)
    odd[...] = base
    frozen = base.copy()
    frozen.flags.writeable = False
    inputs = [base, base.T, np.ascontiguousarray(base.T).T, torch.from_numpy(base).t(), odd,
              frozen, np.flip(base, 1)]
    step = jax.jit(lambda a: a * 2)
    results = [dlinspect.to_jax(x) for x in inputs]
    for x, r in zip(inputs, results):
        np.testing.assert_array_equal(np.asarray(step(r)), 2 * np.asarray(x))
    if UNCOMMITS:
        assert step._cache_size() == 1


class TestIssueCases:
    """The reported inputs, each standing for its kind (the property above draws the kind)."""

    def test_transpose_of_an_aligned_stack(self):
        a = dlinspect.stack([np.arange(64 * 48, dtype=np.float32).reshape(64, 48)])[0]
        j = dlinspect.to_jax(a.T)   # copied into row-major order
        assert dlinspect.plan(a.T).kind == "copy"
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
        order, 64-byte aligned; it is copied into row-major order, uncommitted (the outer
        host fallback once made a permuted import uncommitted, and every computation read
        it row-major)."""
        from dlinspect.testing import DLDeviceType, FakeProducer
        values = np.arange(24, dtype=np.float32).reshape(4, 6) - 5
        x = FakeProducer(values.T, (DLDeviceType.kDLVulkan, 0), copy_into=copy_into)
        assert dlinspect.plan(x).kind == "host-fallback"
        j = quietly(dlinspect.to_jax, x)
        assert_computes_like(j, values.T)
        if not copy_into:   # the copy is the producer's, transposed as the tensor
            assert x.served[-1].strides == values.T.strides
        if UNCOMMITS:
            assert not j._committed
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
        assert route.kind == "copy"
        j = dlinspect.to_jax(base.T)
        assert not j._committed
        assert_computes_like(j, base.T)

    def test_a_moved_transpose_computes_right(self):
        """A zero-copy import of x.T once stood committed in a permuted layout; moved by
        jax.device_put (here: into a jit with a jnp array) it must still compute right.
        tests/multidevice/ moves every drawn result to another device as well."""
        import jax.numpy as jnp
        x = dlinspect.stack([np.arange(12, dtype=np.float32).reshape(3, 4)])[0]
        r = dlinspect.to_jax(x.T)
        assert target().row_major(r)
        np.testing.assert_array_equal(np.asarray(jax.jit(jnp.add)(r, jnp.zeros((4, 3)))), x.T)

    def test_a_jax_array_in_a_permuted_layout(self):
        """What jax.dlpack.from_dlpack makes of a transpose is committed in a permuted
        layout; every entry point hands it out row-major, values right wherever it moves."""
        from dlinspect.testing import aligned_array
        a = aligned_array(np.arange(12).reshape(3, 4), np.float32)
        j = jax.dlpack.from_dlpack(a.T)
        if target().row_major(j):
            pytest.skip("this jaxlib imports a transpose row-major")
        assert dlinspect.plan(j).kind == dlinspect.plan(j, device=CPU).kind == "copy"
        for entry, convert in ENTRY_POINTS.items():
            r = convert(j)
            assert target().row_major(r), entry
            assert_computes_like(r, a.T, entry)
        with pytest.raises(dlinspect.CopyRequiredError, match="row-major"):
            dlinspect.to_jax(j, copy=False)

"""Headers at the edges of the integers: strides and addresses near 2**63 and 2**64 give
exact derived integers or a MalformedTensorError, and shapes that no array can hold are
refused before anything is taken."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")

import dlinspect  # noqa: E402
from dlinspect import MalformedTensorError, Need, plan, to_host, to_jax  # noqa: E402
from dlinspect._core import NUMPY_MAX_NDIM, capsule_name  # noqa: E402
from dlinspect.testing import make_capsule  # noqa: E402
from _helpers import aligned, target  # noqa: E402


class TestDerivedIntegers:
    """TensorInfo's derived integers are exact or an error, never wrapped (a header with
    shape (4, 1) and strides (1, 2**62) once gave byte_strides (4, 0))."""

    def test_extent_one_with_huge_stride(self):
        x = aligned(np.arange(4))
        cap = make_capsule(x, shape=(4, 1), strides=(1, 2**62))
        info = dlinspect.peek(cap)
        assert info.byte_strides == (4, 2**64)
        np.testing.assert_array_equal(to_host(cap).ravel(), np.arange(4))
        np.testing.assert_array_equal(np.asarray(to_jax(make_capsule(x, shape=(4, 1),
                                                                     strides=(1, 2**62)))).ravel(),
                                      np.arange(4))

    @pytest.mark.parametrize("stride", [2**63 - 1, -(2**63) + 1, 2**61, -(2**61)])
    def test_int64_edges(self, stride):
        x = aligned(np.arange(2))
        info = dlinspect.peek(make_capsule(x, shape=(1, 2), strides=(stride, 1)))
        assert info.byte_strides == (stride * 4, 4)
        with pytest.raises(MalformedTensorError):
            dlinspect.peek(make_capsule(x, shape=(2, 1), strides=(stride, 1)))

    def test_data_plus_offset_past_the_address_space(self):
        cap = make_capsule(address=2**64 - 8, shape=(1,), byte_offset=16, null_deleter=True)
        with pytest.raises(MalformedTensorError, match="address space"):
            dlinspect.peek(cap)


class TestShapesNoArrayHolds:
    """Issue cases: an empty tensor whose nonzero extents multiply past int64 bytes (NumPy
    raises 'array is too big', XLA aborts the process), and vector lanes that would be a
    65th dimension. Every entry point: plan says error, the conversion raises
    UnsupportedShapeError, and the capsule is still unconsumed."""

    CASES = {
        "torch (2**62, 0)": lambda: make_capsule(None, shape=(2**62, 0), dtype="float32"),
        "(2**31, 0, 2**31)": lambda: make_capsule(None, shape=(2**31, 0, 2**31), dtype="float32"),
        "(0, 2**61) float64": lambda: make_capsule(None, shape=(0, 2**61), dtype="float64"),
        "lanes 4, as many dims as NumPy holds": lambda: make_capsule(
            np.zeros(4, np.float32), shape=(1,) * NUMPY_MAX_NDIM, dtype=(2, 32, 4),
            strides=(1,) * NUMPY_MAX_NDIM),
        "lanes 2, empty": lambda: make_capsule(None, shape=(0,) + (1,) * (NUMPY_MAX_NDIM - 1),
                                               dtype=(2, 32, 2)),
    }
    if NUMPY_MAX_NDIM < 64:   # (NumPy < 2: 32 dimensions; a header may have 64)
        CASES["more dims than NumPy holds"] = lambda: make_capsule(
            np.zeros(1, np.float32), shape=(1,) * 64, dtype="float32", strides=(1,) * 64)
    CALLS = {
        "to_jax": dlinspect.to_jax, "to_host": dlinspect.to_host,
        "copy=True": lambda c: dlinspect.to_jax(c, copy=True),
        "device=": lambda c: dlinspect.to_jax(c, device=target().cpu_device),
        "batch": lambda c: dlinspect.to_jax({"a": np.ones(2), "b": c}),
    }

    @pytest.mark.parametrize("case", sorted(CASES))
    @pytest.mark.parametrize("call", sorted(CALLS))
    def test_refused_before_anything_is_taken(self, case, call):
        cap = self.CASES[case]()
        for target_name in ("jax", "host"):
            route = plan(cap, target_name)
            assert route.kind == "error" and isinstance(route.error, dlinspect.UnsupportedShapeError)
            assert route.needs & Need.SHAPE
        with pytest.raises(dlinspect.UnsupportedShapeError):
            self.CALLS[call](cap)
        assert capsule_name(cap) in ("dltensor", "dltensor_versioned")

    @pytest.mark.parametrize("case", sorted(CASES))
    def test_stack_of_a_producer_of_it(self, case):
        class Producer:
            def __dlpack__(self, **kwargs):
                return TestShapesNoArrayHolds.CASES[case]()

            def __dlpack_device__(self):
                return (1, 0)
        with pytest.raises(dlinspect.UnsupportedShapeError, match="element 0"):
            dlinspect.stack([Producer()])

    def test_a_large_empty_shape_that_fits_converts(self):
        cap = make_capsule(None, shape=(2**40, 0), dtype="float32")
        assert plan(cap).kind == "zero-copy"
        assert to_jax(cap).shape == (2**40, 0)


@pytest.mark.skipif(not hasattr(__import__("os"), "sysconf") or __import__("sys").platform != "linux",
                    reason="maps and unmaps pages with libc's mmap and munmap (Linux)")
def test_memory_with_an_unmapped_page_between_its_first_and_last_byte_is_malformed():
    """A bare capsule whose elements lie on three pages, the middle one unmapped (its first
    and last bytes are mapped): every entry point refuses it before reading a byte, and
    nothing is consumed."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = mmap.PAGESIZE
    base = libc.mmap(None, 3 * page, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert base not in (None, ctypes.c_void_p(-1).value)
    try:
        assert libc.munmap(base + page, page) == 0
        for cap in (make_capsule(address=base, shape=(3,), strides=(page // 4,), dtype=np.float32),
                    make_capsule(address=base, shape=(3,), strides=(page // 8,), dtype=np.int64)):
            route = plan(cap)
            assert route.kind == "error" and Need.UNMAPPED in route.needs
            for convert in (to_jax, lambda c: to_jax({"x": c}), to_host,
                            lambda c: to_jax(c, copy=True)):
                with pytest.raises(MalformedTensorError, match="not mapped"):
                    convert(cap)
                assert capsule_name(cap) == "dltensor_versioned"
    finally:
        libc.munmap(base, page)
        libc.munmap(base + 2 * page, page)

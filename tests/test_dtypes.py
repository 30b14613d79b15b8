"""Dtypes on the way to JAX and to host memory: 64-bit values with JAX's x64 off (narrowed
as JAX narrows them, with a warning), dtypes JAX cannot hold, vector lanes, booleans,
bfloat16 and float8, packed sub-byte types, ml_dtypes arrays, empty tensors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")

import dlinspect  # noqa: E402
from dlinspect import DLDeviceType as D  # noqa: E402
from dlinspect import (  # noqa: E402
    CopyRequiredError,
    DLInspectWarning,
    Need,
    UnsupportedDTypeError,
    plan,
    to_host,
    to_jax,
)
from dlinspect import _core as djax  # noqa: E402
from dlinspect._core import capsule_name  # noqa: E402
from dlinspect.testing import DeleterCounter, FakeProducer, aligned_empty, make_capsule  # noqa: E402
from _helpers import aligned, buffer_pointer  # noqa: E402
from _versions import enable_x64, torch_exports_float8  # noqa: E402


class TestNarrowing:
    """64-bit dtypes with JAX's x64 off: narrowed to 32 bits as JAX narrows them, never
    silently: a warning names the dtype and the two ways out."""

    @pytest.mark.parametrize("dtype, values", [
        (np.float64, [1 / 3, 1e300, -1e-300, np.nan, 2.0**33 + 5]),
        (np.int64, [1, 2**33 + 5, -(2**40) - 3, 7]),
        (np.uint64, [1, 2**63 + 2**33 + 5, 7]),
        (np.complex128, [1 / 3 + 1e300j, -2.5]),
    ])
    def test_x64_narrowing_matches_jax(self, dtype, values, import_path):
        """float64, int64, uint64 and complex128 with x64 off, which JAX narrows silently
        (values above 2**32 change): JAX's own result, with a warning naming the dtype
        and how to keep 64 bits (jax_enable_x64); copy=False refuses the narrowing."""
        x = aligned(values, dtype)
        assert plan(x).needs & Need.NARROW
        with pytest.warns(DLInspectWarning, match=r'jax_enable_x64", True'):
            ours = to_jax(x)
        expected = jax.dlpack.from_dlpack(x)
        assert ours.dtype == expected.dtype
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(expected))
        with pytest.raises(CopyRequiredError, match="narrows"):
            to_jax(x, copy=False)

    def test_narrowing_warning_points_at_the_caller(self):
        x = aligned([1, 2], np.int64)
        for call in (lambda: to_jax(x), lambda: to_jax(x), lambda: to_jax({"a": [x]}),
                     lambda: to_jax(x[::-1])):
            with pytest.warns(DLInspectWarning) as record:
                call()
            assert {w.filename for w in record} == {__file__}
            # the two ways out: 64 bits, or the narrowing asked for, without the warning
            assert all('jax_enable_x64' in str(w.message) and 'narrow="ok"' in str(w.message)
                       for w in record)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert to_jax(x, narrow="ok").dtype == np.int32

    def test_narrowing_warns_on_a_thread_without_python_frames(self, monkeypatch):
        # A thread C started runs to_jax with no Python frame at all (list.extend of a map):
        # the warning is shown, not a ValueError from sys._getframe ("call stack is not deep
        # enough") raised out of the conversion.
        import _thread
        import time
        x, out, errors = aligned([1, 2], np.int64), [], []
        monkeypatch.setattr("sys.unraisablehook", lambda info: errors.append(info.exc_value))
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            _thread.start_new_thread(out.extend, (map(to_jax, [x]),))
            deadline = time.monotonic() + 30
            while not (out or errors) and time.monotonic() < deadline:
                time.sleep(0.01)
        assert errors == [] and [a.tolist() for a in out] == [[1, 2]]
        assert [w.category for w in record] == [DLInspectWarning]

    def test_x64_enabled_keeps_64_bits(self):
        with enable_x64(True):
            x = aligned([2**40], np.int64)
            assert plan(x).needs == 0
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                y = to_jax(x)
            assert y.dtype == np.int64 and int(y[0]) == 2**40

    def test_narrowing_keeps_subnormals_as_jnp_asarray(self):
        x = aligned([1e-40, -1e-45, 1e-39, 3.0], np.float64)
        with pytest.warns(DLInspectWarning):
            y = np.asarray(to_jax(x))
        assert y.view(np.uint32).tolist() == np.asarray(jax.numpy.asarray(x)).view(np.uint32).tolist()

    def test_large_narrowing_goes_through_numpy(self):
        x = aligned(np.arange(400_000) - 2**40, np.int64)   # 3.2 MB > the C copy's 1 MiB
        expected = np.asarray(jax.numpy.asarray(x))
        for _ in range(2):
            with pytest.warns(DLInspectWarning):
                np.testing.assert_array_equal(np.asarray(to_jax(x)), expected)


class TestDtypes:
    @pytest.mark.parametrize("dtype", [(15, 6, 1), (3, 64, 1), (99, 8, 1)])
    def test_dtypes_jax_cannot_hold(self, dtype):
        cap = make_capsule(aligned_empty((8,), np.uint8, 64), shape=(2,), dtype=dtype)
        match = f"code={dtype[0]}, bits={dtype[1]}, lanes={dtype[2]}"
        if dtype == (15, 6, 1) and djax.jax_caps()._probe_hold(15, 6) is None:
            # jax >= 0.11 holds float6 arrays: then it is the packing that is refused.
            match = "packs 6-bit elements across byte boundaries"
        with pytest.raises(UnsupportedDTypeError, match=match):
            to_jax(cap)
        assert capsule_name(cap) == "dltensor_versioned"

    def test_an_opaque_handle_is_not_advised_a_conversion(self):
        """An opaque handle's bytes are no values: no dtype conversion (nor ml_dtypes)
        is advised, in to_jax and to_host alike."""
        for route in (plan(make_capsule(np.zeros(16, np.uint8), shape=(2,), dtype=(3, 64, 1))),
                      plan(make_capsule(np.zeros(16, np.uint8), shape=(2,), dtype=(3, 64, 1)),
                           "host")):
            text = str(route.error)
            assert "read it with the library that made it" in text, text
            assert "astype" not in text and "ml_dtypes" not in text, text

    def test_vector_lanes_become_a_trailing_axis(self):
        """A vector dtype (float32 with 4 lanes, shape (3,)), which to_jax once sent to
        to_host and to_host refused blaming ml_dtypes: float32 (3, 4) from both."""
        x = aligned(np.arange(12).reshape(3, 4))
        cap = lambda: make_capsule(x, shape=(3,), dtype=(2, 32, 4))  # noqa: E731
        info = dlinspect.peek(cap())
        assert info.dtype_name == "float32x4" and info.nbytes == 48
        host = to_host(cap())
        assert host.dtype == np.float32 and host.shape == (3, 4) and host.ctypes.data == x.ctypes.data
        np.testing.assert_array_equal(host, x)
        route = plan(cap())
        assert route.kind == "zero-copy" and route.needs == Need.LANES and "trailing axis" in route.reason
        y = to_jax(cap())
        assert y.shape == (3, 4) and buffer_pointer(y) == x.ctypes.data
        np.testing.assert_array_equal(np.asarray(y), x)
        # strided vectors: a copy, the lanes still an axis
        strided = make_capsule(x, shape=(2,), strides=(2,), dtype=(2, 32, 4))
        assert plan(strided).kind == "copy"
        np.testing.assert_array_equal(np.asarray(to_jax(strided)), x[::2])
        np.testing.assert_array_equal(to_host(make_capsule(x, shape=(2,), strides=(2,),
                                                           dtype=(2, 32, 4))), x[::2])
        # on a device without a JAX backend: through the producer's host copy
        v = FakeProducer(np.zeros(3, np.float32), (D.kDLVulkan, 0), dtype=(2, 32, 4))
        assert plan(v).kind == "host-fallback"

    def test_sub_byte_lanes_are_refused_with_the_reason(self):
        cap = make_capsule(np.zeros(4, np.uint8), shape=(4,), dtype=(17, 4, 2))  # torch's fp4x2
        with pytest.raises(UnsupportedDTypeError, match="share each byte"):
            to_host(cap)
        with pytest.raises(UnsupportedDTypeError) as err:
            to_jax(cap)
        assert "to_host" not in str(err.value)   # never point at what refuses too
        assert "ml_dtypes" not in str(plan(cap, "host").error)

    def test_bool_every_route(self, torch, import_path):
        """Booleans (NumPy's, and a torch comparison's), the type code older consumers
        failed on: the dtype name bool, and the values on every route."""
        b = np.array([True, False, True, True])
        np.testing.assert_array_equal(np.asarray(to_jax(b)), b)
        np.testing.assert_array_equal(np.asarray(to_jax(b[::2])), b[::2])
        np.testing.assert_array_equal(to_host(b), b)
        t = torch.tensor([1, 2, 3]) > 2
        assert dlinspect.peek(t).dtype_name == "bool"
        np.testing.assert_array_equal(np.asarray(to_jax(t)), [False, False, True])
        v = FakeProducer(b, device=(D.kDLVulkan, 0))
        np.testing.assert_array_equal(np.asarray(to_jax(v)), b)

    def test_bfloat16_float8_to_host(self, torch, ml_dtypes):
        """bfloat16 and float8_e4m3fn torch tensors, which numpy.from_dlpack refuses
        ("Unsupported dtype"): to_host gives ml_dtypes arrays with the same bits."""
        t = torch.arange(3, dtype=torch.bfloat16)
        h = to_host(t)
        assert h.dtype == ml_dtypes.bfloat16 and h.ctypes.data == t.data_ptr()
        np.testing.assert_array_equal(h.view(np.uint16), t.view(torch.int16).numpy().view(np.uint16))
        if not torch_exports_float8():
            pytest.skip(f"torch {torch.__version__} does not export float8 through DLPack")
        f = torch.tensor([0.5, -2.0, 448.0]).to(torch.float8_e4m3fn)
        h8 = to_host(f)
        assert h8.dtype == ml_dtypes.float8_e4m3fn
        np.testing.assert_array_equal(h8.view(np.uint8), f.view(torch.uint8).numpy())
        np.testing.assert_array_equal(np.asarray(to_jax(f)).view(np.uint8), f.view(torch.uint8).numpy())

    def test_packed_int4_to_host(self, ml_dtypes):
        cap = make_capsule(np.array([0x21, 0xF7], np.uint8), shape=(4,), dtype=(0, 4))
        assert plan(cap, "host").kind == "copy"
        np.testing.assert_array_equal(to_host(cap).astype(np.int8), [1, 2, 7, -1])
        padded = make_capsule(np.array([3, -2], np.int8), shape=(2,), dtype=(0, 4),
                              flags=dlinspect.testing.FLAG_IS_SUBBYTE_TYPE_PADDED)
        h = to_host(padded)
        assert h.dtype == ml_dtypes.int4 and h.astype(np.int8).tolist() == [3, -2]

    def test_packed_that_cannot_be_unpacked_leaves_capsule_unconsumed(self):
        for kw in (dict(shape=(2, 3), strides=(1, 2), dtype=(0, 4)),   # packed, strided
                   dict(shape=(5,), dtype=(15, 6))):                   # packed across bytes
            counter = DeleterCounter()
            cap = make_capsule(aligned_empty((8,), np.uint8, 64), counter=counter, **kw)
            assert plan(cap, "host").kind == "error"
            with pytest.raises(UnsupportedDTypeError, match="unpacks only C-contiguous 1-, 2- and 4-bit"):
                to_host(cap)
            assert capsule_name(cap) == "dltensor_versioned" and counter.calls == 0
            del cap
            assert counter.calls == 1

    def test_numpy_ml_dtypes_arrays(self, ml_dtypes):
        x = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(2, 3)
        assert dlinspect.peek(x).dtype_name == "bfloat16"   # NumPy refuses to export it
        assert plan(x).kind in ("zero-copy", "copy")
        assert to_jax(x).dtype == ml_dtypes.bfloat16 and to_jax(x).tolist() == x.astype(np.float32).tolist()
        assert to_host(x[:, ::2]).tolist() == x[:, ::2].astype(np.float32).tolist()

    def test_empty_tensors(self):
        for x in (np.zeros((0, 3), np.float32), np.zeros((2, 0), np.int64),
                  aligned_empty((0,), np.float32, 64, offset=4)):
            route = plan(x)
            assert route.kind == "zero-copy" and route.needs & Need.EMPTY
            if x.dtype == np.int64:   # its dtype still narrows (x64 off): the warning says so
                assert route.warning is not None
                with pytest.warns(dlinspect.DLInspectWarning, match="int64 is narrowed"):
                    y = to_jax(x, copy=False)
                assert y.dtype == np.int32
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    y = to_jax(x, copy=False)
            assert y.shape == x.shape
            assert to_host(x).shape == x.shape

"""plan / explain / to_jax / to_host: the routes of host memory, their values and copies.

Every case of the project's list of real interop failures is a test (marked "C<n>"):
here, in test_devices.py, test_producers.py, test_peek.py, test_batches.py,
test_multiprocess.py or tests/interop/; each stands for its kind.
"""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")

import dlinspect  # noqa: E402
from dlinspect import DLDeviceType as D  # noqa: E402
from dlinspect import (  # noqa: E402
    CopyRequiredError,
    DLInspectWarning,
    MalformedTensorError,
    Need,
    UnsupportedDTypeError,
    plan,
    to_host,
    to_jax,
)
from dlinspect import _core  # noqa: E402
from dlinspect import _core as djax  # noqa: E402
from dlinspect._core import NUMPY_MAX_NDIM, capsule_name  # noqa: E402
from dlinspect._options import COPY_NEVER  # noqa: E402
from dlinspect.testing import DeleterCounter, FakeProducer, aligned_empty, make_capsule  # noqa: E402
from _helpers import aligned, buffer_pointer, read_only, target  # noqa: E402
from _computations import assert_computes_like  # noqa: E402
from _versions import (  # noqa: E402
    enable_x64, torch_exports_float8)


class TestZeroCopy:
    def test_aligned_numpy(self, import_path):
        x = aligned(np.arange(12).reshape(3, 4))
        route = plan(x)
        assert route.kind == "zero-copy" and route.zero_copy and route.copy_bytes == 0
        assert route.needs == 0
        y = to_jax(x)
        assert isinstance(y, jax.Array) and buffer_pointer(y) == x.ctypes.data
        np.testing.assert_array_equal(np.asarray(y), x)

    def test_default_options_by_value_take_the_checked_way_to_the_same_route(self):
        """The front door compares the defaults by identity; options equal to them but
        other objects (a string built at run time) are checked, with the same result,
        and a wrong one is refused before anything is exported."""
        x = aligned(np.arange(12).reshape(3, 4))
        host = "".join(["ho", "st"])
        y = to_jax(x, fallback=host, readonly="".join(["co", "py"]), narrow=str("warn"))
        assert buffer_pointer(y) == x.ctypes.data
        with pytest.raises(ValueError, match="fallback must be 'host' or 'raise'"):
            to_jax(x, fallback="hosts")
        with pytest.raises(ValueError, match="copy must be None, True or False"):
            to_jax(x, copy=0)

    def test_torch_tensor(self, torch, import_path):
        t = torch.arange(12.0).reshape(3, 4)
        y = to_jax(t)
        assert buffer_pointer(y) == t.data_ptr()
        np.testing.assert_array_equal(np.asarray(y), t.numpy())

    @pytest.mark.parametrize("make", [
        lambda torch: torch.arange(12.0).reshape(3, 4).t(),
        lambda torch: torch.arange(24.0).reshape(2, 3, 4).permute(2, 0, 1),
    ])
    def test_transposes(self, torch, make, import_path):  # C13
        """Copied into row-major order: JAX views a permuted layout only as an array
        committed in that layout, which jax.device_put moves wrong."""
        t = make(torch)
        assert plan(t).kind == "copy" and dlinspect.peek(t).is_compact
        y = to_jax(t)
        assert target().row_major(y)
        assert_computes_like(y, t.numpy())

    def test_numpy_transpose(self):  # C13
        x = aligned(np.arange(6.0).reshape(2, 3)).T
        np.testing.assert_array_equal(np.asarray(to_jax(x)), x)

    def test_bare_capsule(self, import_path):  # C11
        x = aligned(np.arange(3.0, dtype=np.float32))
        cap = x.__dlpack__()
        y = to_jax(cap)
        np.testing.assert_array_equal(np.asarray(y), [0, 1, 2])
        assert capsule_name(cap) == "used_dltensor"

    def test_bare_versioned_capsule_through_adapter(self, import_path):
        counter = DeleterCounter()
        x = aligned([1, 2, 3])
        cap = make_capsule(x, counter=counter)
        y = to_jax(cap)
        assert capsule_name(cap) == "used_dltensor_versioned" and counter.calls == 0
        assert buffer_pointer(y) == x.ctypes.data
        del y
        gc.collect()
        assert counter.calls == 1

    def test_device_argument(self):
        dev = jax.devices("cpu")[0]
        x = aligned([1, 2])
        assert to_jax(x, device=dev).devices() == {dev}
        sharding = jax.sharding.SingleDeviceSharding(dev)
        assert to_jax(x, device=sharding).devices() == {dev}


class TestArraysLikeJaxOwn:
    """With no device asked for, to_jax gives what jnp.asarray gives: an uncommitted array
    on the memory's own device, so a jitted function fed both compiles once; with a device
    (or a sharding), a committed one, as jax.device_put(x, device) gives. Every route."""

    @staticmethod
    def _sources(torch):
        x = aligned(np.arange(12.0).reshape(3, 4))
        misaligned = aligned_empty((3, 4), np.float32, 64, offset=16)
        misaligned[...] = x
        return {
            "numpy": x,                                        # put, the array itself
            "torch": torch.arange(12.0).reshape(3, 4),         # put, a view of the capsule
            "bare capsule": make_capsule(x),
            "torch transposed": torch.arange(12.0).reshape(4, 3).t(),   # import (or copy)
            "misaligned": misaligned,                          # a copy in C
            "strided": aligned(np.arange(24.0).reshape(3, 8))[:, ::2],
            "read-only": read_only(aligned(np.arange(12.0).reshape(3, 4))),
            "float64, x64 off": np.arange(12.0).reshape(3, 4),  # narrowed in the copy
            "foreign device": FakeProducer(np.arange(12.0, dtype=np.float32).reshape(3, 4),
                                           (D.kDLVulkan, 0)),  # host fallback
            "empty": np.zeros((0, 4), np.float32),
            "big-endian": np.arange(12.0, dtype=">f4").reshape(3, 4),   # NumPy's own copy
        }

    def test_no_device_is_uncommitted_and_compiles_once(self, torch):
        if not target().direct:
            pytest.skip("the public API is forced: arrays of from_dlpack stay committed")
        for name, src in self._sources(torch).items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DLInspectWarning)
                y = to_jax(src)
            mine = jax.numpy.asarray(np.asarray(y))
            assert y.devices() == mine.devices() and y.aval == mine.aval, name
            assert y._committed is False and mine._committed is False, name
            step = jax.jit(lambda a: a * 2)
            step(y)
            step(mine)
            assert step._cache_size() == 1, name

    def test_a_device_commits(self, torch):
        dev = jax.devices("cpu")[0]
        for name, src in self._sources(torch).items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DLInspectWarning)
                y = to_jax(src, device=dev)
            assert y._committed is True and y.devices() == {dev}, name

    def test_a_batch(self, torch):
        if not target().direct:
            pytest.skip("the public API is forced: arrays of from_dlpack stay committed")
        batch = {"x": torch.ones(4, 3), "y": aligned(np.arange(4), np.int32),
                 "t": torch.arange(12.0).reshape(3, 4).t()}
        out, routes = to_jax(batch), plan(batch)
        # uncommitted, as jnp.asarray's; a permuted order copied into row-major order
        assert not any(a._committed for a in out.values())
        assert routes["t"].kind == "copy" and routes["t"].needs & (Need.PERMUTED | Need.LAYOUT)
        assert_computes_like(out["t"], batch["t"].numpy())
        dev = jax.devices("cpu")[0]
        assert all(a._committed is True for a in to_jax(batch, device=dev).values())


class TestCopies:
    def test_slice_with_gaps(self, import_path):  # C3
        x = np.arange(6, dtype=np.float32).reshape(2, 3)[:, :2]
        route = plan(x)
        assert route.kind == "copy" and "gaps" in route.reason and route.copy_bytes == 16
        assert route.needs & Need.LAYOUT
        np.testing.assert_array_equal(np.asarray(to_jax(x)), x)
        with pytest.raises(CopyRequiredError, match=r"strides \(3, 1\)"):
            to_jax(x, copy=False)
        with pytest.raises(ValueError):
            to_jax(x, copy=False)

    def test_broadcast(self, torch, import_path):  # C4
        t = torch.tensor([1.0, 2.0]).expand(3, 2)
        assert "broadcast" in plan(t).reason
        np.testing.assert_array_equal(np.asarray(to_jax(t)), t.numpy())
        b = np.broadcast_to(np.float32(7), (3, 4))
        np.testing.assert_array_equal(np.asarray(to_jax(b)), np.full((3, 4), 7, np.float32))

    def test_negative_strides(self, import_path):  # C5
        x = np.arange(8, dtype=np.float32)[::-1]
        assert "negative strides" in plan(x).reason
        np.testing.assert_array_equal(np.asarray(to_jax(x)), x)

    def testread_only(self, import_path):  # C6, C25
        """NumPy < 2.1 cannot export read-only arrays at all: dlinspect then describes
        them itself (buffer protocol, READ_ONLY flag); the outcome is the same."""
        x = aligned([1, 2, 3])
        x.flags.writeable = False
        assert dlinspect.peek(x).read_only is True
        route = plan(x)
        assert route.kind == "copy" and "read-only" in route.reason and route.needs == Need.READ_ONLY
        y = to_jax(x)
        np.testing.assert_array_equal(np.asarray(y), x)
        assert buffer_pointer(y) != x.ctypes.data
        with pytest.raises(CopyRequiredError, match="read-only"):
            to_jax(x, copy=False)
        shared = to_jax(x, readonly="share")
        assert plan(x, readonly="share").kind == "zero-copy"
        assert buffer_pointer(shared) == x.ctypes.data
        assert "pass readonly='share' to import it without a copy" in route.reason
        # Read-only and strided: sharing lifts one reason, and the words say so.
        both = read_only(aligned(np.arange(8.0)))[::2]
        assert "readonly='share' lifts this reason, not the others" in plan(both).reason
        assert plan(both, readonly="share").kind == "copy"

    def test_misaligned(self, import_path):  # C7
        align = target().cpu_align
        if align <= 16:
            pytest.skip(f"XLA:CPU here views {align}-byte aligned memory: nothing is misaligned")
        x = aligned_empty((3, 4), np.float32, alignment=64, offset=16)
        x[...] = 1
        route = plan(x)
        assert route.kind == "copy" and "16-byte aligned" in route.reason
        assert f"{align}-byte" in route.reason and route.needs == Need.ALIGN
        np.testing.assert_array_equal(np.asarray(to_jax(x)), x)
        with pytest.raises(CopyRequiredError, match="16-byte aligned.*aligned_empty"):
            to_jax(x, copy=False)

    def test_copy_true(self, import_path):
        x = aligned([1, 2])
        y = to_jax(x, copy=True)
        assert plan(x, copy=True).kind == "copy"
        assert buffer_pointer(y) != x.ctypes.data

    @pytest.mark.parametrize("dtype, values", [
        (np.float64, [1 / 3, 1e300, -1e-300, np.nan, 2.0**33 + 5]),
        (np.int64, [1, 2**33 + 5, -(2**40) - 3, 7]),
        (np.uint64, [1, 2**63 + 2**33 + 5, 7]),
        (np.complex128, [1 / 3 + 1e300j, -2.5]),
    ])
    def test_x64_narrowing_matches_jax(self, dtype, values, import_path):  # C15
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

    def test_copies_are_aligned_as_xla_wants(self):
        """Copies are aligned to the probed XLA:CPU alignment (at least 64 bytes)."""
        align = max(target().cpu_align, 64)
        cases = [np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]]           # strided
        if target().cpu_align > 4:   # (jaxlib 0.4 views any alignment: nothing to copy)
            cases += [aligned_empty((4, 8), np.float32, 64, offset=4),            # C copy
                      aligned_empty((1024, 1024), np.float32, 64, offset=4)]      # NumPy copy
        for x in cases:
            x[...] = 1
            y = to_jax(x)
            assert plan(x).kind == "copy" and buffer_pointer(y) % align == 0


class TestCopiesInC:
    """Host tensors of any size and layout whose only needs are ALIGN, NARROW, READ_ONLY
    and LAYOUT are copied by the core itself (``_core.to_jax_fast``) in one pass, the
    source freed at once."""

    @pytest.mark.parametrize("dtype, values", [
        (np.float64, [1 / 3, 1e300, -1e-300, np.nan]),
        (np.int64, [1, 2**33 + 5, -(2**40) - 3]),
        (np.uint64, [1, 2**63 + 2**33 + 5]),
        (np.complex128, [1 / 3 + 1e300j, -2.5]),
    ])
    def test_narrowing_copy(self, dtype, values):
        x = aligned(values, dtype)[None, :].repeat(3, axis=0)
        x = x.T   # compact, F order: narrowed and made row-major in one pass
        expected = np.asarray(jax.dlpack.from_dlpack(np.ascontiguousarray(x)))
        counter = DeleterCounter()
        cap = make_capsule(x, counter=counter)
        got = _core.to_jax_fast(cap, target(), COPY_NEVER)   # copy=False: not here
        assert type(got) is tuple and got[0] is cap and got[2] & Need.NARROW
        with pytest.warns(DLInspectWarning, match="narrowed"):
            y = _core.to_jax_fast(cap, target())
        assert isinstance(y, jax.Array) and y.dtype == expected.dtype
        assert counter.calls == 1 and capsule_name(cap).startswith("used_")  # freed after the copy
        x[...] = 0
        np.testing.assert_array_equal(np.asarray(y), expected)

    @pytest.mark.parametrize("offset", [1, 3, 4])
    def test_narrowing_copy_of_misaligned_memory(self, offset):
        """UBSan found misaligned double loads in the C narrowing copy (regression input)."""
        for dtype in (np.float64, np.int64, np.complex128):
            x = aligned_empty((5,), dtype, 64, offset=offset)
            x[...] = np.arange(5) * 1.5 if dtype is not np.int64 else np.arange(5) - 2**40
            expected = np.asarray(jax.dlpack.from_dlpack(np.ascontiguousarray(x)))
            with pytest.warns(DLInspectWarning):
                y = _core.to_jax_fast(make_capsule(x), target())
            assert isinstance(y, jax.Array)
            np.testing.assert_array_equal(np.asarray(y), expected)

    def test_misaligned_copy(self):
        if target().cpu_align <= 16:
            pytest.skip("XLA:CPU here views 16-byte aligned memory")
        counter = DeleterCounter()
        src = aligned_empty((4, 8), np.float32, 64, offset=16)
        src[...] = np.arange(32).reshape(4, 8)
        cap = make_capsule(src, counter=counter)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            y = _core.to_jax_fast(cap, target())
        assert isinstance(y, jax.Array) and buffer_pointer(y) % 64 == 0
        assert buffer_pointer(y) != src.ctypes.data and counter.calls == 1
        src[...] = -1
        np.testing.assert_array_equal(np.asarray(y), np.arange(32).reshape(4, 8))

    @pytest.mark.parametrize("make, need", [
        (lambda: np.zeros((0,), np.float32), Need.EMPTY),
        (lambda: make_capsule(np.ones(8, np.float32), dtype=(2, 32, 2), shape=(4,)), Need.LANES),
        (lambda: np.broadcast_to(np.float32(1), (10**6, 10**6)), Need.LAYOUT),  # 4 TB: no room
    ])
    def test_other_needs_go_back_unconsumed(self, make, need):
        x = make()
        cap, info, needs = _core.to_jax_fast(x, target())
        assert capsule_name(cap) in ("dltensor_versioned", "dltensor") and needs & need
        assert info.shape == getattr(x, "shape", info.shape)

    @pytest.mark.parametrize("make, need", [
        (lambda: aligned(np.arange(16.0).reshape(4, 4))[:, ::2], Need.LAYOUT),
        (lambda: aligned(np.arange(16.0).reshape(4, 4))[::-1, ::3], Need.LAYOUT),
        (lambda: np.broadcast_to(np.arange(3.0), (4, 3)), Need.LAYOUT),
        (lambda: read_only(aligned(np.arange(300_000.0))), Need.READ_ONLY),   # over 1 MiB
    ])
    def test_any_size_and_layout_is_copied_in_c(self, make, need):
        x = make()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DLInspectWarning)
            y = _core.to_jax_fast(x, target())
        assert isinstance(y, jax.Array) and buffer_pointer(y) % 64 == 0
        np.testing.assert_array_equal(np.asarray(y), x.astype(y.dtype))
        assert plan(x).kind == "copy" and plan(x).needs & need

    def test_small_read_only_memory_is_copied_in_c(self):
        # Read-only batches (Ray's, tf.data's as_numpy_iterator) copy like misaligned ones.
        x = read_only(aligned(np.arange(8.0), np.float32))
        y = _core.to_jax_fast(x, target())
        assert isinstance(y, jax.Array) and buffer_pointer(y) != x.ctypes.data
        np.testing.assert_array_equal(np.asarray(y), np.arange(8.0))
        assert plan(x).kind == "copy" and plan(x).needs == Need.READ_ONLY

    def test_x64_is_read_per_call(self):
        x = aligned(np.arange(4), np.float64)
        with enable_x64(True):
            y = _core.to_jax_fast(x, target(), COPY_NEVER)
            assert isinstance(y, jax.Array) and y.dtype == np.float64
        assert type(_core.to_jax_fast(x, target(), COPY_NEVER)) is tuple


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

    def test_vector_lanes_become_a_trailing_axis(self):  # C22
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

    def test_bool_every_route(self, torch, import_path):  # C8
        b = np.array([True, False, True, True])
        np.testing.assert_array_equal(np.asarray(to_jax(b)), b)
        np.testing.assert_array_equal(np.asarray(to_jax(b[::2])), b[::2])
        np.testing.assert_array_equal(to_host(b), b)
        t = torch.tensor([1, 2, 3]) > 2
        assert dlinspect.peek(t).dtype_name == "bool"
        np.testing.assert_array_equal(np.asarray(to_jax(t)), [False, False, True])
        v = FakeProducer(b, device=(D.kDLVulkan, 0))
        np.testing.assert_array_equal(np.asarray(to_jax(v)), b)

    def test_bfloat16_float8_to_host(self, torch, ml_dtypes):  # C9
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


class TestDerivedIntegers:
    """TensorInfo's derived integers are exact or an error, never wrapped (C23)."""

    def test_extent_one_with_huge_stride(self):  # C23
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


class TestPickling:
    """Every public result type pickles: a plan travels to another process (a loader's
    worker logs it) with its words, header, needs and bytes; devices are found again by
    platform and id."""

    def routes(self):
        x = aligned(np.arange(16, dtype=np.float32).reshape(4, 4))
        batch = plan({"x": x, "id": "a"})
        return {
            "zero-copy": plan(x), "copy": plan(x[:, ::2]), "narrow": plan(np.arange(3)),
            "host-fallback": plan(FakeProducer(np.ones(3), (D.kDLVulkan, 0))),
            "error": plan(FakeProducer(np.ones(3), (D.kDLVulkan, 0)), fallback="raise"),
            "numpy-copy": plan(np.ones(3, ">f4")), "untouched": batch["id"],
            "host": plan(x, "host"),
        }

    @pytest.mark.parametrize("kind", ["zero-copy", "copy", "narrow", "host-fallback", "error",
                                      "numpy-copy", "untouched", "host"])
    def test_route_pickles(self, kind):
        import pickle
        route = self.routes()[kind]
        back = pickle.loads(pickle.dumps(route))
        for name in ("kind", "action", "target", "needs", "copy_bytes", "info", "reason",
                     "warning", "key_path", "jax_device", "zero_copy", "import_type"):
            assert getattr(back, name) == getattr(route, name), name
        assert type(back.error) is type(route.error)
        assert str(back.error) == str(route.error)
        assert repr(back) == repr(route)

    def test_other_results_pickle(self):
        import pickle
        x = aligned(np.ones((2, 3), np.float32))
        info = dlinspect.peek(x)
        loader = dlinspect.prefetch_to_jax([{"x": x}] * 3)
        assert len(list(loader)) == 3
        for obj in (info, info.dtype, Need.LAYOUT | Need.ALIGN, D.kDLCUDAHost, loader.report):
            back = pickle.loads(pickle.dumps(obj))
            assert type(back) is type(obj) and str(back) == str(obj)
        errors = [getattr(dlinspect, n) for n in dlinspect.__all__ if n.endswith("Error")]
        for error in errors:
            back = pickle.loads(pickle.dumps(error("what was found")))
            assert type(back) is error and str(back) == "what was found"


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


@pytest.mark.parametrize("x", ["abc", 3, None, {"x": np.ones(3)}, [np.ones(2)],
                               np.array(["a"]), np.array([object()])],
                         ids=["str", "int", "None", "dict", "list", "str-array", "object-array"])
def test_plan_to_host_of_what_is_not_one_tensor_is_what_to_host_raises(x):
    """to_host takes one tensor: plan(x, "host") of anything else is the error route of
    what to_host raises for it, not an "untouched" leaf."""
    route = plan(x, "host")
    with pytest.raises(type(route.error)) as raised:
        dlinspect.to_host(x)
    assert route.kind == "error" and str(raised.value) == str(route.error)


def test_host_fallback_facts_differ_by_target_only_where_they_should():
    # Device memory routed through the producer's host copy: the JAX route carries the
    # narrowing fact (None here: float32), the host route has none to carry.
    x = FakeProducer(np.zeros(4, np.float32), (D.kDLCUDA, 0))
    to_host_route = dlinspect.plan(x, target="host")
    to_jax_route = dlinspect.plan(x)
    assert to_host_route.action == to_jax_route.action == "producer-copy"
    assert "narrow" not in to_host_route.facts
    assert to_jax_route.facts["narrow"] is None

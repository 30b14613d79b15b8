"""plan / explain / to_jax / to_host: every route, its values, its errors, its lifetimes.

Every case of the project's list of real interop failures is a test (marked "C<n>"):
here, in test_peek.py, test_batches.py, test_multiprocess.py or tests/interop/; each
stands for its kind.
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
    CapsuleConsumedError,
    CopyRequiredError,
    DLInspectWarning,
    MalformedTensorError,
    Need,
    NotDLPackError,
    ProducerError,
    UnsupportedDeviceError,
    UnsupportedDTypeError,
    explain,
    plan,
    to_host,
    to_jax,
)
from dlinspect import _core  # noqa: E402
from dlinspect import _jaxcaps as djax  # noqa: E402
from dlinspect._core import capsule_name  # noqa: E402
from dlinspect._options import COPY_NEVER  # noqa: E402
from dlinspect.testing import DeleterCounter, FakeProducer, aligned_array, aligned_empty, make_capsule  # noqa: E402
from _versions import (  # noqa: E402
    NUMPY_TAKES_VERSIONED, NUMPY_VERSIONED, enable_x64, torch_exchange_api, torch_exports_float8)


@pytest.fixture(params=["direct", "public"])
def import_path(request):
    """Run a test through jaxlib's import function and through jax.dlpack.from_dlpack."""
    djax.force_public_api(request.param == "public")
    assert djax.caps().direct == (request.param == "direct")
    yield request.param
    djax.force_public_api(False)


def aligned(values, dtype=np.float32):
    return aligned_array(values, dtype)


def buffer_pointer(arr):
    return arr.addressable_data(0).unsafe_buffer_pointer()


def target():
    return djax.caps().target


class TestZeroCopy:
    def test_aligned_numpy(self, import_path):
        x = aligned(np.arange(12).reshape(3, 4))
        route = plan(x)
        assert route.kind == "zero-copy" and route.zero_copy and route.copy_bytes == 0
        assert route.needs == 0
        y = to_jax(x)
        assert isinstance(y, jax.Array) and buffer_pointer(y) == x.ctypes.data
        np.testing.assert_array_equal(np.asarray(y), x)

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
        """Viewed as they are where the installed jaxlib reads permuted layouts right
        (>= 0.8); older ones read every layout as row-major: a copy into C order."""
        t = make(torch)
        assert plan(t).kind == ("zero-copy" if target().permuted_ok else "copy")
        np.testing.assert_array_equal(np.asarray(to_jax(t)), t.numpy())

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

    def test_read_only(self, import_path):  # C6, C25
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


class TestSmallCopiesInC:
    """Compact host tensors of at most 1 MiB whose only needs are ALIGN and NARROW
    are copied by the core itself (``_core.to_jax_fast``), the source freed at once."""

    @pytest.mark.parametrize("dtype, values", [
        (np.float64, [1 / 3, 1e300, -1e-300, np.nan]),
        (np.int64, [1, 2**33 + 5, -(2**40) - 3]),
        (np.uint64, [1, 2**63 + 2**33 + 5]),
        (np.complex128, [1 / 3 + 1e300j, -2.5]),
    ])
    def test_narrowing_copy(self, dtype, values):
        x = aligned(values, dtype)[None, :].repeat(3, axis=0)
        if target().permuted_ok:   # compact, F order (a jaxlib < 0.8 would need C order)
            x = x.T
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
        (lambda: aligned(np.ones((4, 4)))[:, ::2], Need.LAYOUT),
        (lambda: np.zeros((0,), np.float32), Need.EMPTY),
        (lambda: _read_only(aligned(np.ones(300_000))), Need.READ_ONLY),   # over 1 MiB
    ])
    def test_other_needs_go_back_unconsumed(self, make, need):
        x = make()
        cap, info, needs = _core.to_jax_fast(x, target())
        assert capsule_name(cap) in ("dltensor_versioned", "dltensor") and needs & need
        assert info.shape == x.shape

    def test_small_read_only_memory_is_copied_in_c(self):
        # Read-only batches (Ray's, tf.data's as_numpy_iterator) copy like misaligned ones.
        x = _read_only(aligned(np.arange(8.0), np.float32))
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


def _read_only(x):
    x.flags.writeable = False
    return x


class TestForeignDevices:
    def test_pinned_host_without_cuda(self, import_path):  # C1
        counter = DeleterCounter()
        x = aligned([1, 2, 3, 4])
        cap = make_capsule(x, device=(D.kDLCUDAHost, 0), counter=counter)
        info = dlinspect.peek(cap)
        assert info.host_accessible and info.device_type == D.kDLCUDAHost
        route = plan(cap)   # host memory the CPU backend views: no fallback needed
        assert route.kind == "zero-copy" and route.needs == Need.VIA_CPU
        assert "no cuda backend" in route.reason
        y = to_jax(cap)
        np.testing.assert_array_equal(np.asarray(y), x)
        assert buffer_pointer(y) == x.ctypes.data
        host = to_host(make_capsule(x, device=(D.kDLCUDAHost, 0)))
        assert host.ctypes.data == x.ctypes.data and plan(x, "host").kind == "zero-copy"

    def test_pinned_producer_disagreeing_header(self):  # C14
        p = FakeProducer(aligned([5, 6]), device=(D.kDLCUDAHost, 0), capsule_device=(D.kDLCPU, 0))
        info = dlinspect.peek(p)
        assert info.device == (D.kDLCUDAHost, 0) and info.capsule_device == (D.kDLCPU, 0)
        np.testing.assert_array_equal(np.asarray(to_jax(p)), [5, 6])
        assert all(call["stream"] is None for call in p.calls)  # pinned: stream None

    @pytest.mark.parametrize("device", [D.kDLOpenCL, D.kDLVulkan, D.kDLMetal, D.kDLROCM, D.kDLOneAPI])
    def test_device_without_backend(self, device, import_path):  # C2
        src = np.arange(6, dtype=np.float32).reshape(2, 3)
        p = FakeProducer(src, device=(device, 0))
        route = plan(p)
        assert route.kind == "host-fallback" and not route.zero_copy and route.copy_bytes == 24
        assert route.needs & Need.DEVICE
        y = to_jax(p)
        np.testing.assert_array_equal(np.asarray(y), src)
        assert p.calls[-1]["dl_device"] == (1, 0) and p.calls[-1]["copy"] is True
        del y
        gc.collect()
        assert p.counter.calls == len(p.calls)  # every capsule served was freed once

        with pytest.raises(UnsupportedDeviceError) as err:
            to_jax(p, fallback="raise")
        msg = str(err.value)
        for part in (f"{device.name}:0", "(2, 3)", "float32", "platforms here: cpu",
                     "move it to host memory with its own library first", 'fallback="host"'):
            assert part in msg, (part, msg)
        assert isinstance(err.value, BufferError)

    def test_producer_without_host_copy_falls_back_to_asarray(self):
        class ArrayLike(FakeProducer):
            def __array__(self, dtype=None, copy=None):
                return np.array(self.array, dtype=dtype)
        p = ArrayLike(np.ones(3, np.float32), device=(D.kDLVulkan, 0), host_copy=False)
        np.testing.assert_array_equal(np.asarray(to_jax(p)), np.ones(3))

    def test_nothing_works(self):
        p = FakeProducer(np.ones(3, np.float32), device=(D.kDLMetal, 2), host_copy=False)
        with pytest.raises(UnsupportedDeviceError, match=r"kDLMetal:2.*Tried: .*unsupported device "
                                                          r"requested.*numpy.asarray"):
            to_jax(p)

    def test_bare_device_capsule(self):
        cap = make_capsule(np.ones(2, np.float32), device=(D.kDLVulkan, 0))
        with pytest.raises(UnsupportedDeviceError, match="bare capsule"):
            to_jax(cap)
        assert capsule_name(cap) == "dltensor_versioned"

    def test_copy_false_device(self):
        p = FakeProducer(np.ones(2, np.float32), device=(D.kDLVulkan, 0))
        with pytest.raises(CopyRequiredError, match="copy=False"):
            to_jax(p, copy=False)

    def test_to_host_device(self):
        src = np.arange(4.0)
        p = FakeProducer(src, device=(D.kDLCUDA, 0))
        assert plan(p, "host").kind == "host-fallback"
        np.testing.assert_array_equal(to_host(p), src)
        with pytest.raises(CopyRequiredError):
            to_host(p, copy=False)

    def test_narrowing_through_host_memory_is_planned(self):
        """The host copy of a 64-bit tensor is narrowed (x64 off): plan says so and warns
        exactly once, for the caller's tensor (found with dpnp int64 on kDLOneAPI)."""
        p = FakeProducer(np.arange(3, dtype=np.int64), (D.kDLVulkan, 0))
        route = plan(p)
        assert route.kind == "host-fallback" and route.needs & Need.NARROW
        assert route.warning and "narrows int64 to int32" in route.reason
        with pytest.warns(DLInspectWarning) as record:
            y = to_jax(p)
        assert len(record) == 1 and y.dtype == np.int32 and y.tolist() == [0, 1, 2]

    def test_host_methods_are_named_and_tried(self):
        class WithAsnumpy(FakeProducer):
            def asnumpy(self):
                return np.array(self.array)
        p = WithAsnumpy(np.arange(3, dtype=np.float32), (D.kDLOneAPI, 0), host_copy=False)
        assert "its own x.asnumpy()" in plan(p).reason
        assert to_jax(p).tolist() == [0.0, 1.0, 2.0] and to_host(p).tolist() == [0.0, 1.0, 2.0]

    @pytest.mark.parametrize("fn", ["to_jax", "to_host"])
    def test_hints_name_only_what_can_work(self, fn):
        """A fix never sends the user to the option or function that just failed."""
        cap = make_capsule(np.ones(2, np.float32), device=(D.kDLOneAPI, 0))
        call = to_jax if fn == "to_jax" else to_host
        with pytest.raises(UnsupportedDeviceError) as err:
            call(cap)
        msg = str(err.value)
        assert "fallback" not in msg and "producer object" in msg
        with pytest.raises(UnsupportedDeviceError) as err:
            to_jax(FakeProducer(np.ones(2, np.float32), (D.kDLOneAPI, 0)), fallback="raise")
        assert 'pass fallback="host"' in str(err.value)


    def test_failed_host_copy_raises_its_error_not_the_narrowing_warning(self):
        # The narrowing warning of a host fallback comes once the host copy is in hand:
        # under -W error a failed host copy still says why (found by the peer suites).
        p = FakeProducer(np.arange(3.0), (D.kDLVulkan, 0), host_copy=False)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(UnsupportedDeviceError, match="could not be brought to host"):
                to_jax(p)
        with pytest.warns(dlinspect.DLInspectWarning, match="float64 is narrowed"):
            assert to_jax(FakeProducer(np.arange(3.0), (D.kDLVulkan, 0))).tolist() == [0, 1, 2]


    @pytest.mark.parametrize("shape", [(3,), (32, 32), (1000,), (5, 7)])
    def test_host_fallback_makes_one_copy(self, shape):
        # A producer that copies into host memory it is given: one copy in all, into
        # aligned memory JAX views (pointer-checked), for any size.
        src = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        p = FakeProducer(src, (D.kDLVulkan, 0), copy_into=True)
        route = plan(p)
        assert route.kind == "host-fallback" and "copy_into(out)" in route.reason
        y = to_jax(p)
        np.testing.assert_array_equal(np.asarray(y), src)
        assert [a.ctypes.data for a in p.served] == [buffer_pointer(y)]
        h = dlinspect.to_host(p)
        assert h.ctypes.data == p.served[-1].ctypes.data
        np.testing.assert_array_equal(h, src)
        # The producer's own host copy: viewed where this jaxlib views it (aligned to
        # the probed alignment: 64 bytes on jaxlib >= 0.4.31, any on 0.4.30), one copy then.
        q = FakeProducer(src, (D.kDLVulkan, 0))
        y = to_jax(q)
        copy = q.served[-1]
        align = djax.caps().cpu_alignment
        assert (buffer_pointer(y) == copy.ctypes.data) == (copy.ctypes.data % align == 0)

    def test_copy_into_failing_falls_back(self):
        p = FakeProducer(np.arange(3.0, dtype=np.float32), (D.kDLVulkan, 0), copy_into=True,
                         host_copy=False)
        with pytest.raises(UnsupportedDeviceError, match=r"x\.copy_into\(out\) raised"):
            to_jax(p)


class TestDeviceReconciliation:
    """__dlpack_device__ and the header must agree before any memory is touched."""

    @pytest.mark.parametrize("said, header", [
        ((D.kDLCPU, 0), (D.kDLCUDA, 0)),       # C18: a real library shipped this
        ((D.kDLCPU, 0), (D.kDLCPU, 1)),
        ((D.kDLCUDA, 0), (D.kDLCPU, 0)),
        ((D.kDLCUDAHost, 0), (D.kDLCUDA, 0)),
        ((D.kDLCPU, None), (D.kDLVulkan, 0)),
    ])
    def test_disagreement_is_an_error_naming_both(self, said, header):
        counter = DeleterCounter()
        # A non-host address: reading it would crash the process.
        p = FakeProducer(np.ones(4, np.float32), device=said, capsule_device=header,
                         counter=counter)
        for call in (dlinspect.peek, to_jax, to_host, lambda x: to_jax(x, copy=True)):
            with pytest.raises(ProducerError) as err:
                call(p)
            assert dlinspect.DLDeviceType(header[0]).name in str(err.value)
            assert dlinspect.DLDeviceType(said[0]).name in str(err.value)
        for tgt in ("jax", "host"):
            route = plan(p, tgt)
            assert route.kind == "error" and isinstance(route.error, ProducerError)
        gc.collect()
        assert counter.calls == len(p.calls)   # every export released, none consumed

    def test_cuda_header_is_never_read_as_host_memory(self):  # C18
        class Lying:
            def __dlpack_device__(self):
                return (D.kDLCPU, 0)

            def __dlpack__(self, **kw):
                return make_capsule(address=0x10, shape=(1 << 20,), dtype=np.float32,
                                    device=(D.kDLCUDA, 0), null_deleter=True)
        for call in (to_jax, to_host, dlinspect.peek):
            with pytest.raises(ProducerError, match="kDLCUDA:0"):
                call(Lying())

    def test_none_device_id_taken_from_the_header(self):  # C19 (paddlepaddle 3.3.1)
        x = aligned([1, 2, 3])
        p = FakeProducer(x, device=(D.kDLCPU, None))
        assert p.__dlpack_device__() == (D.kDLCPU, None)
        assert dlinspect.peek(p).device == (D.kDLCPU, 0)
        assert plan(p).kind == "zero-copy" and plan(p, "host").kind == "zero-copy"
        assert buffer_pointer(to_jax(p)) == x.ctypes.data
        assert to_host(p).ctypes.data == x.ctypes.data
        pinned = FakeProducer(x, device=(D.kDLCUDAHost, None), capsule_device=(D.kDLCPU, 0))
        assert dlinspect.peek(pinned).device == (D.kDLCUDAHost, 0)

    @pytest.mark.parametrize("device", [(), (1,), (1.5, 0), (1, 0, 5), [1, 0], "ab", None,
                                        (1, 2**40), (None, 0)])
    def test_malformed_device_answer(self, device):
        class P:
            def __dlpack_device__(self):
                return device

            def __dlpack__(self, **kw):
                return aligned([1.0, 2.0]).__dlpack__(**kw)

        for call in (dlinspect.peek, to_jax, to_host):
            with pytest.raises(MalformedTensorError, match="tuple of two ints"):
                call(P())
        assert isinstance(plan(P()).error, MalformedTensorError)


class TestDtypes:
    @pytest.mark.parametrize("dtype", [(15, 6, 1), (3, 64, 1), (99, 8, 1)])
    def test_dtypes_jax_cannot_hold(self, dtype):
        cap = make_capsule(aligned_empty((8,), np.uint8, 64), shape=(2,), dtype=dtype)
        match = f"code={dtype[0]}, bits={dtype[1]}, lanes={dtype[2]}"
        if dtype == (15, 6, 1) and djax.caps()._probe_hold(15, 6) is None:
            # jax >= 0.11 holds float6 arrays: then it is the packing that is refused.
            match = "packs 6-bit elements across byte boundaries"
        with pytest.raises(UnsupportedDTypeError, match=match):
            to_jax(cap)
        assert capsule_name(cap) == "dltensor_versioned"

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


class TestProducerErrors:
    """Any exception a producer raises becomes a ProducerError with its own words."""

    def test_torch_refusals(self, torch):  # C17
        with pytest.raises(ProducerError, match=r"(?s)require gradient.*\.detach\(\)") as err:
            to_jax(torch.ones(2, requires_grad=True))
        # torch's own type: BufferError (RuntimeError before torch 2.4), kept as the cause
        assert isinstance(err.value.__cause__, (BufferError, RuntimeError))
        with pytest.raises(ProducerError, match=r"(?s)conjugate.*resolve_conj\(\)"):
            to_jax(torch.ones(2, dtype=torch.complex64).conj())
        with pytest.raises(ProducerError, match=r"to_dense\(\)"):
            to_jax(torch.eye(2).to_sparse())
        with pytest.raises(ProducerError, match="to_dense"):
            dlinspect.peek(torch.eye(3).to_sparse())
        for t in (torch.ones(2, requires_grad=True), torch.tensor([1j]).conj()):
            route = plan(t)
            assert route.kind == "error" and isinstance(route.error, ProducerError)

    @pytest.mark.parametrize("exc", [TypeError("Can only convert arrays with no nulls"),
                                     RuntimeError("bad"), ValueError("no"), KeyError("k"),
                                     type("ArrowTypeError", (TypeError,), {})("only arrays with no nulls"),
                                     type("Custom", (Exception,), {})("custom words")])
    def test_any_exception_type(self, exc):  # C20
        p = FakeProducer(np.ones(3, np.float32), refuse=exc)
        for call in (dlinspect.peek, to_jax, to_host):
            with pytest.raises(ProducerError) as err:
                call(p)
            assert err.value.__cause__ is exc and str(exc).strip("'") in str(err.value)
            assert type(exc).__name__ in str(err.value)
        for tgt in ("jax", "host"):
            route = plan(p, tgt)
            assert route.kind == "error" and isinstance(route.error, ProducerError)
            assert route.info is None
        assert all("max_version" in c for c in p.calls)   # one call each; never retried bare

    def test_hints_fit_the_refusal(self):
        # A pyarrow array (by its class, as the producer table matches it) in pyarrow's words.
        Array = type("Array", (FakeProducer,), {"__module__": "pyarrow.lib"})
        p = Array(np.ones(2), refuse=TypeError(
            "DataType is not compatible with DLPack spec: date32[day]"))
        with pytest.raises(ProducerError, match=r"date32.*To fix: convert it to a numeric type"):
            to_jax(p)
        # The same words from another producer get no pyarrow advice.
        other = FakeProducer(np.ones(2), refuse=TypeError(
            "DataType is not compatible with DLPack spec: date32[day]"))
        with pytest.raises(ProducerError) as info:
            to_jax(other)
        assert "arr.cast" not in str(info.value)

    def test_retry_only_for_keyword_type_errors(self):
        p = FakeProducer(aligned([1, 2]), legacy_only=True)
        np.testing.assert_array_equal(np.asarray(to_jax(p)), [1, 2])
        assert p.calls == [{"stream": None}]

        class NoKeywords:
            def __init__(self):
                self.x = aligned([4.0, 5.0])

            def __dlpack__(self):
                return self.x.__dlpack__()

            def __dlpack_device__(self):
                return (1, 0)

        np.testing.assert_array_equal(np.asarray(to_jax(NoKeywords())), [4.0, 5.0])
        np.testing.assert_array_equal(to_host(NoKeywords()), [4.0, 5.0])

    def test_dlpack_device_raising(self):
        class P:
            def __dlpack_device__(self):
                raise NotImplementedError("Unknown device type meta for Dlpack")

            def __dlpack__(self, **kw):
                return aligned([1.0]).__dlpack__(**kw)

        for call in (dlinspect.peek, to_jax, to_host):
            with pytest.raises(ProducerError, match="__dlpack_device__.*meta") as err:
                call(P())
            assert isinstance(err.value.__cause__, NotImplementedError)
        assert plan(P()).kind == "error"

    def test_not_a_capsule(self):
        class ReturnsNone:
            def __dlpack__(self, **kw):
                return None

            def __dlpack_device__(self):
                return (1, 0)

        for call in (dlinspect.peek, to_jax, to_host):
            with pytest.raises(ProducerError, match="not a PyCapsule"):
                call(ReturnsNone())

    def test_lazy_negation_on_every_path(self, torch):  # C21
        class Sub(torch.Tensor):
            pass

        plain = torch.arange(16.0)._neg_view()
        for t in (plain, plain.as_subclass(Sub), torch.tensor([1 + 2j, 3 + 4j]).conj().imag,
                  torch.arange(4.0).reshape(2, 2)._neg_view().t()):
            assert t.is_neg()
            for call in (to_jax, lambda t: to_jax(t, copy=True), lambda t: to_jax({"a": t}),
                         lambda t: to_jax(t, device=jax.devices("cpu")[0])):
                with pytest.raises(ProducerError, match=r"resolve_neg\(\)"):
                    call(t)
            assert plan(t).kind == "error"
        assert to_jax(plain.resolve_neg()).tolist() == [-float(i) for i in range(16)]

    def test_lazy_negation_with_a_pinned_capable_producer(self, torch, monkeypatch):  # C21
        """The guard holds when __dlpack_device__ is asked too (a pinned-capable torch)."""
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        _core._forget_types()
        try:
            t = torch.arange(4.0)._neg_view()
            with pytest.raises(ProducerError, match="resolve_neg"):
                to_jax(t)
            assert to_jax(torch.arange(4.0)).tolist() == [0, 1, 2, 3]
        finally:
            monkeypatch.undo()
            _core._forget_types()

    def test_not_dlpack(self):
        with pytest.raises(NotDLPackError):
            to_jax(object(), leaves="raise")
        with pytest.raises(NotDLPackError):
            to_host("text")
        with pytest.raises(NotDLPackError):
            to_jax(np.ndarray, leaves="raise")

    def test_consumed_capsule(self):  # C10
        cap = make_capsule(address=0x1000, shape=(3,), name="used_dltensor", null_deleter=True,
                           versioned=False)
        for fn in (to_jax, to_host):
            with pytest.raises(CapsuleConsumedError, match="already took"):
                fn(cap)
        route = plan(cap)
        assert route.kind == "error" and isinstance(route.error, CapsuleConsumedError)
        assert "already took" in explain(cap)

    def test_bad_options(self):
        with pytest.raises(ValueError, match="fallback"):
            to_jax(np.ones(1), fallback="maybe")
        with pytest.raises(ValueError, match="target"):
            plan(np.ones(1), target="gpu")
        for bad in ("cpu", 1, 0):
            with pytest.raises(TypeError, match="jax.Device"):
                to_jax(aligned([1.0]), device=bad)

    def test_explain(self):
        text = explain(np.arange(6, dtype=np.float32).reshape(2, 3)[:, :2])
        assert text.splitlines()[0].startswith("<TensorInfo kDLCPU:0 float32[2, 2]")
        assert "route to jax: copy (16 B copied)" in text
        err = explain(FakeProducer(np.ones(1, np.float32), device=(D.kDLVulkan, 0)), fallback="raise")
        assert "UnsupportedDeviceError" in err
        refused = explain(FakeProducer(np.ones(1), refuse="no"))
        assert refused.startswith("<no header") and "ProducerError" in refused


class TestLifetimes:  # C12
    def _capsule(self, counter, **kw):
        return make_capsule(aligned([1, 2, 3, 4]), counter=counter, **kw)

    @pytest.mark.parametrize("versioned", [False, True])
    def test_zero_copy_deleter_when_array_dies(self, versioned, import_path):
        counter = DeleterCounter()
        cap = self._capsule(counter, versioned=versioned)
        dlinspect.peek(cap)
        assert counter.calls == 0
        y = to_jax(cap)
        assert counter.calls == 0
        del cap
        assert counter.calls == 0
        del y
        gc.collect()
        assert counter.calls == 1

    @pytest.mark.parametrize("kw", [dict(strides=(2,), shape=(2,)), dict(flags=1)],
                             ids=["strided", "read-only"])
    def test_copy_deleter_right_after_copy(self, kw, import_path):
        counter = DeleterCounter()
        cap = self._capsule(counter, **kw)
        y = to_jax(cap)
        assert counter.calls == 1
        del cap, y
        gc.collect()
        assert counter.calls == 1

    def test_host_fallback_deleters(self):
        p = FakeProducer(np.ones(4, np.float32), device=(D.kDLOpenCL, 0))
        y = to_jax(p)
        del y
        gc.collect()
        assert p.counter.calls == len(p.calls) == 2

    def test_plan_releases_its_export(self):
        p = FakeProducer(aligned([1, 2]))
        for _ in range(3):
            plan(p)
        assert p.counter.calls == len(p.calls) == 3

    def test_error_route_leaves_capsule_unconsumed(self):
        counter = DeleterCounter()
        cap = self._capsule(counter, device=(D.kDLVulkan, 0))
        with pytest.raises(UnsupportedDeviceError):
            to_jax(cap)
        # (numpy.from_dlpack takes versioned capsules from NumPy 2.1 on)
        misaligned = make_capsule(np.arange(6, dtype=np.float32)[::2], counter=counter,
                                  versioned=NUMPY_TAKES_VERSIONED)
        with pytest.raises(CopyRequiredError):
            to_jax(misaligned, copy=False)
        assert capsule_name(cap) == "dltensor_versioned"
        assert capsule_name(misaligned) == ("dltensor_versioned" if NUMPY_TAKES_VERSIONED
                                            else "dltensor")
        assert counter.calls == 0
        y = np.from_dlpack(type("H", (), {"__dlpack__": lambda self, **k: misaligned})())  # noqa: F821
        assert y.shape == (3,)
        del cap, misaligned, y
        gc.collect()
        assert counter.calls == 2

    def test_error_route_frees_the_export_at_once(self):
        """A failed route leaves no reference cycle holding the producer's export: its
        deleter runs when the exception is dropped, not at the next garbage collection."""
        p = FakeProducer(np.ones(3, np.float32), (D.kDLVulkan, 0))
        gc.disable()
        try:
            with pytest.raises(UnsupportedDeviceError):
                to_jax(p, fallback="raise")
            assert p.counter.calls == 1
            with pytest.raises(CopyRequiredError):
                to_jax(FakeProducer(np.ones((3, 3), np.float32)[:, ::2], counter=p.counter),
                       copy=False)
            assert p.counter.calls == 2
        finally:
            gc.enable()

    def test_failed_import_restores_versioned_capsule(self, monkeypatch):
        counter = DeleterCounter()
        cap = self._capsule(counter)
        c = djax.caps()
        c.target   # built (and its probes run) before the import breaks

        def boom(*args):
            raise RuntimeError("import failed")
        monkeypatch.setattr(c, "_direct_fn", boom)
        monkeypatch.setattr(c, "_target", None)
        dlinspect._core.set_target(None)   # (the built target the hot path reads)
        monkeypatch.setattr(c, "_probe_dtype", lambda code, bits: None)
        with pytest.raises(RuntimeError, match="import failed"):
            to_jax(cap)
        assert capsule_name(cap) == "dltensor_versioned" and counter.calls == 0
        monkeypatch.undo()
        dlinspect._core.set_target(None)
        y = to_jax(cap)
        del cap, y
        gc.collect()
        assert counter.calls == 1

    def test_warning_as_error_leaves_capsule_unconsumed(self):
        x = aligned(np.arange(8), np.int64)
        for src in (x, x[::2]):
            cap = make_capsule(src)
            for _ in range(2):
                with warnings.catch_warnings():
                    warnings.simplefilter("error", DLInspectWarning)
                    with pytest.raises(DLInspectWarning):
                        to_jax(cap)
                assert capsule_name(cap) == "dltensor_versioned"
            with pytest.warns(DLInspectWarning):
                assert to_jax(cap).tolist() == src.tolist()

    def test_to_host_view_keeps_tensor_alive(self):
        counter = DeleterCounter()
        h = to_host(self._capsule(counter))
        assert counter.calls == 0 and h.tolist() == [1, 2, 3, 4]
        view = h[1:]
        del h
        gc.collect()
        assert counter.calls == 0 and view.tolist() == [2, 3, 4]
        del view
        gc.collect()
        assert counter.calls == 1

    def test_to_host_read_only(self):
        x = np.ones(3)
        x.flags.writeable = False
        assert not to_host(x).flags.writeable
        # Before NumPy 2.1 its capsules are legacy, which cannot say "writable": the view
        # is read-only then, as numpy.from_dlpack's is.
        assert to_host(np.ones(3)).flags.writeable == NUMPY_VERSIONED


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


class TestProducerProtocol:
    def test_streams_none_on_cpu(self):
        p = FakeProducer(aligned([1, 2]))
        to_jax(p)
        assert p.calls == [{"stream": None, "max_version": (1, 3)}]

    def test_batch_dict(self, torch):  # C16
        batch = {"x": torch.randn(4, 8), "y": torch.tensor([True, False, True, False]),
                 "idx": torch.arange(4)}
        with pytest.warns(DLInspectWarning, match="int64"):
            out = to_jax(batch)
        assert set(out) == {"x", "y", "idx"} and all(isinstance(v, jax.Array) for v in out.values())
        np.testing.assert_array_equal(np.asarray(out["x"]), batch["x"].numpy())
        np.testing.assert_array_equal(np.asarray(out["y"]), batch["y"].numpy())
        np.testing.assert_array_equal(np.asarray(out["idx"]), [0, 1, 2, 3])

    def test_nested_pytree(self):
        from collections import namedtuple
        Pair = namedtuple("Pair", "a b")
        out = to_jax([Pair(aligned([1]), (aligned([2]),))])
        assert isinstance(out[0], Pair) and float(out[0].b[0][0]) == 2.0

    def test_torch_taken_through_the_exchange_api(self, torch, monkeypatch):
        """Plain CPU torch tensors skip torch's Python __dlpack__; tensors it would refuse
        (requires grad, lazy conjugate or negative bit) still meet that refusal."""
        if not torch_exchange_api():
            pytest.skip(f"torch {torch.__version__} has no DLPack C exchange API")
        calls = []
        original = torch.Tensor.__dlpack__

        def spy(self, *args, **kwargs):
            calls.append(1)
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "__dlpack__", spy)
        t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        y = to_jax(t)
        assert calls == [] and buffer_pointer(y) == t.data_ptr()
        t[0, 0] = 7.0
        assert float(y[0, 0]) == 7.0
        del y
        for bad, match in ((torch.ones(3, requires_grad=True), "gradient"),
                           (torch.tensor([1j, 2j]).conj(), "conj"),
                           (torch.tensor([1.0, 2.0])._neg_view(), "negative bit")):
            with pytest.raises(ProducerError, match=match):
                to_jax(bad)

        class Sub(torch.Tensor):
            pass
        calls.clear()
        to_jax(torch.ones(4).as_subclass(Sub))
        assert calls  # a subclass may override __dlpack__: it is asked

    def test_exchange_api_type_cache_is_bounded(self):
        for i in range(2 * _core.TYPES_MAX):
            tp = type(f"T{i}", (FakeProducer,), {})
            dlinspect.peek(tp(np.ones(1)))
        assert _core._types_len() <= _core.TYPES_MAX


def test_jax_capabilities_come_from_installed_jax():
    c = djax.caps()
    from jax._src import dlpack as jdl
    table = getattr(jdl, "_DL_DEVICE_TO_PLATFORM", None)   # (jax 0.4.30 has none)
    expected = djax._DEFAULT_PLATFORMS if table is None else table
    assert c.mapping == {int(k): v for k, v in expected.items()}
    assert (c.symbols[1].found is None) == (table is None)
    assert c.platforms == {"cpu"}
    assert c.target.dtype_problem(15, 6) is not None and c.target.dtype_problem(2, 32) is None
    # jaxlib's import is found on every supported jaxlib (0.4.30: xla_client._xla)
    assert c.direct and c.symbols[0].found.endswith(".dlpack_managed_tensor_to_buffer")


class TestStreams:
    """The ``stream`` handed to ``__dlpack__`` (array API ``__dlpack__``, *stream*)."""

    class _Dev:
        def __init__(self, stream):
            self.stream = stream

        def get_stream_for_external_ready_events(self):
            return self.stream

    @pytest.mark.parametrize(("device_type", "jax_stream", "expected"), [
        (D.kDLCUDA, 0, 1),          # 0 is ambiguous on CUDA: the legacy default stream is 1
        (D.kDLCUDA, 0x7F00, 0x7F00),
        (D.kDLROCM, 0, 0),          # ROCm's default stream is 0
        (D.kDLCPU, 5, None),        # CPU and pinned host: always None
        (D.kDLCUDAHost, 5, None),
    ])
    def test_stream_rules(self, device_type, jax_stream, expected):
        assert djax.stream_of(device_type, self._Dev(jax_stream)) == expected

    def test_no_backend_means_no_stream(self):
        assert djax.stream_of(D.kDLCUDA, None) is None
        assert djax.caps().stream_for(D.kDLCUDA, 0) is None

    def test_device_producer_asked_with_stream_none_for_host_copy(self):
        p = FakeProducer(np.ones(2, np.float32), device=(D.kDLCUDA, 0))
        to_jax(p)
        assert [c["stream"] for c in p.calls] == [None, None]  # no CUDA backend here
        assert p.calls[1]["dl_device"] == (1, 0)


class TestDeviceFastPath:
    """CUDA (and ROCm, pinned) tensors that need nothing take the C fast path, the route
    plan gives them, carried out in C: checked on this CPU machine with a target that
    maps kDLCUDA:0 to a JAX device and an import function that records its call."""

    def target(self, calls):
        tg = djax.target()
        cpu = tg.cpu_device

        def record(cap, device, stream, copy, dl_device_type):
            calls.append((dlinspect._core.capsule_name(cap), device, stream, copy,
                          dl_device_type))
            return "imported"

        return dlinspect._core.JaxTarget(
            jax=tg.jax, jnp=tg.jnp, import_fn=record, direct=True, cpu_device=cpu,
            cpu_align=tg.cpu_align, x64=tg.x64, x64_context=tg.x64_context,
            devices={(D.kDLCPU, 0): cpu, (D.kDLCUDA, 0): cpu, (D.kDLCUDAHost, 0): cpu},
            platforms={"cpu", "cuda"}, cpu_keys={(D.kDLCPU, 0)},
            probe=lambda code, bits: None, hold=lambda code, bits: None, narrow={},
            warn=lambda text: None, stream_for=lambda t, i: 42 if t == D.kDLCUDA else None,
            array_type=tg.array_type, permuted_ok=True, assemble=tg.assemble)

    @pytest.mark.parametrize("device_type, stream", [(D.kDLCUDA, 42), (D.kDLCUDAHost, None)])
    def test_producer(self, device_type, stream):
        calls = []
        tg = self.target(calls)
        p = FakeProducer(aligned([1, 2, 3]), (device_type, 0))
        assert dlinspect._core.to_jax_fast(p, tg) == "imported"
        # The producer was asked with the consumer's stream, and jaxlib got the same one.
        assert p.calls[-1]["stream"] == stream
        assert calls == [("dltensor", tg.cpu_device, stream, None, int(device_type))]
        # The route plan gives the same header: zero-copy IMPORT with that device type.
        info = dlinspect.peek(p)
        needs = dlinspect._core.needs(info, tg)
        route = dlinspect._core.route_jax(info, needs, tg, dlinspect._options.DEFAULT, p)
        assert needs == 0 and route.kind == "zero-copy" and route.import_type == int(device_type)

    def test_bare_capsule_gets_no_stream(self):
        calls = []
        tg = self.target(calls)
        cap = make_capsule(aligned([1, 2]), device=(D.kDLCUDA, 0))
        assert dlinspect._core.to_jax_fast(cap, tg) == "imported"
        assert calls[0][2] is None and calls[0][4] == int(D.kDLCUDA)

    def test_needs_send_it_to_the_general_route(self):
        calls = []
        tg = self.target(calls)
        strided = FakeProducer(np.arange(6, dtype=np.float32)[::2], (D.kDLCUDA, 0))
        got = dlinspect._core.to_jax_fast(strided, tg)
        assert type(got) is tuple and got[2] & Need.LAYOUT and calls == []
        out, pending = dlinspect._core.to_jax_many(
            [FakeProducer(aligned([1.0]), (D.kDLCUDA, 0)), strided], tg)
        assert calls == [] and [f for *_, f in pending] == [True, False]   # nothing imported

"""Devices: foreign devices through host memory, pinned memory, the device a producer
reports against its header, streams, and the C fast path for memory JAX has a device for."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
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
    ProducerError,
    UnsupportedDeviceError,
    plan,
    to_host,
    to_jax,
)
from dlinspect import _core as djax, _jaxcaps  # noqa: E402
from dlinspect._core import capsule_name  # noqa: E402
from dlinspect.testing import DeleterCounter, FakeProducer, make_capsule  # noqa: E402
from _helpers import aligned, buffer_pointer  # noqa: E402


class TestForeignDevices:
    def test_pinned_host_without_cuda(self, import_path):
        """Pinned host memory (kDLCUDAHost) on a machine without CUDA, where plain JAX
        fails ("Unknown backend cuda", a bare KeyError before): host-accessible, the host
        route without a copy, and to_host a view."""
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

    def test_pinned_producer_disagreeing_header(self):
        """What a pinned torch tensor does: ``__dlpack_device__`` says kDLCUDAHost while
        its capsule says kDLCPU. The producer's word is trusted; both are in the info."""
        p = FakeProducer(aligned([5, 6]), device=(D.kDLCUDAHost, 0), capsule_device=(D.kDLCPU, 0))
        info = dlinspect.peek(p)
        assert info.device == (D.kDLCUDAHost, 0) and info.capsule_device == (D.kDLCPU, 0)
        np.testing.assert_array_equal(np.asarray(to_jax(p)), [5, 6])
        assert all(call["stream"] is None for call in p.calls)  # pinned: stream None

    @pytest.mark.parametrize("device", [D.kDLOpenCL, D.kDLVulkan, D.kDLMetal, D.kDLROCM, D.kDLOneAPI])
    def test_device_without_backend(self, device, import_path):
        """Memory on a device no JAX here has a backend for (OpenCL, Vulkan, Metal, ROCm,
        oneAPI), which plain JAX refuses ("unsupported device type", "Unknown backend
        rocm"): the producer's host copy is imported; with fallback="raise", an error that
        names the device, the producer, the platforms here and the fix."""
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

        served = len(p.calls)
        with pytest.raises(UnsupportedDeviceError) as err:
            to_jax(p, fallback="raise")
        msg = str(err.value)
        for part in (f"{device.name}:0", "FakeProducer", "platforms here: cpu",
                     "the producer was not asked to export",
                     "move it to host memory with its own library first", 'fallback="host"'):
            assert part in msg, (part, msg)
        assert isinstance(err.value, BufferError)
        assert len(p.calls) == served   # judged from __dlpack_device__ alone

    @pytest.mark.parametrize("batch", [False, True], ids=["one", "dict"])
    def test_refusing_producer_with_fallback_raise(self, batch):
        """A producer on a device JAX has no device for that refuses to export (its
        ``__dlpack__`` raises): with fallback="raise", in to_jax and in plan, the error is
        the device's, judged from ``__dlpack_device__`` before any export is asked for."""
        p = FakeProducer(np.ones(3, np.float32), device=(D.kDLVulkan, 0),
                         refuse="no DLPack export of Vulkan memory")
        x = {"a": aligned([1.0, 2.0]), "v": p} if batch else p
        with pytest.raises(UnsupportedDeviceError, match=r"kDLVulkan:0 cannot go to JAX") as err:
            to_jax(x, fallback="raise")
        assert str(err.value).startswith("['v']: ") == batch
        route = plan(x, fallback="raise")
        route = route["v"] if batch else route
        assert route.kind == "error" and isinstance(route.error, UnsupportedDeviceError)
        assert p.calls == []
        with pytest.raises(ProducerError, match="no DLPack export of Vulkan memory"):
            to_jax(x)   # fallback="host": the producer is asked, and its refusal is the error

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


    @pytest.mark.slow
    @pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"),
                        reason="needs Linux's reset of the resident high-water mark")
    @pytest.mark.skipif(bool(os.environ.get("DLINSPECT_SANITIZED")),
                        reason="AddressSanitizer's allocator places and holds memory its own way")
    @pytest.mark.parametrize("copy_into", [True, False], ids=["copy-into", "own-copy"])
    def test_host_fallback_peak_memory(self, copy_into):
        """The host memory a host fallback of a 64 MiB tensor holds at its peak, measured by
        the process's resident high-water mark (reset right before), is what plan says:
        one copy where the producer copies into aligned memory dlinspect allocates, which
        JAX views; two where the producer's own host copy is memory JAX cannot view
        (16-byte aligned, as malloc's is, where XLA:CPU views 64-byte aligned memory)
        and is copied once more. In a child
        process, so that nothing else moves the mark; the checks come after it is read."""
        code = textwrap.dedent(f"""
            import numpy as np, dlinspect
            from dlinspect.testing import FakeProducer

            def status(key):
                with open("/proc/self/status") as f:
                    return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

            src = np.ones(16 << 20, np.float32)          # 64 MiB of "device memory"
            p = FakeProducer(src, (7, 0), copy_into={copy_into}, host_align=16)
            dlinspect.to_jax(FakeProducer(np.ones(8, np.float32), (7, 0), copy_into={copy_into},
                                          host_align=16))
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")                             # the high-water mark := now
            before = status("VmRSS:")
            y = dlinspect.to_jax(p).block_until_ready()
            copies = (status("VmHWM:") - before) / src.nbytes
            assert np.asarray(y).sum() == src.size
            from dlinspect._core import jax_caps as caps
            print(copies, "two copies at peak" in dlinspect.plan(p).reason, caps().cpu_alignment)
        """)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        copies, says_two, align = proc.stdout.split()[-3:]
        assert says_two == str(not copy_into)
        # (jaxlib 0.4.30 views 16-byte aligned memory: the producer's own copy too)
        two = not copy_into and int(align) > 16
        # whole copies: the mark moves by what was touched, a few pages either way
        assert abs(float(copies) - (2 if two else 1)) < 0.25, copies

    @pytest.mark.parametrize("shape", [(3,), (32, 32), (1000,), (5, 7)])
    def test_host_fallback_makes_one_copy(self, shape):
        # A producer that copies into host memory it is given: one copy in all, into
        # aligned memory JAX views (pointer-checked), for any size.
        src = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        p = FakeProducer(src, (D.kDLVulkan, 0), copy_into=True)
        route = plan(p)
        assert route.kind == "host-fallback" and "copy_into(out)" in route.reason
        assert "two copies at peak" not in route.reason
        # Without a copy into given memory, plan says what the peak may be.
        assert "two copies at peak" in plan(FakeProducer(src, (D.kDLVulkan, 0))).reason
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
        align = djax.jax_caps().cpu_alignment
        assert (buffer_pointer(y) == copy.ctypes.data) == (copy.ctypes.data % align == 0)

    def test_copy_into_failing_falls_back(self):
        p = FakeProducer(np.arange(3.0, dtype=np.float32), (D.kDLVulkan, 0), copy_into=True,
                         host_copy=False)
        with pytest.raises(UnsupportedDeviceError, match=r"x\.copy_into\(out\) raised"):
            to_jax(p)


class TestDeviceReconciliation:
    """__dlpack_device__ and the header must agree before any memory is touched."""

    @pytest.mark.parametrize("said, header", [
        ((D.kDLCPU, 0), (D.kDLCUDA, 0)),       # says CPU, header CUDA: a real library shipped this
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

    def test_cuda_header_is_never_read_as_host_memory(self):
        """A producer that says kDLCPU while its header says kDLCUDA, with an address that
        is no host memory (dlinspect once crashed reading it in to_jax and to_host): an
        error naming the devices before any memory is read."""
        class Lying:
            def __dlpack_device__(self):
                return (D.kDLCPU, 0)

            def __dlpack__(self, **kw):
                return make_capsule(address=0x10, shape=(1 << 20,), dtype=np.float32,
                                    device=(D.kDLCUDA, 0), null_deleter=True)
        for call in (to_jax, to_host, dlinspect.peek):
            with pytest.raises(ProducerError, match="kDLCUDA:0"):
                call(Lying())

    def test_none_device_id_taken_from_the_header(self):
        """``__dlpack_device__`` giving the id as None, ``(kDLCPU, None)``, as paddlepaddle
        3.3.1 does (JAX fails on every such tensor; peek and to_jax once accepted it while
        plan and to_host refused): every function takes the id from the header."""
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


def test_jax_capabilities_come_from_installed_jax():
    c = djax.jax_caps()
    from jax._src import dlpack as jdl
    table = getattr(jdl, "_DL_DEVICE_TO_PLATFORM", None)   # (jax 0.4.30 has none)
    expected = _jaxcaps._DEFAULT_PLATFORMS if table is None else table
    assert c.mapping == {int(k): v for k, v in expected.items()}
    assert (c.symbols["platforms"].found is None) == (table is None)
    assert c.platforms == {"cpu"}
    assert c.target.dtype_problem(15, 6) is not None and c.target.dtype_problem(2, 32) is None
    # jaxlib's import is found on every supported jaxlib (0.4.30: xla_client._xla)
    assert c.direct and c.symbols["import"].found.endswith(".dlpack_managed_tensor_to_buffer")


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
        assert djax.jax_caps().stream_for(D.kDLCUDA, 0) is None

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
        tg = djax.jax_target()
        cpu = tg.cpu_device

        def record(cap, device, stream, copy, dl_device_type):
            calls.append((dlinspect._core.capsule_name(cap), device, stream, copy,
                          dl_device_type))
            return "imported"

        return dlinspect._core.JaxTarget(
            jax=tg.jax, jnp=tg.jnp, import_fn=record, direct=True, cpu_device=cpu,
            cpu_align=tg.cpu_align, x64=tg.x64,
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
        route = dlinspect._core.route_jax(info, needs, tg, dlinspect._core.DEFAULT, p)
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
        # In a batch the fast path's leaf waits for the strided one's route, an error
        # (device memory dlinspect cannot copy): nothing was imported.
        dlinspect._core.set_target(tg)
        try:
            with pytest.raises(UnsupportedDeviceError):
                dlinspect.to_jax([FakeProducer(aligned([1.0]), (D.kDLCUDA, 0)), strided])
        finally:
            dlinspect._core.set_target(None)
        assert calls == []

    def test_device_memory_jax_cannot_view_names_the_producers_method(self):
        # Strided memory on a device JAX has (CUDA here), which dlinspect cannot copy:
        # the advice is the producer's own contiguous copy, not another library's.
        tg = self.target([])
        CupyArray = type("ndarray", (FakeProducer,), {"__module__": "cupy"})
        for p, advice in ((CupyArray(np.arange(6, dtype=np.float32)[::2], (D.kDLCUDA, 0)),
                           "(cupy.ascontiguousarray(x))."),
                          (FakeProducer(np.arange(6, dtype=np.float32)[::2], (D.kDLCUDA, 0)),
                           "with its own library first.")):
            info = dlinspect.peek(p)
            route = dlinspect._core.route_jax(info, dlinspect._core.needs(info, tg), tg,
                                              dlinspect._core.DEFAULT, p)
            assert route.kind == "error" and route.problem == "layout-not-host"
            assert str(route.error).endswith(advice) and "torch" not in str(route.error)

"""Every header a buggy producer can send, through peek, plan, explain, to_jax and to_host.

Each call returns or raises a DLInspectError: nothing else, never a crash, and the
deleter of every capsule runs exactly once. Headers whose memory claims are backed
by a real buffer also go through to_jax and to_host, and their values are checked
against NumPy's view of the same bytes.

DLINSPECT_FUZZ_EXAMPLES_SCALE scales the example counts (the regular run gives >= 20,000);
DLINSPECT_FUZZ_REPORT names a JSON file the counts are added to.
"""

from __future__ import annotations

import json
import os
import time
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jax  # (imported once, before hypothesis starts timing examples)

import dlinspect
from dlinspect import DLDeviceType, DLInspectError, DLInspectWarning
from dlinspect._core import capsule_name
from dlinspect.testing import DeleterCounter, FakeProducer, make_capsule
from _versions import enable_x64

SCALE = float(os.environ.get("DLINSPECT_FUZZ_EXAMPLES_SCALE", "1"))
SETTINGS = dict(deadline=None, database=None, derandomize=os.environ.get("DLINSPECT_FUZZ_RANDOM") != "1",
                suppress_health_check=list(HealthCheck))
COUNTS: dict[str, int] = {}

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT64_MAX = 2**64 - 1

device_types = st.one_of(st.sampled_from([int(d) for d in DLDeviceType]),
                         st.integers(-2, 40), st.sampled_from([INT64_MIN >> 32, 2**31 - 1]))
device_ids = st.one_of(st.integers(-2, 4), st.just(2**31 - 1), st.just(-(2**31)))
dtype_codes = st.one_of(st.integers(0, 20), st.just(255))
dtype_bits = st.one_of(st.sampled_from([0, 1, 2, 4, 6, 8, 16, 32, 64, 128, 255]), st.integers(0, 255))
dtype_lanes = st.one_of(st.sampled_from([0, 1, 2, 4, 65535]), st.integers(0, 65535))
small_or_huge = st.one_of(st.integers(-3, 8), st.integers(INT64_MIN, INT64_MAX),
                          st.sampled_from([2**31, 2**32, 2**62, INT64_MAX, INT64_MIN, -1]))
flags = st.one_of(st.integers(0, 7), st.integers(0, UINT64_MAX))
versions = st.tuples(st.integers(0, 3), st.integers(0, 5))


def record(name: str) -> None:
    COUNTS[name] = COUNTS.get(name, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    path = os.environ.get("DLINSPECT_FUZZ_REPORT")
    if path:
        old = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                old = json.load(f)
        for k, v in COUNTS.items():
            old[k] = old.get(k, 0) + v
        with open(path, "w") as f:
            json.dump(old, f)


def calls(cap_or_obj):
    """Every reading entry point; each must return or raise a DLInspectError."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DLInspectWarning)
        for fn in (dlinspect.peek,
                   lambda x: dlinspect.plan(x), lambda x: dlinspect.plan(x, target="host"),
                   lambda x: dlinspect.explain(x), lambda x: dlinspect.plan(x, copy=False),
                   lambda x: dlinspect.plan(x, fallback="raise", readonly="share")):
            try:
                fn(cap_or_obj)
            except DLInspectError:
                pass


@settings(max_examples=int(10_000 * SCALE), **SETTINGS)
@given(versioned=st.booleans(), version=versions, flag_bits=flags, device=st.tuples(device_types, device_ids),
       code=dtype_codes, bits=dtype_bits, lanes=dtype_lanes,
       ndim=st.one_of(st.integers(-2, 8), st.integers(60, 70), st.integers(INT64_MIN >> 33, 2**31 - 1)),
       extents=st.lists(small_or_huge, max_size=8),
       strides=st.one_of(st.none(), st.lists(small_or_huge, max_size=8)),
       byte_offset=st.one_of(st.integers(0, 128), st.integers(0, UINT64_MAX)),
       null_data=st.booleans(), name=st.sampled_from([None, None, None, "used_dltensor",
                                                        "used_dltensor_versioned", "dltensorX"]))
def test_any_header_is_read_or_refused(versioned, version, flag_bits, device, code, bits, lanes,
                                       ndim, extents, strides, byte_offset, null_data, name):
    """Headers that lie about anything: read in place, never dereferenced past the header."""
    if device[0] < -(2**31) or device[0] >= 2**31:
        device = (device[0] % (2**31), device[1])
    if not -(2**31) <= ndim < 2**31:
        ndim = ndim % (2**31)
    if strides is not None:
        strides = (strides + [1] * len(extents))[: len(extents)]
    counter = DeleterCounter()
    cap = make_capsule(None if null_data else np.zeros(16, np.uint8),
                       shape=extents, ndim=ndim, strides=strides, dtype=(code, bits, lanes),
                       device=device, byte_offset=byte_offset, versioned=versioned,
                       version=version, flags=flag_bits if versioned else 0, counter=counter,
                       name=name, address=None if null_data else 0x10000)
    calls(cap)
    try:
        info = dlinspect.peek(cap)
    except DLInspectError:
        # Refused headers: to_jax and to_host refuse them too, and consume nothing.
        # (Accepted ones point at unbacked memory here; the next test routes real memory.)
        for fn in (dlinspect.to_jax, dlinspect.to_host):
            with pytest.raises(DLInspectError):
                fn(cap)
            assert capsule_name(cap) == (name or ("dltensor_versioned" if versioned else "dltensor"))
    else:
        assert info.ndim == ndim and info.shape == tuple(extents[:ndim]) if ndim <= len(extents) else True
    del cap
    assert counter.calls == (0 if name else 1)
    record("any header: peek/plan/explain")


def _span(shape, strides, itemsize):
    lo = hi = 0
    for n, s in zip(shape, strides):
        if n > 0:
            lo += min(0, (n - 1) * s)
            hi += max(0, (n - 1) * s)
    return lo * itemsize, (hi + 1) * itemsize


REAL_DTYPES = ["float32", "float64", "float16", "int8", "uint8", "int16", "int32", "int64",
               "uint64", "bool", "complex64", "complex128", "bfloat16", "float8_e4m3fn",
               (0, 4, 1), (1, 4, 1), (2, 6, 1), (0, 32, 2), (3, 64, 1), (255, 8, 1)]
HOST_DEVICES = [DLDeviceType.kDLCPU] * 4 + [DLDeviceType.kDLCUDAHost, DLDeviceType.kDLCUDAManaged,
                                            DLDeviceType.kDLROCMHost]
OTHER_DEVICES = [DLDeviceType.kDLCUDA, DLDeviceType.kDLVulkan, DLDeviceType.kDLOpenCL,
                 DLDeviceType.kDLMetal, DLDeviceType.kDLROCM, DLDeviceType.kDLOneAPI, 99]


def _dtype_info(dtype):
    if isinstance(dtype, tuple):
        code, bits, lanes = dtype
        return (bits * lanes + 7) // 8, None
    dt = np.dtype(dtype) if dtype != "bfloat16" and not dtype.startswith("float8") else None
    if dt is None:
        import ml_dtypes
        dt = np.dtype(getattr(ml_dtypes, dtype))
    return dt.itemsize, dt


@settings(max_examples=int(8_000 * SCALE), **SETTINGS)
@given(shape=st.lists(st.integers(0, 5), max_size=4),
       stride_mode=st.sampled_from(["null", "c", "random"]),
       random_strides=st.lists(st.integers(-6, 6), min_size=4, max_size=4),
       byte_offset=st.integers(0, 70), misalign=st.integers(0, 63),
       dtype=st.sampled_from(REAL_DTYPES), versioned=st.booleans(),
       flag_bits=st.integers(0, 7), device=st.one_of(st.sampled_from(HOST_DEVICES),
                                                   st.sampled_from(OTHER_DEVICES)),
       copy=st.sampled_from([None, None, True, False]), x64=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_backed_header_routes(shape, stride_mode, random_strides, byte_offset, misalign, dtype,
                              versioned, flag_bits, device, copy, x64, seed):
    """Headers whose memory claims are true: every route runs, values match NumPy's view."""
    itemsize, np_dtype = _dtype_info(dtype)
    if stride_mode == "null":
        strides = None
        c_strides = [int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape))]
    elif stride_mode == "c":
        strides = c_strides = [int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape))]
    else:
        strides = c_strides = random_strides[: len(shape)]
    lo, hi = _span(shape, c_strides, max(itemsize, 1))
    rng = np.random.default_rng(seed)
    buf = rng.integers(0, 2 if dtype == "bool" else 256, size=(hi - lo) + 256, dtype=np.uint8)
    base = buf.ctypes.data + 64 + misalign - lo   # element (0, ..., 0) sits here
    counter = DeleterCounter()
    cap = make_capsule(buf, address=base - byte_offset, shape=shape, strides=strides, dtype=dtype,
                       device=(device, 0), byte_offset=byte_offset, versioned=versioned,
                       flags=flag_bits if versioned else 0, counter=counter)
    calls(cap)
    made = 1
    results = []
    with warnings.catch_warnings(), enable_x64(x64):
        warnings.simplefilter("ignore", DLInspectWarning)
        for fn in (lambda c: dlinspect.to_host(c, copy=copy), lambda c: dlinspect.to_jax(c, copy=copy)):
            before = capsule_name(cap)
            try:
                results.append(np.asarray(fn(cap)))
            except DLInspectError:
                assert capsule_name(cap) == before  # a failed route consumes nothing
                results.append(None)
            if capsule_name(cap).startswith("used_"):
                # consumed: a fresh capsule over the same memory for the next call
                cap = make_capsule(buf, address=base - byte_offset, shape=shape, strides=strides,
                                   dtype=dtype, device=(device, 0), byte_offset=byte_offset,
                                   versioned=versioned, flags=flag_bits if versioned else 0,
                                   counter=counter)
                made += 1
    host, via_jax = results
    if np_dtype is not None and 0 not in shape:
        view = np.ndarray(shape, np_dtype, buffer=buf, offset=64 + misalign - lo,
                          strides=[s * itemsize for s in c_strides])
        if host is not None:
            assert host.dtype == np_dtype and host.tobytes() == view.tobytes()
        if via_jax is not None and via_jax.dtype == np_dtype:
            assert via_jax.tobytes() == view.tobytes()
    del results, host, via_jax, cap
    # By reference counting (no route leaves a cycle holding a tensor), once JAX lets go:
    # jaxlib drops host memory it views at its next call, and may release an imported
    # buffer a moment later on its own thread; exactly once either way.
    jax.device_put(0)
    deadline = time.monotonic() + 5
    while counter.calls < made and time.monotonic() < deadline:
        time.sleep(0.001)
    assert counter.calls == made
    record("backed header: to_jax/to_host")


REFUSALS = [None, None, None, "requires_grad", "weird", TypeError("only arrays with no nulls"),
            RuntimeError("no"), type("ProducerSpecific", (Exception,), {})("its own words")]


@settings(max_examples=int(3_000 * SCALE), **SETTINGS)
@given(shape=st.lists(st.integers(0, 4), max_size=3), step=st.sampled_from([1, 1, 2, -1]),
       dtype=st.sampled_from(["float32", "float64", "int64", "bool", "uint8", "complex64"]),
       device=st.one_of(st.sampled_from(HOST_DEVICES), st.sampled_from(OTHER_DEVICES)),
       header=st.sampled_from(["same", "same", "same", "cpu", "other"]), id_none=st.booleans(),
       legacy_only=st.booleans(), read_only=st.booleans(), host_copy=st.booleans(),
       refuse=st.sampled_from(REFUSALS),
       fallback=st.sampled_from(["host", "raise"]), readonly=st.sampled_from(["copy", "share"]))
def test_producers(shape, step, dtype, device, header, id_none, legacy_only, read_only, host_copy,
                   refuse, fallback, readonly):
    """Producers on any device, old and new, refusing or not, their __dlpack_device__ agreeing
    with their header or not: right values or a DLInspectError, exactly as plan() said."""
    arr = np.arange(int(np.prod(shape)), dtype=np.int64).astype(dtype).reshape(shape)
    if arr.ndim and step != 1:
        arr = arr[..., ::step]
    capsule_device = {"same": None, "cpu": (DLDeviceType.kDLCPU, 0),
                      "other": (DLDeviceType.kDLVulkan, 3)}[header]
    p = FakeProducer(arr, (device, None if id_none else 0), capsule_device=capsule_device,
                     legacy_only=legacy_only, read_only=read_only, host_copy=host_copy,
                     refuse=refuse)
    calls(p)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DLInspectWarning)
        for target, fn in (("host", lambda x: dlinspect.to_host(x)),
                           ("jax", lambda x: dlinspect.to_jax(x, fallback=fallback, readonly=readonly))):
            route = dlinspect.plan(p, target, **({"fallback": fallback, "readonly": readonly}
                                                 if target == "jax" else {}))
            try:
                out = np.asarray(fn(p))
            except DLInspectError as exc:
                if route.kind == "host-fallback":   # plan does not ask for the host copy
                    assert isinstance(exc, dlinspect.UnsupportedDeviceError), (route, exc)
                    continue
                assert route.kind == "error" and type(route.error) is type(exc), (route, exc)
                continue
            assert route.kind != "error", route
            np.testing.assert_array_equal(out.astype(np.result_type(out, arr)),
                                          arr.astype(np.result_type(out, arr)))
    del p
    record("producers")


ENTRY_POINTS = {
    "peek": dlinspect.peek, "plan": dlinspect.plan, "explain": dlinspect.explain,
    "to_jax": dlinspect.to_jax, "to_jax copy": lambda x: dlinspect.to_jax(x, copy=True),
    "to_jax no copy": lambda x: dlinspect.to_jax(x, copy=False), "to_host": dlinspect.to_host,
    "to_host copy": lambda x: dlinspect.to_host(x, copy=True),
    "a batch": lambda x: dlinspect.to_jax({"x": x}),
    "a batch copied": lambda x: dlinspect.to_jax([x], copy=True), "stack": lambda x: dlinspect.stack([x]),
}


class Forged:
    """A producer whose export points where ``address`` and ``byte_offset`` say."""

    def __init__(self, address, byte_offset):
        self.memory = np.arange(256, dtype=np.float32)
        self.address, self.byte_offset = address, byte_offset

    def __dlpack__(self, **kwargs):
        return make_capsule(self.memory, address=self.address, byte_offset=self.byte_offset)

    def __dlpack_device__(self):
        return (DLDeviceType.kDLCPU, 0)


def _mapped(start, size):
    """Whether bytes [start, start + size) lie in one mapping of this process (Linux's
    /proc/self/maps; False elsewhere)."""
    if not os.path.exists("/proc/self/maps"):
        return False
    with open("/proc/self/maps") as maps:
        for line in maps:
            low, high = (int(bound, 16) for bound in line.split()[0].split("-"))
            if low <= start and start + size <= high:
                return True
    return False


@pytest.mark.parametrize("address, byte_offset", [
    (None, 2**40), (None, 2**47), (None, 2**57), (None, 2**62), (None, 2**63), (None, UINT64_MAX - 7),
    (2**47, 0), (2**48 - 64, 0), (2**56, 0), (2**63, 0), (UINT64_MAX - 63, 0), (2**63, 2**63 - 64)])
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_header_pointing_past_memory_is_malformed_everywhere(address, byte_offset, entry):
    """A float32[256] whose DLTensor.data plus byte_offset lies at the top of the address
    range, or past the memory this process has mapped: every entry point plans an error or
    raises MalformedTensorError, reads nothing and consumes nothing; a bare capsule and a
    producer's export alike (stack takes producers only). Peek reads the header of memory
    that could lie in this process (it reads no element)."""
    memory = np.arange(256, dtype=np.float32)
    forged = Forged(address, byte_offset)
    for start in (memory.ctypes.data, forged.memory.ctypes.data):
        if address is None and _mapped(start + byte_offset, memory.nbytes):
            pytest.skip("the offset lands in memory this process has mapped (AddressSanitizer's "
                        "allocator reserves terabytes): such a header is not provably wrong")
    counter = DeleterCounter()
    cap = make_capsule(memory, address=address, byte_offset=byte_offset, counter=counter)
    for x in (forged,) + ((cap,) if entry != "stack" else ()):
        try:
            result = ENTRY_POINTS[entry](x)
        except dlinspect.MalformedTensorError as e:
            assert "address" in str(e) or "mapped" in str(e)
        else:
            if entry == "peek":
                assert result.data_ptr + 1024 <= 2**48
            elif entry == "plan":
                assert result.kind == "error" and type(result.error) is dlinspect.MalformedTensorError
            else:
                assert entry == "explain" and "MalformedTensorError" in result
            del result
        assert capsule_name(cap) == "dltensor_versioned"
    del cap, x
    assert counter.calls == 1

"""peek(): read a DLPack header in place, from capsules and from producers."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

import dlinspect
from dlinspect import DLDataTypeCode as C
from dlinspect import DLDeviceType as D
from dlinspect import (
    CapsuleConsumedError,
    MalformedTensorError,
    NotDLPackError,
    ProducerError,
    UnsupportedVersionError,
    peek,
)
from dlinspect.testing import (
    FLAG_IS_COPIED,
    FLAG_IS_SUBBYTE_TYPE_PADDED,
    FLAG_READ_ONLY,
    DeleterCounter,
    FakeProducer,
    make_capsule,
)
from dlinspect._core import capsule_name
from _versions import (NUMPY_TAKES_VERSIONED, NUMPY_VERSIONED, ml_dtypes_has, torch_exchange_api,
                       torch_exports_float8)

EXPECTED_NAMES = {
    (C.kDLInt, 8): "int8", (C.kDLInt, 64): "int64", (C.kDLInt, 4): "int4",
    (C.kDLUInt, 16): "uint16", (C.kDLUInt, 2): "uint2",
    (C.kDLFloat, 16): "float16", (C.kDLFloat, 32): "float32", (C.kDLFloat, 64): "float64",
    (C.kDLOpaqueHandle, 64): "opaque64", (C.kDLBfloat, 16): "bfloat16",
    (C.kDLComplex, 64): "complex64", (C.kDLComplex, 128): "complex128", (C.kDLBool, 8): "bool",
    (C.kDLFloat8_e3m4, 8): "float8_e3m4", (C.kDLFloat8_e4m3, 8): "float8_e4m3",
    (C.kDLFloat8_e4m3b11fnuz, 8): "float8_e4m3b11fnuz", (C.kDLFloat8_e4m3fn, 8): "float8_e4m3fn",
    (C.kDLFloat8_e4m3fnuz, 8): "float8_e4m3fnuz", (C.kDLFloat8_e5m2, 8): "float8_e5m2",
    (C.kDLFloat8_e5m2fnuz, 8): "float8_e5m2fnuz", (C.kDLFloat8_e8m0fnu, 8): "float8_e8m0fnu",
    (C.kDLFloat6_e2m3fn, 6): "float6_e2m3fn", (C.kDLFloat6_e3m2fn, 6): "float6_e3m2fn",
    (C.kDLFloat4_e2m1fn, 4): "float4_e2m1fn",
}


def _numpy_knows(name):
    try:
        np.dtype(name)
        return True
    except TypeError:
        return False


class TestCapsules:
    @pytest.mark.parametrize("versioned", [False, True])
    @pytest.mark.parametrize("device", list(D) + [42])
    def test_every_device_type(self, device, versioned):
        cap = make_capsule(np.zeros((2, 3), np.float32), device=(device, 3), versioned=versioned)
        info = peek(cap)
        assert info.device_type == device and info.device_id == 3
        assert info.device == (device, 3)
        assert info.capsule_device is None
        assert info.host_accessible == (device in (D.kDLCPU, D.kDLCUDAHost, D.kDLROCMHost, D.kDLCUDAManaged))
        if device == 42:
            assert type(info.device_type) is int and "DLDeviceType(42):3" in repr(info)
        else:
            assert str(info.device_type) == device.name and f"{device.name}:3" in repr(info)

    @pytest.mark.parametrize(("code", "bits"), sorted(EXPECTED_NAMES))
    def test_every_dtype_code(self, code, bits):
        cap = make_capsule(shape=(5,), dtype=(code, bits, 1), address=4096)
        info = peek(cap)
        assert info.dtype == (code, bits, 1)
        assert info.dtype_name == EXPECTED_NAMES[(code, bits)]
        assert info.itemsize == (bits + 7) // 8
        assert info.nbytes == (5 * bits + 7) // 8

    def test_unknown_code_and_lanes_are_described(self):
        assert peek(make_capsule(shape=(2,), dtype=(99, 8, 1), address=4096)).dtype_name == \
            "DLDataType(code=99, bits=8)"
        info = peek(make_capsule(shape=(2,), dtype=(C.kDLFloat, 32, 4), address=4096))
        assert info.dtype_name == "float32x4" and info.numpy_dtype == np.float32  # one lane
        assert info.itemsize == 16 and info.nbytes == 32

    def test_numpy_dtypes(self, ml_dtypes):
        for (code, bits), name in EXPECTED_NAMES.items():
            dt = peek(make_capsule(shape=(1,), dtype=(code, bits), address=4096)).numpy_dtype
            if code == C.kDLOpaqueHandle or not (ml_dtypes_has(name) or _numpy_knows(name)):
                assert dt is None   # opaque; or a name this ml_dtypes lacks (0.4: no uint2)
            else:
                assert dt is not None and dt.name == name, (name, dt)

    def test_subbyte_packed_and_padded(self):
        assert peek(make_capsule(shape=(3, 3), dtype=(C.kDLInt, 4), address=4096)).nbytes == 5
        padded = peek(make_capsule(shape=(3, 3), dtype=(C.kDLInt, 4), address=4096,
                                   flags=FLAG_IS_SUBBYTE_TYPE_PADDED))
        assert padded.nbytes == 9
        assert peek(make_capsule(shape=(7,), dtype=(C.kDLFloat6_e2m3fn, 6), address=4096)).nbytes == 6

    @pytest.mark.parametrize("versioned", [False, True])
    def test_capsule_unchanged_and_still_consumable(self, versioned):
        if versioned and not NUMPY_TAKES_VERSIONED:
            pytest.skip("numpy.from_dlpack takes versioned capsules from NumPy 2.1 on")
        counter = DeleterCounter()
        src = np.arange(6, dtype=np.float64).reshape(2, 3)
        cap = make_capsule(src, counter=counter, versioned=versioned)
        name = capsule_name(cap)
        for _ in range(3):
            info = peek(cap)
        assert capsule_name(cap) == name and counter.calls == 0
        assert info.shape == (2, 3) and info.data_ptr == src.ctypes.data

        class Holder:  # numpy.from_dlpack wants __dlpack__, not a bare capsule
            def __dlpack__(self, **kw):
                return cap  # noqa: F821 (the enclosing function's)
        out = np.from_dlpack(Holder())
        np.testing.assert_array_equal(out, src)
        assert capsule_name(cap) == "used_" + name and counter.calls == 0
        del out
        assert counter.calls == 1
        del cap
        assert counter.calls == 1

    def test_deleter_runs_once_when_unconsumed_capsule_dies(self):
        counter = DeleterCounter()
        cap = make_capsule(np.ones(3), counter=counter)
        peek(cap)
        del cap
        assert counter.calls == 1

    @pytest.mark.parametrize("name", ["used_dltensor", "used_dltensor_versioned"])
    def test_consumed_capsule(self, name):
        """A capsule already consumed: peek says so and reads nothing (its address is no
        memory)."""
        cap = make_capsule(address=0xDEAD, shape=(3,), name=name, null_deleter=True,
                           versioned=name.endswith("versioned"))
        with pytest.raises(CapsuleConsumedError, match="already took the tensor"):
            peek(cap)
        with pytest.raises(ValueError):
            peek(cap)

    def test_really_consumed_numpy_capsule(self):
        """The same with NumPy's own capsule, consumed by numpy.from_dlpack."""
        x = np.arange(3.0)

        class Holder:
            def __init__(self):
                self.cap = x.__dlpack__()

            def __dlpack__(self, **kw):
                return self.cap
        h = Holder()
        np.from_dlpack(h)
        with pytest.raises(CapsuleConsumedError, match="used_dltensor"):
            peek(h.cap)

    def test_foreign_capsule(self):
        cap = make_capsule(shape=(1,), address=4096, name="not_a_tensor", null_deleter=True)
        with pytest.raises(NotDLPackError, match="not_a_tensor"):
            peek(cap)

    def test_version_fields_are_unsigned(self):
        """DLPackVersion's fields are uint32: a minor of 2**32 - 1 reads as itself (it read -1)."""
        info = peek(make_capsule(np.ones(2), version=(1, 2**32 - 1)))
        assert info.version == (1, 2**32 - 1)
        assert pickle.loads(pickle.dumps(info)).version == (1, 2**32 - 1)
        with pytest.raises(UnsupportedVersionError, match="version 4294967295.0"):
            peek(make_capsule(np.ones(2), version=(2**32 - 1, 0)))

    @pytest.mark.parametrize("major", [0, 2, 3])
    def test_unsupported_major_version(self, major):
        cap = make_capsule(shape=(2,), address=4096, version=(major, 7), ndim=-5)
        with pytest.raises(UnsupportedVersionError, match=f"version {major}.7"):
            peek(cap)

    def test_versioned_fields(self):
        info = peek(make_capsule(np.ones(2), version=(1, 1), flags=FLAG_READ_ONLY | FLAG_IS_COPIED))
        assert info.version == (1, 1) and info.read_only and info.is_copied
        assert info.capsule_name == "dltensor_versioned" and info.source == "dltensor_versioned"
        legacy = peek(make_capsule(np.ones(2), versioned=False))
        assert legacy.version is None and legacy.read_only is None and legacy.is_copied is None
        assert legacy.capsule_name == "dltensor"

    def test_null_strides_are_row_major(self):
        info = peek(make_capsule(shape=(2, 3, 4), address=4096))
        assert info.strides_null and info.strides == (12, 4, 1) and info.is_c_contiguous
        assert info.byte_strides == (48, 16, 4)

    def test_zero_dim_and_null_shape(self):
        info = peek(make_capsule(shape=None, ndim=0, address=64))
        assert info.shape == () and info.size == 1 and info.nbytes == 4 and not info.strides_null

    def test_zero_size_and_null_data(self):
        info = peek(make_capsule(shape=(0, 5), strides=(7, 3)))
        assert info.size == 0 and info.nbytes == 0 and info.data_ptr == 0
        assert info.alignment == 4096 and info.is_c_contiguous and info.is_compact

    def test_alignment_and_byte_offset(self):
        info = peek(make_capsule(shape=(2,), address=4096 * 3, byte_offset=48))
        assert info.data_ptr == 4096 * 3 + 48 and info.alignment == 16 and info.byte_offset == 48
        assert peek(make_capsule(shape=(2,), address=4096 * 5)).alignment == 4096
        assert peek(make_capsule(shape=(2,), address=3)).alignment == 1

    def test_more_dims_than_inline_storage(self):
        shape = (1, 2) * 10
        info = peek(make_capsule(shape=shape, address=4096))
        assert info.shape == shape and info.size == 2 ** 10 and info.ndim == 20
        assert peek(make_capsule(shape=(1,) * dlinspect.MAX_NDIM, address=4096)).ndim == 64


MALFORMED = [
    ("ndim -1", dict(shape=(2,), ndim=-1), "ndim is -1"),
    ("ndim huge", dict(shape=(2,), ndim=65), "ndim is 65"),
    ("ndim int32 max", dict(shape=(2,), ndim=2**31 - 1), "ndim is 2147483647"),
    ("null shape", dict(shape=None, ndim=2), "shape is NULL"),
    ("negative extent", dict(shape=(3, -2)), r"shape\[1\] is -2"),
    ("element overflow", dict(shape=(2**40, 2**40)), "more than 2\\*\\*63-1 elements"),
    ("byte overflow", dict(shape=(2**60, 4), dtype="float64"), r"more than 2\*\*63-1 bytes"),
    ("stride overflow", dict(shape=(4, 4), strides=(2**62, 1)), "reach past"),
    ("stride int64 min", dict(shape=(2,), strides=(-(2**63),)), "reach past"),
    ("span byte overflow", dict(shape=(2, 2), strides=(2**61, 1), dtype="float64"), "span more than"),
    ("zero lanes", dict(shape=(2,), dtype=(2, 32, 0)), "lanes is 0"),
    ("offset past address space", dict(shape=(2,), byte_offset=2**64 - 16), "address space"),
    ("offset past user addresses", dict(shape=(2,), byte_offset=2**48), "address space"),
    ("offset of 2**62", dict(shape=(256,), dtype="float32", byte_offset=2**62), "address space"),
    ("span past user addresses", dict(shape=(4,), strides=(2**50,)), "address space"),
    ("negative stride below address 0", dict(shape=(4,), strides=(-4096,), dtype="float64"),
     "98304 bytes before it"),
]


class TestMalformed:
    @pytest.mark.parametrize(("case", "kwargs", "message"), MALFORMED, ids=[m[0] for m in MALFORMED])
    @pytest.mark.parametrize("versioned", [False, True])
    def test_malformed_header(self, case, kwargs, message, versioned):
        counter = DeleterCounter()
        cap = make_capsule(address=4096, versioned=versioned, counter=counter, **kwargs)
        with pytest.raises(MalformedTensorError, match=message):
            peek(cap)
        with pytest.raises(BufferError):
            peek(cap)
        assert counter.calls == 0
        del cap
        assert counter.calls == 1

    @pytest.mark.parametrize("n", [2**63 - 8, 2**63 - 7, 2**63 - 1])
    def test_packed_bits_near_int64_max(self, n):
        """1-bit elements whose bit count rounds up past 2**63 - 1 (UBSan found the rounding
        overflowing): counted right on a device, and in host memory, where 2**60 bytes pass the
        end of user addresses, a MalformedTensorError from every entry point, nothing consumed."""
        on_device = make_capsule(address=4096, shape=[n], dtype=(1, 1, 1), device=(2, 0))
        assert peek(on_device).nbytes == (n + 7) // 8
        counter = DeleterCounter()
        cap = make_capsule(np.zeros(16, np.uint8), shape=[n], dtype=(1, 1, 1), counter=counter)
        with pytest.raises(MalformedTensorError, match="address space"):
            peek(cap)
        for convert in (dlinspect.to_host, dlinspect.to_jax):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", dlinspect.DLInspectWarning)
                with pytest.raises(dlinspect.DLInspectError):
                    convert(cap)
            assert capsule_name(cap) == "dltensor_versioned"
        del cap
        assert counter.calls == 1

    def test_null_data_with_elements(self):
        with pytest.raises(MalformedTensorError, match="data is NULL but the shape \\(4,\\) holds 4"):
            peek(make_capsule(None, shape=(4,)))
        assert peek(make_capsule(None, shape=(0, 4))).size == 0

    def test_huge_zero_size_is_fine(self):
        info = peek(make_capsule(shape=(2**62, 0, 2**62), address=4096))
        assert info.size == 0 and info.nbytes == 0
        # NULL strides: C order (zero extents count as 1). UBSan found the signed overflow
        # of the unused last product 2**62 * 2**62; regression input for it.
        assert info.strides == (2**62, 2**62, 1) and info.is_c_contiguous and info.is_compact
        info = peek(make_capsule(shape=(2**40, 2**40, 0, 2**40), address=4096))
        assert info.size == 0 and info.strides == (0, 2**40, 2**40, 1)


class TestNumpy:
    def test_c_contiguous(self):
        x = np.zeros((3, 4), np.float32)
        info = peek(x)
        assert (info.shape, info.strides, info.dtype_name) == ((3, 4), (4, 1), "float32")
        assert info.is_c_contiguous and not info.is_f_contiguous and info.is_compact
        if NUMPY_VERSIONED:
            assert info.version == (1, 0) and info.read_only is False
            assert info.source == "dltensor_versioned"
        else:   # NumPy < 2.1 exports legacy capsules only
            assert info.version is None and info.source == "dltensor"
        assert info.data_ptr == x.ctypes.data and info.nbytes == 48

    def test_transpose_is_compact_not_c(self):
        info = peek(np.ones((2, 3)).T)
        assert info.strides == (1, 3) and info.is_f_contiguous and info.is_compact
        assert not info.is_c_contiguous

    def test_slice_with_gap(self):
        """A column slice with gaps between its rows, which JAX refuses: not compact."""
        info = peek(np.arange(6, dtype=np.float32).reshape(2, 3)[:, :2])
        assert info.strides == (3, 1) and not info.is_compact and not info.is_c_contiguous
        assert not info.has_broadcast and not info.has_negative_strides

    def test_broadcast(self):
        """np.broadcast_to's stride-0 array, which NumPy will not export (it is read-only)
        and JAX refuses: peek reports the broadcast."""
        info = peek(np.broadcast_to(np.float32(7), (3, 4)))
        assert info.strides == (0, 0) and info.has_broadcast and not info.is_compact
        assert info.read_only is True

    def test_negative_strides(self):
        x = np.arange(8, dtype=np.float32)[::-1]
        info = peek(x)
        assert info.strides == (-1,) and info.has_negative_strides and not info.is_compact
        assert info.data_ptr == x.ctypes.data

    def test_read_only(self):
        """A read-only NumPy array, which NumPy refuses to export to JAX: peek describes
        it, with read_only=True."""
        x = np.ones(3)
        x.flags.writeable = False
        info = peek(x)   # (NumPy < 2.1 cannot export it: dlinspect describes it itself)
        assert info.read_only is True and info.version in ((1, 0), (1, 3))

    def test_bool(self):
        info = peek(np.array([True, False]))
        assert info.dtype_name == "bool" and info.dtype == (C.kDLBool, 8, 1)

    def test_zero_d_and_zero_size(self):
        assert peek(np.array(3.0)).shape == ()
        info = peek(np.empty((0, 3), np.int16))
        assert info.size == 0 and info.is_c_contiguous and info.is_f_contiguous

    def test_bare_capsule(self):
        """A bare capsule, no ``__dlpack_device__`` to ask: the device is the header's."""
        info = peek(np.arange(3.0).__dlpack__())
        assert info.device == (D.kDLCPU, 0) and info.capsule_name == "dltensor"


class TestTorch:
    def test_exchange_api_path(self, torch):
        if not torch_exchange_api():
            pytest.skip(f"torch {torch.__version__} has no DLPack C exchange API")
        t = torch.ones(3, 4)
        assert dlinspect._core.exchange_api_version(torch.Tensor) is not None
        info = peek(t)
        assert info.source == "exchange_api" and info.capsule_name is None
        assert info.shape == (3, 4) and info.data_ptr == t.data_ptr()

    @pytest.mark.parametrize("make", [
        lambda torch: torch.ones(3, 4).t(),
        lambda torch: torch.zeros(2, 3, 4).permute(2, 0, 1),
    ])
    def test_permutations_are_compact(self, torch, make):
        info = peek(make(torch))
        assert info.is_compact and not info.is_c_contiguous

    def test_expand_is_broadcast(self, torch):
        info = peek(torch.tensor([1.0, 2.0]).expand(3, 2))
        assert info.strides == (0, 1) and info.has_broadcast

    def test_bool_bfloat16_float8(self, torch):
        """The names of dtypes other consumers refused: bool (older ones), bfloat16 and
        float8_e4m3fn (numpy.from_dlpack)."""
        assert peek(torch.tensor([1, 2, 3]) > 2).dtype_name == "bool"
        assert peek(torch.arange(3, dtype=torch.bfloat16)).dtype_name == "bfloat16"
        if torch_exports_float8():   # torch 2.3: "float8 types are not supported by dlpack"
            assert peek(torch.zeros(3, dtype=torch.float8_e4m3fn)).dtype_name == "float8_e4m3fn"

    def test_capsule_from_torch(self, torch):
        t = torch.arange(6.0).reshape(2, 3)
        try:
            cap, name = t.__dlpack__(max_version=(1, 0)), "dltensor_versioned"
        except TypeError:   # torch < 2.4: __dlpack__(stream=None) only
            cap, name = t.__dlpack__(), "dltensor"
        info = peek(cap)
        assert info.capsule_name == name and info.shape == (2, 3)
        assert torch.from_dlpack(cap).sum().item() == 15.0

    def test_requires_grad_is_described(self, torch):
        # The exchange API describes it; routing decides (see test_producers.py). Without the
        # API, peek has only torch's __dlpack__, which refuses it.
        if torch_exchange_api():
            assert peek(torch.ones(2, requires_grad=True)).shape == (2,)
        else:
            with pytest.raises(ProducerError, match="detach"):
                peek(torch.ones(2, requires_grad=True))


class TestJax:
    def test_jax_array(self, jax):
        import jax.numpy as jnp
        info = peek(jnp.arange(6, dtype=jnp.float32).reshape(2, 3))
        assert info.shape == (2, 3) and info.device_type == D.kDLCPU and info.dtype_name == "float32"


class TestProducers:
    def test_dlpack_device_wins_and_capsule_device_is_kept(self):
        """A pinned torch tensor's way: ``__dlpack_device__`` says kDLCUDAHost, the
        capsule kDLCPU. Pinned memory is host-accessible, and the capsule's device kept."""
        p = FakeProducer(np.ones(3, np.float32), device=(D.kDLCUDAHost, 0), capsule_device=(D.kDLCPU, 0))
        info = peek(p)
        assert info.device == (D.kDLCUDAHost, 0) and info.capsule_device == (D.kDLCPU, 0)
        assert info.host_accessible and "capsule_device=kDLCPU:0" in repr(info)
        assert p.calls == [{"stream": None, "max_version": (1, 3)}]
        assert p.counter.calls == 1

    def test_old_producer_retried_without_max_version(self):
        p = FakeProducer(np.ones(3), legacy_only=True)
        info = peek(p)
        assert info.capsule_name == "dltensor" and len(p.calls) == 1
        assert p.counter.calls == 1

    def test_producer_refusal_keeps_reason(self):
        p = FakeProducer(np.ones(3), refuse="Can't export tensors that require gradient, use tensor.detach()")
        with pytest.raises(ProducerError, match=r"require gradient.*detach\(\)") as err:
            peek(p)
        assert isinstance(err.value.__cause__, BufferError)

    def test_not_dlpack(self):
        with pytest.raises(NotDLPackError, match="neither a DLPack capsule nor has __dlpack__"):
            peek([1, 2, 3])
        with pytest.raises(TypeError):
            peek(object())

    def test_vulkan_producer(self):
        """Memory on a device no JAX backend serves (Vulkan): described, not host memory."""
        info = peek(FakeProducer(np.ones((2, 2), np.float32), device=(D.kDLVulkan, 1)))
        assert info.device == (D.kDLVulkan, 1) and not info.host_accessible


class TestTensorInfo:
    def test_immutable(self):
        info = peek(np.ones(3))
        with pytest.raises(AttributeError):
            info.shape = (4,)
        with pytest.raises(AttributeError):
            info.extra = 1
        with pytest.raises(TypeError):
            dlinspect.TensorInfo()

    def test_pickle_round_trip(self):
        info = peek(FakeProducer(np.ones((2, 3), np.float32).T, device=(D.kDLCUDAHost, 0),
                                 capsule_device=(D.kDLCPU, 0), read_only=True))
        back = pickle.loads(pickle.dumps(info))
        assert back == info and back.to_dict() == info.to_dict() and repr(back) == repr(info)

    def test_repr_one_line(self):
        x = np.zeros((3, 4), np.float32)
        r = repr(peek(x))
        assert r.startswith("<TensorInfo kDLCPU:0 float32[3, 4] strides=(4, 1) C-contiguous 48 B align=")
        assert "\n" not in r

    def test_to_dict_is_plain(self):
        import json
        d = peek(np.ones((2, 2))).to_dict()
        assert json.loads(json.dumps(d)) == d
        assert d["shape"] == [2, 2] and d["device_type"] == "kDLCPU"


class TestSliced:
    """TensorInfo.sliced(index) is the header of x[index] (basic slices), whatever the
    steps: what each device's slice of a sharded split is decided from."""

    @staticmethod
    def _slices(draw, shape):
        from hypothesis import strategies as st
        out = []
        for extent in shape[: draw(st.integers(0, len(shape)))]:
            bound = st.one_of(st.none(), st.integers(-extent - 2, extent + 2))
            out.append(slice(draw(bound), draw(bound),
                             draw(st.one_of(st.none(), st.sampled_from([-3, -2, -1, 1, 2, 3])))))
        return tuple(out)

    def test_is_the_header_of_the_slice(self):
        from hypothesis import given, settings
        from hypothesis import strategies as st

        @settings(max_examples=300, deadline=None)
        @given(shape=st.lists(st.integers(0, 6), min_size=1, max_size=4), data=st.data(),
               reverse=st.booleans())
        def check(shape, data, reverse):
            x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
            if reverse:
                x = x[::-1]
            index = self._slices(data.draw, shape)
            got, want = dlinspect.peek(x).sliced(index), dlinspect.peek(x[index])
            assert got.shape == want.shape and got.dtype == want.dtype
            if want.size:   # (an empty slice's strides and address are not read)
                assert got.data_ptr == want.data_ptr
                assert [s for s, n in zip(got.strides, got.shape) if n > 1] == \
                    [s for s, n in zip(want.strides, want.shape) if n > 1]
        check()

    def test_refuses_what_is_not_a_basic_slice(self):
        info = dlinspect.peek(np.ones((2, 3)))
        with pytest.raises(TypeError, match="takes slices, not int"):
            info.sliced((0,))
        with pytest.raises(ValueError, match="3 slices for a tensor of 2"):
            info.sliced((slice(None),) * 3)
        assert info.sliced([slice(1, None)]).shape == (1, 3)   # any sequence of slices

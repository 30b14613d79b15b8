"""Producers: their refusals, the array API protocol as they speak it, and the lifetime
of what they export on every route (the deleter exactly once)."""

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
    NotDLPackError,
    ProducerError,
    UnsupportedDeviceError,
    explain,
    plan,
    to_host,
    to_jax,
)
from dlinspect import _core  # noqa: E402
from dlinspect import _core as djax  # noqa: E402
from dlinspect._core import capsule_name  # noqa: E402
from dlinspect.testing import DeleterCounter, FakeProducer, make_capsule  # noqa: E402
from _helpers import aligned, buffer_pointer, jax_lets_go  # noqa: E402
from _versions import (  # noqa: E402
    NUMPY_TAKES_VERSIONED, NUMPY_VERSIONED, torch_exchange_api)


class TestProducerErrors:
    """Any exception a producer raises becomes a ProducerError with its own words."""

    def test_torch_refusals(self, torch):
        """torch refuses a tensor that requires grad, a conjugated one and a sparse one
        with its own BufferError: the error keeps torch's reason and adds what to do
        (detach(), resolve_conj(), to_dense())."""
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
    def test_any_exception_type(self, exc):
        """A refusal of any exception type (pyarrow raises ArrowTypeError, a TypeError, for
        an array with nulls, once raised as it was after a second call without keywords):
        a ProducerError keeping the producer's words, plan's kind "error", one call."""
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

    def test_a_quantized_torch_tensor_is_told_to_dequantize(self, torch):
        # torch refuses quantized dtypes in its own words; the fix is torch's dequantize().
        with warnings.catch_warnings():   # (torch deprecates making quantized tensors)
            warnings.simplefilter("ignore")
            q = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)
        with pytest.raises(ProducerError, match=r"To fix: call \.dequantize\(\) first"):
            to_jax(q)
        assert q.is_quantized   # (refused, untouched)

    @pytest.mark.parametrize("module, name, method", [
        ("paddle.base.core", "Tensor", "x.astype(paddle.complex64)"),
        ("mlx.core", "array", "a.astype(mlx.core.complex64)"),
        ("somewhere", "Tensor", "xp.astype(x, xp.complex64)"),
    ])
    def test_dtype_advice_names_the_producers_method(self, module, name, method):
        cls = type(name, (FakeProducer,), {"__module__": module})
        p = cls(np.zeros(4, np.uint8), dtype=(dlinspect.DLDataTypeCode.kDLComplex, 32, 1))
        for target in ("jax", "host"):   # (JAX has no complex32; NumPy may, from ml_dtypes)
            route = plan(p, target)
            assert route.kind == "error" or target == "host"
            assert route.kind != "error" or f"convert it to complex64 first ({method})" in str(route.error)
            assert "t.float()" not in str(route.error)

    def test_refusal_advice_is_the_producers_own(self):
        # Words no hint matches: the advice is the producer's row's, never torch's methods
        # for a tensor of another library.
        refusal = RuntimeError("UNIMPLEMENTED: XLA type S4 has no DLPack equivalent")
        Mlx = type("array", (FakeProducer,), {"__module__": "mlx.core"})
        with pytest.raises(ProducerError, match=r"To fix: take it as NumPy with numpy\.array"):
            to_host(Mlx(np.ones(2), refuse=RuntimeError("strange")))
        for p in (FakeProducer(np.ones(2), refuse=refusal), Mlx(np.ones(2), refuse=refusal)):
            with pytest.raises(ProducerError) as err:
                to_host(p)
            assert ".cpu()" not in str(err.value) and ".contiguous()" not in str(err.value)

    def test_jax_int4_to_host_advises_numpy(self):
        ml_dtypes = pytest.importorskip("ml_dtypes")
        x = jax.device_put(np.array([0, 1, 2, 3], ml_dtypes.int4))   # (old jax: no int4 iota)
        try:
            np.testing.assert_array_equal(np.asarray(to_host(x)).astype(np.int8), [0, 1, 2, 3])
        except ProducerError as exc:   # a jaxlib whose __dlpack__ has no int4
            assert "numpy.asarray(x)" in str(exc) and ".cpu()" not in str(exc)
            np.testing.assert_array_equal(np.asarray(x).astype(np.int8), [0, 1, 2, 3])

    @pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
    def test_complex32_advice_keeps_the_imaginary_part(self, torch):
        t = torch.zeros(3, dtype=torch.complex32)
        with pytest.raises(dlinspect.UnsupportedDTypeError,
                           match=r"t\.to\(torch\.complex64\)") as err:
            to_jax(t)
        assert "t.float()" not in str(err.value)

    def test_a_loader_is_refused_naming_prefetch_to_jax(self, torch):
        DatasetV2 = type("DatasetV2", (), {"__module__": "tensorflow.python.data.ops.dataset_ops"})
        loaders = [torch.utils.data.DataLoader([np.zeros(2)] * 4, batch_size=2),
                   type("DataLoader", (), {"__module__": "grain._src.python.data_loader"})(),
                   type("MapDataset", (), {"__module__": "grain._src.python.dataset.dataset"})(),
                   type("_PrefetchDataset", (DatasetV2,), {"__module__": DatasetV2.__module__})()]
        for loader in loaders:
            with pytest.raises(ProducerError, match=r"data loader.*prefetch_to_jax\(loader\)"):
                to_jax(loader)
            batch = {"x": np.zeros(2, np.float32), "loader": loader}
            assert plan(batch)["loader"].kind == "error"
            with pytest.raises(ProducerError, match="prefetch_to_jax"):
                to_jax(batch)

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

    def test_lazy_negation_on_every_path(self, torch):
        """torch's lazy negative bit (``_neg_view()``, on a subclass too), whose values
        to_jax once returned un-negated: refused, saying resolve_neg(), on every path."""
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

    def test_lazy_negation_with_a_pinned_capable_producer(self, torch, monkeypatch):
        """The guard holds when __dlpack_device__ is asked too (a pinned-capable torch)."""
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        _core._TYPES.clear()
        try:
            t = torch.arange(4.0)._neg_view()
            with pytest.raises(ProducerError, match="resolve_neg"):
                to_jax(t)
            assert to_jax(torch.arange(4.0)).tolist() == [0, 1, 2, 3]
        finally:
            monkeypatch.undo()
            _core._TYPES.clear()

    def test_not_dlpack(self):
        with pytest.raises(NotDLPackError):
            to_jax(object(), leaves="raise")
        with pytest.raises(NotDLPackError):
            to_host("text")
        with pytest.raises(NotDLPackError):
            to_jax(np.ndarray, leaves="raise")

    def test_consumed_capsule(self):
        """A capsule some consumer already took (used_dltensor), on which consumers raised
        assorted errors or crashed: every route says it was consumed, reading nothing."""
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
        # torch's way of naming a device: told that JAX names them by object, and which it has
        platforms = sorted({d.platform for d in jax.devices()})
        with pytest.raises(TypeError, match=rf"not the string 'cuda'.*this JAX's devices are "
                                            rf"{', '.join(platforms)} ones"):
            to_jax(aligned([1.0]), device="cuda")
        # explain takes plan's options by name, and a misspelt one is named as explain's
        with pytest.raises(TypeError, match=r"explain\(\) got an unexpected keyword argument 'narow'"):
            explain(np.ones(3), narow="ok")
        assert "float64" in explain(np.ones(3), narrow="ok")

    def test_explain(self):
        text = explain(np.arange(6, dtype=np.float32).reshape(2, 3)[:, :2])
        assert text.splitlines()[0].startswith("<TensorInfo kDLCPU:0 float32[2, 2]")
        assert "route to jax: copy (16 B copied)" in text
        err = explain(FakeProducer(np.ones(1, np.float32), device=(D.kDLVulkan, 0)), fallback="raise")
        assert "UnsupportedDeviceError" in err
        refused = explain(FakeProducer(np.ones(1), refuse="no"))
        assert refused.startswith("<no header") and "ProducerError" in refused


class TestLifetimes:
    """The producer's deleter runs exactly once on every route (zero-copy, copy, host,
    error) and never during peek: consumers have leaked capsules (never calling it) and
    crashed (calling it twice)."""

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
                to_jax(p, fallback="raise")   # judged before any export: nothing to free
            assert p.calls == [] and p.counter.calls == 0
            with pytest.raises(CopyRequiredError):
                to_jax(p, copy=False)          # exported, then refused: freed at once
            assert p.counter.calls == 1
            with pytest.raises(CopyRequiredError):
                to_jax(FakeProducer(np.ones((3, 3), np.float32)[:, ::2], counter=p.counter),
                       copy=False)
            assert p.counter.calls == 2
        finally:
            gc.enable()

    @pytest.mark.parametrize("way", ["import", "put"])
    def test_failed_import_restores_versioned_capsule(self, monkeypatch, way):
        """jaxlib's DLPack import, or its batched put (after the capsule was taken for a
        view), fails: the capsule is left as it was, named and owning its tensor."""
        counter = DeleterCounter()
        cap = self._capsule(counter)
        c = djax.jax_caps()
        c.target   # built (and its probes run) before the import breaks
        real_put, failing = c._put_fn, []

        def boom(*args):
            raise RuntimeError("import failed")

        def put(*args):
            if failing:
                raise RuntimeError("put failed")
            return real_put(*args)
        if way == "import":
            monkeypatch.setattr(c, "_direct_fn", boom)
            monkeypatch.setattr(c, "_put_fn", None)
            monkeypatch.setattr(c, "_probe_dtype", lambda code, bits: None)
        else:
            monkeypatch.setattr(c, "_put_fn", put)
        monkeypatch.delattr(c, "target")   # (the cached one: built again)
        dlinspect._core.set_target(None)   # (the built target the hot path reads)
        assert (c.target.put is None) == (way == "import")
        failing.append(True)
        with pytest.raises(RuntimeError, match=f"{way} failed"):
            to_jax(cap)
        assert capsule_name(cap) == "dltensor_versioned" and counter.calls == 0
        monkeypatch.undo()
        dlinspect._core.set_target(None)
        y = to_jax(cap)
        del cap, y
        jax_lets_go()
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

    def test_to_hostread_only(self):
        x = np.ones(3)
        x.flags.writeable = False
        assert not to_host(x).flags.writeable
        # Before NumPy 2.1 its capsules are legacy, which cannot say "writable": the view
        # is read-only then, as numpy.from_dlpack's is.
        assert to_host(np.ones(3)).flags.writeable == NUMPY_VERSIONED


class TestProducerProtocol:
    def test_streams_none_on_cpu(self):
        p = FakeProducer(aligned([1, 2]))
        to_jax(p)
        assert p.calls == [{"stream": None, "max_version": (1, 3)}]

    def test_batch_dict(self, torch):
        """A torch DataLoader's batch, ``{"x": float32, "y": bool, "idx": int64}``, becomes
        the same dict of jax arrays, with no tree walk of one's own around from_dlpack."""
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
        assert len(_core._TYPES) <= _core.TYPES_MAX


# Capsule names live as long as the capsules that carry them.
LEGACY, USED = b"dltensor", b"used_dltensor"


class TestCapsulesWhoseDestructorRunsPython:
    """A producer's capsule destructor may be Python code (warp's is a ctypes callback):
    dlinspect lets go of an unconsumed export with no error pending, whatever the route
    raises, so that code runs as it would anywhere else."""

    def producer(self, seen):
        import ctypes
        api = ctypes.pythonapi
        api.PyCapsule_New.restype = ctypes.py_object
        api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        api.PyCapsule_GetPointer.restype = ctypes.c_void_p
        api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
        name_of = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(("PyCapsule_GetName", api))

        @ctypes.CFUNCTYPE(None, ctypes.c_void_p)
        def destructor(ptr):
            # Python code calling back into the C API, as warp's does
            seen.append(name_of(ptr).decode())

        class CtypesProducer:
            keep: list = []

            def __dlpack_device__(self):
                return (1, 0)

            def __dlpack__(self, **kwargs):
                # the header of a strided float32 tensor, held by a capsule of ctypes'
                inner = make_capsule(np.arange(6, dtype=np.float32), shape=(3,), strides=(2,),
                                     versioned=False)
                ptr = api.PyCapsule_GetPointer(inner, LEGACY)
                api.PyCapsule_SetName(inner, USED)   # its header is the new capsule's now
                self.keep.append((inner, destructor))
                return api.PyCapsule_New(ptr, LEGACY, ctypes.cast(destructor, ctypes.c_void_p))
        return CtypesProducer()

    def test_on_a_refused_route_and_in_a_batch(self):
        seen: list = []
        p = self.producer(seen)
        with pytest.raises(dlinspect.CopyRequiredError):
            to_jax(p, copy=False)
        with pytest.raises(dlinspect.CopyRequiredError, match=r"^\['a'\]: "):
            to_jax({"a": p, "b": aligned([1.0])}, copy=False)
        with pytest.raises(dlinspect.CopyRequiredError):
            dlinspect.to_jax(p, copy=False, device=jax.devices("cpu")[0])
        gc.collect()
        assert seen == ["dltensor"] * 3   # each export let go of, unconsumed, without error
        assert to_jax(p).tolist() == [0.0, 2.0, 4.0]

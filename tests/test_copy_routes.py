"""When to_jax copies host memory, and how: layouts JAX cannot view (gaps between rows,
broadcasts, negative strides, transposed and permuted orders), read-only and misaligned
memory, copy=True, the alignment of the copies, and the copies the core makes in C."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")

import dlinspect  # noqa: E402
from dlinspect import CopyRequiredError, DLInspectWarning, Need, plan, to_jax  # noqa: E402
from dlinspect import _core  # noqa: E402
from dlinspect._core import capsule_name  # noqa: E402
from dlinspect._core import check_options  # noqa: E402
from dlinspect.testing import DeleterCounter, aligned_empty, make_capsule  # noqa: E402
from _helpers import aligned, buffer_pointer, read_only, target  # noqa: E402
from _computations import assert_computes_like  # noqa: E402
from _versions import enable_x64  # noqa: E402

COPY_NEVER = check_options(copy=False)


class TestCopies:
    def test_slice_with_gaps(self, import_path):
        """A column slice, gaps between its rows, that JAX refuses ("Only DLPack tensors
        with trivial (compact) striding", even with copy=None): copied in C order, and
        copy=False is an error that names the strides."""
        x = np.arange(6, dtype=np.float32).reshape(2, 3)[:, :2]
        route = plan(x)
        assert route.kind == "copy" and "gaps" in route.reason and route.copy_bytes == 16
        assert route.needs & Need.LAYOUT
        np.testing.assert_array_equal(np.asarray(to_jax(x)), x)
        with pytest.raises(CopyRequiredError, match=r"strides \(3, 1\)"):
            to_jax(x, copy=False)
        with pytest.raises(ValueError):
            to_jax(x, copy=False)

    def test_broadcast(self, torch, import_path):
        """Broadcast memory, stride 0 (torch's expand; np.broadcast_to, whose read-only
        array NumPy will not even export), that JAX refuses: the right values."""
        t = torch.tensor([1.0, 2.0]).expand(3, 2)
        assert "broadcast" in plan(t).reason
        np.testing.assert_array_equal(np.asarray(to_jax(t)), t.numpy())
        b = np.broadcast_to(np.float32(7), (3, 4))
        np.testing.assert_array_equal(np.asarray(to_jax(b)), np.full((3, 4), 7, np.float32))

    def test_negative_strides(self, import_path):
        """A reversed array, which JAX refuses for its negative strides: the right values
        through a copy, and the plan says why."""
        x = np.arange(8, dtype=np.float32)[::-1]
        assert "negative strides" in plan(x).reason
        np.testing.assert_array_equal(np.asarray(to_jax(x)), x)

    def test_read_only(self, import_path):
        """A read-only NumPy array, which NumPy refuses to export to JAX (JAX asks for no
        versioned capsule, the only kind that can say read-only), converts through a copy,
        or shared with readonly='share'. NumPy < 2.1 cannot export read-only arrays at
        all: dlinspect then describes them itself (buffer protocol, READ_ONLY flag); the
        outcome is the same."""
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

    def test_misaligned(self, import_path):
        """Memory 16- but not 64-byte aligned, which JAX copies silently (with copy=False,
        a bare ValueError about alignment): plan predicts the copy and says why; copy=False
        names the alignment and aligned_empty, which gives aligned memory."""
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

    @pytest.mark.parametrize("make", [
        lambda torch: torch.arange(12.0).reshape(3, 4).t(),
        lambda torch: torch.arange(24.0).reshape(2, 3, 4).permute(2, 0, 1),
    ])
    def test_transposes(self, torch, make, import_path):
        """Transposed and permuted torch tensors, compact but not row-major (older JAX
        imported them with wrong values), keep their values. Copied into row-major order:
        JAX views a permuted layout only as an array committed in that layout, which
        jax.device_put moves wrong."""
        t = make(torch)
        assert plan(t).kind == "copy" and dlinspect.peek(t).is_compact
        y = to_jax(t)
        assert target().row_major(y)
        assert_computes_like(y, t.numpy())

    def test_numpy_transpose(self):
        """A NumPy transpose (F order), which older JAX imported with wrong values."""
        x = aligned(np.arange(6.0).reshape(2, 3)).T
        np.testing.assert_array_equal(np.asarray(to_jax(x)), x)

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

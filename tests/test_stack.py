"""dlinspect.stack: np.stack's values, written once into memory JAX views without a copy."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")
ml_dtypes = pytest.importorskip("ml_dtypes")

import dlinspect  # noqa: E402
from dlinspect import StackError, plan, stack, to_jax  # noqa: E402
from dlinspect.testing import aligned_empty  # noqa: E402
from _versions import enable_x64  # noqa: E402

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64", "complex64", "complex128", ml_dtypes.bfloat16]


def misaligned(shape, dtype, i):
    """An element as malloc may place it: 16 bytes past a 64-byte boundary."""
    x = aligned_empty(shape, dtype, 64, offset=16)
    x[...] = np.arange(int(np.prod(shape))).reshape(shape) % 7 + i
    return x


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 2, 3, 7, 16])
def test_every_dtype_and_batch_size_reaches_jax_zero_copy(dtype, n):
    elements = [{"x": misaligned((3, 5), dtype, i), "y": misaligned((), dtype, i)}
                for i in range(n)]
    batch = stack(elements)
    for key in ("x", "y"):
        want = np.stack([e[key] for e in elements])
        got = batch[key]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        assert got.flags.c_contiguous and got.flags.writeable
        assert got.ctypes.data % 64 == 0
    with enable_x64(True):   # 64-bit leaves too: x64 on, nothing to narrow
        routes = plan(batch)
        assert {r.kind for r in routes.values()} == {"zero-copy"}
        out = to_jax(batch)
        for key in ("x", "y"):
            assert out[key].unsafe_buffer_pointer() == batch[key].ctypes.data


def test_values_and_dtypes_are_np_stacks():
    # Mixed dtypes at one position (np.stack's promotion), Python scalars, strings,
    # objects, nested containers, namedtuples.
    Pair = collections.namedtuple("Pair", "a b")
    elements = [{"img": np.full((2, 2), i, np.uint8), "label": i, "score": float(i),
                 "mixed": np.int8(i) if i % 2 else np.float32(i), "id": f"ex{i}",
                 "obj": np.array([{"k": i}], dtype=object),
                 "pair": Pair(np.arange(3) + i, [np.float32(i), np.float32(-i)])}
                for i in range(5)]
    batch = stack(elements)
    flat_got, tree = jax.tree_util.tree_flatten(batch)
    columns = zip(*(jax.tree_util.tree_leaves(e) for e in elements))
    for got, column in zip(flat_got, columns):
        want = np.stack(column)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert tree == jax.tree_util.tree_structure(elements[0])
    assert isinstance(batch["pair"], Pair) and batch["id"].tolist() == [f"ex{i}" for i in range(5)]
    assert batch["obj"].dtype == object and batch["obj"][3, 0] == {"k": 3}


def test_torch_and_jax_elements(torch):
    elements = [{"t": torch.arange(6, dtype=torch.float32).reshape(2, 3) + i,
                 "j": jax.numpy.ones(4) * i} for i in range(3)]
    batch = stack(elements)
    np.testing.assert_array_equal(batch["t"], np.stack([e["t"].numpy() for e in elements]))
    np.testing.assert_array_equal(batch["j"], np.stack([np.asarray(e["j"]) for e in elements]))
    assert batch["t"].ctypes.data % 64 == 0 and plan(batch)["t"].kind == "zero-copy"


def test_alignment():
    x = [np.ones(100, np.float32)] * 3
    for alignment in (64, 128, 4096):
        assert stack(x, alignment=alignment).ctypes.data % alignment == 0
    for bad in (-1, 3, 96):
        with pytest.raises(ValueError, match="power of two"):
            stack(x, alignment=bad)


@dataclasses.dataclass
class Example:
    x: np.ndarray


def test_what_does_not_stack_says_where():
    with pytest.raises(StackError, match="no elements"):
        stack([])
    with pytest.raises(StackError, match=r"element 2 .*structure.*To fix"):
        stack([{"a": 1, "b": 2}, {"a": 1, "b": 2}, {"a": 1}])
    with pytest.raises(StackError, match=r"^\['b'\]\[1\]: element 1 has shape \(3,\).*\(2,\)"):
        stack([{"a": 0, "b": [0, np.ones(2)]}, {"a": 0, "b": [0, np.ones(3)]}])
    with pytest.raises(ValueError, match=r"^element 1 has shape \(3,\)"):   # as np.stack
        stack([np.ones(2), np.ones(3)])   # (a leaf at the top: no key path before it)
    assert issubclass(StackError, dlinspect.DLInspectError)


def test_a_generator_of_elements():
    batch = stack(np.full(3, i, np.float32) for i in range(4))
    np.testing.assert_array_equal(batch[:, 0], [0, 1, 2, 3])


def test_pinned_needs_a_cuda_device():
    """pinned=True allocates through torch's CUDA host allocator: where torch has no CUDA
    device, a clear refusal before anything is stacked (tests/gpu checks a real one)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: tests/gpu/test_cuda.py::TestPinnedStack")
    with pytest.raises(dlinspect.UnsupportedDeviceError,
                       match=r"page-locked host memory.*is_available\(\) is False.*pinned=False"):
        stack([np.ones(3)] * 2, pinned=True)
    assert stack([np.ones(3)] * 2, pinned=False).shape == (2, 3)

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


@pytest.mark.parametrize("kind", ["contiguous", "strided", "reversed", "fortran", "big-endian",
                                  "mixed", "0-d"])
def test_arrays_as_elements_are_np_stacks(kind):
    """Elements that are arrays themselves (one column, copied row by row in C where the
    dtypes agree and each row is contiguous, by NumPy where not) give np.stack's values."""
    base = [np.arange(24, dtype=np.float32).reshape(4, 6) * (i + 1) for i in range(5)]
    make = {"contiguous": lambda a: a, "strided": lambda a: a[:, ::2],
            "reversed": lambda a: a[::-1], "fortran": np.asfortranarray,
            "big-endian": lambda a: a.astype(">f4"), "0-d": lambda a: a[1, 1],
            "mixed": lambda a: a.astype(np.float16) if a[0, 1] % 2 else a}[kind]
    elements = [np.asarray(make(a)) for a in base]
    got, want = stack(elements), np.stack(elements)
    assert got.dtype == want.dtype and got.shape == want.shape and got.ctypes.data % 64 == 0
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("column", [[True, False], [np.float16(1.5), np.float16(2)], [b"a", b"bcd"],
                                    [1 + 2j, 3j], [np.int8(3), np.int8(-1)], [1, 2.5], ["a", "bc"]],
                         ids=repr)
def test_scalar_columns_are_np_stacks(column):
    """A leaf that is a scalar in every element (labels) has np.stack's dtype and values."""
    got = stack([{"s": v} for v in column])["s"]
    want = np.stack([np.asarray(v) for v in column])
    assert got.dtype == want.dtype and got.tolist() == want.tolist()


def test_structured_dtypes_are_packed_as_np_stack_packs_them():
    padded = np.dtype({"names": ["a", "b"], "formats": ["<i4", "<f8"], "offsets": [12, 0],
                       "itemsize": 24})
    x = np.zeros(3, padded)
    x["a"], x["b"] = [1, 2, 3], [0.5, 1.5, 2.5]
    got, want = stack([x, x[::-1]]), np.stack([x, x[::-1]])
    assert got.dtype == want.dtype and got.dtype.itemsize == want.dtype.itemsize
    assert got.tolist() == want.tolist() and got.ctypes.data % 64 == 0


def test_stack_column_copies_only_uniform_contiguous_arrays():
    """A column of C-contiguous arrays of one shape and native dtype is stacked into
    aligned memory, values as np.stack's; any other column is None (the caller's slower
    path), a non-contiguous array found after the allocation included."""
    column = dlinspect._core.stack_column
    rng = np.random.default_rng(0)
    arrays = [rng.random((3, 4), dtype=np.float32) for _ in range(5)]
    for alignment in (16, 64, 4096):
        out = column(arrays, alignment)
        assert out.ctypes.data % alignment == 0 and out.flags.c_contiguous
        assert out.flags.writeable and out.dtype == np.float32
        np.testing.assert_array_equal(out, np.stack(arrays))
        assert float((jax.numpy.asarray(out) + 0).sum()) == pytest.approx(
            float(np.stack(arrays).sum()), rel=1e-6)
    refused = {
        "empty arrays (their extents are checked on the caller's path)": [np.zeros((0, 2))] * 3,
        "NumPy's most dimensions (one more with the batch's)": [
            np.zeros((1,) * dlinspect._core.NUMPY_MAX_NDIM)] * 2,
        "another shape": arrays[:2] + [np.ones(4, np.float32)],
        "another dtype": arrays[:2] + [np.ones((3, 4), np.float64)],
        "non-native": [a.astype(">f4") for a in arrays],
        "object": [np.array([object()], object)] * 2,
        "structured": [np.zeros(3, [("a", "<i4")])] * 2,
        "not an ndarray": arrays[:1] + [[[0.0] * 4] * 3],
        "a later strided view": arrays[:1] + [np.ones((4, 3), np.float32).T],
        "empty": [],
    }
    for why, col in refused.items():
        assert column(col, 64) is None, why
    huge = np.broadcast_to(np.zeros(1, np.uint8), (2**62,))   # (a view: costs nothing)
    for n in (2, 4):   # 2**63 and 2**64 bytes: no wrap lets them past the memory bound
        assert column([huge] * n, 64) is None
        with pytest.raises(dlinspect.AllocationError, match=f"needs {n * 2**62} bytes"):
            stack([{"x": huge}] * n)


def test_torch_and_jax_elements(torch):
    elements = [{"t": torch.arange(6, dtype=torch.float32).reshape(2, 3) + i,
                 "j": jax.numpy.ones(4) * i} for i in range(3)]
    batch = stack(elements)
    np.testing.assert_array_equal(batch["t"], np.stack([e["t"].numpy() for e in elements]))
    np.testing.assert_array_equal(batch["j"], np.stack([np.asarray(e["j"]) for e in elements]))
    kind = plan(batch)["t"].kind   # (before pytest's assert holds the leaf in a variable)
    assert batch["t"].ctypes.data % 64 == 0 and kind == "zero-copy"


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
    with pytest.raises(ValueError, match=r"^element 1 has shape \(3,\) at the examples' top "
                                         r"level, and element 0 \(2,\)"):   # as np.stack
        stack([np.ones(2), np.ones(3)])   # (a leaf at the top: no key path before it)
    with pytest.raises(StackError, match=r"^\['b'\]\[1\]: element 1 has shape \(3,\) there"):
        stack([{"a": 0, "b": [0, np.ones(2)]}, {"a": 0, "b": [0, np.ones(3)]}])
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


class BatchEncoding(collections.UserDict):
    """What transformers' BatchEncoding is: a UserDict subclass."""


@dataclasses.dataclass
class Pair:
    image: np.ndarray
    label: int


class TestTheOneWalker:
    """stack walks the elements as to_jax walks a batch (dlinspect._tree): containers JAX
    does not register come back as their own types, and what cannot be walked or stacked
    is a dlinspect error naming the element, the key path, what was found and the fix."""

    def test_mapping_subclasses_and_dataclasses_keep_their_types(self):
        batch = stack([BatchEncoding(x=np.full(3, i, np.float32)) for i in range(4)])
        assert type(batch) is BatchEncoding and batch["x"].dtype == np.float32
        np.testing.assert_array_equal(batch["x"][:, 0], [0, 1, 2, 3])
        pairs = stack([Pair(np.full((2, 2), i, np.uint8), i) for i in range(3)])
        assert type(pairs) is Pair and pairs.image.shape == (3, 2, 2)
        assert pairs.label.tolist() == [0, 1, 2] and pairs.image.dtype == np.uint8
        assert plan(pairs).image.kind == "zero-copy"

    def test_structures_of_the_walker_must_match(self):
        with pytest.raises(StackError, match=r"element 1 .*BatchEncoding with keys \['y'\]"):
            stack([BatchEncoding(x=np.ones(2)), BatchEncoding(y=np.ones(2))])

    def test_a_batch_that_cannot_be_walked(self):
        loop = {"x": np.ones(2)}
        loop["self"] = loop
        with pytest.raises(dlinspect.ContainerError, match=r"^element 0: the batch contains "
                                                           r"itself: \['self'\]"):
            stack([loop])
        deep = np.ones(2)
        for _ in range(3000):
            deep = [deep]
        with pytest.raises(dlinspect.ContainerError, match="^element 0: .*nests more than"):
            stack([deep])
        with pytest.raises(dlinspect.ContainerError, match="keys of several types"):
            stack([{1: np.ones(2), "a": np.ones(2)}])
        assert stack([np.ones(2)]).shape == (1, 2)   # and the interpreter goes on

    def test_dtypes_with_no_common_dtype(self):
        record = np.zeros(2, dtype=[("a", "f4"), ("b", "i4")])
        with pytest.raises(StackError, match=r"^\['x'\]: element 1 has dtype float64 there, and "
                                             r"element 0 \[\('a'.*no common dtype.*To fix"):
            stack([{"x": record}, {"x": np.ones(2)}])
        with pytest.raises(StackError, match="datetime64.*no common dtype"):
            stack([np.datetime64("2020-01-01"), 1.0])

    def test_byte_order_as_np_stack(self):
        big = np.arange(3, dtype=">f4")
        got = stack([big, big])
        assert got.dtype == np.stack([big, big]).dtype == np.dtype("float32")
        np.testing.assert_array_equal(got, np.stack([big, big]))

    def test_tensors_read_as_to_host_reads_them(self, torch):
        bf16 = stack([{"t": torch.arange(3, dtype=torch.bfloat16) + i} for i in range(2)])
        assert bf16["t"].dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(bf16["t"].astype(np.float32), [[0, 1, 2], [1, 2, 3]])
        with pytest.raises(dlinspect.ProducerError, match=r"^element 0 at \['t'\]: .*detach"):
            stack([{"t": torch.ones(2, requires_grad=True)}])
        with pytest.raises(dlinspect.ProducerError,
                           match=r"no data.*torch.zeros_like\(t, device=\"cpu\"\)"):
            stack([torch.empty(2, device="meta")])

    def test_capsules_are_refused_unconsumed(self):
        cap = np.arange(3.0).__dlpack__()
        with pytest.raises(StackError, match="DLPack capsule.*To fix: pass the producer"):
            stack([cap])
        assert dlinspect._core.capsule_name(cap) == "dltensor"

    def test_what_is_not_elements(self):
        with pytest.raises(StackError, match="builtins.int is not iterable"):
            stack(5)
        with pytest.raises(StackError, match="one builtins.dict.*list of elements"):
            stack({"x": np.ones(2)})   # one element, not a sequence of them
        for bad in (2**63, 2**31):
            with pytest.raises(ValueError, match="power of two.*2\\*\\*30"):
                stack([np.ones(2)], alignment=bad)
        with pytest.raises(TypeError):
            stack([np.ones(2)], alignment=64.0)

    def test_a_batch_too_large_to_allocate(self):
        row = np.broadcast_to(np.uint8(1), (1 << 28,))   # 256 MiB a row, in no memory
        with pytest.raises(dlinspect.AllocationError, match=r"2199023255552 bytes.*stack fewer"):
            stack([row] * (1 << 13))
        with pytest.raises(MemoryError):
            stack([row] * (1 << 13))

    def test_a_leaf_numpy_makes_no_array_of(self):
        class Refuses:
            def __array__(self, dtype=None, copy=None):
                raise ValueError("no array here")
        with pytest.raises(StackError, match=r"^\['x'\]: element 0 is a .*Refuses that NumPy "
                                             r"makes no array of \(no array here\)"):
            stack([{"x": Refuses()}])


class TestOnlyDocumentedErrors:
    """Issue cases: a batched leaf no NumPy array can be is a StackError (65 dimensions,
    nonzero extents past int64 bytes); an object column too large for memory an
    AllocationError; never NumPy's own ValueError or MemoryError."""

    def test_leaves_of_numpys_most_dimensions(self):
        most = dlinspect._core.NUMPY_MAX_NDIM   # (64; 32 before NumPy 2)
        with pytest.raises(StackError, match=f"{most + 1} dimensions"):
            stack([np.zeros((1,) * most, np.float32)] * 2)
        with pytest.raises(StackError, match=f"{most + 1} dimensions"):
            stack([{"x": np.zeros((1,) * most, object)}] * 2)

    def test_empty_extents_past_int64(self):
        leaf = np.empty((2**60, 0), np.int8)
        with pytest.raises(StackError, match="2\\*\\*63"):
            stack([leaf] * 16)
        assert stack([leaf] * 4).shape == (4, 2**60, 0)

    def test_object_column_past_memory(self):
        from dlinspect import AllocationError
        huge = np.broadcast_to(np.array(None, object), (2**33,))
        with pytest.raises(AllocationError, match="bytes"):
            stack([huge, huge])

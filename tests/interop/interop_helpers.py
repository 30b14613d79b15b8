"""Helpers of the interop suite (see conftest.py): the agreement check on real producers,
the record of what ``jax.dlpack.from_dlpack`` does, lifetimes and leaks."""

from __future__ import annotations

import gc
import os
import warnings
from collections import defaultdict
from typing import Any, Callable

import numpy as np
import pytest

from dlinspect.bench._common import rss_kib


def need(module: str, pip_name: str) -> Any:
    """Import ``module`` or skip the calling test module, saying how to install it."""
    pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # producers' import-time deprecations
        return pytest.importorskip(
            module, reason=f"{pip_name} is not installed (bash scripts/interop.sh installs it)")


# ---- the agreement check -------------------------------------------------------

def pointer_of(result: Any) -> int:
    if isinstance(result, np.ndarray):
        return result.__array_interface__["data"][0]
    return result.addressable_data(0).unsafe_buffer_pointer()


def jax_reference(reference: np.ndarray) -> np.ndarray:
    """The values JAX holds for ``reference`` (64-bit types narrowed with x64 off)."""
    import jax.numpy as jnp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(jnp.asarray(np.array(reference, order="C")))


def same_values(got: Any, expected: np.ndarray) -> bool:
    got = np.asarray(got)
    if got.shape != expected.shape:
        return False
    if got.dtype != expected.dtype:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            expected = expected.astype(got.dtype)
    return bool(np.array_equal(got.astype(np.float64) if got.dtype.name == "bfloat16" else got,
                               expected.astype(np.float64) if got.dtype.name == "bfloat16"
                               else expected, equal_nan=got.dtype.kind in "fc"))


def check(x: Any, reference: np.ndarray, target: str = "jax", **options: Any) -> Any:
    """``plan(x, target, **options)`` against the conversion of ``x``; returns the route."""
    import dlinspect
    try:
        info = dlinspect.peek(x)
    except dlinspect.DLInspectError:
        info = None   # a producer's refusal or a bad header: the route must be an error
    route = dlinspect.plan(x, target, **options)
    convert = dlinspect.to_jax if target == "jax" else dlinspect.to_host
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = convert(x, **options)
        except dlinspect.DLInspectError as exc:
            assert route.kind == "error", (f"plan said {route.kind!r} but {target} raised "
                                           f"{type(exc).__name__}: {exc}", route)
            assert type(exc) is type(route.error), (route, exc)
            return route
    assert route.kind != "error", (f"plan said error ({route.error!r}) but {target} returned",
                                   route)
    assert info is not None, "peek raised, but the conversion worked"
    warned = [w for w in caught if issubclass(w.category, dlinspect.DLInspectWarning)]
    assert bool(warned) == (route.warning is not None), (
        f"route.warning={route.warning!r} but the conversion warned "
        f"{[str(w.message) for w in warned]}", route)
    if info.size == 0:   # no memory to share: an empty tensor counts as zero-copy
        assert route.kind == "zero-copy" and result.size == 0, route
    else:
        shares = pointer_of(result) == info.data_ptr
        assert shares == (route.kind == "zero-copy"), (
            f"plan said {route.kind!r} but the result "
            f"{'shares' if shares else 'does not share'} the producer's memory", route, info)
    expected = jax_reference(reference) if target == "jax" else np.asarray(reference)
    assert same_values(result, expected), (route, np.asarray(result), expected)
    if target == "jax":
        computes_like(result, reference, route)
    return route


def computes_like(result: Any, reference: np.ndarray, what: Any) -> None:
    """What users compute with ``result`` equals the same on ``jnp.asarray(reference)``
    (tests/_computations.py), for the dtypes jax.numpy computes with everywhere."""
    from _computations import assert_computes_like
    if np.dtype(result.dtype).name in COMPUTED:
        assert_computes_like(result, np.asarray(reference), str(what))


COMPUTED = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
            "float16", "float32", "float64", "bfloat16", "complex64", "complex128"}


def options() -> dict[str, list[dict[str, Any]]]:
    """Options that change a route, per target (``device=``: to_jax's general path, not
    its fast path)."""
    import jax
    return {
        "jax": [{}, {"copy": True}, {"copy": False}, {"readonly": "share"},
                {"device": jax.devices("cpu")[0]}],
        "host": [{}, {"copy": True}, {"copy": False}],
    }


def check_all(producer: str, case: str, make: Callable[[], Any], reference: np.ndarray) -> dict:
    """:func:`check` for every target and option on fresh tensors from ``make``, and
    ``explain`` saying ``plan``'s route; records what ``jax.dlpack.from_dlpack`` does.
    Returns ``{(target, options): kind}`` (options as sorted item tuples; ``()`` for the
    defaults)."""
    kinds = {}
    for target, variants in options().items():
        for options_ in variants:
            route = check(make(), reference, target, **options_)
            kinds[(target, tuple(sorted(options_.items())))] = route.kind
        import dlinspect
        x = make()   # its own memory: a small tensor's alignment varies from one to the next
        text = dlinspect.explain(x, target)
        assert f"route to {target}: {dlinspect.plan(x, target).kind}" in text, text
    x = make()
    record_jax(producer, case, x, dlinspect.plan(x).kind)   # the same tensor's route
    return kinds


# ---- what jax.dlpack.from_dlpack does with the same tensor ------------------------

JAX_RECORD: dict[str, list[dict]] = defaultdict(list)


def jax_from_dlpack(x: Any) -> tuple[str, str]:
    """``("ok" | "shares" | "raised", detail)`` of ``jax.dlpack.from_dlpack(x)``."""
    import jax
    import dlinspect
    try:
        ptr = dlinspect.peek(x).data_ptr
    except Exception:
        ptr = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            y = jax.dlpack.from_dlpack(x)
        except Exception as exc:
            msg = str(exc).splitlines()[0][:160] if str(exc) else ""
            if ", array:" in msg:   # JAX's TypeError prints the whole array after this
                msg = msg.split(", array:")[0] + ")"
            return "raised", f"{type(exc).__name__}: {msg}"
    if y.size and ptr is not None and pointer_of(y) == ptr:
        return "shares", f"{y.dtype}{list(y.shape)}"
    return "ok", f"{y.dtype}{list(y.shape)} (a copy)" if y.size else f"{y.dtype}{list(y.shape)}"


def record_jax(producer: str, case: str, x: Any, dlinspect_kind: str) -> tuple[str, str]:
    outcome = jax_from_dlpack(x)
    JAX_RECORD[producer].append({"case": case, "dlinspect": dlinspect_kind,
                                 "jax": outcome[0], "detail": outcome[1]})
    return outcome


# ---- lifetimes -------------------------------------------------------------------

def check_lifetime(make: Callable[[], Any], reference: np.ndarray,
                   churn: Callable[[], Any] | None = None) -> None:
    """The result stays right after the producer's object is deleted and its memory
    could have been reused (``churn`` allocates through the producer meanwhile)."""
    import dlinspect
    x = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dlinspect.DLInspectWarning)
        y = dlinspect.to_jax(x)
        h = dlinspect.to_host(x)
    del x
    gc.collect()
    garbage = [churn() for _ in range(64)] if churn is not None else []
    assert same_values(y, jax_reference(reference))
    assert same_values(h, np.asarray(reference))
    del garbage


#: Per producer module: (conversions, RSS growth in KiB) of its leak check.
LEAK_RECORD: dict[str, tuple[int, int]] = {}

#: Conversions per leak check, and the RSS growth allowed over them.
LEAK_N = 10_000
LEAK_BOUND_KIB = 20 * 1024


def check_no_leak(x: Any, n: int = LEAK_N, bound_kib: int = LEAK_BOUND_KIB,
                  refused: type[BaseException] | None = None) -> int:
    """``n`` conversions of ``x`` (to_jax and to_host, results dropped): RSS grows by less
    than ``bound_kib``. ``refused``: the exception every conversion raises (an error
    route's leak check). Returns the growth in KiB."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("RSS is read from /proc/self/status (Linux)")
    if os.environ.get("DLINSPECT_SANITIZED"):
        pytest.skip("ASan keeps freed memory: RSS says nothing under the sanitizers")
    import dlinspect

    def convert(fn: Callable[[Any], Any]) -> None:
        if refused is None:
            fn(x)
            return
        try:
            fn(x)
        except refused:
            return
        raise AssertionError(f"{fn.__name__} did not raise {refused.__name__}")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dlinspect.DLInspectWarning)
        for _ in range(max(n // 5, 50)):   # warm-up: allocators (jaxlib's), caches
            convert(dlinspect.to_jax)
            convert(dlinspect.to_host)
        gc.collect()
        before = rss_kib()
        for _ in range(n):
            convert(dlinspect.to_jax)
            convert(dlinspect.to_host)
        gc.collect()
    grown = rss_kib() - before
    key = type(x).__module__.split(".")[0] + (f" ({refused.__name__})" if refused else "")
    LEAK_RECORD[key] = (n, grown)
    assert grown < bound_kib, f"RSS grew {grown} KiB over {n} conversions (bound {bound_kib} KiB)"
    return grown


def reference(dtype: str, shape: tuple[int, ...] = (3, 4)) -> np.ndarray:
    """Values of ``dtype`` (a NumPy name, ``"bool_"`` or ``"bfloat16"``) and ``shape``: small
    integers, negative ones for signed types, imaginary parts for complex ones."""
    n = int(np.prod(shape))
    if dtype in ("bool", "bool_"):
        return (np.arange(n) % 3 == 0).reshape(shape)
    if dtype == "bfloat16":
        import ml_dtypes
        return (np.arange(n) - 5).astype(ml_dtypes.bfloat16).reshape(shape)
    vals = np.arange(n) - (0 if dtype.startswith("uint") else 5)
    if dtype.startswith("complex"):
        vals = vals + 1j * vals[::-1]
    return vals.astype(dtype).reshape(shape)


def convert_and_check(batch: Any, reference: Callable[[Any], np.ndarray] = np.asarray,
                      **options: Any) -> tuple[Any, Any]:
    """``to_jax(batch, **options)`` against ``plan(batch, **options)`` on every leaf of a
    Mapping batch (a loader's): values (``reference(leaf)``: the leaf's NumPy values),
    zero-copy exactly where planned (by pointer), non-tensors kept, the Mapping rebuilt
    as its own type (a plain dict as JAX rebuilds it, keys sorted). The batch is its
    caller's as well, so a leaf is copied here wherever sharing needs that proof: a test
    of the zero-copy route converts where its batch is made. Returns (out, routes)."""
    import jax
    import dlinspect
    routes = dlinspect.plan(batch, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dlinspect.DLInspectWarning)
        out = dlinspect.to_jax(batch, **options)
    assert type(out) is type(batch)
    keys = sorted(batch.keys()) if type(batch) is dict else list(batch.keys())
    assert list(out.keys()) == keys
    for key, leaf in batch.items():
        route = routes[key]
        if route.kind == "untouched":
            assert out[key] is leaf, key
            continue
        assert isinstance(out[key], jax.Array), key
        assert same_values(out[key], jax_reference(reference(leaf))), key
        computes_like(out[key], reference(leaf), key)
        shares = pointer_of(out[key]) == dlinspect.peek(leaf).data_ptr
        assert shares == (route.kind == "zero-copy"), (key, route, dlinspect.peek(leaf))
    return out, routes

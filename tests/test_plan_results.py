"""What plan returns: routes and the other public results pickle with their words; the
host target's error route of what is not one tensor is what to_host raises; a route's facts
differ by target only where they should."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'dlinspect[jax]')")

import dlinspect  # noqa: E402
from dlinspect import DLDeviceType as D  # noqa: E402
from dlinspect import Need, plan  # noqa: E402
from dlinspect.testing import FakeProducer  # noqa: E402
from _helpers import aligned  # noqa: E402


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

"""Suite ``peek``: one ``dlinspect.peek`` call next to the calls it replaces.

Rows, median µs per call (``timeit``; every statement one global lookup plus calls):

    id(x)                 the floor of any call from Python into C
    peek(cap)             the capsule dlinspect's export takes from x (``__dlpack__(max_version=(1, 3))``
                          on NumPy >= 2.1, a legacy one before), made once
    peek(x)               a 32x32 float32 NumPy array
    peek(x.__dlpack__(max_version=(1, 3)))   baseline for peek(x): the export peek makes
                          (bare ``x.__dlpack__()`` on NumPy < 2.1), then peek the capsule
    peek(x.__dlpack__())  the same with NumPy's legacy export, which cannot carry the
                          READ_ONLY flag (for comparison)
    peek(t)               a 32x32 float32 torch CPU tensor (DLPack 1.3 C exchange API)
    t.__dlpack__()        torch's own export, which peek(t) avoids
    numpy.from_dlpack(x)  a full DLPack round trip in NumPy

Targets: peek(cap) <= 2.5x id(x); peek(x) <= 1.5x peek of the same export made by hand;
peek(t) <= 0.25x t.__dlpack__() where torch has the C exchange API (torch >= 2.4; before,
peek(t) is torch's own ``__dlpack__`` plus its ``__dlpack_device__`` and the guards, and the
target is skipped with that reason). torch is optional (its rows are skipped).
"""

from __future__ import annotations

from typing import Any

import numpy

import dlinspect
from dlinspect._core import exchange_api_version, export

from ._common import Tick, optional, time_cases

_VERSIONED = numpy.lib.NumpyVersion(numpy.__version__) >= "2.1.0"
_SAME_EXPORT = "peek(x.__dlpack__(max_version=(1, 3)))" if _VERSIONED else "peek(x.__dlpack__())"
CASES = [
    ("id(x)", "id(x)", False),
    ("peek(cap)", "peek(cap)", False),
    ("peek(x)", "peek(x)", False),
    ("peek(the same export by hand)", _SAME_EXPORT, False),
    ("peek(x.__dlpack__())", "peek(x.__dlpack__())", False),
    ("peek(t)", "peek(t)", True),
    ("t.__dlpack__()", "t.__dlpack__()", True),
    ("numpy.from_dlpack(x)", "from_dlpack(x)", False),
]
TARGETS = [
    ("peek(capsule) <= 2.5x id()", "peek(cap)", "id(x)", 2.5),
    ("peek(numpy array) <= 1.5x peek(the same export by hand)", "peek(x)",
     "peek(the same export by hand)", 1.5),
    ("peek(torch tensor) <= 0.25x t.__dlpack__()", "peek(t)", "t.__dlpack__()", 0.25),
]


def dlinspect_export(x: Any) -> Any:
    """The capsule dlinspect's export takes from ``x`` (versioned where NumPy >= 2.1 can)."""
    return export(x)[0]


def run(quick: bool = False, repeat: int | None = None, tick: Tick | None = None) -> dict[str, Any]:
    repeat = repeat or (3 if quick else 15)
    torch = optional("torch")
    x = numpy.zeros((32, 32), dtype=numpy.float32)
    ns: dict[str, Any] = {"x": x, "cap": dlinspect_export(x), "peek": dlinspect.peek,
                          "from_dlpack": numpy.from_dlpack}
    if torch is not None:
        ns["t"] = torch.zeros((32, 32), dtype=torch.float32)
    rows, targets = time_cases("peek", CASES, ns, repeat, quick, tick, TARGETS)
    notes = [] if torch else ["torch is not installed: its rows are skipped"]
    if torch is not None and exchange_api_version(torch.Tensor) is None:
        why = (f"torch {torch.__version__} has no DLPack C exchange API: peek(t) goes "
               f"through its __dlpack__")
        targets = [dict(t, status="SKIP", why=why) if t["target"].startswith("peek(torch")
                   else t for t in targets]
        notes.append(why)
    return {"title": "peek", "unit": "µs per call", "rows": rows, "repeat": repeat,
            "targets": targets, "notes": notes}

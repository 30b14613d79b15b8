"""Interop suite (issue 12): dlinspect against real third-party DLPack producers.

Every module here skips, with a reason, when its producer is not installed:
``bash scripts/interop.sh`` installs them (``INTEROP=light`` for the small ones).

Helpers (interop_helpers.py beside this file):

- :func:`need` imports a producer or skips the module;
- :func:`check` is the agreement check of ``tests/test_agreement.py`` on a real
  producer's tensor: ``plan(x)`` on one export, the conversion on another; "error"
  exactly when it raises (the same exception type), "zero-copy" exactly when the
  result shares the producer's memory (``peek(x).data_ptr``), a warning exactly when
  the route has one, and the values equal to a NumPy reference;
- :func:`check_all` runs :func:`check` over the options that change a route, both
  targets, and records what ``jax.dlpack.from_dlpack`` does with the same tensor;
- :func:`check_lifetime` and :func:`check_no_leak` for the producer's memory.

What ``jax.dlpack.from_dlpack`` did is recorded, not asserted, and summarised at the end
of the run (and written as JSON to ``$DLINSPECT_INTEROP_REPORT`` when that is set).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import warnings
from collections import defaultdict
from typing import Any

# The helpers module beside this file, whatever pytest's import mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _opencl_runtime() -> str | None:
    """The OpenCL CPU runtime pip installs with intel-opencl-rt (``<prefix>/lib``).

    Its ICD file (``<prefix>/etc/OpenCL/vendors/intel-cpu.icd``) names the library by a
    conda placeholder path that pip does not rewrite, so the ICD loader finds no
    platform and SYCL no device, until OCL_ICD_FILENAMES names the library itself.
    """
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        lib = os.path.join(prefix, "lib", "libintelocl.so")
        if os.path.exists(lib):
            return lib
    return None


# Before any test module imports dpctl: the ICD loader reads it when SYCL first
# enumerates platforms. A value the user set is kept.
if not os.environ.get("OCL_ICD_FILENAMES") and _opencl_runtime():
    os.environ["OCL_ICD_FILENAMES"] = _opencl_runtime()  # type: ignore[assignment]


# Producers that break each other in one process, in the one import order that works:
# dpnp after paddle fails to load (libmkl_tbb_thread.so.3: undefined symbol from
# paddle's older libtbb), and paddle after tensorflow segfaults (paddlepaddle 3.3.1,
# tensorflow-cpu 2.21.0). Where two of them are installed, they are imported here, in
# that order, so the suite runs whatever order its modules are collected in.
_CLASHING = ("dpnp", "paddle", "tensorflow")
if sum(importlib.util.find_spec(name) is not None for name in _CLASHING) >= 2:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for _name in _CLASHING:
        if importlib.util.find_spec(_name) is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    importlib.import_module(_name)
                except Exception:   # noqa: BLE001 - its test module skips or fails with the reason
                    pass


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from interop_helpers import JAX_RECORD, LEAK_RECORD
    if not JAX_RECORD and not LEAK_RECORD:
        return
    tr = terminalreporter
    tr.section("interop: dlinspect.to_jax and jax.dlpack.from_dlpack on the same tensors; leaks")
    for producer, rows in sorted(JAX_RECORD.items()):
        kinds: dict[str, int] = defaultdict(int)
        jaxs: dict[str, int] = defaultdict(int)
        errors: dict[str, list[str]] = defaultdict(list)
        for row in rows:
            kinds[row["dlinspect"]] += 1
            jaxs[row["jax"]] += 1
            if row["jax"] == "raised":
                errors[row["detail"][:100]].append(row["case"])
        tr.write_line(f"{producer}: {len(rows)} tensors; dlinspect.to_jax "
                      f"{dict(sorted(kinds.items()))}; jax.dlpack.from_dlpack "
                      f"{dict(sorted(jaxs.items()))}")
        for detail, cases in sorted(errors.items()):
            tr.write_line(f"    jax raised {detail}  [{', '.join(cases[:6])}"
                          f"{', ...' if len(cases) > 6 else ''}]")
    for producer, (n, grown) in sorted(LEAK_RECORD.items()):
        tr.write_line(f"{producer}: {n} to_jax + {n} to_host conversions, RSS {grown:+d} KiB")
    path = os.environ.get("DLINSPECT_INTEROP_REPORT")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(JAX_RECORD, f, indent=1)

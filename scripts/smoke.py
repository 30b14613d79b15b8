"""Smoke test of an installed dlinspect (a wheel, an sdist build): peek, plan, to_jax, doctor.

Run from anywhere but the source tree (so the installed package is imported):
``python scripts/smoke.py``. Exits non-zero on the first failure.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

import dlinspect

here = os.path.dirname(os.path.abspath(dlinspect.__file__))
assert "site-packages" in here or "dist-packages" in here, f"not an installed dlinspect: {here}"
x = np.arange(12, dtype=np.float32).reshape(3, 4)
info = dlinspect.peek(x)
assert info.shape == (3, 4) and info.dtype_name == "float32", info
assert dlinspect.to_host(x[:, ::2]).tolist() == x[:, ::2].tolist()
assert dlinspect.plan(x, "host").kind == "zero-copy"
try:
    import jax  # noqa: F401
except ImportError:
    print("smoke: jax is not installed; to_jax not tried")
else:
    y = dlinspect.to_jax(x)
    assert y.tolist() == x.tolist() and dlinspect.plan(x[:, ::2]).kind == "copy"
doctor = subprocess.run([sys.executable, "-m", "dlinspect", "doctor"], capture_output=True,
                        text=True)
assert doctor.returncode == 0 and "kDLCPU" in doctor.stdout, doctor.stdout + doctor.stderr
print(f"smoke: dlinspect {dlinspect.__version__} from {here}: peek, to_host, plan"
      f"{', to_jax' if 'jax' in sys.modules else ''}, doctor OK")

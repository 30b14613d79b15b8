"""Tests that need 4 CPU devices: collected only inside the subprocess that
tests/test_subprocess_suites.py starts with XLA_FLAGS=--xla_force_host_platform_device_count=4,
so the device count never leaks into the rest of the suite."""

import os
import sys
from pathlib import Path

# tests/_versions.py (what the installed stack offers) for the tests here too.
sys.path.insert(0, str(Path(__file__).parents[1]))

if os.environ.get("DLINSPECT_MULTIDEVICE") != "1":
    collect_ignore_glob = ["test_*.py"]

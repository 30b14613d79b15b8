"""Hypothesis fuzzing of every header field: collected only inside the subprocess that
tests/test_subprocess_suites.py starts (DLINSPECT_FUZZ=1), so a crash fails that test, not the run."""

import os
import sys
from pathlib import Path

# tests/_versions.py (what the installed stack offers) for the tests here too.
sys.path.insert(0, str(Path(__file__).parents[1]))

if os.environ.get("DLINSPECT_FUZZ") != "1":
    collect_ignore_glob = ["test_*.py"]

"""Hypothesis fuzzing of every header field: collected only inside the subprocess that
tests/test_fuzz.py starts (DLINSPECT_FUZZ=1), so a crash fails that test, not the run."""

import os

if os.environ.get("DLINSPECT_FUZZ") != "1":
    collect_ignore_glob = ["test_*.py"]

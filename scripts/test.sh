#!/usr/bin/env bash
# The quick test run, for "does it work on my machine" and between two changes: installs
# what the tests need (the build tools and the test extra of pyproject.toml), builds
# dlinspect in place (an editable install whose build folder, build/, makes a rebuild after
# a change take seconds), and runs the default test suite on every core (pytest-xdist):
# every test but those marked slow, the property tests drawing a tenth of their examples
# (tests/conftest.py). CI's full run, `bash .ci/run`, runs this first, then everything.
#
# Runs in the active virtual environment, or in the clone's .venv when none is active (the
# README's first command makes it). Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ]; then
    . .venv/bin/activate
fi
start=$SECONDS
say() { echo "test.sh: $1 ($((SECONDS - start)) s)"; }
say "1/3 installing the build tools into $(dirname "$(dirname "$(command -v python)")")"
python -m pip install -q "scikit-build-core>=0.10" "cython>=3.0" "cython-cmake>=0.2" \
    "numpy>=1.26" ninja cmake
if [ -f build/CMakeCache.txt ]; then   # (pip install . builds in build/<wheel tag>/, not here)
    say "2/3 the test tools, and dlinspect rebuilt in place where it changed (build/)"
else
    say "2/3 the test tools, and dlinspect built in place (build/; the first build takes 1-2 min)"
fi
python -m pip install -q --no-build-isolation -Cbuild-dir=build -e ".[test]"
say "3/3 the tests, on every core (four at most)"
python -m pytest -n auto --maxprocesses 4 --dist worksteal "$@"

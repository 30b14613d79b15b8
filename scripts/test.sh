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
python -m pip install -q "scikit-build-core>=0.10" "cython>=3.0" "cython-cmake>=0.2" \
    "numpy>=1.26" ninja cmake
python -m pip install -q --no-build-isolation -Cbuild-dir=build -e ".[test]"
python -m pytest -n auto --maxprocesses 4 --dist worksteal "$@"

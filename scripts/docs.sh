#!/usr/bin/env bash
# Build the reference site (docs/) and check it as code:
#   1. python scripts/figures.py --check: every generated table of README.md and docs/
#      is what its source file (benchmarks/results.json, .ci/stacks.json, ...) gives;
#   2. sphinx-build with warnings as errors (-W --keep-going) and nitpicky references (-n)
#      into docs/_build/html;
#   3. every >>> example of README.md and of the site's pages (each page in its own
#      process), and of the docstrings the API reference renders, run as doctests
#      (scripts/doctest_docs.py); pages whose libraries are not installed here are
#      skipped with the reason (the interop suite runs those);
#   4. where a Chromium is installed (chromium, chromium-browser or google-chrome on PATH,
#      or the one $DLINSPECT_BROWSER names), every built page opened in it headless: each
#      must render its main text, and every relative link and anchor must resolve to a
#      built file and id (scripts/check_site.py). Without one this step is skipped with a
#      message; --install-browser installs Debian's chromium first (apt-get, sudo where
#      not root), as CI does.
#
# Runs in the active Python environment, which needs dlinspect installed (any way: the
# README's first command, or the editable build); the site's tools (the docs extra of
# pyproject.toml, pinned) are installed into it when missing. Pages whose examples need
# torch and jax run where they are installed (the examples extra has both).
# The site: docs/_build/html/index.html. Usage: bash scripts/docs.sh [--install-browser]
set -euo pipefail
cd "$(dirname "$0")/.."
export JAX_PLATFORMS=cpu
start=$SECONDS
lap() { echo "docs.sh: $1 ($((SECONDS - start)) s)"; }

if ! python -c "import dlinspect" 2>/dev/null; then
    echo "docs.sh: dlinspect is not installed in $(command -v python); install it first:" >&2
    echo "  pip install \".[jax,examples]\"     (in the clone's top folder)" >&2
    exit 1
fi
if ! python -c "import sphinx, myst_parser, numpydoc, pydata_sphinx_theme, sphinx_copybutton, matplotlib" 2>/dev/null; then
    tools=$(python -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]))')
    echo "docs.sh: installing the site's tools into $(command -v python): $tools"
    python -m pip install -q $tools
fi
python scripts/figures.py --check
lap "generated tables agree with their sources"

rm -rf docs/_build docs/_generated
python -m sphinx -W --keep-going -n -q -b html docs docs/_build/html
lap "site built without warnings: docs/_build/html/index.html"

python scripts/doctest_docs.py --docstrings
lap "examples of README, the pages and the API docstrings ran"

browser=${DLINSPECT_BROWSER:-$(command -v chromium chromium-browser google-chrome | head -1 || true)}
if [ -z "$browser" ] && [ "${1:-}" = --install-browser ]; then
    echo "docs.sh: installing Debian's chromium (apt-get)"
    if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
    browser=$(command -v chromium)
fi
if [ -z "$browser" ]; then
    lap "pages not opened in a browser: no Chromium here (the site is built; to check that its
pages render and its links resolve, install one, or run bash scripts/docs.sh --install-browser)"
    exit 0
fi
python scripts/check_site.py docs/_build/html --browser "$browser"
lap "every page rendered in $("$browser" --version 2>/dev/null | head -1)"

"""The documentation is checked like code: every example of README.md, of the site's pages
(docs/) and of the docstrings the API reference renders runs; every public name is in the
API reference; links resolve; hand-written signatures are the real ones; and the checkers
of scripts/docs.sh find what they are there to find."""

from __future__ import annotations

import doctest
import functools
import inspect
import re
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

import dlinspect
from dlinspect import _core, _prefetch, testing

pytest.importorskip("jax", reason="the routing examples need jax")

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import check_site  # noqa: E402
import doctest_docs  # noqa: E402

PAGES = doctest_docs.pages()   # README.md and docs/**/*.md
DOCS = [p for p in PAGES if p.name != "README.md"]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ---- the examples run -----------------------------------------------------------------

@pytest.mark.parametrize("module", [_core, _prefetch, testing], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = finder.find(module, module.__name__, globs={})
    if module is _core:  # a Cython module: its compiled functions are found one by one
        tests = [t for fn in (_core.peek, _core.plan, _core.explain, _core.to_jax, _core.to_host)
                 for t in finder.find(fn, fn.__name__, globs={})]
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0, f"no examples found in {module.__name__}"
    assert result.failed == 0


def test_api_reference_docstring_examples():
    """The examples of every docstring docs/api.md renders (scripts/docs.sh runs the same)."""
    result = doctest_docs.run_docstrings()
    assert result["docstrings"] > 40 and result["attempted"] > 0, result
    assert result["failed"] == 0, result


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_page_examples(page):
    """Every ``>>>`` example of the page runs, in order, in one namespace, in its own
    process (README.md's too); pages that need a library this environment lacks run in
    the interop suite (tests/interop/test_docs_pages.py)."""
    pytest.importorskip("torch", reason="the examples use torch")
    result = doctest_docs.run_page(page)
    if "skipped" in result:
        pytest.skip(f"{result['skipped']}: tests/interop/test_docs_pages.py runs it")
    assert result["failed"] == 0, result["output"]
    assert result["attempted"] == result["prompts"], result["output"]


def test_the_examples_are_where_users_read_them():
    """README has its three examples, and the guide's pages theirs."""
    counts = {rel(p): doctest_docs.prompts(p) for p in PAGES}
    assert counts["README.md"] >= 10
    for page in ("getting-started", "routes", "errors", "loaders/index"):
        assert counts[f"docs/{page}.md"] >= 10, (page, counts)


FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.M | re.S)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_python_block_is_a_doctest(page):
    """Python shown in a page is a doctest (```pycon, every statement after ``>>>``), so the
    runner executes it; other code is shell (```bash), plain text, or an excerpt of a
    tested script (literalinclude)."""
    for lang, body in FENCE.findall(page.read_text(encoding="utf-8")):
        assert lang != "python", f"{rel(page)}: a ```python block (write it as ```pycon)"
        if lang == "pycon":
            assert body.lstrip().startswith(">>>"), f"{rel(page)}: {body[:80]!r}"


# ---- the API reference ----------------------------------------------------------------

def test_api_reference_renders_every_public_name():
    rendered = doctest_docs.api_names()
    errors = set(dlinspect.errors.__all__)
    for name in dlinspect.__all__:
        where = f"dlinspect.errors.{name}" if name in errors else f"dlinspect.{name}"
        assert where in rendered, f"docs/api.md does not render {name}"
    for module in ("errors", "testing", "grain"):
        mod = __import__(f"dlinspect.{module}", fromlist=["__all__"])
        assert f"dlinspect.{module}" in rendered
        for name in mod.__all__:
            assert f"dlinspect.{module}.{name}" in rendered, f"docs/api.md lacks {module}.{name}"


def test_public_api_is_documented():
    for name in dlinspect.__all__:
        obj = getattr(dlinspect, name)
        if callable(obj):
            assert obj.__doc__ and len(obj.__doc__) > 40, name


def test_public_functions_document_every_parameter():
    """What the API reference shows for each public function: every parameter of its
    signature in its Parameters section, and what it raises."""
    import dlinspect.grain
    functions = [dlinspect.peek, dlinspect.plan, dlinspect.to_jax, dlinspect.to_host,
                 dlinspect.stack, dlinspect.prefetch_to_jax, dlinspect.grain.device_put]
    for fn in functions:
        doc = inspect.getdoc(fn) or ""
        assert "Parameters\n----------\n" in doc, f"{fn.__name__}: no Parameters section"
        section = doc.split("Parameters\n----------\n", 1)[1]
        section = re.split(r"\n[A-Z][a-z]+( [A-Z][a-z]+)?\n-+\n", section)[0]
        names = set()
        for line in section.splitlines():
            if line and not line[0].isspace():      # "name : type" or "a, b, c"
                names |= {n.strip() for n in line.split(" : ")[0].split(",")}
        missing = set(inspect.signature(fn).parameters) - names
        assert not missing, f"{fn.__name__}: parameters not documented: {missing}"
        assert "Raises\n" in doc, f"{fn.__name__}: no Raises section"


SIGNATURE = re.compile(r"`((?:dlinspect\.)?(?:grain\.)?(\w+)\((?:[^`()]|\([^`()]*\))*=[^`]*\))`")


def test_hand_written_signatures_are_the_real_ones():
    """A signature written out by hand in README or docs (in backticks, a public
    function's name, its first parameter's name, then a ``*`` or three or more
    ``name=default`` parameters) is exactly ``inspect.signature``'s:
    ``to_jax``'s and ``plan``'s ``leaves`` and ``narrow`` included. The full signatures are
    rendered by autodoc (getting-started, routes, loaders, api)."""
    import dlinspect.grain
    public = {"to_jax": dlinspect.to_jax, "plan": dlinspect.plan, "to_host": dlinspect.to_host,
              "peek": dlinspect.peek, "stack": dlinspect.stack, "explain": dlinspect.explain,
              "prefetch_to_jax": dlinspect.prefetch_to_jax, "device_put": dlinspect.grain.device_put}

    def plain(fn):
        sig = inspect.signature(fn)
        return str(sig.replace(parameters=[p.replace(annotation=inspect.Parameter.empty)
                                           for p in sig.parameters.values()],
                               return_annotation=inspect.Signature.empty))

    for page in PAGES:
        for text, name in SIGNATURE.findall(page.read_text(encoding="utf-8")):
            if name not in public or "..." in text:
                continue
            shown, real = text[text.index("("):], plain(public[name])
            first = next(iter(inspect.signature(public[name]).parameters))
            # a signature, not a call: the first parameter by name, a `*` or 3 defaults
            if re.match(rf"\({first}[,)]", shown) and ("*" in shown or shown.count("=") >= 3):
                assert shown == real, (rel(page), text, real)
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    for name in ("to_jax", "plan", "prefetch_to_jax"):
        assert f".. autofunction:: dlinspect.{name}" in api
    assert {"leaves", "narrow"} <= set(inspect.signature(dlinspect.to_jax).parameters)
    assert {"leaves", "narrow"} <= set(inspect.signature(dlinspect.plan).parameters)
    assert "narrow" in inspect.signature(dlinspect.prefetch_to_jax).parameters


# ---- links and words ------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")


def github_slug(heading: str) -> str:
    """The anchor GitHub and MyST (myst_heading_anchors) give a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {github_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.M)}


GENERATED = ROOT / "docs" / "_generated"   # drawn by the site's build, never committed


@functools.cache
def _drawn() -> frozenset[str]:
    """The names of the plots the site's build draws into docs/_generated."""
    import figures
    with warnings.catch_warnings(), tempfile.TemporaryDirectory() as folder:
        # matplotlib 3.7 (the oldest declared) warns with newer pyparsing releases
        warnings.simplefilter("ignore", DeprecationWarning)
        pytest.importorskip("matplotlib")
        return frozenset(p.name for p in figures.draw_plots(Path(folder)))


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page):
    """Every relative Markdown link names a file of the repository (or a plot the site's
    build draws), and its #anchor a heading of that file (the built site's links are
    checked in a browser by scripts/check_site.py)."""
    for link in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if target.parent == GENERATED:
            assert target.name in _drawn(), f"{rel(page)}: {link} is no plot the build draws"
            continue
        assert target.is_file(), f"{rel(page)}: {link} names no file"
        if anchor:
            assert anchor in anchors(target), f"{rel(page)}: {link}: no heading {anchor!r}"


def test_readme_is_a_few_screens():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, len(lines)


def _hand_written(path: Path) -> str:
    """The page less its generated blocks (scripts/figures.py writes those)."""
    import figures
    return figures.BLOCK.sub("", path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("page", PAGES + [ROOT / "CHANGELOG.md"], ids=rel)
def test_no_run_log_kept_by_hand(page):
    """No pass counts, durations, sizes on disk or one day's circumstances typed into the
    documentation: results live where runs write them (benchmarks/results.json,
    BENCHMARKS.md, .ci/stacks.json, CI's own report), and the pages' tables are
    rendered from those; nor words about how the project was made."""
    text = _hand_written(page)
    for pattern in (r"\b\d[\d,]* (passed|failed|skipped|xfailed)\b",
                    r"\b\d+(\.\d+)? ?(min|minutes|seconds|GB|MB)\b(?! of)",
                    r"\b\d+ s\b", r"\b20\d\d-\d\d-\d\d\b",
                    r"\bsessions?\b", r"\bthat day\b", r"\bnoisy day\b", r"\bwe (found|ran)\b",
                    r"\ba trial\b", r"\bhere, once\b"):
        found = re.search(pattern, text, re.I)
        assert not found, f"{rel(page)}: {found.group(0)!r} ({pattern})"


# ---- the checkers can fail ------------------------------------------------------------

@pytest.mark.slow
def test_doctest_runner_reports_a_wrong_output_and_a_missing_library(tmp_path):
    wrong = tmp_path / "wrong.md"
    wrong.write_text("```pycon\n>>> 1 + 1\n3\n\n```\n", encoding="utf-8")
    result = doctest_docs.run_page(wrong)
    assert result["attempted"] == 1 and result["failed"] == 1, result
    lacking = tmp_path / "lacking.md"
    lacking.write_text("---\nrequires: [no_such_module_here]\n---\n\n```pycon\n>>> 1\n1\n```\n",
                       encoding="utf-8")
    assert "no_such_module_here" in doctest_docs.run_page(lacking)["skipped"]
    four = tmp_path / "four.md"
    four.write_text("---\ndevices: 4\n---\n\n```pycon\n>>> import jax\n>>> jax.device_count()\n"
                    "4\n\n```\n", encoding="utf-8")
    assert doctest_docs.run_page(four)["failed"] == 0


def test_site_checker_finds_blank_pages_and_broken_links(tmp_path):
    text = "Words of the page. " * 20
    (tmp_path / "good.html").write_text(
        f'<html><body><main><h1 id="top">Good</h1><p id="p">{text}</p>'
        '<a href="other.html#there">ok</a><a href="#p">ok</a>'
        '<a href="https://example.org/x">out</a></main></body></html>', encoding="utf-8")
    (tmp_path / "other.html").write_text(
        f'<html><body><main><h1>Other</h1><p id="there">{text}</p>'
        '<a href="missing.html">broken</a><a href="good.html#nowhere">no anchor</a>'
        '</main></body></html>', encoding="utf-8")
    (tmp_path / "blank.html").write_text("<html><body><main></main></body></html>",
                                         encoding="utf-8")
    pages = {p.resolve(): check_site.read(p.read_text(encoding="utf-8"))
             for p in tmp_path.glob("*.html")}
    found = check_site.problems(tmp_path.resolve(), pages)
    assert sorted(found) == sorted([
        "blank.html: its main text has 0 characters (blank page?)",
        "blank.html: no title (h1)",
        "other.html: link 'missing.html' names no file of the build",
        "other.html: link 'good.html#nowhere': no id 'nowhere' in good.html",
    ]), found

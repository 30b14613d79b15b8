"""The examples of the site's pages that need a library of this suite: the loader pages
whose front matter names ``requires:`` (grain, Hugging Face, Ray, TensorFlow), which the
default test run skips. Each page runs in its own process, as scripts/doctest_docs.py
runs it; a page whose libraries are not installed here is skipped, naming them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import doctest_docs  # noqa: E402

PAGES = [p for p in doctest_docs.pages() if doctest_docs.front_matter(p).get("requires")]


def test_the_loader_pages_are_found():
    names = {p.name for p in PAGES}
    assert {"grain.md", "huggingface.md", "ray.md", "tfdata.md"} <= names, names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_page_examples_run(page):
    result = doctest_docs.run_page(page)
    if "skipped" in result:
        pytest.skip(result["skipped"])
    assert result["failed"] == 0, result["output"]
    assert result["attempted"] == result["prompts"], result["output"]

"""The examples in public docstrings run, so they cannot rot."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

import dlinspect
from dlinspect import _core, _prefetch, _words, testing

pytest.importorskip("jax", reason="the routing examples need jax")


@pytest.mark.parametrize("module", [_core, _words, _prefetch, testing], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = finder.find(module, module.__name__, globs={})
    if module is _core:  # a Cython module: its compiled functions are found one by one
        tests = [t for fn in (_core.peek, _core.plan, _core.to_jax, _core.to_host)
                 for t in finder.find(fn, fn.__name__, globs={})]
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0, f"no examples found in {module.__name__}"
    assert result.failed == 0


def test_public_api_is_documented():
    for name in dlinspect.__all__:
        obj = getattr(dlinspect, name)
        if callable(obj):
            assert obj.__doc__ and len(obj.__doc__) > 40, name


def test_readme_examples():
    """Every ``>>>`` example of README.md, in order, in one namespace."""
    pytest.importorskip("torch", reason="the README examples use torch")
    readme = Path(__file__).parents[1] / "README.md"
    result = doctest.testfile(str(readme), module_relative=False, globs={},
                              optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 25
    assert result.failed == 0

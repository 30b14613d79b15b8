"""The flow stays one-way: one export, no import cycles, production never built on testing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "python" / "dlinspect"


def _load_layout():
    """scripts/layout.py, the one reader of the package's and the core's arrows."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("layout", ROOT / "scripts" / "layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


layout = _load_layout()


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        yield layout.module_name(rel), path


def _imports(name: str, path: Path) -> set[str]:
    """The dlinspect modules ``name`` imports, anywhere in the file."""
    known = {n for n, _ in _modules()} | {"dlinspect._core"}
    return layout.python_imports(path.relative_to(ROOT).as_posix(),
                                 path.read_text(encoding="utf-8"), known)


def _core_imports() -> set[str]:
    """The dlinspect modules the compiled core (src/*.pyx, *.pxi) imports, at the top or
    inside a function, as a module graph sees them."""
    return layout.core_imports([p.read_text(encoding="utf-8")
                                for p in sorted((ROOT / "src").glob("*.p*"))],
                               {n for n, _ in _modules()})


def test_no_import_cycles():
    """No cycle among the package's modules, the compiled core's imports included (the
    core never reaches up: the words, the tables and the JAX probes stand below it, and
    the probes get the core's capsules as arguments)."""
    graph = {name: _imports(name, path) for name, path in _modules()}
    graph["dlinspect._core"] = _core_imports()
    assert graph["dlinspect._core"], "no import of the core found"
    graph = {n: {m for m in deps if m != "dlinspect"} for n, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in graph.get(node, ()):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep] if dep in stack else [node, dep]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])


def test_the_core_never_reaches_up():
    """Inside the core too the flow runs one way: each file of src/_core.pyx's includes
    reads only module-level names of the files included before it."""
    up = {r.path: r.up for r in layout.layout() if r.up}
    assert not up, up


#: The most tokens Python + core hold today (scripts/layout.py counts them in the package
#: without its benchmark suites, src/ and include/: names, numbers, strings and operators,
#: no comment, docstring or layout). A ratchet toward layout.TOKEN_BUDGET: what a change
#: adds it takes out elsewhere; joining lines takes out nothing.
TOKEN_CEILING = 55011


def test_code_does_not_grow():
    """The package and its core hold no more tokens than :data:`TOKEN_CEILING`."""
    total = layout.token_total()
    assert total <= TOKEN_CEILING, (
        f"Python + core hold {total} tokens, more than the {TOKEN_CEILING} they held (budget "
        f"{layout.TOKEN_BUDGET}): take out as much code as the change adds (python "
        f"scripts/layout.py shows where it is)")


def test_production_never_imports_testing():
    # The package itself re-exports `testing` as public API, and the CLI puts it in
    # scope for --expr; no internal module or benchmark builds on it.
    allowed = {"dlinspect", "dlinspect.cli", "dlinspect.testing"}
    for name, path in _modules():
        if name not in allowed:
            assert "dlinspect.testing" not in _imports(name, path), name


def test_only_the_export_calls_producers():
    """``__dlpack__``/``__dlpack_device__`` are called in src/export.pxi and nowhere else
    (the benchmarks call producers directly: they are the baselines)."""
    call = re.compile(r"\.__dlpack(_device)?__\(")
    for path in list(PACKAGE.rglob("*.py")) + list((ROOT / "src").glob("*.p*")):
        if path.name in ("export.pxi", "testing.py") or "bench" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        assert not call.search(text), f"{path.relative_to(ROOT)} calls a producer"
    assert call.search((ROOT / "src" / "export.pxi").read_text(encoding="utf-8"))


def test_every_action_has_one_executor_and_its_words():
    """One decision, executed once: each action a route can carry (the ones routes.pxi
    imports from dlinspect._tables) has its executor, a JAX route's or a host route's, but
    KEEP (a leaf kept as it is); UNPACK is a host route's only (into JAX, packed data is a
    NUMPY_PUT); and every action but RAISE has a reason in the words' table."""
    from dlinspect import _core, _tables, _words
    text = (ROOT / "src" / "routes.pxi").read_text(encoding="utf-8")
    names = re.search(r"from dlinspect\._tables import \(([^)]*)\)", text).group(1)
    actions = {getattr(_tables, name) for name in re.findall(r"\w+", names)}
    assert set(_core.EXECUTORS) | set(_core.HOST_EXECUTORS) | {_core.KEEP} == actions
    assert _core.KEEP not in set(_core.EXECUTORS) | set(_core.HOST_EXECUTORS)
    assert _core.UNPACK not in _core.EXECUTORS
    assert set(_words.REASONS) == actions - {_core.RAISE}, set(_words.REASONS) ^ actions


def test_every_problem_has_its_words():
    """Every ``fail(problem, ...)`` of the core is worded by one function of the words'
    table (``"raised"``: the producer's or the header's own error), and no entry of
    that table is for a problem nobody raises."""
    from dlinspect import _words
    raised = set()
    for path in (ROOT / "src").glob("*.pxi"):
        raised |= set(re.findall(r'\bfail\("([a-z-]+)"', path.read_text(encoding="utf-8")))
    assert raised, "no fail(...) found in src/"
    assert raised - {"raised"} == set(_words.PROBLEMS), raised ^ set(_words.PROBLEMS)


def test_no_message_text_is_parsed():
    """Routes are words made from facts (dlinspect._words); no module splits an
    exception's text to find its parts."""
    pattern = re.compile(r"str\((exc|error|err|e|shard|cause)\)\s*\.\s*(split|partition|startswith)\("
                         r"|\[len\(head\):\]")
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert not pattern.search(text), f"{path.relative_to(ROOT)} parses a message"


def test_lint_clean():
    """ruff, with the project's own configuration (pyproject.toml), finds nothing."""
    import shutil
    import subprocess
    ruff = shutil.which("ruff")
    if ruff is None:
        import pytest
        pytest.skip("ruff is not installed (pip install ruff)")
    proc = subprocess.run([ruff, "check", "--output-format", "concise", str(ROOT)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


PYTHON_CODE = [PACKAGE, ROOT / "benchmarks", ROOT / "scripts"]


def test_no_function_above_complexity_15():
    """No function of the package (its benchmark suites included), the benchmarks or the
    scripts has a cyclomatic complexity above 15 (radon's count; issue 38): decisions are
    tables and small steps. The compiled core is held to radon's grade D (21 or more) below."""
    import pytest
    complexity = pytest.importorskip("radon.complexity", reason="radon is not installed")
    above = []
    for path in sorted(p for folder in PYTHON_CODE for p in folder.rglob("*.py")):
        for block in complexity.cc_visit(path.read_text(encoding="utf-8")):
            if block.complexity > 15:
                above.append(f"{path.relative_to(ROOT)}:{block.lineno} {block.name} "
                             f"({block.complexity})")
    assert not above, above


DEF_LINE = re.compile(r"^(\s*)(?:cdef|cpdef|def)\s+(?!class\b|enum\b|struct\b|extern\b)"
                      r"[^=(]*?(\w+)\s*\(")
DECISIONS = {"if", "elif", "for", "while", "except", "and", "or"}


def _functions(text: str):
    """``(name, line, source)`` of every def/cdef/cpdef function of a Cython file."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = DEF_LINE.match(line)
        if not m or line.lstrip().startswith("cdef class"):
            continue
        indent, j = len(m.group(1)), i + 1
        while j < len(lines) and (not lines[j].strip() or lines[j].lstrip().startswith(")")
                                  or len(lines[j]) - len(lines[j].lstrip()) > indent):
            j += 1
        yield m.group(2), i + 1, "\n".join(lines[i:j])


def cython_complexity(source: str) -> int:
    """radon's count, for Cython: 1 + each if, elif, for, while, except, and, or
    (conditional expressions and comprehensions included), strings and comments left out."""
    import io
    import tokenize
    n = 1
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            n += tok.type == tokenize.NAME and tok.string in DECISIONS
    except (tokenize.TokenError, IndentationError):   # a C declaration tokenize trips on
        pass
    return n


def test_no_c_function_above_complexity_15():
    """The C headers' functions (include/dlinspect/*.h) at cyclomatic complexity 15 at most
    too, by lizard's count (each if, for, while, case, &&, || and ?): a kernel is small
    static inline steps, each with its contract."""
    import pytest
    lizard = pytest.importorskip("lizard", reason="lizard is not installed (pip install lizard)")
    above = []
    for path in sorted((ROOT / "include" / "dlinspect").glob("*.h")):
        for function in lizard.analyze_file(str(path)).function_list:
            if function.cyclomatic_complexity > 15:
                above.append(f"{path.name}:{function.start_line} {function.name} "
                             f"({function.cyclomatic_complexity})")
    assert not above, above


def test_no_core_function_above_complexity_15():
    """The compiled core's functions (src/*.pyx, *.pxi) at cyclomatic complexity 15 at
    most too: moving code into the core is not a way around the limit."""
    graded = []
    for path in sorted((ROOT / "src").glob("*.p*x*")):
        for name, line, source in _functions(path.read_text(encoding="utf-8")):
            if cython_complexity(source) > 15:
                graded.append(f"{path.name}:{line} {name} ({cython_complexity(source)})")
    assert not graded, graded
    assert cython_complexity("if a and b or c:\n    pass") == 4   # the count itself

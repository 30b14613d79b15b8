"""The layout of the package and its core, read from the code: rooms, their lines, their arrows.

Usage: python scripts/layout.py [--rev REV]

A room is a module of ``python/dlinspect`` (its benchmark suites left out) or a file of the
compiled core (``src/*.pyx|pxi|pxd``, ``include/**/*.h``). A module's arrows are the
dlinspect modules it imports, at the top or inside a function; a core file's arrows are
the files whose names it uses: the earlier files of ``src/_core.pyx``'s includes whose
module-level names it reads (below it in the flow), and any later one it reads too
(reaching up: ``up`` lists those). ``--rev`` draws a commit of this repository instead of
the working tree (``git show``). ``scripts/figures.py`` writes the drawing into the How it
works page (block ``layout``); ``tests/test_structure.py`` checks the arrows and the lines.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "python/dlinspect"
#: The lines Python + core may hold (the package without its benchmark
#: suites, src/*.pyx|pxi|pxd, include/**/*.h).
BUDGET = 9400
#: The code lines of the same files may hold (lines neither blank, nor only a comment, nor
#: inside a docstring: :func:`code_lines`).
CODE_BUDGET = 5900

Reader = Callable[[str], str]


class Room(NamedTuple):
    """One file of the package or the core: where it is, its lines, where its arrows go."""

    path: str
    lines: int
    reaches: tuple[str, ...]
    up: tuple[str, ...] = ()


def _files(rev: str | None) -> list[str]:
    if rev is None:
        paths = [p.relative_to(ROOT).as_posix() for folder in (PACKAGE, "src", "include")
                 for p in (ROOT / folder).rglob("*") if p.is_file()]
    else:
        paths = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, PACKAGE, "src",
                                "include"], capture_output=True, text=True, check=True,
                               cwd=ROOT).stdout.split()
    return sorted(p for p in paths if _counted(p))


def _counted(path: str) -> bool:
    if path.startswith(PACKAGE):
        return path.endswith(".py") and "/bench/" not in path
    return re.search(r"\.(pyx|pxi|pxd|h)$", path) is not None


def _reader(rev: str | None) -> Reader:
    if rev is None:
        return lambda path: (ROOT / path).read_text(encoding="utf-8")
    return lambda path: subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True,
                                       text=True, check=True, cwd=ROOT).stdout


def module_name(path: str) -> str:
    """``python/dlinspect/_tree.py`` -> ``dlinspect._tree`` (a package: its own name)."""
    name = ".".join(Path(path).relative_to("python").with_suffix("").parts)
    return name.removesuffix(".__init__")


def python_imports(path: str, text: str, known: set[str]) -> set[str]:
    """The dlinspect modules a module imports, anywhere in the file."""
    name = module_name(path)
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)   # `from . import _core`
    return {m for m in out if m in known and m != name}


CORE_IMPORT = re.compile(r"^\s*(?:from\s+(dlinspect[\w.]*)\s+import\s+([\w, ()]+)|"
                         r"import\s+(dlinspect[\w.]*))", re.M)


def core_imports(texts: list[str], known: set[str]) -> set[str]:
    """The dlinspect modules the compiled core imports, at the top or inside a function."""
    out: set[str] = set()
    for text in texts:
        for frm, names, imp in CORE_IMPORT.findall(text):
            mod = frm or imp
            out.add(mod)
            out.update(f"{mod}.{n}" for n in re.split(r"[,()\s]+", names) if n)
    return {m for m in out if m in known}


TOP_NAME = re.compile(r"^(?:cdef|cpdef|def|class|ctypedef)\b(?!\s+(?:enum|struct|extern)\s*:)"
                      r"[^=(:]*?\b(\w+)\s*(?:\(|:|$)"
                      r"|^(\w+)\s*(?::[^=]*)?=", re.M)
#: A name read: not an attribute (``x.name``) nor a keyword or target (``name=``).
WORD = re.compile(r"(?<![.\w])\w+\b(?!\s*=(?!=))")
#: A name the file binds itself (a local ``cdef list plan``): its own, not another file's.
BOUND = re.compile(r"^[ \t]*cdef\s+(?!class\b)[\w.\[\]*]+\s+(\w+)", re.M)
#: A class body's own names (``    EMPTY = ...``, ``    to_host: str``, its methods):
#: definitions, not reads.
MEMBER = re.compile(r"^[ \t]+\w+\s*(?::[^=\n]*)?=(?!=)|^[ \t]+\w+\s*:\s*\w+\s*$"
                    r"|^[ \t]+(?:cdef|cpdef|def)\b[^(\n]*?\w+\s*\(", re.M)


def _code(text: str) -> str:
    """A core file without its comments and string literals (names in prose are no arrows)."""
    text = re.sub(r'"""(?:.|\n)*?"""|\'\'\'(?:.|\n)*?\'\'\'', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', '""', text)
    return re.sub(r"#[^\n]*", "", text)


def core_rooms(read: Reader) -> list[Room]:
    """The files ``src/_core.pyx`` includes, in its order, each with the files it reads."""
    order = re.findall(r'^include "(\w+\.pxi)"', read("src/_core.pyx"), re.M)
    codes = {name: _code(read(f"src/{name}")) for name in order}
    defined = {name: {a or b for a, b in TOP_NAME.findall(code)} - {""}
               for name, code in codes.items()}
    rooms = []
    for i, name in enumerate(order):
        code = MEMBER.sub("", codes[name])
        used = set(WORD.findall(code)) - set(BOUND.findall(code))
        reads = [other for other in order if other != name and used & defined[other]]
        rooms.append(Room(f"src/{name}", len(read(f"src/{name}").splitlines()),
                          tuple(r for r in reads if order.index(r) < i),
                          tuple(r for r in reads if order.index(r) > i)))
    return rooms


def layout(rev: str | None = None) -> list[Room]:
    """Every room of the package and the core, the package's modules first."""
    read, files = _reader(rev), _files(rev)
    modules = {module_name(p): p for p in files if p.startswith(PACKAGE)}
    known = set(modules) | {"dlinspect._core"}
    core_texts = [read(p) for p in files if p.startswith("src/")]
    rooms = []
    for path in modules.values():
        reaches = sorted(m.removeprefix("dlinspect.") for m in
                         python_imports(path, read(path), known) if m != "dlinspect")
        rooms.append(Room(path, len(read(path).splitlines()), tuple(reaches)))
    rooms.append(Room("src/_core.pyx", len(read("src/_core.pyx").splitlines()), tuple(sorted(
        m.removeprefix("dlinspect.") for m in core_imports(core_texts, known)))))
    pxi = core_rooms(read)
    rooms += pxi
    others = [p for p in files if not p.startswith(PACKAGE) and p != "src/_core.pyx"
              and p not in {r.path for r in pxi}]
    rooms += [Room(p, len(read(p).splitlines()), ()) for p in others]
    return rooms


def code_lines(path: str, text: str) -> int:
    """The lines of file ``text`` that hold code: not blank, not only a comment, not inside a
    docstring (Python: a string statement, found with ast; Cython: a block whose first line
    starts with triple quotes; C: ``/* */`` blocks and ``//`` lines)."""
    if path.endswith(".py"):
        return _python_code_lines(text)
    kinds = _c_kinds(text) if path.endswith(".h") else _cython_kinds(text)
    return sum(kind == "code" for kind in kinds)


def _python_code_lines(text: str) -> int:
    docs: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            docs.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER, tokenize.COMMENT}
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in skip:
            code.update(range(tok.start[0], tok.end[0] + 1))
    lines = text.splitlines()
    return sum(1 for n in code - docs if n <= len(lines) and lines[n - 1].strip())


def _cython_kinds(text: str) -> list[str]:
    kinds, doc = [], False
    for line in (raw.strip() for raw in text.splitlines()):
        if not line or doc or line.startswith(('"""', 'r"""', "#")):
            kind = "blank" if not line else "comment" if line[0] == "#" and not doc else "doc"
            if doc:
                doc = '"""' not in line
            elif kind == "doc":
                doc = line.count('"""') == 1
        else:
            kind, doc = "code", line.count('"""') == 1
        kinds.append(kind)
    return kinds


def _c_kinds(text: str) -> list[str]:
    kinds, comment = [], False
    for line in (raw.strip() for raw in text.splitlines()):
        if comment or line.startswith(("/*", "//", "*")):
            kinds.append("comment")
            comment = ("*/" not in line) if (comment or line.startswith("/*")) else False
        else:
            kinds.append("code" if line else "blank")
    return kinds


def code_total(rev: str | None = None) -> int:
    """The code lines of every room (:func:`code_lines`), against :data:`CODE_BUDGET`."""
    read = _reader(rev)
    return sum(code_lines(path, read(path)) for path in _files(rev))


def drawing(rooms: list[Room]) -> str:
    """The rooms as a text table, and the total against :data:`BUDGET`."""
    width = max(len(r.path) for r in rooms) + 2
    out = [f"{'room':<{width}}{'lines':>6}  reads", f"{'-' * (width - 2):<{width}}{'-----':>6}  -----"]
    for r in rooms:
        reads = ", ".join(Path(x).stem if x.endswith(".pxi") else x for x in r.reaches) or "-"
        up = f"  UP: {', '.join(Path(x).stem for x in r.up)}" if r.up else ""
        out.append(f"{r.path:<{width}}{r.lines:>6}  {reads}{up}")
    total = sum(r.lines for r in rooms)
    out.append(f"{'total (Python + core)':<{width}}{total:>6}  (budget {BUDGET})")
    out.append(f"{'code lines of them':<{width}}{code_total():>6}  (budget {CODE_BUDGET})")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    rev = argv[argv.index("--rev") + 1] if "--rev" in argv else None
    print(drawing(layout(rev)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

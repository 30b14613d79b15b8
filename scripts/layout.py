"""The layout of the package and its core, read from the code: rooms, their size, their arrows.

Usage: python scripts/layout.py [--rev REV]

A room is a module of ``python/dlinspect`` (its benchmark suites left out) or a file of the
compiled core (``src/*.pyx|pxi|pxd``, ``include/**/*.h``). A module's arrows are the
dlinspect modules it imports, at the top or inside a function; a core file's arrows are
the files whose names it uses: the earlier files of ``src/_core.pyx``'s includes whose
module-level names it reads (below it in the flow), and any later one it reads too
(reaching up: ``up`` lists those). ``--rev`` draws a commit of this repository instead of
the working tree (``git show``). ``scripts/figures.py`` writes the drawing into the How it
works page (block ``layout``); ``tests/test_structure.py`` checks the arrows and the size.

Size is counted in tokens (:func:`tokens`): names, numbers, strings, operators and brackets,
but no comment, docstring, newline or indentation, so that joining or splitting lines
leaves it as it was and only less code makes it smaller.
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
#: The tokens Python + core may hold (the package without its benchmark suites,
#: src/*.pyx|pxi|pxd, include/**/*.h): what an audit of the code found reachable without
#: cutting a feature.
TOKEN_BUDGET = 52400

Reader = Callable[[str], str]


class Room(NamedTuple):
    """One file of the package or the core: where it is, its lines and tokens, where its
    arrows go."""

    path: str
    lines: int
    tokens: int
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
        rooms.append(Room(*_size(f"src/{name}", read),
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
        rooms.append(Room(*_size(path, read), tuple(reaches)))
    rooms.append(Room(*_size("src/_core.pyx", read), tuple(sorted(
        m.removeprefix("dlinspect.") for m in core_imports(core_texts, known)))))
    pxi = core_rooms(read)
    rooms += pxi
    others = [p for p in files if not p.startswith(PACKAGE) and p != "src/_core.pyx"
              and p not in {r.path for r in pxi}]
    rooms += [Room(*_size(p, read), ()) for p in others]
    return rooms


def _size(path: str, read: Reader) -> tuple[str, int, int]:
    text = read(path)
    return path, len(text.splitlines()), tokens(path, text)


#: Tokens that are layout, not code: line ends, indentation, the end of the file.
_LAYOUT = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
#: C: comments (removed first), then one token per name, number, string or character
#: literal, multi-character operator (``->``, ``<<=``, ``&&``...) or other character.
_C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_C_TOKEN = re.compile(r"""
    [A-Za-z_]\w*                                  # names and keywords
  | \d[\w.]*(?:[eEpP][-+]\d+\w*)?                # numbers (64, 0x3F, 1.5e-3f)
  | "(?:[^"\\]|\\.)*" | '(?:[^'\\]|\\.)*'       # string and character literals
  | <<= | >>= | -> | \+\+ | -- | << | >> | && | \|\| | \#\# | [-+*/%&|^!=<>]=
  | \S
""", re.X)


#: Python 3.12's tokenize splits an f-string into its parts (PEP 701); each is counted
#: whole, as Python 3.11 reads it, so that every interpreter counts the same.
_FSTRING_START = getattr(tokenize, "FSTRING_START", None)
_FSTRING_END = getattr(tokenize, "FSTRING_END", None)


def _whole_fstrings(toks: list[tokenize.TokenInfo]) -> list[tokenize.TokenInfo]:
    """``toks`` with each f-string (its parts, nested ones too) one STRING token."""
    out = []
    depth = 0
    for tok in toks:
        if tok.type == _FSTRING_START:
            depth += 1
            if depth == 1:
                out.append(tok._replace(type=tokenize.STRING))
        elif tok.type == _FSTRING_END:
            depth -= 1
        elif depth == 0:
            out.append(tok)
    return out


def tokens(path: str, text: str) -> int:
    """The tokens of file ``text`` at ``path``: names, numbers, strings, operators and
    brackets; no comment, no docstring (a string that is a statement of its own), no line
    end or indentation. Python and Cython through ``tokenize``, C by :data:`_C_TOKEN`."""
    if path.endswith(".h"):
        return len(_C_TOKEN.findall(_C_COMMENT.sub(" ", text)))
    toks = _whole_fstrings([t for t in tokenize.generate_tokens(io.StringIO(text).readline)
                            if t.type != tokenize.COMMENT])
    count = 0
    for i, tok in enumerate(toks):
        if tok.type in _LAYOUT:
            continue
        alone = (tok.type == tokenize.STRING and (i == 0 or toks[i - 1].type in _LAYOUT)
                 and toks[i + 1].type in (tokenize.NEWLINE, tokenize.ENDMARKER))
        count += not alone
    return count


def token_total(rev: str | None = None) -> int:
    """The tokens of every room (:func:`tokens`), against :data:`TOKEN_BUDGET`."""
    return sum(room.tokens for room in layout(rev))


def drawing(rooms: list[Room]) -> str:
    """The rooms as a text table, and the total tokens against :data:`TOKEN_BUDGET`."""
    width = max(len(r.path) for r in rooms) + 2
    out = [f"{'room':<{width}}{'lines':>6}{'tokens':>8}  reads",
           f"{'-' * (width - 2):<{width}}{'-----':>6}{'------':>8}  -----"]
    for r in rooms:
        reads = ", ".join(Path(x).stem if x.endswith(".pxi") else x for x in r.reaches) or "-"
        up = f"  UP: {', '.join(Path(x).stem for x in r.up)}" if r.up else ""
        out.append(f"{r.path:<{width}}{r.lines:>6}{r.tokens:>8}  {reads}{up}")
    lines, total = sum(r.lines for r in rooms), sum(r.tokens for r in rooms)
    out.append(f"{'total (Python + core)':<{width}}{lines:>6}{total:>8}  "
               f"(budget {TOKEN_BUDGET} tokens)")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    rev = argv[argv.index("--rev") + 1] if "--rev" in argv else None
    print(drawing(layout(rev)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Open every page of the built site in headless Chromium and check what it rendered.

Usage: python scripts/check_site.py [BUILD_DIR] [--browser PATH]
       (default docs/_build/html; the browser: chromium on PATH)

For each HTML page, the DOM as Chromium has it after loading the page (``--dump-dom``,
scripts run) must have a main text (the article of the page: at least 200 characters, a
title), and every relative link of it (``href`` and ``src``) must name a file of the build,
and its ``#fragment``, where it has one, an ``id`` of the page it names, as Chromium
rendered that page. Links to other sites are not followed. Exits 1, naming each page and
link, when one fails.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parents[1]
MIN_TEXT = 200
# Pages whose main part is a form or an index filled by script, not prose.
SPARSE = {"search.html", "genindex.html", "py-modindex.html"}
#: The tags whose ``href`` or ``src`` is a link to check.
LINKING = {"a", "link", "img", "script", "iframe", "source"}


@dataclass
class Page:
    ids: set[str] = field(default_factory=set)
    links: list[str] = field(default_factory=list)
    main_text: str = ""
    title: str = ""


class _Reader(HTMLParser):
    """Ids, links, the text of the page's main part, and its first heading."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self._main_depth = 0          # > 0 inside <main> (or the theme's article)
        self._heading = False
        self._skip = 0                # inside <script> or <style>

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.page.ids.update(v for v in (a.get("id"), a.get("name") if tag == "a" else None) if v)
        if tag in LINKING:
            self.page.links.extend(v for v in (a.get("href"), a.get("src")) if v)
        if tag in ("script", "style"):
            self._skip += 1
        if self._main_depth:
            self._main_depth += 1
        elif _opens_main(tag, a):
            self._main_depth = 1
        if tag == "h1" and not self.page.title:
            self._heading = True

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skip:
            self._skip -= 1
        if self._main_depth:
            self._main_depth -= 1
        if tag == "h1":
            self._heading = False

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        if self._main_depth:
            self.page.main_text += data
        if self._heading:
            self.page.title += data


def _opens_main(tag: str, attrs: dict[str, str | None]) -> bool:
    """The tag opens the page's main part: ``<main>``, or the theme's article."""
    return tag == "main" or (tag == "article" and "bd-article" in (attrs.get("class") or ""))


def dump_dom(browser: str, path: Path) -> str:
    """The page's DOM after Chromium loaded it and ran its scripts."""
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--allow-file-access-from-files", "--virtual-time-budget=3000",
         "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or "<html" not in proc.stdout:
        raise RuntimeError(f"chromium could not render {path}: {proc.stderr[-500:]}")
    return proc.stdout


def read(html: str) -> Page:
    reader = _Reader()
    reader.feed(html)
    return reader.page


def problems(build: Path, pages: dict[Path, Page]) -> list[str]:
    """What is wrong with the rendered pages: blank ones, broken links and anchors."""
    out = []
    for path, page in sorted(pages.items()):
        rel = path.relative_to(build)
        text = " ".join(page.main_text.split())
        if path.name not in SPARSE and len(text) < MIN_TEXT:
            out.append(f"{rel}: its main text has {len(text)} characters (blank page?)")
        if path.name not in SPARSE and not page.title.strip():
            out.append(f"{rel}: no title (h1)")
        out += [f"{rel}: link {link!r}{why}" for link in page.links
                if (why := _broken(build, pages, path, link))]
    return out


def _broken(build: Path, pages: dict[Path, Page], path: Path, link: str) -> str:
    """What is wrong with ``link`` of page ``path`` (after the link in the message), or
    "" where nothing is (and for links to other sites, not followed)."""
    parts = urlsplit(link)
    if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
        return ""
    target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
    if target.is_dir():
        target = target / "index.html"
    if not target.is_file() or build.resolve() not in target.parents:
        return " names no file of the build"
    if not parts.fragment or target.suffix != ".html":
        return ""
    if unquote(parts.fragment) in (pages[target].ids if target in pages else set()):
        return ""
    return f": no id {parts.fragment!r} in {target.relative_to(build.resolve())}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", nargs="?", default=str(ROOT / "docs" / "_build" / "html"))
    parser.add_argument("--browser", default=shutil.which("chromium") or "chromium")
    args = parser.parse_args(argv)
    build = Path(args.build).resolve()
    files = sorted(p for p in build.rglob("*.html")
                   if not any(part.startswith("_") for part in p.relative_to(build).parts))
    if not files:
        print(f"check_site.py: no HTML pages under {build}", file=sys.stderr)
        return 1
    with ThreadPoolExecutor(max_workers=2) as pool:
        doms = list(pool.map(lambda p: dump_dom(args.browser, p), files))
    pages = {p.resolve(): read(dom) for p, dom in zip(files, doms)}
    found = problems(build, pages)
    links = sum(len(p.links) for p in pages.values())
    for line in found:
        print(f"check_site.py: {line}", file=sys.stderr)
    print(f"check_site.py: {len(pages)} pages rendered by {Path(args.browser).name}, "
          f"{links} links checked, {len(found)} problems")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

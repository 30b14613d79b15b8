"""Sphinx configuration of dlinspect's reference site (built by scripts/docs.sh).

Pages are Markdown (MyST); the API reference is rendered by autodoc from the numpydoc
docstrings of the installed package. The build is strict: scripts/docs.sh runs it with
warnings as errors (-W --keep-going) and nitpicky references (-n).
"""

from __future__ import annotations

import sys
from pathlib import Path

import dlinspect

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

project = "dlinspect"
author = "the dlinspect authors"
copyright = "the dlinspect authors"  # noqa: A001 - Sphinx's own name for it
release = version = dlinspect.__version__

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx_copybutton",
]
# The copy button copies what a reader types: the code after ">>> " and "... " (not the
# output), and shell commands without their comments' prompts.
copybutton_prompt_text = r">>> |\.\.\. "
copybutton_prompt_is_regexp = True
copybutton_only_copy_prompt_lines = True

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_generated/*.md"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
# Front matter keys the doctest runner reads (scripts/doctest_docs.py); not page titles.
myst_title_to_header = False

# API reference: autodoc renders the docstrings as numpydoc writes them.
autodoc_member_order = "bysource"
autodoc_typehints = "none"          # the signature line shows the defaults; types are in the text
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_attributes_as_param_list = False
# Every parameter of a rendered signature is documented, and no documented one is unknown.
# (Classes no user constructs, or whose fields are their Attributes, are left out.)
numpydoc_validation_checks = {"PR01", "PR02"}
numpydoc_validation_exclude = {
    r"^dlinspect\.(Need|DLDeviceType|DLDataTypeCode|DLDataType|PrefetchLoader)$",
    r"^dlinspect\.testing\.FakeProducer$",
}

# Every cross-reference must resolve (-n); names outside the package are shown as text.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(jax|numpy|np|torch|grain|ml_dtypes|collections|typing|enum)(\..*)?"),
    (r"py:.*", r"dlinspect\._\w+(\..*)?"),
]

pygments_style = "default"
html_theme = "pydata_sphinx_theme"
html_title = f"dlinspect {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_prev_next": True,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_sidebars: dict[str, list[str]] = {"**": []}   # the top bar and the page's own contents
html_static_path: list[str] = []
html_show_sourcelink = False
html_last_updated_fmt = None


def _draw_figures(app: object) -> None:
    """Plots drawn from benchmarks/results.json at every build (never committed)."""
    import figures
    figures.draw_plots(Path(__file__).parent / "_generated")


def setup(app: object) -> None:
    app.connect("builder-inited", _draw_figures)  # type: ignore[attr-defined]

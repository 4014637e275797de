"""Sphinx configuration: the notebooks rendered with their stored outputs, the API reference from
the package's docstrings (a page per module), and annotated source pages. `make docs` builds it
offline: MathJax is served from the build itself (see _ext/offline_assets.py) and no page requests
an outside URL."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "aftalibi"
author = "the aftalibi developers"
copyright = "the aftalibi developers, MIT License"
extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "offline_assets",
    "notebook_pages",
    "annotated_source",
    "api_pages",
    "search_math",
    "i18n",
]
# Translations (docs/locales/README.md): one catalogue a page, docs/locales/<lang>/LC_MESSAGES/<page>.po.
locale_dirs = ["locales"]
gettext_compact = False
gettext_location = False
# Every ../notebooks/*.ipynb is copied to notebooks/ at build time (see _ext/notebook_pages.py).
# They are executed by the test suite; the docs show their committed outputs.
notebook_pages_source = "../notebooks"
notebook_pages_dir = "notebooks"
nb_execution_mode = "off"
# A cell's stdout (and its stderr) in one box, not one box per print.
nb_merge_streams = True
# A notebook's text/markdown outputs (result tables, findings lists) are read as MyST, so their
# tables and math render as the notebook's own Markdown does.
nb_render_markdown_format = "myst"
# $...$, $$...$$ and \begin{...} environments in Markdown become math nodes for MathJax;
# ::: fences hold directives (the annotated pages' two-column rows).
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
# MathJax 3 (the bundled copy); an empty config would leave Sphinx configuring MathJax 4.
mathjax3_config = {"chtml": {"displayAlign": "center"}}
exclude_patterns = ["_build", "**/.ipynb_checkpoints"]

# One API page per public module of the package (see _ext/api_pages.py), written to api/.
api_pages_package = "aftalibi"
api_pages_dir = "api"

# Two-column pages of these modules, written to annotated/<module>.md at build time.
annotated_source_modules = ["aftalibi.attention", "aftalibi.aft", "aftalibi.alibi"]
annotated_source_dir = "annotated"
annotated_source_notebook_dir = notebook_pages_dir

# Furo: a page's contents on its right, a layout for phones, light and dark modes; it uses the
# system's fonts and its own scripts and styles only, so the site stays offline.
html_theme = "furo"
html_title = "aftalibi"
html_static_path = ["_static"]  # custom.css, loaded after the theme's style
html_css_files = ["custom.css"]
html_show_sourcelink = False

autodoc_member_order = "bysource"
# A method without a docstring (most `forward`s) is not shown with torch's nn.Module text.
autodoc_inherit_docstrings = False
# The docstrings write code in single backticks (Markdown style): show it as code in reST too.
default_role = "code"


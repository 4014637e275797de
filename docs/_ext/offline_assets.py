"""Keep the built site self-contained: a page requests nothing outside docs/_build/html.

- Math is typeset by MathJax 3 from the PyPI package `django-static-mathjax` (an unmodified copy
  of MathJax's `es5` build, Apache-2.0; its Python package is named `mathjax`). The parts the
  pages use are copied to `_static/mathjax/`, and Sphinx loads `tex-chtml.js` from there.
- A remote image in a notebook's Markdown (the "Open in Colab" badge) would be fetched by every
  visitor; it is replaced by its alt text, which stays inside its link.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform
from sphinx.util.fileutil import copy_asset

# tex-chtml.js is the TeX-input, HTML-output bundle; what it loads on demand lies beside it:
# TeX extensions (autoload), the CHTML fonts, and the menu with its accessibility tools.
MATHJAX_FILES = ["tex-chtml.js", "input/tex/extensions", "output/chtml/fonts", "ui", "a11y", "sre"]


def mathjax_root() -> Path:
    """MathJax's distribution in the package: LICENSE, package.json and the es5 build."""
    return Path(str(files("mathjax"))) / "static" / "mathjax"


def use_bundled_mathjax(app: Sphinx, config) -> None:
    config.mathjax_path = "mathjax/tex-chtml.js"  # relative to _static


def copy_mathjax(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    source, target = mathjax_root() / "es5", Path(app.outdir) / "_static" / "mathjax"
    for part in MATHJAX_FILES:
        destination = target / part if (source / part).is_dir() else target
        copy_asset(source / part, destination)
    copy_asset(mathjax_root() / "LICENSE", target)  # Apache-2.0, travels with the copy


class RemoteImagesToText(SphinxTransform):
    """Replace an image with an http(s) URI by its alt text."""

    default_priority = 400

    def apply(self, **kwargs) -> None:
        for image in list(self.document.findall(nodes.image)):
            if image["uri"].startswith(("http://", "https://", "//")):
                image.replace_self(nodes.inline(text=image.get("alt", ""), classes=["remote-image-alt"]))


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", use_bundled_mathjax)
    app.connect("build-finished", copy_mathjax)
    app.add_transform(RemoteImagesToText)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

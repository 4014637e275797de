"""The notebooks as pages of the docs: every `notebooks/*.ipynb` of the repository is copied into
`docs/notebooks/` when a build starts, and copies of deleted notebooks are removed.

A copy, not a link: Sphinx resolves a link between pages through the file's real path, so a
notebook reached through a symbolic link outside the docs could not be linked to. Only changed
files are copied (with their times), so Sphinx re-reads only the notebooks that changed.

On the pages, code cells are shown without nbdev's `#| export`-style directive lines, which
steer the export and say nothing to a reader.
"""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform


def copy_notebooks(app: Sphinx) -> None:
    source = (Path(app.confdir) / app.config.notebook_pages_source).resolve()
    target = Path(app.srcdir) / app.config.notebook_pages_dir
    target.mkdir(exist_ok=True)
    notebooks = {path.name: path for path in source.glob("*.ipynb")}
    for stale in target.glob("*.ipynb"):
        if stale.name not in notebooks:
            stale.unlink()
    for name, path in notebooks.items():
        copy = target / name
        if not copy.exists() or not filecmp.cmp(path, copy, shallow=False):
            shutil.copy2(path, copy)


class HideNbdevDirectives(SphinxTransform):
    """Drop the `#| ...` lines of notebook code cells (a cell of directives only disappears)."""

    default_priority = 500

    def apply(self, **kwargs) -> None:
        for cell_input in list(self.document.findall(nodes.container)):
            if "cell_input" not in cell_input["classes"]:
                continue
            for block in list(cell_input.findall(nodes.literal_block)):
                kept = [line for line in block.astext().splitlines() if not line.startswith("#|")]
                code = "\n".join(kept).strip("\n")
                if not code:
                    cell_input.parent.remove(cell_input)
                    break
                block.children = [nodes.Text(code)]
                block.rawsource = code


def setup(app: Sphinx) -> dict:
    app.add_config_value("notebook_pages_source", "../notebooks", "env", types=[str])
    app.add_config_value("notebook_pages_dir", "notebooks", "env", types=[str])
    app.connect("builder-inited", copy_notebooks)
    app.add_transform(HideNbdevDirectives)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

"""What every notebook opened alone (on Colab) starts with: its "Open in Colab" badge and its install cell.

The repository is named once, in pyproject.toml (`[project.urls] Repository`), and the release once,
in `aftalibi.__version__` (tagged `v<version>`). `make export` runs this module, which writes both
into the badge and the install cell (the first code cell) of every notebook, and into the README's
badges: a fork changes one line and runs `make export`. tests/test_colab.py fails when a notebook's
cells differ from what this module writes, and plays Colab with them.
"""

import re
import sys
import tomllib
from pathlib import Path

import nbformat

from aftalibi import __version__

ROOT = Path(__file__).resolve().parent.parent  # the repository checkout this module is run from

# The install cell, filled in with the repository and the release. It installs the `triton` extra
# because notebook 10 runs the Triton kernels (on a CPU in Triton's interpreter); Colab's torch
# brings Triton already, and pip adds nothing there. Colab shows the cell folded to its title
# (`cellView: form`), as do JupyterLab (`source_hidden`) and the docs (the `hide-input` tag).
INSTALL_CELL = '''\
# @title Install aftalibi where it is missing (Colab): this notebook's release
# The results the notebooks read come with it (6.5 MB); nothing else is fetched.
# The installed torch is kept: pip may add packages, never replace it.
# AFTALIBI_SOURCE, a path or URL of a copy of the repository, is installed instead.
import importlib.metadata, importlib.util, os, pathlib, subprocess, sys, tempfile

# Written by `make export`, from pyproject.toml and aftalibi.__version__:
REPOSITORY, RELEASE = "{repository}", "{release}"
if importlib.util.find_spec("aftalibi") is None:
    if importlib.util.find_spec("torch") is None:
        raise SystemExit("aftalibi needs torch >= 2.4: install PyTorch first")
    torch_version = importlib.metadata.version("torch")
    if tuple(int(part) for part in torch_version.split(".")[:2]) < (2, 4):
        raise SystemExit(f"aftalibi needs torch >= 2.4, not {{torch_version}}")
    source = os.environ.get("AFTALIBI_SOURCE", f"git+{{REPOSITORY}}@{{RELEASE}}")
    source = source if "://" in source else pathlib.Path(source).resolve().as_uri()
    keep_torch = pathlib.Path(tempfile.mkdtemp(), "constraints.txt")
    keep_torch.write_text(f"torch=={{torch_version}}\\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-c", keep_torch,
                    f"aftalibi[triton] @ {{source}}"], check=True)
    importlib.invalidate_caches()'''

# The install cell's metadata: folded to its title where the reader's tool allows it.
INSTALL_CELL_METADATA = {"cellView": "form", "jupyter": {"source_hidden": True}, "tags": ["hide-input"]}

BADGE = "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})"
# A Colab badge's link, in a notebook's first cell or in the README's table of notebooks.
BADGE_LINK = re.compile(r"\(https://colab\.research\.google\.com/github/[^)\s]*/notebooks/([\w.-]+\.ipynb)\)")


def repository() -> str:
    """The repository's URL, from pyproject.toml: the one place it is written."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["project"]["urls"]["Repository"]


def release() -> str:
    """The git tag of this version, which the install cells and the badges name."""
    return f"v{__version__}"


def install_cell(repository: str, release: str) -> str:
    """The source of every notebook's install cell."""
    return INSTALL_CELL.format(repository=repository, release=release)


def badge_url(repository: str, release: str, notebook: str) -> str:
    """Colab's link that opens `notebook` (a file name in notebooks/) of `release` from GitHub."""
    owner_and_name = re.fullmatch(r"https://github\.com/([^/]+/[^/]+?)(?:\.git)?/?", repository)
    if owner_and_name is None:
        raise ValueError(f"Colab opens notebooks from GitHub only: the repository must be "
                         f"https://github.com/OWNER/NAME, got {repository!r}")
    return f"https://colab.research.google.com/github/{owner_and_name[1]}/blob/{release}/notebooks/{notebook}"


def with_badges(text: str, repository: str, release: str) -> str:
    """`text` with every Colab badge's link pointing at `release` of `repository`."""
    return BADGE_LINK.sub(lambda found: f"({badge_url(repository, release, found[1])})", text)


def install_cell_index(notebook: nbformat.NotebookNode) -> int:
    """The index of the install cell: the first code cell."""
    return next(i for i, cell in enumerate(notebook.cells) if cell.cell_type == "code")


def write(root: Path = ROOT) -> list[Path]:
    """Write the badges and install cells of root/notebooks/*.ipynb and the README; returns the changed files."""
    url, tag = repository(), release()
    changed = []
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        first = notebook.cells[0]
        if first.cell_type != "markdown" or not BADGE_LINK.search(first.source):
            raise ValueError(f"{path}: the first cell must be Markdown with the Open in Colab badge "
                             f"({BADGE.format(url=badge_url(url, tag, path.name))})")
        cell = notebook.cells[install_cell_index(notebook)]
        written = with_badges(first.source, url, tag), install_cell(url, tag), INSTALL_CELL_METADATA
        if (first.source, cell.source, cell.metadata) != written:
            first.source, cell.source, cell.metadata = written
            nbformat.write(notebook, path)
            changed.append(path)
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8")
    if with_badges(text, url, tag) != text:
        readme.write_text(with_badges(text, url, tag), encoding="utf-8")
        changed.append(readme)
    return changed


if __name__ == "__main__":
    for changed_path in write(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT):
        print(f"wrote the Colab badge and install cell of {changed_path}")

"""Every notebook opened alone, as "Open in Colab" opens it: the notebook file and a kernel, nothing else.

The install cell of every notebook is written from one place (`aftalibi._colab`), and no notebook
reads a file of the repository. That each notebook then runs, alone in an empty folder, in a fresh
environment that has what Colab preinstalls, is how nbval runs it (tests/colab_kernel.py).
"""

import ast
import os
import re
import subprocess
from pathlib import Path

import nbformat
import pytest

from aftalibi import _colab

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# A string in a code cell that looks like a file path: it has a folder separator or a file suffix.
PATH_LIKE = re.compile(r"[\w.-]*/|\.(pt|json|txt|csv|npy|npz|pkl|ipynb|py|md|toml|yml|yaml)$")


def code_cells(notebook: nbformat.NotebookNode):
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_the_badge_and_install_cell_are_written_from_one_place(path):
    """The repository and release are written once (pyproject.toml, aftalibi.__version__), and
    `make export` writes them into every notebook: a notebook that differs has not been exported."""
    notebook = nbformat.read(path, as_version=4)
    repository, release = _colab.repository(), _colab.release()
    install = code_cells(notebook)[0]
    assert install.source == _colab.install_cell(repository, release), \
        f"{path.name}: the install cell is not aftalibi._colab's: run `make export`"
    assert install.metadata == _colab.INSTALL_CELL_METADATA, \
        f"{path.name}: the install cell is not folded to its title: run `make export`"
    badges = _colab.BADGE_LINK.findall(notebook.cells[0].source)
    assert badges == [path.name], f"{path.name}: the first cell must hold its own Colab badge, found {badges}"
    assert _colab.with_badges(notebook.cells[0].source, repository, release) == notebook.cells[0].source, \
        f"{path.name}: the Colab badge does not open {release} of {repository}: run `make export`"
    assert all(len(line) <= 88 for line in install.source.splitlines())


def test_the_readme_badges_open_the_release_of_each_notebook():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert sorted(_colab.BADGE_LINK.findall(readme)) == [path.name for path in NOTEBOOKS]
    assert _colab.with_badges(readme, _colab.repository(), _colab.release()) == readme, "run `make export`"


def test_the_install_pins_a_release_and_keeps_torch():
    cell = _colab.install_cell("https://github.com/someone/fork", "v9.9.9")
    assert 'REPOSITORY, RELEASE = "https://github.com/someone/fork", "v9.9.9"' in cell
    assert _colab.badge_url("https://github.com/someone/fork", "v9.9.9", "01_attention.ipynb") == (
        "https://colab.research.google.com/github/someone/fork/blob/v9.9.9/notebooks/01_attention.ipynb")
    with pytest.raises(ValueError, match="from GitHub only"):
        _colab.badge_url("https://gitlab.com/someone/fork", "v9.9.9", "01_attention.ipynb")
    assert _colab.release() == f"v{__import__('aftalibi').__version__}"


def string_constants(source: str) -> list[str]:
    """The string literals of a code cell (IPython's magics and shell lines left out)."""
    python = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    return [node.value for node in ast.walk(ast.parse(python))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def repository_paths() -> set[str]:
    """The repository's files and folders, relative to its root, as git tracks them. Not what a
    run wrote into the checkout (`runs/demo` after `make demo`): a notebook naming that output path
    does not read the repository."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    files = [Path(line) for line in listed.stdout.splitlines()]
    return {str(part) for file in files for part in (file, *file.parents) if part != Path(".")}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_no_notebook_reads_a_file_of_the_repository(path):
    """Opened alone, a notebook has nothing beside it: a path into the repository (relative to the
    notebook or to the checkout) would work here and fail on Colab. Files a notebook reads come with
    the package (`aftalibi.RESULTS_FOLDER`)."""
    tracked = repository_paths()

    def in_repository(candidate: Path) -> bool:
        return os.path.relpath(candidate, ROOT) in tracked

    found = []
    for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
        if cell.cell_type != "code":
            continue
        for text in string_constants(cell.source):
            if "\n" in text or not re.search(r"\w", text) or text.startswith("/"):
                continue  # not a relative path
            beside = "/" not in text and not text.endswith(".ipynb") and in_repository(path.parent / text)
            if text.startswith("../") or beside or (PATH_LIKE.search(text) and (
                    in_repository(path.parent / text) or in_repository(ROOT / text))):
                found.append(f"cell {index}: {text!r}")
    assert not found, f"{path.name} reads files of the repository, which a notebook opened alone lacks: {found}"

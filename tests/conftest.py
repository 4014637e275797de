"""Fixtures shared by the tests: a small corpus file and Ctrl-C pressed during training (the
training tests), and the docs built once per run (the docs and translation tests)."""

import sys
from pathlib import Path

import pytest
from filelock import FileLock

import aftalibi.train as training

SPEECHES = ("ROMEO:\nBut, soft! what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n\n"
            "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n\n")


@pytest.fixture
def corpus_file(tmp_path) -> str:
    """A corpus file of the two speeches, 60 times: enough characters for a tiny run's two splits."""
    path = tmp_path / "corpus.txt"
    path.write_text(SPEECHES * 60, encoding="utf-8")
    return str(path)


@pytest.fixture
def ctrl_c_at_draw(monkeypatch):
    """`ctrl_c_at_draw(n)`: training's n-th batch draw from now on raises KeyboardInterrupt, as Ctrl-C
    pressed while a step is being prepared; `ctrl_c_at_draw(None)` lets training run on."""
    draw, plan = training.sample_windows, {"draws": 0, "at": None}

    def interrupted_draw(*args, **kwargs):
        plan["draws"] += 1
        if plan["draws"] == plan["at"]:
            raise KeyboardInterrupt
        return draw(*args, **kwargs)

    monkeypatch.setattr(training, "sample_windows", interrupted_draw)

    def press_at(draw_number: int | None):
        plan.update(draws=0, at=draw_number)

    return press_at


DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture(scope="session")
def docs_tree_lock(tmp_path_factory, worker_id) -> FileLock:
    """Held by whatever runs Sphinx on docs/: a build writes generated pages into the source tree
    (docs/notebooks/, docs/annotated/, docs/api/), so two builds at once, in two pytest-xdist
    workers, could read each other's half-written files. The lock file is shared by the workers of
    one run (their base folders' parent) and by nothing else."""
    folder = tmp_path_factory.getbasetemp()
    return FileLock((folder if worker_id == "master" else folder.parent) / "docs-tree.lock")


@pytest.fixture(scope="session")
def docs_site(tmp_path_factory, worker_id, docs_tree_lock) -> Path:
    """The site as `make docs` builds it (English, Japanese and Sinhala, each a fresh -E -W build),
    built once per test run and shared by tests/test_docs.py and tests/test_translations.py, also
    across pytest-xdist workers: the first worker to get here builds it, the others wait and reuse
    it (the build takes minutes; before, each file built its own)."""
    sys.path.insert(0, str(DOCS / "_ext"))
    import i18n_site

    folder = tmp_path_factory.getbasetemp()
    shared = (folder if worker_id == "master" else folder.parent) / "docs-site"
    with docs_tree_lock:
        if not (shared / "built").exists():
            errors = i18n_site.build_site(shared / "html")
            (shared / "errors.txt").write_text("\n".join(errors), encoding="utf-8")
            (shared / "built").touch()
    errors = (shared / "errors.txt").read_text(encoding="utf-8")
    assert not errors, errors
    return shared / "html"


def pytest_collection_modifyitems(items):
    """A test that needs the docs built (minutes) or their messages extracted (Sphinx's gettext
    builder) is slow by what it uses: `make check` leaves it out."""
    for item in items:
        if {"docs_site", "extraction"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)

"""`refresh-notebooks`: a fast-mode refresh keeps the full-size outputs a reader sees (cells tagged
full-mode-output), `--full` replaces them, and every such cell is one nbval does not compare."""

import json
import os
from pathlib import Path

import nbformat
import pytest

from aftalibi.__main__ import FULL_MODE_OUTPUT, main

ROOT = Path(__file__).resolve().parent.parent
MODE = 'import os\nprint("fast" if os.environ["AFTALIBI_FAST"] == "1" else "full")'


def printed(path: Path) -> list[str]:
    return ["".join(cell.outputs[0].text).strip() for cell in nbformat.read(path, as_version=4).cells]


@pytest.fixture
def notebook(tmp_path) -> Path:
    """Two cells that print the mode they ran in, the second tagged as a full-size run, stored from one."""
    notebook = nbformat.v4.new_notebook()
    plain = nbformat.v4.new_code_cell(MODE)
    published = nbformat.v4.new_code_cell(MODE, metadata={"tags": ["nbval-ignore-output", FULL_MODE_OUTPUT]})
    published.outputs = [nbformat.v4.new_output("stream", name="stdout", text="full\n")]
    notebook.cells = [plain, published]
    path = tmp_path / "tagged.ipynb"
    nbformat.write(notebook, path)
    return path


def test_a_fast_refresh_keeps_the_full_size_outputs_and_full_replaces_every_one(notebook):
    assert main(["refresh-notebooks", str(notebook)]) == 0
    assert printed(notebook) == ["fast", "full"]
    assert main(["refresh-notebooks", "--full", str(notebook)]) == 0
    assert printed(notebook) == ["full", "full"]
    assert os.environ["AFTALIBI_FAST"] == "1"  # the mode reached the kernels only, not this process


def test_every_full_size_output_is_left_out_of_nbval_comparisons():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            tags = cell["metadata"].get("tags", [])
            if FULL_MODE_OUTPUT in tags:
                assert "nbval-ignore-output" in tags, f"{path.name} cell {index}: {FULL_MODE_OUTPUT} without nbval-ignore-output"

"""Test set-up shared by the unit tests (tests/) and the notebooks (notebooks/, under nbval)."""

import os

import torch

# Without a GPU, the Triton kernels (the AFT kernel "triton") run in Triton's interpreter, which is
# chosen when a kernel is defined: before aftalibi.aft_triton is imported, here and in every
# notebook kernel, which inherits the variable.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Notebooks run in their fast mode unless the caller asks otherwise; nbval starts each
# notebook's kernel from this process, so the kernel inherits the variable.
os.environ.setdefault("AFTALIBI_FAST", "1")


def pytest_collection_modifyitems(items):
    """Compare every notebook cell's outputs, although the notebooks are committed clean.

    `nbdev-clean` strips execution counts so that diffs stay small, and nbval reads a missing
    count as "this cell was never run: do not compare it" (and fails a cell that has outputs
    anyway). Giving each code cell a count in memory makes nbval compare all of them,
    including cells whose committed output is empty.
    """
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is not None and cell.get("cell_type") == "code" and cell.get("execution_count") is None:
            cell.execution_count = 1

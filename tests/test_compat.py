"""labml 0.5.3 logs in a Jupyter kernel on IPython 9 once aftalibi is imported."""

import importlib

import IPython.core.display as core_display

from aftalibi._compat import patch_ipython_display_for_labml


def test_display_is_restored_where_labml_imports_it(monkeypatch):
    monkeypatch.delattr(core_display, "display", raising=False)
    assert patch_ipython_display_for_labml() is True
    from IPython.display import display

    assert core_display.display is display
    assert patch_ipython_display_for_labml() is False  # idempotent


def test_labml_notebook_logger_imports():
    import aftalibi  # noqa: F401

    module = importlib.import_module("labml.internal.logger.destinations.ipynb")
    assert hasattr(module, "IpynbDestination")


def test_labml_logs_inside_a_jupyter_kernel():
    # The notebooks' case: a real kernel, which renders labml's log as HTML through IPython's display.
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import aftalibi\n"
        "from labml import logger\n"
        "from labml.logger import Text\n"
        "logger.log([('labml logs in this kernel', Text.success)])")])
    NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
    outputs = notebook.cells[0].outputs
    assert not [output for output in outputs if output.output_type == "error"], outputs
    assert any("labml logs in this kernel" in output.get("data", {}).get("text/html", "") for output in outputs), outputs

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

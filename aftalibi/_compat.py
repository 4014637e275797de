"""Compatibility shims for the libraries aftalibi builds on."""

__all__ = ["patch_ipython_display_for_labml"]


def patch_ipython_display_for_labml() -> bool:
    """Let labml 0.5.3 log inside a Jupyter kernel running IPython 9.

    labml's notebook logger does `from IPython.core.display import display`.
    IPython 8 re-exported `display` there; IPython 9 keeps it only in
    `IPython.core.display_functions` (and `IPython.display`), so labml fails
    with an ImportError the first time it logs in a notebook. Restoring the
    name on `IPython.core.display` is all labml needs, and leaves IPython's
    own behaviour unchanged. Returns True when the name had to be restored.
    Without IPython installed (a plain script) there is nothing to do.
    """
    try:
        import IPython.core.display as core_display
    except ImportError:
        return False
    if hasattr(core_display, "display"):
        return False
    from IPython.core.display_functions import display

    core_display.display = display
    return True

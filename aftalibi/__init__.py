"""aftalibi: the Attention Free Transformer and ALiBi, built step by step and tested.

The modules are generated from the notebooks in `notebooks/` by `nbdev-export`:
edit the notebook, not the module.
"""
__version__ = "0.1.0"

from ._compat import patch_ipython_display_for_labml

patch_ipython_display_for_labml()

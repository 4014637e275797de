"""Sphinx configuration: the notebooks rendered with their stored outputs, and the API
reference from the package's docstrings. Built offline by `make docs`."""

project = "aftalibi"
author = "the aftalibi developers"
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
# The notebooks are executed by the test suite; the docs show their committed outputs.
nb_execution_mode = "off"
exclude_patterns = ["_build"]
html_theme = "alabaster"
autodoc_member_order = "bysource"

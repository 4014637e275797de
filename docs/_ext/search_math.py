"""Formulas read as text in the search page's summaries, and docstrings may write `$...$` math.

- Sphinx's search page shows, under each result, a summary cut from the text of the page it found
  (searchtools.js reads the page's HTML). A formula's text there is its TeX source, `\\(m_h (i - j)\\)`.
  `static/search_math.js` (loaded on every page; it acts on the search page only) rewrites each formula of that HTML as
  plain text (`m_h (i − j)`) before the summary is cut.
- A docstring writes inline math as `$...$` (read as it is by `help()`), or as reST's
  :math:`...` role, and a display formula as a `.. math::` block or a `$$ ... $$` paragraph. autodoc
  reads reST, so `$...$` and `$$` paragraphs become :math: roles and math blocks here
  (the annotated pages are MyST, which reads `$...$` and `$$` itself). Docstrings also
  write distances as |t - t'|, which reST reads as a substitution: the bars outside code and
  math are escaped.
"""

from __future__ import annotations

import re
from pathlib import Path

from sphinx.application import Sphinx

STATIC = str(Path(__file__).parent / "static")

# A `code` or :role:`...` span, left as it is.
CODE_OR_ROLE = re.compile(r"((?::[a-z]+(?::[a-z]+)?:)?`[^`]*`)")
# $...$ on one line: not $$, not an escaped \$, no space just inside the dollars (as MyST reads it).
INLINE_DOLLAR = re.compile(r"(?<![\\$])\$(?=[^\s$])(?P<tex>[^$\n]*?[^\s\\$])\$(?!\$)")
DISPLAY_DOLLAR = re.compile(r"^(?P<indent>\s*)\$\$(?P<tex>.*?)\$\$\s*$")


def inline_math(line: str) -> str:
    """`$x$` as :math:`x`, and bars escaped, outside code spans and roles."""
    parts = CODE_OR_ROLE.split(line)
    for i, part in enumerate(parts):
        if i % 2 == 0:
            pieces = INLINE_DOLLAR.split(part)  # text, tex, text, tex, ..., text
            parts[i] = "".join(f":math:`{p}`" if j % 2 else p.replace("|", r"\|") for j, p in enumerate(pieces))
    return "".join(parts)


def indentation(line: str) -> int:
    return len(line) - len(line.lstrip())


def dollar_math_to_rest(lines: list[str]) -> list[str]:
    """A docstring's lines with its `$...$` and `$$...$$` math in reST. The body of a block that
    a line ending in `::` opens (`.. math::`, a literal block) is left as it is."""
    out: list[str] = []
    display: list[str] | None = None  # the lines of an open multi-line $$ block
    indent = ""
    verbatim: int | None = None  # the indentation of the line that opened a `::` block
    for line in lines:
        if verbatim is not None:
            if not line.strip() or indentation(line) > verbatim:
                out.append(line)
                continue
            verbatim = None
        if display is not None:
            if line.strip().endswith("$$"):
                display.append(line.strip()[:-2])
                out += [f"{indent}.. math::", ""] + [f"{indent}   {t.strip()}" for t in display if t.strip()] + [""]
                display = None
            else:
                display.append(line)
            continue
        single = DISPLAY_DOLLAR.match(line)
        if single:
            out += [f"{single['indent']}.. math::", "", f"{single['indent']}   {single['tex'].strip()}", ""]
        elif line.strip().startswith("$$"):
            indent, display = line[: len(line) - len(line.lstrip())], [line.strip()[2:]]
        else:
            out.append(inline_math(line))
            if line.rstrip().endswith("::"):
                verbatim = indentation(line)
    if display is not None:
        raise ValueError("a docstring opens a $$ display formula and never closes it")
    return out


def process_docstring(app, what, name, obj, options, lines: list[str]) -> None:
    lines[:] = dollar_math_to_rest(lines)


def add_static_folder(app: Sphinx, config) -> None:
    if STATIC not in config.html_static_path:
        config.html_static_path.append(STATIC)


def setup(app: Sphinx) -> dict:
    app.connect("autodoc-process-docstring", process_docstring)
    app.connect("config-inited", add_static_folder)
    # On every page, deferred: after searchtools.js where it is loaded; elsewhere it does nothing.
    app.add_js_file("search_math.js", loading_method="defer")
    return {"parallel_read_safe": True, "parallel_write_safe": True}

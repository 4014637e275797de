"""Annotated source pages: a module's code on the right, its notes and math on the left, section
by section.

For every module named in `annotated_source_modules` (conf.py) this extension writes one MyST
page, `<annotated_source_dir>/<module>.md`, when the build starts. The module is cut

- at its `# %%` cell markers (nbdev writes one above each exported notebook cell), and
- inside a cell, at each top-level definition, and in a class at each method that has a
  docstring or a comment block above it.

The left column of a section holds the notebook's Markdown cells written directly above the
exported cell (with their `$...$` math), then the comment block above the definition and its
docstring (taken out of the code), read as Markdown. Docstrings write their formulas as reST math,
:math:`...` roles and `.. math::` blocks, so that autodoc renders them on the API pages; here they
become MyST's {math}`...` roles and ```{math} blocks (a comment may use either form, or $...$).
The right column is the code, which Sphinx highlights with Pygments. A heading in the notebook's
notes becomes a heading of the page, so the sections appear in the page's contents and in the
search.

Each definition's section is a link target; the API reference (autodoc) gets an `[annotated]`
link beside viewcode's `[source]` for every definition that has one.

Code lines are as long as the modules have them (up to about 120 characters), longer than a code
column beside the notes holds on most screens. So each highlighted line of the code column becomes
a block of its own that wraps, and its continuation is indented four characters past the line's
own indentation (annotated_source.css), like a Python continuation line: no sideways scrolling.
"""

from __future__ import annotations

import ast
import html
import importlib.util
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx

# `# %% ../notebooks/02_aft.ipynb #d658c7db`: the exported cell's notebook and id ("auto" for __all__).
CELL_MARKER = re.compile(r"^# %% (?P<source>\S+)(?: #(?P<cell_id>\S+))?\s*$")
HEADING = re.compile(r"^(?P<hashes>#{1,6})\s+(?P<title>.+?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
# A Markdown image or link whose target is a relative path: not ](http...), ](#...) or ](/...).
RELATIVE_IMAGE = re.compile(r"(?P<alt>!\[[^\]]*\])\((?![a-zA-Z][a-zA-Z0-9+.-]*:|#|/)(?P<target>[^)\s]+)\)")
# The highlighted code of an annotated row: Pygments' <pre>, one source line per text line
# (Pygments closes and reopens its spans at each line end, so every line is balanced HTML).
ANNOTATED_CODE = re.compile(r'(<div class="annotated-code[^"]*"[^>]*>\s*<div class="highlight-python[^"]*">'
                            r'<div class="highlight"><pre>)(?P<code>.*?)(</pre>)', re.DOTALL)
CONTINUATION_INDENT = 4  # characters
RELATIVE_LINK = re.compile(r"\]\((?![a-zA-Z][a-zA-Z0-9+.-]*:|#|/)(?P<target>[^)\s]+)\)")
# An interpreted-text role of reST, `:math:` or `:py:func:`, followed by its backquoted content.
REST_ROLE = re.compile(r"(?<![\w`]):(?P<role>[a-z]+(?::[a-z]+)?):(?=`)")
# A `.. math::` directive: its indented block is the formula.
REST_MATH = re.compile(r"^(?P<indent>[ \t]*)\.\. math::[ \t]*(?P<first>.*)\n(?P<body>(?:(?:(?P=indent)[ \t]+.*)?\n)*)",
                       re.MULTILINE)


@dataclass
class Section:
    """One row of the page: Markdown notes on the left, code on the right (either may be empty)."""

    notes: list[str] = field(default_factory=list)
    code: list[str] = field(default_factory=list)
    name: str | None = None  # the definition's qualified name: the row's link target
    label: str | None = None  # the name within the module: `aft_full`, `AFTFull.forward`


def module_path(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"annotated_source_modules: cannot find module {module!r}")
    return Path(spec.origin)


def shown_path(module: str, path: Path) -> str:
    """The module's file as a reader finds it in the repository: `aftalibi/aft.py`."""
    package_root = module_path(module.split(".")[0]).parent.parent
    return path.relative_to(package_root).as_posix() if path.is_relative_to(package_root) else path.name


def notebook_notes(notebook: Path, cell_id: str) -> str:
    """The Markdown cells directly above the cell `cell_id` of `notebook`, in reading order."""
    if not notebook.is_file():
        return ""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    index = next((i for i, cell in enumerate(cells) if cell.get("id") == cell_id), None)
    if index is None:
        return ""
    notes = []
    for cell in reversed(cells[:index]):
        if cell["cell_type"] != "markdown":
            break
        notes.insert(0, "".join(cell["source"]).strip())
    return "\n\n".join(notes)


def comment_block_above(lines: list[str], start: int) -> tuple[int, list[str]]:
    """The `#` comment lines directly above line index `start`: (first line index, their text)."""
    first = start
    while first > 0 and lines[first - 1].strip().startswith("#") and not CELL_MARKER.match(lines[first - 1]):
        first -= 1
    text = [re.sub(r"^\s*# ?", "", line) for line in lines[first:start]]
    return first, text


def docstring_of(node: ast.AST) -> tuple[str | None, range]:
    """The docstring of a def or class and the 0-based line range of its statement."""
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return ast.get_docstring(node), range(body[0].lineno - 1, body[0].end_lineno)
    return None, range(0)


def first_line(node: ast.stmt) -> int:
    """0-based index of a statement's first line, decorators included."""
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decorators]) - 1


def rest_math_to_myst(text: str) -> str:
    """A docstring's or comment's reST roles and math blocks in MyST's syntax, the rest unchanged:
    :math:`x^2` becomes {math}`x^2`, and a `.. math::` block a ```{math} fence."""
    def math_block(match: re.Match) -> str:
        body = "\n".join(line.strip() for line in [match["first"]] + match["body"].splitlines() if line.strip())
        return f"{match['indent']}```{{math}}\n{body}\n```\n\n"
    return REST_ROLE.sub(lambda m: "{" + m["role"] + "}", REST_MATH.sub(math_block, text))


def trim_blank(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def definition_sections(lines: list[str], statements: list[ast.stmt], module: str, end: int,
                        prefix: str = "") -> list[Section]:
    """Cut `statements` (one block, all at one depth) into sections; the last runs to line `end`.

    At the top level a def or class opens a section, and consecutive other statements share one.
    In a class (`prefix` is "ClassName."), a member opens one only when it has a docstring or a
    comment block above it; the others stay in the section above them. The comment block directly
    above a section's first statement and a definition's docstring move from the code to the notes.
    """
    starts: list[tuple[int, ast.stmt]] = []  # (first line of the section, its first statement)
    for statement in statements:
        comment_start, comment = comment_block_above(lines, first_line(statement))
        if prefix:
            opens = bool(comment or docstring_of(statement)[0])
        else:
            opens = isinstance(statement, DEFINITIONS) or not starts or isinstance(starts[-1][1], DEFINITIONS)
        if opens:
            starts.append((comment_start, statement))
    sections = []
    for i, (start, opening) in enumerate(starts):
        stop = starts[i + 1][0] if i + 1 < len(starts) else end
        code_start = first_line(opening)
        _, comment = comment_block_above(lines, code_start)
        notes = [rest_math_to_myst("\n".join(comment))] if comment else []
        if not isinstance(opening, DEFINITIONS):
            sections.append(Section(notes=notes, code=trim_blank(lines[code_start:stop])))
            continue
        docstring, docstring_lines = docstring_of(opening)
        if docstring:
            notes.append(rest_math_to_myst(docstring))
        label = prefix + opening.name
        members = []
        if isinstance(opening, ast.ClassDef) and not prefix:
            documented = [m for m in opening.body if isinstance(m, DEFINITIONS)
                          and (docstring_of(m)[0] or comment_block_above(lines, first_line(m))[1])]
            if documented:
                members = [m for m in opening.body if first_line(m) >= first_line(documented[0])]
        if members:  # the class head, then a section per documented member
            head_end = comment_block_above(lines, first_line(members[0]))[0]
            code = code_without(lines, code_start, head_end, docstring_lines)
            sections.append(Section(notes, code, f"{module}.{label}", label))
            sections += definition_sections(lines, members, module, stop, prefix=f"{label}.")
        else:
            code = code_without(lines, code_start, stop, docstring_lines)
            sections.append(Section(notes, code, f"{module}.{label}", label))
    return sections


def code_without(lines: list[str], first: int, last: int, docstring_lines: range) -> list[str]:
    """Lines [first, last) less the docstring's (which the notes show)."""
    return trim_blank([line for n, line in enumerate(lines[first:last], first) if n not in docstring_lines])


def module_sections(module: str, path: Path, notebook_folder: str) -> tuple[list[Section], list[Path]]:
    """All sections of `module`, and the notebooks it was exported from.

    `notebook_folder` is where the docs hold the notebooks, for their notes' relative links."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    statements = ast.parse(source).body
    markers = [(n, CELL_MARKER.match(line)) for n, line in enumerate(lines) if CELL_MARKER.match(line)]
    if not markers:  # a hand-written module: one cell, no notebook
        markers = [(-1, None)]
    sections, notebooks = [], []
    for i, (marker_line, marker) in enumerate(markers):
        cell_end = markers[i + 1][0] if i + 1 < len(markers) else len(lines)
        cell_statements = [s for s in statements if marker_line < first_line(s) < cell_end]
        notes = ""
        if marker and marker["cell_id"] and marker["source"].endswith(".ipynb"):
            notebook = (path.parent / marker["source"]).resolve()
            if notebook not in notebooks:
                notebooks.append(notebook)
            notes = relink(notebook_notes(notebook, marker["cell_id"]), notebook_folder)
        cell_sections = definition_sections(lines, cell_statements, module, cell_end)
        if notes:
            if cell_sections:
                cell_sections[0].notes.insert(0, notes)
            else:
                cell_sections = [Section(notes=[notes])]
        sections += cell_sections
    return sections, notebooks


def relink(markdown: str, folder: str) -> str:
    """Rewrite the relative links and images of a notebook's Markdown (relative to the notebook's
    `folder` in the docs) as paths from the docs' root, so they resolve from the generated page."""
    markdown = RELATIVE_IMAGE.sub(lambda m: f"{m['alt']}(/{folder}/{m['target']})", markdown)
    return RELATIVE_LINK.sub(lambda m: f"](project:/{folder}/{m['target']})", markdown)


def fence(text: str, char: str, minimum: int = 3) -> str:
    """A fence of `char` longer than any run of it at the start of a line of `text`."""
    runs = [len(m.group(0)) for m in re.finditer(rf"^\s*{re.escape(char)}+", text, flags=re.M)]
    return char * max([minimum] + [run + 1 for run in runs])


def split_headings(markdown: str) -> list[tuple[int, str] | str]:
    """Split notes into headings (level, title) and the text between them (outside code fences)."""
    parts: list[tuple[int, str] | str] = []
    text: list[str] = []
    in_fence = False
    for line in markdown.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        heading = None if in_fence else HEADING.match(line)
        if heading:
            if "\n".join(text).strip():
                parts.append("\n".join(text).strip())
            text = []
            parts.append((len(heading["hashes"]), heading["title"]))
        else:
            text.append(line)
    if "\n".join(text).strip():
        parts.append("\n".join(text).strip())
    return parts


def render_page(module: str, notebook_folder: str) -> tuple[str, list[str]]:
    """The MyST source of the annotated page of `module`, and the qualified names it has targets for.

    `notebook_folder` is the folder of the docs whose pages are the notebooks."""
    path = module_path(module)
    sections, notebooks = module_sections(module, path, notebook_folder)
    relative = shown_path(module, path)
    out = [f"# `{relative}`, annotated", ""]
    origin = ""
    if notebooks:
        links = ", ".join(f"[](project:/{notebook_folder}/{nb.name})" for nb in notebooks)  # the notebook's title
        origin = f" It is exported from the notebook {links}; the notes are the notebook's text above each exported cell."
    out += [
        f"The code of `{relative}` is on the right, cut at each exported cell and definition; on the left, "
        f"the notes and math that explain it, then the comments and docstrings of the code itself.{origin} "
        f"Reference: {{py:mod}}`{module}`.",
        "",
    ]
    names, level = [], 1
    for section in sections:
        pending: list[str] = []
        for note in section.notes:
            for part in split_headings(note):
                if isinstance(part, tuple):
                    if pending:
                        out += row(pending, [], None, None)
                        pending = []
                    level = max(2, min(part[0], level + 1))  # the page title is the only level 1
                    out += ["#" * level + " " + part[1], ""]
                else:
                    pending.append(part)
        if section.name:
            names.append(section.name)
        out += row(pending, section.code, section.name, section.label)
    return "\n".join(out) + "\n", names


def row(notes: list[str], code: list[str], name: str | None, label: str | None) -> list[str]:
    """A two-column row: a container of the notes beside a container of the code."""
    if not notes and not code:
        return []
    if name:  # the definition's name, linked to its API entry where it has one
        notes = [f"{{py:obj}}`{label} <{name}>`"] + notes
    notes_text = "\n\n".join(notes)
    code_text = "\n".join(code)
    inner = fence(notes_text + "\n" + code_text, ":")
    outer = inner + ":"
    code_fence = fence(code_text, "`")
    out = [f"{outer}{{container}} annotated-row"]
    if name:
        out.append(f":name: {anchor_name(name)}")
    out += ["", f"{inner}{{container}} annotated-notes", "", notes_text, inner, ""]
    out += [f"{inner}{{container}} annotated-code", ""]
    if code:
        out += [f"{code_fence}python", code_text, code_fence]
    out += [inner, outer, ""]
    return out


def anchor_name(qualified_name: str) -> str:
    return f"annotated-{qualified_name}"


def write_if_changed(path: Path, text: str) -> None:
    """Write only on change, so Sphinx rebuilds the page only when its module changed."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)


def generate_pages(app: Sphinx) -> None:
    """Write the page of each listed module, and remove pages of modules no longer listed."""
    page_dir = Path(app.srcdir) / app.config.annotated_source_dir
    modules = app.config.annotated_source_modules
    for stale in page_dir.glob("*.md"):
        if stale.stem not in modules:
            stale.unlink()
    app.env.annotated_source_targets = {}  # qualified name -> docname of its annotated page
    for module in modules:
        text, names = render_page(module, app.config.annotated_source_notebook_dir)
        write_if_changed(page_dir / f"{module}.md", text)
        docname = f"{app.config.annotated_source_dir}/{module}"
        app.env.annotated_source_targets.update(dict.fromkeys(names, docname))


def link_api_to_annotated(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """Add `[annotated]` beside each autodoc signature whose definition has an annotated section."""
    targets = getattr(app.env, "annotated_source_targets", {})
    for signature in doctree.findall(addnodes.desc_signature):
        module, fullname = signature.get("module"), signature.get("fullname")
        if not module or not fullname:
            continue
        target_doc = targets.get(f"{module}.{fullname}")
        if target_doc is None or target_doc == docname:
            continue
        uri = app.builder.get_relative_uri(docname, target_doc) + "#" + nodes.make_id(
            anchor_name(f"{module}.{fullname}"))
        link = nodes.reference("", "", internal=True, refuri=uri, classes=["annotated-link"])
        link += nodes.inline("", "[annotated]", classes=["viewcode-link"])
        signature += link


def wrappable_lines(code_html: str) -> str:
    """Each line of highlighted code as a `span.code-line` whose wrapped continuation starts
    `CONTINUATION_INDENT` characters right of the line's own indentation."""
    lines = code_html.split("\n")
    if lines and not lines[-1]:
        lines.pop()
    out = []
    for line in lines:
        text = html.unescape(re.sub(r"<[^>]*>", "", line))
        hang = len(text) - len(text.lstrip(" ")) + CONTINUATION_INDENT
        out.append(f'<span class="code-line" style="padding-left: {hang}ch; text-indent: -{hang}ch">{line}\n</span>')
    return "".join(out)


def wrap_annotated_code(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    if not pagename.startswith(app.config.annotated_source_dir + "/") or "body" not in context:
        return
    context["body"] = ANNOTATED_CODE.sub(lambda m: m[1] + wrappable_lines(m["code"]) + m[3], context["body"])


def setup(app: Sphinx) -> dict:
    app.add_config_value("annotated_source_modules", [], "env", types=[list])
    app.add_config_value("annotated_source_dir", "annotated", "env", types=[str])
    app.add_config_value("annotated_source_notebook_dir", "notebooks", "env", types=[str])
    app.connect("builder-inited", generate_pages)
    app.connect("doctree-resolved", link_api_to_annotated)
    app.connect("html-page-context", wrap_annotated_code)
    static = Path(__file__).parent / "static"
    app.connect("config-inited", lambda app, config: config.html_static_path.append(str(static)))
    app.add_css_file("annotated_source.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}

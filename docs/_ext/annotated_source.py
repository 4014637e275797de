"""Annotated source pages: a module's code on the right, its notes and math on the left, section
by section.

For every module named in `annotated_source_modules` (conf.py) this extension writes one MyST
page, `<annotated_source_dir>/<module>.md`, when the build starts. The module is cut

- at its `# %%` cell markers (nbdev writes one above each exported notebook cell),
- inside a cell, at each top-level definition, and in a class at each method that has a
  docstring or a comment block above it, and
- inside a definition, at each block of comment lines: the comment is the note of the lines
  below it (labml's form: a short note beside each few lines).

The left column of a section holds the notebook's Markdown cells written directly above the
exported cell (with their `$...$` math), then the comment block above the definition and its
docstring (taken out of the code), read as Markdown. A docstring paragraph that repeats the
notebook's text just above it is left out. Docstrings write their formulas as `$...$` or as reST
math, :math:`...` roles and `.. math::` blocks (search_math.py makes either work on the API pages);
here the reST forms become MyST's {math}`...` roles and ```{math} blocks. The imports and `__all__`
at the top of a module share one row with a short generated note, so that no row has an empty
note. The right column is the code, which Sphinx highlights with Pygments. A heading in the
notebook's notes becomes a heading of the page, so the sections appear in the page's contents (on
the left, in the navigation: the pages hide the right-hand contents to give the code the width)
and in the search.

Each definition's section is a link target; the API reference (autodoc) gets an `[annotated]`
link beside viewcode's `[source]` for every definition that has one.

The code column is as wide as 88 characters of code (the notebooks' line length), and a code line
is never wrapped: the rare longer line (nbdev's `__all__`) scrolls sideways inside its block
(annotated_source.css). On a narrow screen the two columns are stacked.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import tokenize
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


def comment_lines(source: str) -> set[int]:
    """0-based indices of the lines that hold only a comment (not a `#` inside a string)."""
    lines = source.splitlines()
    tokens = tokenize.generate_tokens(iter(source.splitlines(keepends=True)).__next__)
    return {t.start[0] - 1 for t in tokens
            if t.type == tokenize.COMMENT and lines[t.start[0] - 1].strip().startswith("#")}


# Words of a text for comparing two texts: TeX commands, roles and markup left out.
WORD = re.compile(r"[a-z][a-z0-9]{2,}")
REPEATED = 0.7  # a docstring paragraph whose words are this much in the notes above repeats them


def words(text: str) -> set[str]:
    return set(WORD.findall(re.sub(r"\\[A-Za-z]+|\{[a-z:]+\}|:[a-z:]+:", " ", text).lower()))


def new_paragraphs(docstring: str, prose: str) -> str:
    """The paragraphs of `docstring` that do not repeat `prose` (most of their words in it)."""
    seen = words(prose)
    kept = [p for p in re.split(r"\n\s*\n", docstring)
            if not (seen and words(p) and len(words(p) & seen) >= REPEATED * len(words(p)))]
    return "\n\n".join(kept)


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
                        comments: set[int], prose: str = "", prefix: str = "") -> list[Section]:
    """Cut `statements` (one block, all at one depth) into sections; the last runs to line `end`.

    At the top level a def or class opens a section, and consecutive other statements share one.
    In a class (`prefix` is "ClassName."), a member opens one only when it has a docstring or a
    comment block above it; the others stay in the section above them. The comment block directly
    above a section's first statement and a definition's docstring move from the code to the notes
    (less the docstring's paragraphs that repeat `prose`, the notebook's text above the cell); each
    later comment block inside the code opens a row of its own, whose note it is.
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
    sections: list[Section] = []

    def add(notes: list[str], code: list[tuple[int, str]], name: str | None = None, label: str | None = None):
        """The section of `code`, then a row per comment block inside it."""
        (_, first), *rest = split_at_comments(code, comments) or [("", [])]
        sections.append(Section(notes, first, name, label))
        sections.extend(Section([rest_math_to_myst(note)], body) for note, body in rest)

    for i, (start, opening) in enumerate(starts):
        stop = starts[i + 1][0] if i + 1 < len(starts) else end
        code_start = first_line(opening)
        _, comment = comment_block_above(lines, code_start)
        notes = [rest_math_to_myst("\n".join(comment))] if comment else []
        if not isinstance(opening, DEFINITIONS):
            add(notes, code_without(lines, code_start, stop, range(0)))
            continue
        docstring, docstring_lines = docstring_of(opening)
        docstring = new_paragraphs(docstring, prose) if docstring else ""
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
            add(notes, code_without(lines, code_start, head_end, docstring_lines), f"{module}.{label}", label)
            sections += definition_sections(lines, members, module, stop, comments, prose, prefix=f"{label}.")
        else:
            add(notes, code_without(lines, code_start, stop, docstring_lines), f"{module}.{label}", label)
        prose = ""  # only the first definition of a cell sits just below the notebook's text
    return sections


def code_without(lines: list[str], first: int, last: int, docstring_lines: range) -> list[tuple[int, str]]:
    """Lines [first, last) less the docstring's (which the notes show), with their indices."""
    return [(n, line) for n, line in enumerate(lines[first:last], first) if n not in docstring_lines]


def split_at_comments(code: list[tuple[int, str]], comments: set[int]) -> list[tuple[str, list[str]]]:
    """Cut numbered code lines at each block of comment lines: [(the block's text, the code below
    it up to the next block)]. The first piece has no comment of its own ("")."""
    pieces: list[tuple[list[str], list[str]]] = [([], [])]
    for n, line in code:
        if n in comments:
            note, body = pieces[-1]
            if any(l.strip() for l in body):  # a new block below some code: a new piece
                pieces.append(([], []))
            pieces[-1][0].append(re.sub(r"^\s*# ?", "", line))
        else:
            pieces[-1][1].append(line)
    return [("\n".join(note), trim_blank(body)) for note, body in pieces if note or trim_blank(body)]


def module_sections(module: str, path: Path, notebook_folder: str) -> tuple[list[Section], list[Path]]:
    """All sections of `module`, and the notebooks it was exported from.

    `notebook_folder` is where the docs hold the notebooks, for their notes' relative links."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    statements = ast.parse(source).body
    comments = comment_lines(source)
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
        cell_sections = definition_sections(lines, cell_statements, module, cell_end, comments, notes)
        if notes:
            if cell_sections:
                cell_sections[0].notes.insert(0, notes)
            else:
                cell_sections = [Section(notes=[notes])]
        sections += cell_sections
    return fold_unannotated(sections, module), notebooks


def fold_unannotated(sections: list[Section], module: str) -> list[Section]:
    """Each run of rows with code and no notes (the imports, `__all__`) as one row, with a note
    that says what the code is, so that no row's note is empty."""
    folded: list[Section] = []
    run: list[str] = []  # the code of the current run of note-less rows
    for section in sections + [Section(notes=["end"])]:
        if not section.notes and not section.name and section.code:
            run += ([""] if run else []) + section.code
            continue
        if run:
            folded.append(Section([generated_note(run, module)], run))
            run = []
        folded.append(section)
    return folded[:-1]


def generated_note(code: list[str], module: str) -> str:
    """A short note on note-less top-level code: what it imports, what it exports, what it sets."""
    parts = []
    if any(re.match(r"(import|from)\s", line) for line in code):
        parts.append("the modules this one uses")
    if any(line.startswith("__all__") for line in code):
        parts.append(f"`__all__`, the names `from {module} import *` gives (the API reference documents them)")
    assigned = [m[1] for line in code if (m := re.match(r"([A-Za-z_]\w*)\s*(?::[^=]*)?=", line)) and m[1] != "__all__"]
    if assigned:
        parts.append("the module's " + ", ".join(f"`{name}`" for name in assigned))
    if not parts:
        parts.append("module-level code run on import")
    text = " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)
    return text[0].upper() + text[1:] + "."


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
    # Furo's file-wide option: no right-hand contents, the headings are in the navigation.
    out = ["---", "hide-toc: true", "---", "", f"# `{relative}`, annotated", ""]
    origin = ""
    if notebooks:
        links = ", ".join(f"[](project:/{notebook_folder}/{nb.name})" for nb in notebooks)  # the notebook's title
        origin = f" It is exported from the notebook {links}; the notes are the notebook's text above each exported cell."
    out += [
        f"The code of `{relative}` is on the right, cut at each exported cell, definition and comment "
        f"block; on the left, the notes and math that explain it, then the comments and docstrings of "
        f"the code itself (on a narrow screen, above it).{origin} "
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


def setup(app: Sphinx) -> dict:
    app.add_config_value("annotated_source_modules", [], "env", types=[list])
    app.add_config_value("annotated_source_dir", "annotated", "env", types=[str])
    app.add_config_value("annotated_source_notebook_dir", "notebooks", "env", types=[str])
    app.connect("builder-inited", generate_pages)
    app.connect("doctree-resolved", link_api_to_annotated)
    static = Path(__file__).parent / "static"
    app.connect("config-inited", lambda app, config: config.html_static_path.append(str(static)))
    app.add_css_file("annotated_source.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}

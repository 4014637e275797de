"""The docs build without a warning, and work in a real browser.

The site is built into a temporary folder exactly as `make docs` builds it (warnings are errors),
then every page is opened in headless Chromium (Debian's `chromium`, driven by Selenium through
Debian's `chromedriver`): math is typeset by the bundled MathJax with no TeX left raw (docstring
formulas included, on the API and annotated pages), every image loads, no page logs an error or
requests anything from the network, every internal link points to an existing page and anchor,
every image has alt text that says something, no output block is wider than its column and none
is empty, the annotated pages fit their code at desktop width and stack their columns on a narrow
screen, the API entries' links stay on their signature, and the site search finds a term and
summarises it with its formulas as text. The browser tests are skipped only where Chromium is not
installed; CI installs it (.ci/run).

Checks of the notebooks' sources come first (no browser): their Markdown math cannot be read as a
list or a table row, and their stored outputs hold no local path and no traceback.
"""

import functools
import http.server
import importlib
import json
import pkgutil
import re
import shutil
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ANNOTATED_MODULES = ["aftalibi.attention", "aftalibi.aft", "aftalibi.alibi"]
# Every public module of the package has an API page; a new module needs no change to the docs.
PUBLIC_MODULES = [f"aftalibi.{m.name}" for m in pkgutil.iter_modules(importlib.import_module("aftalibi").__path__)
                  if not m.name.startswith("_")]
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
needs_chromium = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="Chromium is not installed (Debian: apt-get install chromium chromium-driver; CI installs it)")
# Flags for a closed network: no sandbox (root in CI), no GPU, and none of Chromium's own
# background traffic (updates, sync, QUIC probes), which would only log refused connections.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1400,1000"]
NETWORK_SCHEMES = {"http", "https", "ws", "wss", "ftp"}

# Run in the page after MathJax finished: what the checks need, in one round trip.
INSPECT_PAGE = """
const done = arguments[0];
const typeset = window.MathJax && MathJax.startup && MathJax.startup.promise;
Promise.resolve(typeset).then(() => {
  const main = document.querySelector("article[role=main]");
  const math = [...main.querySelectorAll(".math")];
  const text = main.cloneNode(true);
  text.querySelectorAll("pre, code, script, style, mjx-container, .highlight").forEach(e => e.remove());
  done({
    math: math.length,
    typeset: math.filter(e => e.querySelector("mjx-container")).length,
    mathErrors: document.querySelectorAll("mjx-merror").length,
    text: text.textContent,
    images: [...document.images].map(i => ({src: i.src, alt: i.getAttribute("alt"),
                                           loaded: i.complete && i.naturalWidth > 0,
                                           natural: i.naturalWidth,
                                           shown: i.getBoundingClientRect().width})),
    links: [...document.querySelectorAll("a[href]")].map(a => a.href),
    // API entries and annotated sections (by their anchor) whose description shows typeset math.
    definitionsWithMath: [...main.querySelectorAll("dl.py > dt[id], div.annotated-row[id]")]
      .filter(e => (e.tagName === "DT" ? e.nextElementSibling : e.querySelector(".annotated-notes"))
        .querySelector(".math mjx-container"))
      .map(e => e.id),
    // The visible text of docstrings (API entries) and annotated notes, less code and typeset math.
    docstringText: [...main.querySelectorAll("dl.py > dd, div.annotated-notes")].map(e => {
      const copy = e.cloneNode(true);
      copy.querySelectorAll("pre, code, script, mjx-container, dl.py").forEach(c => c.remove());
      return copy.textContent;
    }).join("\\n"),
    ...outputBoxes(main),
  });
});

// A notebook page's output boxes and code cells: which are wider than the column (or scroll
// sideways), and which are empty. A code cell may scroll only for a line over 88 characters.
function outputBoxes(main) {
  const column = main.getBoundingClientRect();
  const describe = e => e.textContent.trim().slice(0, 60) || e.className;
  const outputs = [...main.querySelectorAll("div.cell_output, div.cell_output > div.output, " +
                                            "div.cell_output pre, div.cell_output table")];
  const wideOutputs = outputs.filter(e => e.scrollWidth > e.clientWidth + 1 ||
                                           e.getBoundingClientRect().right > column.right + 1);
  const emptyOutputs = [...main.querySelectorAll("div.cell_output > *")]
    .filter(e => !e.textContent.trim() && !e.matches("img, svg, canvas, iframe") &&
                 !e.querySelector("img, svg, canvas, iframe"));
  const scrollingCode = [...main.querySelectorAll("div.cell_input pre")]
    .filter(pre => pre.scrollWidth > pre.clientWidth + 1 &&
                   Math.max(...pre.textContent.split("\\n").map(l => l.length)) <= 88);
  const splitStreams = [...main.querySelectorAll("div.cell_output")]
    .filter(e => e.querySelectorAll(":scope > div.output.stream").length > 1);
  return {wideOutputs: wideOutputs.map(describe), emptyOutputs: emptyOutputs.map(e => e.className),
          scrollingCode: scrollingCode.map(describe), splitStreams: splitStreams.map(describe)};
}
"""
# TeX that MathJax left as it was: \( \) \[ \] delimiters, or $...$ / $$ that was never parsed as math.
RAW_TEX = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$\$|\$[^$\s][^$\n]*\$")
# Math written as ASCII in a docstring or note instead of as a formula: `w_{t, t + delta}`, `x^{2}`,
# `sum_t' softmax_t'(K) V_t'` (a subscript with a prime).
ASCII_MATH = re.compile(r"\w_\{|\w\^\{|\b[A-Za-z]\w*_[A-Za-z0-9]+'")
# An image whose alt text is a file name (Sphinx's default: the hashed name of a notebook's plot).
FILE_NAME_ALT = re.compile(r"^\S*\.(png|jpe?g|svg|gif)$|^[0-9a-f]{16,}", re.IGNORECASE)


@pytest.fixture(scope="module")
def site(docs_site) -> Path:
    """The English pages of `make docs`'s site (tests/conftest.py builds it once per run)."""
    return docs_site / "en"


def pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if not p.relative_to(site).parts[0].startswith("_static"))


class Anchors(HTMLParser):
    """The ids (and old-style names) a page can be linked to, and its <link rel=...> targets."""

    def __init__(self):
        super().__init__()
        self.ids, self.relations = set(), {}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.ids.update(attrs[key] for key in ("id", "name") if attrs.get(key) and (key == "id" or tag == "a"))
        if tag == "link" and attrs.get("rel") in ("prev", "next"):
            self.relations[attrs["rel"]] = attrs["href"]


@functools.cache
def anchors(page: Path) -> Anchors:
    """The page parsed once per run: the link checks and the reading-order check share it (a
    notebook's page takes a fraction of a second to parse)."""
    parser = Anchors()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


def cells(notebook: Path, kind: str) -> list[tuple[int, dict]]:
    """(index, cell) of the notebook's cells of type `kind`."""
    return [(i, c) for i, c in enumerate(json.loads(notebook.read_text(encoding="utf-8"))["cells"])
            if c["cell_type"] == kind]


# A line that opens a Markdown block: a list item (`- `, `+ `, `* `, `1. `), a heading, a quote.
BLOCK_START = re.compile(r"^ {0,3}(?:[-+*][ \t]|\d{1,9}[.)][ \t]|#{1,6}[ \t]|>)")
FENCED_CODE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1", re.MULTILINE | re.DOTALL)


def math_traps(markdown: str) -> list[str]:
    """Where Markdown would break a formula: a line inside a `$...$` or `$$...$$` span that starts
    a block (`+ x_j$` is read as a list item), or an unescaped `|` in the math of a table row
    (it splits the cell). A `$$` that begins a line opens a math block, whose lines are safe."""
    text = FENCED_CODE.sub("", markdown)
    problems = []
    math = None  # the open delimiter, "$" or "$$"
    block = False  # the open $$ began its line: MyST's math block, not inline math
    code = False
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "`" and not math:
            code = not code
        elif char == "$" and not code:
            delimiter = "$$" if text.startswith("$$", i) else "$"
            if math is None:
                math = delimiter
                line_start = text.rfind("\n", 0, i) + 1
                block = delimiter == "$$" and len(text[line_start:i]) <= 3 and not text[line_start:i].strip()
            elif math == delimiter:
                math = None
            i += len(delimiter)
            continue
        elif char == "\n" and math and not block:
            line = text[i + 1:].split("\n", 1)[0]
            if BLOCK_START.match(line):
                problems.append(f"a line inside {math}...{math} starts a Markdown block: {line[:60]!r}")
        i += 1
    for line in text.splitlines():
        if line.lstrip().startswith("|"):
            for formula in re.findall(r"(?<!\\)\$([^$]+)\$", line):
                if re.search(r"(?<!\\)\|", formula):
                    problems.append(f"a table row's math holds an unescaped |: ${formula}$")
    return problems


def test_math_traps_are_found():
    assert math_traps("so $S_j = S_{j-1}\n+ x_j$ holds") and math_traps("so $$a\n- b$$")
    assert not math_traps("so\n\n$$a\n+ b$$\n")
    assert math_traps("| $|t - t'|$ | 1 |") and not math_traps("| $\\lvert t \\rvert$ | 1 |")
    assert not math_traps("$a +\nb$, then\n- a list item") and not math_traps("`$x\n- y`")
    assert not math_traps("```\n$a\n- b\n```") and not math_traps("costs \\$5 and\n- item $x$")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_markdown_math_survives_markdown(notebook):
    """No formula in a notebook's Markdown is cut by a list item, a heading or a table cell: its
    lines never start with `+`, `-`, `*`, `N.`, `#` or `>`, and math in a table has no bare `|`."""
    problems = [f"cell {i}: {problem}" for i, cell in cells(notebook, "markdown")
                for problem in math_traps("".join(cell["source"]))]
    assert not problems, f"{notebook.name}:\n" + "\n".join(problems)


# A path of the machine a notebook ran on, which a reader's copy of the output should not show.
LOCAL_PATH = re.compile(r"/tmp/|/work/|/home/|/Users/|site-packages|\.venv|\.pyenv|[A-Z]:\\\\Users")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_outputs_hold_no_local_path(notebook):
    found = [f"cell {i}: {match}" for i, cell in cells(notebook, "code") for output in cell.get("outputs", [])
             for match in LOCAL_PATH.findall(json.dumps(output))]
    assert not found, f"{notebook.name}: stored outputs show local paths: {found}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_a_demonstrated_error_is_one_line(notebook):
    """A cell that shows an error shows its one-line message (`ValueError: ...`), not a traceback:
    no stored error output with more than one line of traceback, and no traceback printed to a
    stream."""
    long = []
    for i, cell in cells(notebook, "code"):
        for output in cell.get("outputs", []):
            if output["output_type"] == "error" and len("".join(output["traceback"]).splitlines()) > 1:
                long.append(f"cell {i}: {output['ename']} with a {len(output['traceback'])}-part traceback")
            text = "".join(output.get("text", ""))
            if output["output_type"] == "stream" and "Traceback (most recent call last)" in text:
                long.append(f"cell {i}: a traceback printed to {output['name']}")
    assert not long, f"{notebook.name}: " + "; ".join(long)


# A module as nbdev exports it, and the notebook it came from: the annotated page's input.
EXPORTED_MODULE = '''# AUTOGENERATED! DO NOT EDIT! File to edit: nb.ipynb.

# %% nb.ipynb #c1
import math

# %% auto #0
__all__ = ['area', 'Circle']

# %% nb.ipynb #c3
# Why pi: the comment block above a definition.
def area(radius):
    r"""The area $\\pi r^2$."""
    return math.pi * radius ** 2


class Circle:
    """A circle."""

    def __init__(self, radius):
        self.radius = radius

    def area(self):
        """Its area."""
        return area(self.radius)
'''
NOTEBOOK_CELLS = [
    {"cell_type": "code", "id": "c1", "source": ["#| export\n", "import math"]},
    {"cell_type": "markdown", "id": "m1", "source": ["A note on a check cell."]},
    {"cell_type": "code", "id": "c2", "source": ["assert area(1) == math.pi"]},
    {"cell_type": "markdown", "id": "m2", "source": ["## Areas\n", "\n", "See [the intro](01_intro.ipynb)."]},
    {"cell_type": "markdown", "id": "m3", "source": ["It is $\\pi r^2$."]},
    {"cell_type": "code", "id": "c3", "source": ["#| export\n", "..."]},
]


def docs_extension(name: str):
    """One of docs/_ext's Sphinx extensions, imported from there for the length of a test."""
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(DOCS / "_ext"))


@pytest.fixture
def annotated_source():
    yield from docs_extension("annotated_source")


def test_annotated_source_cuts_a_module_at_cells_and_definitions(tmp_path, annotated_source):
    module = tmp_path / "shapes.py"
    module.write_text(EXPORTED_MODULE)
    (tmp_path / "nb.ipynb").write_text(json.dumps({"cells": NOTEBOOK_CELLS}))
    sections, notebooks = annotated_source.module_sections("pkg.shapes", module, "notebooks")
    assert notebooks == [tmp_path / "nb.ipynb"]
    assert [s.name for s in sections] == [None, "pkg.shapes.area", "pkg.shapes.Circle", "pkg.shapes.Circle.area"]
    top, area, circle, circle_area = sections
    # The imports and __all__ share one row, whose note says what they are.
    assert top.code == ["import math", "", "__all__ = ['area', 'Circle']"]
    assert top.notes == ["The modules this one uses and `__all__`, the names `from pkg.shapes import *` gives "
                         "(the API reference documents them)."]
    # The Markdown cells directly above the exported cell (not the one above the check cell), the
    # comment block and the docstring; the code keeps neither comment nor docstring.
    assert area.notes == ["## Areas\n\nSee [the intro](project:/notebooks/01_intro.ipynb).\n\nIt is $\\pi r^2$.",
                          "Why pi: the comment block above a definition.", "The area $\\pi r^2$."]
    assert area.code == ["def area(radius):", "    return math.pi * radius ** 2"]
    # An undocumented method stays with the class head; a documented one gets its own section.
    assert circle.notes == ["A circle."] and circle.label == "Circle"
    assert circle.code == ["class Circle:", "", "    def __init__(self, radius):", "        self.radius = radius"]
    assert circle_area.label == "Circle.area" and circle_area.notes == ["Its area."]
    assert circle_area.code == ["    def area(self):", "        return area(self.radius)"]


def test_annotated_source_lifts_headings_out_of_the_notes(annotated_source):
    parts = annotated_source.split_headings("## Areas\n\nText.\n\n```\n# not a heading\n```\n### Sub\nMore.")
    assert parts == [(2, "Areas"), "Text.\n\n```\n# not a heading\n```", (3, "Sub"), "More."]
    fence = annotated_source.fence("a\n:::: b\n", ":")
    assert fence == ":::::"


def test_annotated_source_renders_docstring_math_as_myst(annotated_source):
    """Docstrings write reST math for autodoc; the annotated notes are MyST."""
    docstring = "Gate :math:`\\sigma(Q_t)`, see :py:func:`aft_full`, not a:math:`x`.\n\n.. math::\n\n   Y = X\n\nAfter."
    assert annotated_source.rest_math_to_myst(docstring) == (
        "Gate {math}`\\sigma(Q_t)`, see {py:func}`aft_full`, not a:math:`x`.\n\n```{math}\nY = X\n```\n\nAfter.")


def test_annotated_source_puts_each_comment_beside_the_lines_below_it(tmp_path, annotated_source):
    """A comment block inside a definition opens a row: it is the note of the code below it, up to
    the next block; a `#` inside a string is code."""
    module = tmp_path / "steps.py"
    module.write_text('def f(x):\n    """Doc."""\n    y = x + 1\n\n    # Double it,\n    # then add.\n'
                      '    y = 2 * y  # inline stays\n    s = """\n# not a comment\n"""\n    # Done.\n    return y\n')
    sections, _ = annotated_source.module_sections("pkg.steps", module, "notebooks")
    assert [(s.notes, s.code) for s in sections] == [
        (["Doc."], ["def f(x):", "    y = x + 1"]),
        (["Double it,\nthen add."], ["    y = 2 * y  # inline stays", '    s = """', "# not a comment", '"""']),
        (["Done."], ["    return y"])]


def test_annotated_source_leaves_out_docstring_paragraphs_that_repeat_the_notes(annotated_source):
    notes = "The band of a bias stores row $t$'s window: `band[t, delta + s - 1]` $= w_{t, t + \\delta}$."
    docstring = "The band storage of a bias: entry (t, delta + s - 1) of row t's window.\n\nRaises on a bad `s`."
    assert annotated_source.new_paragraphs(docstring, notes) == "Raises on a bad `s`."
    assert annotated_source.new_paragraphs(docstring, "") == docstring


@pytest.fixture
def search_math():
    yield from docs_extension("search_math")


def test_docstring_dollar_math_becomes_rest_math(search_math):
    """Docstrings may write `$...$` and `$$` formulas; autodoc gets :math: roles and math blocks,
    and code spans, roles and |t - t'| bars outside math are kept apart."""
    lines = ["Weights $w_{t, t'}$ for |t - t'| < s, `$not math$`, :math:`m_h`, costs \\$5.",
             "", "$$ Y = \\sigma(Q) $$", "", "    $$", "    a |b|", "    $$", "after"]
    assert search_math.dollar_math_to_rest(lines) == [
        "Weights :math:`w_{t, t'}` for \\|t - t'\\| < s, `$not math$`, :math:`m_h`, costs \\$5.",
        "", ".. math::", "", "   Y = \\sigma(Q)", "", "",
        "    .. math::", "", "       a |b|", "", "after"]
    # The body of a math or literal block is TeX or code: no bar is escaped, no dollar converted.
    block = ["Where::", "", "    |x| costs $5", "", ".. math::", "", "   \\|w\\| = |t - t'|", "", "Then |t|."]
    assert search_math.dollar_math_to_rest(block) == block[:-1] + ["Then \\|t\\|."]
    with pytest.raises(ValueError, match="never closes"):
        search_math.dollar_math_to_rest(["$$", "x"])


def test_every_notebook_and_annotated_module_has_a_page(site):
    for notebook in NOTEBOOKS:
        assert (site / "notebooks" / f"{notebook.stem}.html").is_file(), f"no page for {notebook.name}"
    for module in ANNOTATED_MODULES:
        assert (site / "annotated" / f"{module}.html").is_file(), f"no annotated page for {module}"


def test_notebooks_are_in_reading_order_with_previous_and_next(site):
    """The index lists the notebooks in file order, and each notebook page links to its neighbours."""
    index = (site / "index.html").read_text(encoding="utf-8")
    listed = re.findall(r'href="notebooks/([^"#]+)\.html"', index)
    assert list(dict.fromkeys(listed)) == [nb.stem for nb in NOTEBOOKS]
    for before, after in zip(NOTEBOOKS, NOTEBOOKS[1:]):
        assert anchors(site / "notebooks" / f"{before.stem}.html").relations["next"] == f"{after.stem}.html"
        assert anchors(site / "notebooks" / f"{after.stem}.html").relations["prev"] == f"{before.stem}.html"


def test_api_reference_has_a_page_per_module_in_reading_order(site):
    """One page per public module, listed by the API index in the order of their notebooks."""
    assert "aftalibi.attention" in PUBLIC_MODULES and "aftalibi._compat" not in PUBLIC_MODULES
    for module in PUBLIC_MODULES:
        page = (site / "api" / f"{module}.html").read_text(encoding="utf-8")
        assert f'id="module-{module}"' in page, f"the API page of {module} does not document it"
    index = (site / "api" / "index.html").read_text(encoding="utf-8")
    listed = list(dict.fromkeys(re.findall(r'href="(aftalibi\.[a-z_0-9]+)\.html"', index)))
    assert sorted(listed) == sorted(PUBLIC_MODULES)
    assert listed[:3] == ["aftalibi.attention", "aftalibi.aft", "aftalibi.alibi"]
    # The index's body: a line per module, its name and what it holds.
    article = index.split('role="main"', 1)[1]
    lines = {m: re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html)).strip()
             for m, html in re.findall(r'<li><p><a class="reference internal" href="(aftalibi\.[a-z_0-9]+)\.html">'
                                       r'(.*?)</p>', article, flags=re.DOTALL)}
    assert sorted(lines) == sorted(PUBLIC_MODULES), f"the index's lines: {lines}"
    short = {m: line for m, line in lines.items() if not re.fullmatch(rf"{re.escape(m)}: \S.{{10,}}", line)}
    assert not short, f"index lines without a summary: {short}"
    assert lines["aftalibi.aft"] == "aftalibi.aft: The Attention Free Transformer"


def test_api_reference_links_to_the_annotated_source(site):
    """An `[annotated]` link beside the API entries, to the definition's section."""
    for module, anchor in [("aft", "aft-full"), ("aft", "aftfull-bias-matrix"), ("alibi", "get-slopes"),
                           ("attention", "attention-weights")]:
        api = (site / "api" / f"aftalibi.{module}.html").read_text(encoding="utf-8")
        assert f'href="../annotated/aftalibi.{module}.html#annotated-aftalibi-{module}-{anchor}"' in api


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tmp_path_factory.mktemp("chromium-profile")  # a fresh profile every run
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def visits(site, browser) -> dict[str, dict]:
    """Every page opened once, at 1400 px: what the page shows, its console errors and its network
    requests, and its layout at 1400, 900 and 390 px (`layouts`). Loading a page is what takes the
    time (its MathJax, its images), so every browser check of a page reads this one visit."""
    reports = {}
    for page in pages(site):
        name = page.relative_to(site).as_posix()
        browser.get_log("browser"), browser.get_log("performance")  # drop what came before this page
        browser.get(page.as_uri())
        report = browser.execute_async_script(INSPECT_PAGE)
        report["layout"] = layouts(browser, name)
        report["errors"] = [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
        events = [json.loads(entry["message"])["message"] for entry in browser.get_log("performance")]
        report["requests"] = [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]
        reports[name] = report
    return reports


@needs_chromium
def test_math_is_typeset(visits):
    problems = {page: f"{r['typeset']} of {r['math']} typeset, {r['mathErrors']} errors"
                for page, r in visits.items() if r["typeset"] != r["math"] or r["mathErrors"]}
    assert not problems
    for page in ["notebooks/02_aft.html", "notebooks/03_alibi.html", "annotated/aftalibi.aft.html",
                 "annotated/aftalibi.alibi.html"]:
        assert visits[page]["math"] > 5, f"{page} shows no math"
    raw = {page: RAW_TEX.findall(r["text"]) for page, r in visits.items() if RAW_TEX.search(r["text"])}
    assert not raw, f"TeX left untypeset: {raw}"


@needs_chromium
def test_docstrings_write_math_as_formulas(visits):
    """No docstring on an API page, and no note on an annotated page, writes a formula in ASCII
    (`w_{t, t + delta}`, `sum_t' softmax_t'(K) V_t'`) beside the typeset ones: it writes `$...$`."""
    ascii_math = {page: sorted({m.string[max(0, m.start() - 20):m.end() + 20].replace("\n", " ")
                                for m in ASCII_MATH.finditer(r["docstringText"])})
                  for page, r in visits.items() if ASCII_MATH.search(r["docstringText"])}
    assert not ascii_math, f"ASCII math in docstrings or notes: {json.dumps(ascii_math, indent=1)}"


@needs_chromium
def test_docstring_formulas_are_typeset(visits):
    """A docstring's :math: role is math on the API page (autodoc) and in the notes of the
    annotated page (converted to MyST), not TeX in a code span."""
    api = visits["api/aftalibi.attention.html"]["definitionsWithMath"]
    assert "aftalibi.attention.attention_weights" in api, f"API entries with math: {api}"
    annotated = visits["annotated/aftalibi.attention.html"]["definitionsWithMath"]
    assert "annotated-aftalibi-attention-attention-weights" in annotated, f"annotated sections with math: {annotated}"


# Run on an annotated page: where its columns sit, what its code blocks do, whether a note is empty.
ANNOTATED_LAYOUT = """
const rows = [...document.querySelectorAll("div.annotated-row")];
const toc = document.querySelector(".toc-drawer");
return {
  page: document.documentElement.scrollWidth - window.innerWidth,
  toc: toc ? toc.getBoundingClientRect().width : 0,
  rows: rows.map(row => {
    const notes = row.querySelector(".annotated-notes");
    const box = notes.getBoundingClientRect();
    const code = row.querySelector(".annotated-code").getBoundingClientRect();
    const pre = row.querySelector(".annotated-code pre");
    const longest = pre ? Math.max(...pre.textContent.replace(/\\n$/, "").split("\\n").map(l => l.length)) : 0;
    const probe = document.createElement("span");  // the width of 88 characters of the code's font
    probe.textContent = "x".repeat(88);
    if (pre) pre.appendChild(probe);
    const width88 = pre ? probe.getBoundingClientRect().width : 0;
    probe.remove();
    return {id: row.id || notes.textContent.trim().slice(0, 40), code: Boolean(pre),
            note: notes.textContent.trim(), stacked: code.top >= box.bottom - 1,
            gutter: code.left - box.right, longest, width88,
            inner: pre ? pre.clientWidth : 0, overflow: pre ? pre.scrollWidth - pre.clientWidth : 0,
            wraps: pre ? getComputedStyle(pre).whiteSpace !== "pre" : false};
  }),
};
"""


@needs_chromium
@pytest.mark.parametrize("width", [1400, 900, 390])
def test_annotated_pages_fit_the_screen(visits, width):
    """labml's form. At 1400 px: no right-hand contents, notes and code side by side with a gutter,
    the code column holds 88 characters, code lines never wrap, and only a line longer than 88
    characters scrolls. At 900 and 390 px the columns are stacked and nothing is wider than the
    screen. At every width each row with code has a note."""
    for module in ANNOTATED_MODULES:
        layout = visits[f"annotated/{module}.html"]["layout"][width]["annotated"]
        rows = [row for row in layout["rows"] if row["code"]]
        assert rows, f"{module}: no annotated rows with code"
        assert not [r["id"] for r in rows if not r["note"]], f"{module}: rows with an empty note"
        assert not [r["id"] for r in rows if r["wraps"]], f"{module}: code lines wrap"
        assert layout["page"] <= 0, f"{module} at {width} px: the page scrolls sideways by {layout['page']} px"
        if width == 1400:
            assert layout["toc"] == 0, f"{module}: the right-hand contents take {layout['toc']} px"
            assert all(not r["stacked"] and r["gutter"] >= 12 for r in rows), (
                f"{module}: columns not side by side with a gutter: "
                f"{[(r['id'], r['gutter']) for r in rows if r['stacked'] or r['gutter'] < 12]}")
            narrow = [r["id"] for r in rows if r["inner"] < r["width88"]]
            assert not narrow, f"{module}: code columns narrower than 88 characters: {narrow}"
            scrolling = [r["id"] for r in rows if r["overflow"] > 0 and r["longest"] <= 88]
            assert not scrolling, f"{module}: code blocks of lines <= 88 characters scroll: {scrolling}"
        else:
            assert all(r["stacked"] for r in rows), f"{module} at {width} px: the columns are not stacked"


# Run on an API page: the [source] and [annotated] links that stick out of their signature's box.
LINKS_OUTSIDE_SIGNATURE = """
return [...document.querySelectorAll("dl.py > dt")].flatMap(dt => {
  const box = dt.getBoundingClientRect();
  return [...dt.querySelectorAll(".viewcode-link")].filter(link => {
    const r = link.getBoundingClientRect();
    return r.bottom > box.bottom + 1 || r.top < box.top - 1 || r.right > box.right + 1;
  }).map(link => dt.id + " " + link.textContent);
});
"""


@needs_chromium
@pytest.mark.parametrize("width", [1400, 390])
def test_api_links_stay_on_their_signature(visits, width):
    """The `[source]` and `[annotated]` links of an API entry sit inside its signature, never over
    the description below it (the theme floats them right, where they overlapped AFTSimple's)."""
    outside = {module: found for module in PUBLIC_MODULES
               if (found := visits[f"api/{module}.html"]["layout"][width]["api links"])}
    assert not outside


# Run on a page: the names in code in its title that the browser broke over two lines.
TITLE_CODE = "article[role=main] h1 code"
TITLE_NAMES_BROKEN = f"""
return [...document.querySelectorAll("{TITLE_CODE}")]
  .filter(code => code.getClientRects().length > 1).map(code => code.textContent);
"""


@needs_chromium
def test_titles_keep_a_name_on_one_line_on_a_phone(visits):
    """At 390 px a title that names a module (`aftalibi.experiment_files`, `aftalibi/alibi.py`)
    keeps the name on one line: at the theme's title size it broke in the middle of the name."""
    checked = {page: r["layout"][390]["titles"] for page, r in visits.items() if "titles" in r["layout"].get(390, {})}
    assert {f"api/{module}.html" for module in PUBLIC_MODULES} <= set(checked), "titles naming a module not checked"
    broken = {page: names for page, names in checked.items() if names}
    assert not broken, f"titles whose names break over two lines at 390 px: {broken}"


def wide_math(selector: str) -> str:
    """A script to run on a page MathJax has typeset: its display formulas (`selector`) that are
    wider than the box that holds them."""
    return (f"return [...document.querySelectorAll({json.dumps(selector)})]"
            ".filter(m => m.scrollWidth > m.clientWidth).map(m => m.textContent.trim().slice(0, 60));")


# What the browser measures of a page's layout: (the check's name, the widths in px, the folder of
# the pages it applies to ("" for every page), the elements its script measures where a page
# without them has nothing to find (None: any page of the folder), its script). `visits` runs them
# on each page.
LAYOUT_CHECKS = [
    ("annotated", (1400, 900, 390), "annotated/", None, ANNOTATED_LAYOUT),
    ("api links", (1400, 390), "api/", None, LINKS_OUTSIDE_SIGNATURE),
    ("titles", (390,), "", TITLE_CODE, TITLE_NAMES_BROKEN),
    ("formulas", (1400,), "annotated/", None, wide_math("div.annotated-notes div.math")),
    ("formulas", (1400,), "notebooks/", None, wide_math("div.math")),
]


def layouts(browser, page: str) -> dict[int, dict]:
    """{width: {check: what its script found}} for the LAYOUT_CHECKS that apply to `page`, which
    the browser shows at 1400 px, typeset. For a narrower width the window is narrowed and the same
    page measured: its layout is the stylesheets' (media queries), which a narrowed window applies
    as a page opened at that width has them, while opening it again would cost as much as the first
    time. A page is narrowed only for the checks that have something to measure on it (a notebook's
    title holds no name in code). The window is back at 1400 px after."""
    applying = [(name, widths, script) for name, widths, folder, elements, script in LAYOUT_CHECKS
                if page.startswith(folder) and (elements is None or browser.execute_script(
                    "return document.querySelector(arguments[0]) !== null", elements))]
    found, width_now = {}, 1400
    try:
        for width in sorted({width for _, widths, _ in applying for width in widths}, reverse=True):
            if width != width_now:
                browser.set_window_size(width, 1000)
                width_now = width
            found[width] = {name: browser.execute_script(script) for name, widths, script in applying if width in widths}
    finally:
        if width_now != 1400:
            browser.set_window_size(1400, 1000)
    return found


@needs_chromium
@pytest.mark.parametrize("page", [*(f"annotated/{module}.html" for module in ANNOTATED_MODULES),
                                  *(f"notebooks/{notebook.stem}.html" for notebook in NOTEBOOKS)])
def test_formulas_fit_their_column(visits, page):
    """At 1400 px every display formula fits its column (on an annotated page, the narrow notes
    column): none scrolls sideways."""
    wide = visits[page]["layout"][1400]["formulas"]
    assert not wide, f"{page}: formulas wider than their column: {wide}"


@needs_chromium
def test_images_say_what_they_show(visits):
    """Every image has alt text, and not a file name (Sphinx's default for a notebook's plot is its
    hashed file name): a plotting cell sets it in its metadata, {"mystnb": {"image": {"alt": ...}}}."""
    unsaid = {page: [i["alt"] or i["src"].rsplit("/", 1)[-1] for i in r["images"]
                     if not (i["alt"] or "").strip() or FILE_NAME_ALT.search(i["alt"].rsplit("/", 1)[-1])]
              for page, r in visits.items()}
    assert not {page: images for page, images in unsaid.items() if images}


@needs_chromium
def test_images_are_drawn_for_the_column(visits):
    """At 1400 px no image is shrunk to fit the column (736 px): a plot drawn for the column (7.2 in
    at 100 dpi) shows its legend and labels at the size they were drawn, 9 pt or larger."""
    shrunk = {page: [f"{(i['alt'] or i['src'])[:50]}: {i['natural']} px shown at {i['shown']:.0f}"
                     for i in r["images"] if i["natural"] > i["shown"] + 1]
              for page, r in visits.items()}
    shrunk = {page: found for page, found in shrunk.items() if found}
    assert not shrunk, f"images shrunk to fit the column: {json.dumps(shrunk, indent=1)}"


@needs_chromium
def test_outputs_fit_their_column(visits):
    """At 1400 px no output block is wider than the content column or scrolls sideways, and a code
    cell scrolls only for a line longer than 88 characters."""
    wide = {page: r["wideOutputs"] for page, r in visits.items() if r["wideOutputs"]}
    code = {page: r["scrollingCode"] for page, r in visits.items() if r["scrollingCode"]}
    assert not code, f"code cells of lines <= 88 characters that scroll: {code}"
    assert not wide, f"outputs wider than the column: {json.dumps(wide, indent=1)}"


@needs_chromium
def test_a_cells_printed_text_is_one_box(visits):
    """What a cell prints comes in one box, not a box per print (myst-nb's nb_merge_streams)."""
    split = {page: r["splitStreams"] for page, r in visits.items() if r["splitStreams"]}
    assert not split


@needs_chromium
def test_no_output_is_empty(visits):
    """An output box shows something (an empty print, a stray newline, would draw an empty box)."""
    empty = {page: r["emptyOutputs"] for page, r in visits.items() if r["emptyOutputs"]}
    assert not empty


@needs_chromium
def test_images_load(visits):
    broken = {page: [i["src"] for i in r["images"] if not i["loaded"]] for page, r in visits.items()}
    assert not {page: srcs for page, srcs in broken.items() if srcs}
    assert sum(len(r["images"]) for r in visits.values()) >= len(NOTEBOOKS), "the notebooks' plots are missing"


@needs_chromium
def test_no_console_errors(visits):
    assert not {page: r["errors"] for page, r in visits.items() if r["errors"]}


@needs_chromium
def test_nothing_is_requested_from_the_network(visits):
    outside = {page: [u for u in r["requests"] if urlsplit(u).scheme in NETWORK_SCHEMES] for page, r in visits.items()}
    assert not {page: urls for page, urls in outside.items() if urls}
    mathjax = [u for u in visits["notebooks/02_aft.html"]["requests"] if "/_static/mathjax/" in u]
    assert mathjax, "MathJax was not loaded from the site itself"


@needs_chromium
def test_internal_links_resolve(site, visits):
    broken = []
    for page, report in visits.items():
        for link in report["links"]:
            url = urlsplit(link)
            if url.scheme != "file":
                continue
            target = Path(unquote(url.path))
            # The language switcher leads to the same page in ../ja/ and ../si/.
            if not (target.is_relative_to(site.parent) and target.is_file()):
                broken.append(f"{page} -> {link}")
                continue
            fragment = unquote(url.fragment)
            if fragment and target.suffix == ".html":
                if fragment not in anchors(target).ids:
                    broken.append(f"{page} -> {link} (no such anchor)")
    assert not broken, "\n".join(broken)
    assert sum(len(r["links"]) for r in visits.values()) > 100


@needs_chromium
def test_search_finds_a_term(site, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get((site / "search.html").as_uri() + "?q=slopes")
    results = WebDriverWait(browser, 20).until(
        lambda b: b.find_elements(By.CSS_SELECTOR, "#search-results ul.search li a"))
    targets = {urlsplit(a.get_attribute("href")).path.rsplit("/", 1)[-1] for a in results}
    assert "03_alibi.html" in targets


@pytest.fixture(scope="module")
def served(site):
    """The site over HTTP on localhost: the search page reads the pages it summarises with fetch(),
    which a browser refuses for file:// URLs."""
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


# Run on the search page: the summaries, once the search has shown every result. A page's result
# gets its summary once the page is fetched; an object's result (an API entry, shown with its
# description in a <span>) gets none; a result still without a summary after 40 polls is left out.
SEARCH_SUMMARIES = """
const done = arguments[0];
const poll = () => {
  const status = document.querySelector("#search-results .search-summary, #search-results p");
  const items = [...document.querySelectorAll("#search-results ul.search li")];
  const finished = status && /finished|did not match/i.test(status.textContent);
  const settled = li => li.querySelector("p.context, :scope > span") || li.dataset.checked;
  if (finished && items.every(settled)) {
    done(items.map(li => li.querySelector("p.context")?.textContent || ""));
  } else {
    items.forEach(li => { if (!li.querySelector("p.context")) li.dataset.waits = (+li.dataset.waits || 0) + 1;
                          if (+li.dataset.waits > 40) li.dataset.checked = "1"; });
    setTimeout(poll, 100);
  }
};
poll();
"""


@needs_chromium
@pytest.mark.parametrize("term", ["slope", "alibi"])
def test_search_summaries_read_as_prose(served, browser, term):
    """A search result's summary is cut from its page's text: its formulas read as text
    (`m_h (i − j)`), not as TeX (`\\(m_h (i - j)\\)`), and from its prose, not from its code
    (`__all__ = ['get_slopes', ...`, a run of imports)."""
    browser.get(f"{served}/search.html?q={term}")
    summaries = [s for s in browser.execute_async_script(SEARCH_SUMMARIES) if s]
    assert len(summaries) >= 3, f"'{term}': too few summaries: {summaries}"
    assert any(term in s.lower() for s in summaries)
    tex = [s for s in summaries if RAW_TEX.search(s) or re.search(r"\\[A-Za-z]+|\\[()\[\]]", s)]
    assert not tex, f"summaries with TeX: {tex}"
    code = [s for s in summaries if re.search(r"__all__ = \[|^\s*(?:from \S+ )?import \w|^\s*def \w+\(", s, re.M)]
    assert not code, f"summaries cut from code: {code}"

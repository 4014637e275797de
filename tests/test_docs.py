"""The docs build without a warning, and work in a real browser.

The site is built into a temporary folder exactly as `make docs` builds it (warnings are errors),
then every page is opened in headless Chromium (Debian's `chromium`, driven by Selenium through
Debian's `chromedriver`): math is typeset by the bundled MathJax with no TeX left raw (docstring
formulas included, on the API and annotated pages), every image loads, no page logs an error or
requests anything from the network, every internal link points to an existing page and anchor,
the annotated pages fit their code at desktop width and stack their columns on a narrow screen,
and the site search finds a term. The browser tests are
skipped only where Chromium is not installed; CI installs it (.ci/run).
"""

import importlib
import json
import pkgutil
import re
import shutil
import subprocess
import sys
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
    images: [...document.images].map(i => ({src: i.src, loaded: i.complete && i.naturalWidth > 0})),
    links: [...document.querySelectorAll("a[href]")].map(a => a.href),
    // API entries and annotated sections (by their anchor) whose description shows typeset math.
    definitionsWithMath: [...main.querySelectorAll("dl.py > dt[id], div.annotated-row[id]")]
      .filter(e => (e.tagName === "DT" ? e.nextElementSibling : e.querySelector(".annotated-notes"))
        .querySelector(".math mjx-container"))
      .map(e => e.id),
  });
});
"""
# TeX that MathJax left as it was: \( \) \[ \] delimiters, or $...$ / $$ that was never parsed as math.
RAW_TEX = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$\$|\$[^$\s][^$\n]*\$")


def build(destination: Path) -> subprocess.CompletedProcess:
    """`make docs`'s command, into `destination`."""
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q",
                           str(DOCS), str(destination)], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    html = tmp_path_factory.mktemp("docs") / "html"
    result = build(html)
    assert result.returncode == 0, f"the docs build failed or warned:\n{result.stderr}"
    return html


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


def anchors(page: Path) -> Anchors:
    parser = Anchors()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


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


@pytest.fixture
def annotated_source():
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import annotated_source
        yield annotated_source
    finally:
        sys.path.remove(str(DOCS / "_ext"))


def test_annotated_source_cuts_a_module_at_cells_and_definitions(tmp_path, annotated_source):
    module = tmp_path / "shapes.py"
    module.write_text(EXPORTED_MODULE)
    (tmp_path / "nb.ipynb").write_text(json.dumps({"cells": NOTEBOOK_CELLS}))
    sections, notebooks = annotated_source.module_sections("pkg.shapes", module, "notebooks")
    assert notebooks == [tmp_path / "nb.ipynb"]
    assert [s.name for s in sections] == [None, None, "pkg.shapes.area", "pkg.shapes.Circle", "pkg.shapes.Circle.area"]
    imports, names, area, circle, circle_area = sections
    assert (imports.notes, imports.code) == ([], ["import math"])
    assert names.code == ["__all__ = ['area', 'Circle']"]
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


def test_annotated_code_lines_wrap_with_a_hanging_indent(annotated_source):
    code = '<span class="k">def</span> f():\n<span class="w">    </span><span class="k">return</span> 1\n'
    assert annotated_source.wrappable_lines(code) == (
        '<span class="code-line" style="padding-left: 4ch; text-indent: -4ch"><span class="k">def</span> f():\n</span>'
        '<span class="code-line" style="padding-left: 8ch; text-indent: -8ch"><span class="w">    </span>'
        '<span class="k">return</span> 1\n</span>')


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
    """Every page opened once: what the page shows, its console errors and its network requests."""
    reports = {}
    for page in pages(site):
        browser.get_log("browser"), browser.get_log("performance")  # drop what came before this page
        browser.get(page.as_uri())
        report = browser.execute_async_script(INSPECT_PAGE)
        report["errors"] = [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
        events = [json.loads(entry["message"])["message"] for entry in browser.get_log("performance")]
        report["requests"] = [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]
        reports[page.relative_to(site).as_posix()] = report
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
def test_docstring_formulas_are_typeset(visits):
    """A docstring's :math: role is math on the API page (autodoc) and in the notes of the
    annotated page (converted to MyST), not TeX in a code span."""
    api = visits["api/aftalibi.attention.html"]["definitionsWithMath"]
    assert "aftalibi.attention.attention_weights" in api, f"API entries with math: {api}"
    annotated = visits["annotated/aftalibi.attention.html"]["definitionsWithMath"]
    assert "annotated-aftalibi-attention-attention-weights" in annotated, f"annotated sections with math: {annotated}"


# Run on an annotated page: where its columns sit and whether a code block needs a scroll bar.
ANNOTATED_LAYOUT = """
const rows = [...document.querySelectorAll("div.annotated-row")].filter(r => r.querySelector("pre"));
return rows.map(row => {
  const notes = row.querySelector(".annotated-notes").getBoundingClientRect();
  const code = row.querySelector(".annotated-code").getBoundingClientRect();
  const pre = row.querySelector(".annotated-code pre");
  return {stacked: code.top >= notes.bottom - 1, side_by_side: code.left >= notes.right - 1,
          code_width: code.width, overflow: pre.scrollWidth - pre.clientWidth};
});
"""


@needs_chromium
@pytest.mark.parametrize("width", [1400, 900])
def test_annotated_pages_fit_the_screen(site, browser, width):
    """At 1400 px the columns sit side by side and no code needs horizontal scrolling; at 900 px
    they are stacked, each as wide as the page."""
    browser.set_window_size(width, 1000)
    try:
        for module in ANNOTATED_MODULES:
            browser.get((site / "annotated" / f"{module}.html").as_uri())
            rows = browser.execute_script(ANNOTATED_LAYOUT)
            assert rows, f"{module}: no annotated rows with code"
            scrolling = [row for row in rows if row["overflow"] > 0]
            assert not scrolling, f"{module} at {width} px: {len(scrolling)} code blocks scroll sideways"
            layout = "side_by_side" if width == 1400 else "stacked"
            assert all(row[layout] for row in rows), f"{module} at {width} px: the columns are not {layout}"
    finally:
        browser.set_window_size(1400, 1000)


# Run on a page after MathJax finished: the display formulas wider than the box that holds them.
WIDE_MATH = """
const [selector, done] = arguments;
Promise.resolve(window.MathJax && MathJax.startup && MathJax.startup.promise).then(() => done(
  [...document.querySelectorAll(selector)].filter(m => m.scrollWidth > m.clientWidth)
    .map(m => m.textContent.trim().slice(0, 60))));
"""


@needs_chromium
@pytest.mark.parametrize("page,selector", [
    *((f"annotated/{module}.html", "div.annotated-notes div.math") for module in ANNOTATED_MODULES),
    *((f"notebooks/{notebook.stem}.html", "div.math") for notebook in NOTEBOOKS)])
def test_formulas_fit_their_column(site, browser, page, selector):
    """At 1400 px every display formula fits its column (on an annotated page, the narrow notes
    column): none scrolls sideways."""
    browser.get((site / page).as_uri())
    wide = browser.execute_async_script(WIDE_MATH, selector)
    assert not wide, f"{page}: formulas wider than their column: {wide}"


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
    ids: dict[Path, set[str]] = {}
    broken = []
    for page, report in visits.items():
        for link in report["links"]:
            url = urlsplit(link)
            if url.scheme != "file":
                continue
            target = Path(unquote(url.path))
            if not (target.is_relative_to(site) and target.is_file()):
                broken.append(f"{page} -> {link}")
                continue
            fragment = unquote(url.fragment)
            if fragment and target.suffix == ".html":
                if target not in ids:
                    ids[target] = anchors(target).ids
                if fragment not in ids[target]:
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

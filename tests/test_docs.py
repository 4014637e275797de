"""The docs build without a warning, and work in a real browser.

The site is built into a temporary folder exactly as `make docs` builds it (warnings are errors),
then every page is opened in headless Chromium (Debian's `chromium`, driven by Selenium through
Debian's `chromedriver`): math is typeset by the bundled MathJax with no TeX left raw, every
image loads, no page logs an error or requests anything from the network, every internal link
points to an existing page and anchor, and the site search finds a term. The browser tests are
skipped only where Chromium is not installed; CI installs it (.ci/run).
"""

import json
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
ANNOTATED_MODULES = ["aftalibi.aft", "aftalibi.alibi"]
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
  const math = [...document.querySelectorAll("div.body .math")];
  const text = document.querySelector("div.body").cloneNode(true);
  text.querySelectorAll("pre, code, script, style, mjx-container, .highlight").forEach(e => e.remove());
  done({
    math: math.length,
    typeset: math.filter(e => e.querySelector("mjx-container")).length,
    mathErrors: document.querySelectorAll("mjx-merror").length,
    text: text.textContent,
    images: [...document.images].map(i => ({src: i.src, loaded: i.complete && i.naturalWidth > 0})),
    links: [...document.querySelectorAll("a[href]")].map(a => a.href),
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


def test_api_reference_links_to_the_annotated_source(site):
    """An `[annotated]` link beside the API entries, to the definition's section."""
    api = (site / "api.html").read_text(encoding="utf-8")
    for href in ["annotated/aftalibi.aft.html#annotated-aftalibi-aft-aft-full",
                 "annotated/aftalibi.aft.html#annotated-aftalibi-aft-aftfull-bias-matrix",
                 "annotated/aftalibi.alibi.html#annotated-aftalibi-alibi-get-slopes"]:
        assert f'href="{href}"' in api


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

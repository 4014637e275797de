"""The translations of the docs (docs/locales, docs/_ext/i18n.py): none ships stale or broken.

For every page a language declares complete (docs/locales/complete.toml), against a fresh
extraction of the current English (Sphinx's gettext builder, the segmentation the build uses):
every message is translated, none fuzzy, none stale (a changed English paragraph is named); each
translation keeps its English's inline math, code spans, link targets and roles; none starts a
Markdown block by accident. Then the site, built exactly as `make docs` builds it (each language
fresh, -E, warnings as errors), opened in headless Chromium: notebook 03 in each language that
declares it complete shows its translated title, typeset math, the English page's code, and a
language switcher whose links resolve.
"""

import json
from collections import Counter
import re
import shutil
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import i18n  # noqa: E402
import i18n_catalogues as catalogues  # noqa: E402
import i18n_site  # noqa: E402

COMPLETE = [(language, page) for language, pages in catalogues.manifest().items() for page in pages]
NOTEBOOK = "notebooks/03_alibi"  # the page the browser test opens
# The browser as tests/test_docs.py drives it (Debian's Chromium, flags for a closed network).
from test_docs import CHROMEDRIVER, CHROMIUM, CHROMIUM_FLAGS, needs_chromium  # noqa: E402

# What a translation must keep exactly as its English has it (as a multiset: order may change).
KEPT = {
    "inline math": re.compile(r"(?<![$\\])\$(?!\$)(?:\\.|[^$\\])+\$"),
    "role": re.compile(r"\{[a-z]+(?::[a-z]+)*\}`[^`]*`"),
    "code span": re.compile(r"(?<![}`])(`+)(?!`)(.+?)(?<!`)\1(?!`)"),
    "link target": re.compile(r"\]\(([^)\s]*)\)"),
}
# A line that Markdown would read as the start of a block: a heading, list item, quote or fence.
BLOCK_START = re.compile(r"^(?: {4}|\s*(?:#{1,6}(?:\s|$)|[-+*]\s|>|\d+[.)](?:\s|$)|```|~~~|:::|\$\$))")


# A role with a title, {doc}`API reference <api/index>`: the title may be translated, not the target.
TITLED_ROLE = re.compile(r"^(\{[^}]*\}`)[^`<]*(<[^`>]*>`)$")


def kept(text: str) -> dict[str, list[str]]:
    """The spans of `text` that a translation keeps, by kind; code spans inside roles not twice."""
    found, rest = {}, text
    for kind in ["inline math", "role", "code span", "link target"]:
        spans = [TITLED_ROLE.sub(r"\1\2", m.group(0)) for m in KEPT[kind].finditer(rest)]
        found[kind] = sorted(spans)
        if kind in ("inline math", "role"):  # `$` inside code is not math, but a role's code is its own
            rest = KEPT[kind].sub(" ", rest)
    return found


def message_problems(msgid: str, msgstr: str) -> list[str]:
    """What is wrong with `msgstr` as the translation of `msgid` (empty: nothing)."""
    problems = []
    english, translated = kept(msgid), kept(msgstr)
    for kind in KEPT:
        if english[kind] != translated[kind]:
            missing = sorted((Counter(english[kind]) - Counter(translated[kind])).elements())
            extra = sorted((Counter(translated[kind]) - Counter(english[kind])).elements())
            problems.append(f"{kind} changed (missing {missing}, added {extra})")
    for line in msgstr.splitlines():
        if BLOCK_START.match(line):
            problems.append(f"starts a Markdown block: {line[:40]!r} (escape it: `3\\.`, `\\#`, `\\-`)")
    return problems


def quote(msgid: str) -> str:
    return repr(msgid if len(msgid) <= 90 else msgid[:90] + "...")


def page_problems(extracted: list[str], done: dict[str, tuple[str, bool]]) -> list[str]:
    """Every problem of a page's translations (`msgid -> (msgstr, fuzzy)`) against its current
    English messages: missing or stale, fuzzy, or broken."""
    problems = []
    for msgid in extracted:
        msgstr, fuzzy = done.get(msgid, ("", False))
        if not msgstr:
            problems.append(f"untranslated or stale (its English changed): {quote(msgid)}")
        elif fuzzy:
            problems.append(f"fuzzy (check it against the new English, then drop the flag): {quote(msgid)}")
        else:
            problems += [f"{quote(msgid)}: {problem}" for problem in message_problems(msgid, msgstr)]
    return problems


@pytest.fixture(scope="module")
def extraction(tmp_path_factory, docs_tree_lock):
    """The current English messages of the complete pages, of the notebooks they share and of
    notebook 03, by page: one gettext build for every test here (a page's messages are the same
    whichever other pages the build reads)."""
    pages = sorted({page for _, page in COMPLETE} | {nb for _, page in COMPLETE for nb in catalogues.shared_notebooks(page)}
                   | {NOTEBOOK})
    with docs_tree_lock:
        return catalogues.extract(tmp_path_factory.mktemp("pot"), pages=pages)


@pytest.fixture(scope="module")
def extracted(extraction):
    """The current English messages of the complete pages and of the notebooks they share."""
    if not COMPLETE:
        pytest.skip("no language declares a page complete yet")
    return extraction


def test_manifest_names_pages_that_exist():
    sources = {p.relative_to(DOCS).with_suffix("").as_posix() for p in DOCS.rglob("*.md")} | \
              {f"notebooks/{p.stem}" for p in (ROOT / "notebooks").glob("*.ipynb")} | \
              {f"annotated/{m}" for m in ["aftalibi.attention", "aftalibi.aft", "aftalibi.alibi"]}
    for language, page in COMPLETE:
        assert language in i18n.NOT_TRANSLATED, f"complete.toml: unknown language {language!r}"
        assert page in sources, f"complete.toml [{language}]: no page {page!r}"


@pytest.mark.parametrize(("language", "page"), COMPLETE, ids=[f"{l}:{p}" for l, p in COMPLETE])
def test_complete_page_is_translated_in_full(extracted, language, page):
    problems = page_problems([m.id for m in extracted[page] if m.id], catalogues.translations(language, page))
    assert not problems, f"{language} {page}:\n" + "\n".join(problems)


def test_kept_spans_are_checked():
    english = "The bias $m_h (i - j)$ of `alibi_bias` ({py:func}`aftalibi.alibi.alibi_bias`, [03](03_alibi.ipynb))."
    good = "バイアス $m_h (i - j)$ は `alibi_bias` の値です（{py:func}`aftalibi.alibi.alibi_bias`、[03](03_alibi.ipynb)）。"
    assert message_problems(english, good) == []
    assert "inline math changed" in message_problems(english, good.replace("(i - j)", "(i-j)"))[0]
    assert "code span changed" in message_problems(english, good.replace("`alibi_bias`", "alibi_bias"))[0]
    assert "role changed" in message_problems(english, good.replace("{py:func}", "{py:obj}"))[0]
    assert "link target changed" in message_problems(english, good.replace("(03_alibi.ipynb)", "(03.ipynb)"))[0]
    for start in ["3. ALiBi", "# 見出し", "- 項目", "> 引用", "* 項目", "+ 項目"]:
        assert "starts a Markdown block" in message_problems("x", start)[0], start
    assert message_problems("3. ALiBi: attention", r"3\. ALiBi：アテンション") == []
    titled = "See the {doc}`API reference <api/index>`."
    assert message_problems(titled, "{doc}`API リファレンス <api/index>` を参照。") == []
    assert "role changed" in message_problems(titled, "{doc}`API リファレンス <api/other>` を参照。")[0]
    assert message_problems("*Train Short*, ICLR", "*Train Short*、ICLR") == []


def test_a_changed_word_makes_the_page_stale(tmp_path, extracted_03):
    """One word of one English paragraph of notebook 03 changed in a copy: the page fails, naming
    that paragraph, and only it (the translations here: the unchanged English, a stand-in). The
    English before the change is the docs' own; the copy differs from them in that word only."""
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs, ignore=shutil.ignore_patterns("_build", "notebooks", "annotated", "api", "*.mo"))
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    shutil.copy2(ROOT / "notebooks" / "03_alibi.ipynb", notebooks)
    before = extracted_03
    translated = {m.id: (re.sub(r"^(\d+)\.", r"\1\\.", m.id), False) for m in before if m.id}

    notebook = json.loads((notebooks / "03_alibi.ipynb").read_text("utf-8"))
    text = json.dumps(notebook)
    # A word that occurs once in the notebook, in a paragraph (not a title): the one edited.
    paragraph, word = next((m.id, w) for m in before if m.id and len(m.id) > 200
                           for w in re.findall(r"\b[a-z]{7,}\b", m.id) if text.count(w) == 1)
    for cell in notebook["cells"]:
        cell["source"] = [line.replace(word, "changed") for line in cell["source"]]
    (notebooks / "03_alibi.ipynb").write_text(json.dumps(notebook), encoding="utf-8")
    after = catalogues.extract(tmp_path / "after", docs=docs, pages=[NOTEBOOK], notebooks=notebooks)[NOTEBOOK]

    assert page_problems([m.id for m in before if m.id], translated) == []
    problems = page_problems([m.id for m in after if m.id], translated)
    assert len(problems) == 1 and "stale" in problems[0], problems
    assert quote(paragraph.replace(word, "changed", 1)) in problems[0]


def test_display_math_and_the_colab_badge_are_not_messages(extracted_03):
    messages = [m.id for m in extracted_03 if m.id]
    assert not [m for m in messages if "colab.research.google.com" in m]
    assert not [m for m in messages if m.startswith("$$") or "\\begin{" in m]
    notebook = json.loads((ROOT / "notebooks" / "03_alibi.ipynb").read_text("utf-8"))
    markdown = "".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown")
    assert "$$" in markdown and "colab.research.google.com" in markdown  # both were there to leave out
    assert any("$" in m for m in messages)  # inline math stays inside its paragraph's message


@pytest.fixture(scope="module")
def extracted_03(extraction):
    return extraction[NOTEBOOK]


def test_annotated_pages_do_not_repeat_notebook_paragraphs():
    """A paragraph an annotated page shows from its notebook is translated once, in the notebook's
    catalogue (the build reads both)."""
    for language in catalogues.LANGUAGES:
        for po in sorted((catalogues.LOCALES / language / "LC_MESSAGES" / "annotated").glob("*.po")):
            page = f"annotated/{po.stem}"
            own = {m.id for m in catalogues.read(po) if m.id}
            notebooks = catalogues.shared_notebooks(page)
            assert notebooks, f"{page}: no notebook found"
            for notebook in notebooks:
                repeated = own & {m.id for m in catalogues.read(catalogues.catalogue_path(language, notebook)) if m.id}
                assert not repeated, f"{language} {page} repeats {notebook}: {sorted(repeated)[:3]}"


def test_sinhala_search_keeps_words_whole():
    words = i18n.SearchSinhala({}).split("ALiBi අවධානය ස්ථානීය කේතනය (position encoding)")
    assert words == ["ALiBi", "අවධානය", "ස්ථානීය", "කේතනය", "position", "encoding"]


@pytest.fixture(scope="module")
def site(docs_site) -> Path:
    """`make docs`: every language, each a fresh -E -W build (tests/conftest.py builds it once)."""
    return docs_site


def test_every_language_builds_without_a_warning(site):
    for language in i18n_site.LANGUAGES:
        assert (site / language / "notebooks" / "03_alibi.html").is_file()
    assert not (site / "jupyter_execute").exists()
    assert 'url=en/index.html' in (site / "index.html").read_text("utf-8")
    # A page not declared complete says so, in the page's language; an English page does not.
    for language, notice in i18n.NOT_TRANSLATED.items():
        complete = catalogues.manifest().get(language, [])
        page = "notebooks/04_model"
        assert (notice in (site / language / f"{page}.html").read_text("utf-8")) == (page not in complete)
        if NOTEBOOK in complete:
            assert notice not in (site / language / f"{NOTEBOOK}.html").read_text("utf-8")
    assert "i18n-not-translated" not in (site / "en" / f"{NOTEBOOK}.html").read_text("utf-8")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


INSPECT = """
const done = arguments[0];
Promise.resolve(window.MathJax && MathJax.startup && MathJax.startup.promise).then(() => {
  const main = document.querySelector("article[role=main]");
  const math = [...main.querySelectorAll(".math")];
  const text = main.cloneNode(true);
  text.querySelectorAll("pre, code, script, style, mjx-container, .highlight").forEach(e => e.remove());
  done({
    title: main.querySelector("h1").textContent.replace(/[#¶]/g, "").trim(),
    math: math.length,
    typeset: math.filter(e => e.querySelector("mjx-container")).length,
    mathErrors: document.querySelectorAll("mjx-merror").length,
    text: text.textContent,
    code: [...main.querySelectorAll("div.highlight pre")].map(e => e.textContent),
    switcher: [...document.querySelectorAll(".sidebar-languages a")].map(a => a.href),
    current: [...document.querySelectorAll(".sidebar-languages .current")].map(e => e.lang),
  });
});
"""
RAW_TEX = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$\$|\$[^$\s][^$\n]*\$")
BROWSER_LANGUAGES = [language for language, page in COMPLETE if page == NOTEBOOK]


@needs_chromium
@pytest.mark.parametrize("language", BROWSER_LANGUAGES)
def test_browser_shows_notebook_03_translated(site, notebook_03, language):
    english, page = notebook_03["en"], notebook_03[language]
    title = next(m for m in catalogues.read(catalogues.catalogue_path(language, NOTEBOOK)) if m.id.startswith("3. "))
    assert page["title"] == title.string.replace("\\.", ".") != english["title"]
    assert page["math"] == english["math"] > 10 and page["typeset"] == page["math"] and not page["mathErrors"]
    assert not RAW_TEX.findall(page["text"]), "TeX left untypeset"
    assert page["code"] == english["code"] and len(page["code"]) > 5
    assert page["current"] == [language]
    assert len(page["switcher"]) == len(i18n_site.LANGUAGES) - 1
    for link in page["switcher"]:
        target = Path(unquote(urlsplit(link).path))
        assert target.is_file() and target.is_relative_to(site), link
        assert target.relative_to(site).as_posix().split("/", 1)[1] == f"{NOTEBOOK}.html"



# Run on a page: the text that starts a line with a character Japanese typesetting keeps off the
# start of a line (kinsoku: small kana, the prolonged sound mark, closing punctuation).
LINE_STARTS = """
const forbidden = arguments[0];
const main = document.querySelector("article[role=main]");
const walker = document.createTreeWalker(main, NodeFilter.SHOW_TEXT, {acceptNode: node =>
  node.parentElement.closest("pre, code, mjx-container, script, style")
    ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT});
const range = document.createRange();
const found = [];
for (let node; (node = walker.nextNode());) {
  let top = null;
  for (let i = 0; i < node.length; i++) {
    range.setStart(node, i);
    range.setEnd(node, i + 1);
    const box = range.getClientRects()[0];
    if (!box) continue;
    if (top !== null && box.top > top + box.height / 2 && forbidden.includes(node.data[i]))
      found.push(node.data.slice(Math.max(0, i - 6), i) + " / " + node.data.slice(i, i + 6));
    top = box.top;
  }
}
return found;
"""
KINSOKU = "ぁぃぅぇぉっゃゅょゎゕゖァィゥェォッャュョヮヵヶー、。，．）」』】〕〉》"


@pytest.fixture(scope="module")
def notebook_03(site, browser) -> dict:
    """Notebook 03 opened once in English and in each language that declares it complete, at
    1400 px: what INSPECT reads of each, by language. On the Japanese page, its line starts
    (LINE_STARTS) at 1400 px and, the window narrowed on the same page, at 390 px ("ja line
    starts": {width: found}): the browser breaks the lines of a narrowed window as those of a page
    opened at that width."""
    opened = {}
    for language in dict.fromkeys(["en", *BROWSER_LANGUAGES, "ja"]):
        browser.get((site / language / f"{NOTEBOOK}.html").as_uri())
        opened[language] = browser.execute_async_script(INSPECT)
        if language == "ja":
            starts = {1400: browser.execute_script(LINE_STARTS, KINSOKU)}
            browser.set_window_size(390, 1000)
            try:
                starts[390] = browser.execute_script(LINE_STARTS, KINSOKU)
            finally:
                browser.set_window_size(1400, 1000)
            opened["ja line starts"] = starts
    return opened


@needs_chromium
@pytest.mark.parametrize("width", [1400, 390])
def test_japanese_lines_do_not_start_with_a_small_kana(notebook_03, width):
    """Notebook 03 in Japanese breaks its lines by Japanese rules (kinsoku): no line starts with a
    small kana, the prolonged sound mark or closing punctuation. The browser's default line
    breaking did ("パ / ッケージ" in the introduction, "アテンシ / ョン" in the title)."""
    starts = notebook_03["ja line starts"][width]
    assert not starts, f"lines starting with a character kinsoku keeps off a line's start: {starts}"

def test_english_single_language_build_has_no_switcher():
    """tests/test_docs.py builds English alone: no switcher (its links would lead nowhere)."""
    from types import SimpleNamespace
    context = {}
    app = SimpleNamespace(config=SimpleNamespace(i18n_languages=[], language="en"))
    i18n.language_links(app, NOTEBOOK, "page.html", context, None)
    assert "i18n_languages" not in context
    app.config.i18n_languages = ["en", "ja", "si"]
    i18n.language_links(app, NOTEBOOK, "page.html", context, None)
    assert [l["href"] for l in context["i18n_languages"]] == [
        "../../en/notebooks/03_alibi.html", "../../ja/notebooks/03_alibi.html", "../../si/notebooks/03_alibi.html"]

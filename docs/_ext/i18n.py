"""The docs in several languages, with Sphinx's gettext: one catalogue per page,
`docs/locales/<lang>/LC_MESSAGES/<page>.po` (docs/locales/README.md says how to work on them).

What this extension adds to Sphinx's own internationalisation:

- Display math, the Colab badge, paragraphs of numbers and units only, and the cells' outputs (Markdown tables a cell displays) stay out of
  the catalogues. A
  translated display formula renders as `\\[::\\]` with no warning, and the badge's
  `blob/v<version>` would make its message fuzzy at every release.
- The annotated pages repeat the notebooks' paragraphs. Their catalogues hold only their own
  messages; at build time each annotated page also reads the catalogues of the notebooks it was
  exported from, so a shared paragraph is translated once, in the notebook's catalogue.
- A page that `docs/locales/complete.toml` does not declare complete in the build's language
  starts with one line, in that language, saying that it is not translated yet (what is not
  translated shows in English, message by message: Sphinx's fallback).
- A page depends on its catalogues, so an incremental build re-reads a page whose `.po` changed
  (`make docs` builds with -E all the same).
- Sphinx's and Furo's interface strings that Sphinx has no translation for are in
  `docs/locales/<lang>/LC_MESSAGES/sphinx.po`: Sphinx reads it before its own catalogue, and the
  search page's strings (`_static/translations.js`) are written from both.
- Sinhala search: words are not split at vowel signs (Unicode marks), in the index and in the
  query.
- With `i18n_languages` set (`make docs` sets it: `-D i18n_languages=en,ja,si`), every page has a
  language switcher in the sidebar linking `../<lang>/<page>.html`: the languages are built into
  sibling folders. A single-language build has no switcher.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from babel.messages import mofile, pofile
from babel.messages.catalog import Catalog
from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.search import SearchLanguage
from sphinx.transforms import SphinxTransform
from sphinx.util.i18n import docname_to_domain

HERE = Path(__file__).resolve().parent
# What each language is called in its own script, for the switcher.
LANGUAGE_NAMES = {"en": "English", "ja": "日本語", "si": "සිංහල"}
# The line at the top of a page not (yet) translated into the build's language.
NOT_TRANSLATED = {
    "ja": "このページはまだ日本語に翻訳されていません。英語の原文を表示しています。",
    "si": "මෙම පිටුව තවම සිංහලට පරිවර්තනය කර නැත; ඉංග්‍රීසි මුල් පිටපත පෙන්වයි.",
}
# A paragraph that is only the Colab badge: [![Open In Colab](...svg)](https://colab...).
COLAB = re.compile(r"^\s*\[!\[[^\]]*\]\([^)]*\)\]\(https://colab\.research\.google\.com/[^)]*\)\s*$")


# A word of two letters or more: a paragraph without one (`1.26 s`, `7.9x`, `T`) is not a message.
WORD = re.compile(r"[^\W\d_]{2,}")


def complete_pages(confdir: Path) -> dict[str, list[str]]:
    """docs/locales/complete.toml: for each language, the pages (docnames) translated in full."""
    manifest = confdir / "locales" / "complete.toml"
    if not manifest.is_file():
        return {}
    return {lang: list(table.get("pages", [])) for lang, table in tomllib.loads(manifest.read_text("utf-8")).items()}


def is_untranslatable(node: nodes.Node) -> bool:
    """Display math, a paragraph that is only the Colab badge, and one that is only a reference to
    code (the annotated pages' `{py:obj}` label of each definition) or an image: nothing to
    translate."""
    if isinstance(node, nodes.math_block):
        return True
    if isinstance(node, nodes.paragraph) and node.rawsource and COLAB.match(node.rawsource):
        return True
    if isinstance(node, nodes.paragraph) and node.children and all(map(is_code, node.children)):
        return True
    if isinstance(node, nodes.paragraph) and not WORD.search(node.astext()):
        return True  # numbers and units (a table's cells): nothing to translate
    return False


def is_output(node: nodes.Node) -> bool:
    """A notebook cell's output (MyST-NB's `cell_output` container): computed, like the code, and
    changed by every rerun; a Markdown table a cell displays stays as the code printed it."""
    return isinstance(node, nodes.container) and "cell_output" in node["classes"]


def is_code(node: nodes.Node) -> bool:
    """Code, or a reference whose text is code (`{py:obj}` roles), an image (its alt text is a
    message of its own), or blank space."""
    if isinstance(node, nodes.Text):
        return not node.strip()
    if isinstance(node, (nodes.literal, nodes.image)):
        return True
    return isinstance(node, (nodes.reference, addnodes.pending_xref)) and bool(node.children) \
        and all(isinstance(child, nodes.literal) for child in node.children)


class KeepOutOfCatalogues(SphinxTransform):
    """Mark display math and the Colab badge untranslatable: before Sphinx extracts or replaces
    messages (its PreserveTranslatableMessages runs at 10, Locale at 20)."""

    default_priority = 5

    def apply(self, **kwargs) -> None:
        for node in self.document.findall(nodes.Element):
            if is_untranslatable(node) or is_output(node):
                node["translatable"] = False
                for child in node.findall(nodes.Element):
                    if isinstance(child, nodes.TextElement):
                        child["translatable"] = False


class NotTranslatedNotice(SphinxTransform):
    """One line at the top of a page not declared complete in the build's language."""

    default_priority = 30  # after Locale (20): the notice itself is not a message

    def apply(self, **kwargs) -> None:
        language = self.config.language
        if language not in NOT_TRANSLATED or self.app.builder.name == "gettext":
            return
        docname = self.env.current_document.docname
        if docname in complete_pages(Path(self.app.confdir)).get(language, []):
            return
        notice = nodes.paragraph("", NOT_TRANSLATED[language], classes=["i18n-not-translated"])
        section = next(self.document.findall(nodes.section), None)
        if section is not None and section.children and isinstance(section[0], nodes.title):
            section.insert(1, notice)
        else:
            self.document.insert(0, notice)


def page_catalogue(confdir: Path, language: str, docname: str) -> Path:
    return confdir / "locales" / language / "LC_MESSAGES" / f"{docname}.po"


def shared_catalogues(app: Sphinx) -> dict[str, list[str]]:
    """For each annotated page (docname), the notebook pages whose paragraphs it repeats."""
    modules = getattr(app.config, "annotated_source_modules", [])
    folder = getattr(app.config, "annotated_source_dir", "annotated")
    notebooks = getattr(app.config, "notebook_pages_dir", "notebooks")
    source = (Path(app.confdir) / getattr(app.config, "notebook_pages_source", "../notebooks")).resolve()
    shared = {}
    for module in modules:
        name = module.rsplit(".", 1)[-1]
        # The notebooks a module is exported from: the `# %% ../notebooks/NN_x.ipynb` markers.
        package = source.parent / module.split(".")[0]
        path = package / f"{name}.py"
        found = []
        if path.is_file():
            for match in re.finditer(r"^# %% \S*?([^/\s]+)\.ipynb", path.read_text("utf-8"), re.M):
                docname = f"{notebooks}/{match[1]}"
                if docname not in found:
                    found.append(docname)
        shared[f"{folder}/{module}"] = found
    return shared


def write_shared_catalogues(app: Sphinx) -> None:
    """A second locale folder in which each annotated page's domain holds its notebooks' messages:
    Sphinx merges the catalogues of one domain from every locale folder."""
    language = app.config.language
    if not language or language == "en":
        return
    folder = Path(app.doctreedir) / "i18n-shared"
    confdir = Path(app.confdir)
    for docname, notebooks in shared_catalogues(app).items():
        catalogue = Catalog(locale=language)
        for notebook in notebooks:
            po = page_catalogue(confdir, language, notebook)
            if po.is_file():
                with po.open("rb") as f:
                    for message in pofile.read_po(f):
                        if message.id and message.string and not message.fuzzy:
                            catalogue.add(message.id, message.string)
        domain = docname_to_domain(docname, app.config.gettext_compact)
        mo = folder / language / "LC_MESSAGES" / f"{domain}.mo"
        mo.parent.mkdir(parents=True, exist_ok=True)
        with mo.open("wb") as f:
            mofile.write_mo(f, catalogue)
    if str(folder) not in app.config.locale_dirs:
        app.config.locale_dirs = [*app.config.locale_dirs, str(folder)]


def note_catalogues(app: Sphinx, docname: str, source: list[str]) -> None:
    """A page depends on its own catalogue and on those it shares."""
    language = app.config.language
    if not language or language == "en":
        return
    confdir = Path(app.confdir)
    for name in [docname, *shared_catalogues(app).get(docname, [])]:
        po = page_catalogue(confdir, language, name)
        if po.is_file():
            app.env.note_dependency(str(po))


def write_translations_js(app: Sphinx, exception: Exception | None) -> None:
    """`_static/translations.js` (the search page's strings) from Sphinx's catalogue and ours."""
    language = app.config.language
    ours = Path(app.confdir) / "locales" / str(language) / "LC_MESSAGES" / "sphinx.po"
    if exception or app.builder.format != "html" or not ours.is_file():
        return
    target = Path(app.outdir) / "_static" / "translations.js"
    messages, plural = {}, "(n != 1)"
    if target.is_file():  # Sphinx's own, copied from its package
        text = target.read_text("utf-8")
        data = json.loads(text[text.index("(") + 1:text.rindex(")")])
        messages, plural = data["messages"], data.get("plural_expr", plural)
    with ours.open("rb") as f:
        for message in pofile.read_po(f):
            if message.id and message.string and not message.fuzzy:
                key = message.id if isinstance(message.id, str) else message.id[0]
                if not messages.get(key):
                    messages[key] = message.string
    data = {"locale": language, "messages": messages, "plural_expr": plural}
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"Documentation.addTranslations({json.dumps(data, ensure_ascii=False, indent=1)});\n",
                      encoding="utf-8")


def language_links(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """The switcher's links: the same page in each language's sibling folder."""
    languages = app.config.i18n_languages
    if not languages:
        return
    up = "../" * (pagename.count("/") + 1)
    current = app.config.language or "en"
    context["i18n_languages"] = [
        {"code": code, "name": LANGUAGE_NAMES.get(code, code), "href": f"{up}{code}/{pagename}.html",
         "current": code == current}
        for code in languages
    ]


def add_switcher(app: Sphinx, config) -> None:
    """The switcher's template in the sidebar (after the search box), in a multi-language build.
    (And the catalogues' folder is not a folder of pages: its README.md is no page.)"""
    config.exclude_patterns = [*config.exclude_patterns, "locales"]
    config.templates_path = [*config.templates_path, str(HERE.parent / "_templates")]
    if not config.i18n_languages:
        return
    sidebars = ["sidebar/brand.html", "sidebar/search.html", "sidebar/languages.html",
                "sidebar/scroll-start.html", "sidebar/navigation.html", "sidebar/scroll-end.html"]
    config.html_sidebars = {"**": sidebars}


def add_static_path(app: Sphinx, config) -> None:
    """i18n.css, in the folder annotated_source.py shares."""
    if str(HERE / "static") not in config.html_static_path:
        config.html_static_path = [*config.html_static_path, str(HERE / "static")]


# MyST-NB's prompts of a folded cell ("Show code cell source"): its settings, not gettext messages,
# so they are translated in our interface catalogue (sphinx.po) and set from it.
CODE_PROMPTS = {"nb_code_prompt_show": "Show code cell {type}", "nb_code_prompt_hide": "Hide code cell {type}"}


def translate_code_prompts(app: Sphinx, config) -> None:
    """Set MyST-NB's prompts from sphinx.po, before MyST-NB reads its settings."""
    ours = Path(app.confdir) / "locales" / str(config.language) / "LC_MESSAGES" / "sphinx.po"
    if not ours.is_file():
        return
    with ours.open("rb") as f:
        catalogue = pofile.read_po(f)
    for setting, msgid in CODE_PROMPTS.items():
        message = catalogue.get(msgid)
        if message is not None and message.string and not message.fuzzy:
            setattr(config, setting, message.string)


class SearchSinhala(SearchLanguage):
    """Sinhala: a word runs on through its vowel signs and virama (Unicode marks) and the zero-width
    joiners of conjuncts; the default splitter cuts words at each of them."""

    lang = "si"
    language_name = "Sinhala"
    _word_re = re.compile(r"[\w\u0D81-\u0DFF\u200C\u200D]+")
    js_splitter_code = r"""
function splitQuery(query) {
  return query
    .split(/[^\p{Letter}\p{Mark}\p{Number}_\u200C\u200D]+/gu)
    .filter((term) => term);
}
"""

    def init(self, options: dict) -> None:
        pass

    def stem(self, word: str) -> str:
        return word.lower()


def setup(app: Sphinx) -> dict:
    app.add_config_value("i18n_languages", [], "html", types=[list])
    app.connect("config-inited", add_switcher)
    app.connect("config-inited", translate_code_prompts, priority=400)
    app.connect("builder-inited", write_shared_catalogues)
    app.connect("source-read", note_catalogues)
    app.connect("html-page-context", language_links)
    app.connect("build-finished", write_translations_js)
    app.add_transform(KeepOutOfCatalogues)
    app.add_transform(NotTranslatedNotice)
    app.add_search_language(SearchSinhala)
    app.connect("config-inited", add_static_path)
    app.add_css_file("i18n.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}

"""The translation catalogues: refresh them after the English changed, report their coverage,
and check them (tests/test_translations.py).

    python docs/_ext/i18n_catalogues.py update     # `make translations`: extract, merge, coverage
    python docs/_ext/i18n_catalogues.py coverage   # messages and words per page and language

`update` extracts the messages of the English docs with Sphinx's gettext builder (the same
segmentation the build uses to look them up: one message per paragraph, title or list item,
display math and the Colab badge left out by i18n.py), then merges them into
`docs/locales/<lang>/LC_MESSAGES/<page>.po`: a message whose English changed becomes fuzzy and
keeps its previous English (`#| msgid`), so the translator sees what changed; a new one is empty;
one no longer in the English is kept as obsolete (`#~`). An annotated page's catalogue holds only
the messages that are not the paragraphs of the notebooks it shows: those are translated once, in
the notebook's catalogue. The API pages are not translated.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from babel.messages import pofile
from babel.messages.catalog import Catalog

DOCS = Path(__file__).resolve().parent.parent
LOCALES = DOCS / "locales"
LANGUAGES = ["ja", "si"]
# Pages not translated: the API reference (the docstrings, in English only).
UNTRANSLATED = re.compile(r"^api/")


def manifest() -> dict[str, list[str]]:
    """docs/locales/complete.toml: for each language, the pages it declares complete."""
    return {lang: list(table.get("pages", []))
            for lang, table in tomllib.loads((LOCALES / "complete.toml").read_text("utf-8")).items()}


def extract(out: Path, docs: Path = DOCS, pages: list[str] | None = None,
            notebooks: Path | None = None) -> dict[str, Catalog]:
    """The messages of the English docs, by page (docname), extracted into `out` by Sphinx's gettext
    builder. `pages`: read only these pages (and what the build needs), which is much faster;
    `notebooks`: the folder of notebooks to show (default: the repository's)."""
    command = [sys.executable, "-m", "sphinx", "-E", "-b", "gettext", "-q", str(docs), str(out)]
    if pages is not None:
        wanted = set(pages)
        every = [p.relative_to(docs).with_suffix("").as_posix()
                 for p in docs.rglob("*") if p.suffix in (".md", ".ipynb") and "_build" not in p.parts]
        every += [f"notebooks/{p.stem}" for p in (notebooks or DOCS.parent / "notebooks").glob("*.ipynb")]
        excluded = sorted({page for page in every if page not in wanted and page != "index"} | {"api/**"})
        command += ["-D", "exclude_patterns=" + ",".join(["_build", "**/.ipynb_checkpoints", *excluded])]
    if notebooks is not None:
        command += ["-D", f"notebook_pages_source={notebooks}"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=DOCS.parent)
    if result.returncode != 0:
        raise RuntimeError(f"the gettext extraction failed:\n{result.stderr}")
    catalogues = {}
    for pot in sorted(out.rglob("*.pot")):
        docname = pot.relative_to(out).with_suffix("").as_posix()
        if UNTRANSLATED.match(docname) or (pages is not None and docname not in pages):
            continue
        with pot.open("rb") as f:
            catalogues[docname] = pofile.read_po(f)
    return catalogues


def shared_notebooks(docname: str) -> list[str]:
    """The notebook pages whose paragraphs the annotated page `docname` repeats (i18n.py)."""
    if not docname.startswith("annotated/"):
        return []
    module = DOCS.parent / (docname.split("/", 1)[1].replace(".", "/") + ".py")
    if not module.is_file():
        return []
    found = []
    for match in re.finditer(r"^# %% \S*?([^/\s]+)\.ipynb", module.read_text("utf-8"), re.M):
        if f"notebooks/{match[1]}" not in found:
            found.append(f"notebooks/{match[1]}")
    return found


def own_messages(docname: str, extracted: dict[str, Catalog]) -> list[str]:
    """The messages of `docname` that its own catalogue holds: an annotated page's less the
    paragraphs of its notebooks."""
    shared = set()
    for notebook in shared_notebooks(docname):
        if notebook in extracted:
            shared |= {m.id for m in extracted[notebook] if m.id}
    return [m.id for m in extracted[docname] if m.id and m.id not in shared]


def catalogue_path(language: str, docname: str) -> Path:
    return LOCALES / language / "LC_MESSAGES" / f"{docname}.po"


def read(path: Path) -> Catalog | None:
    if not path.is_file():
        return None
    with path.open("rb") as f:
        return pofile.read_po(f)


def write(path: Path, catalogue: Catalog) -> None:
    for message in catalogue:  # babel's guesses (python-format) mean nothing here
        message.flags -= {"python-format", "python-brace-format"}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        # No wrapping: a message is one line, its diff one line.
        pofile.write_po(f, catalogue, width=0, include_previous=True, omit_header=False,
                        sort_output=False, ignore_obsolete=False)


# Interface strings of the extensions (not Sphinx's or Furo's), kept in every sphinx.po.
UI_MESSAGES = ["Show code cell {type}", "Hide code cell {type}"]


def update(extracted: dict[str, Catalog]) -> None:
    """Merge the extracted messages into every language's catalogues."""
    for language in LANGUAGES:
        interface = read(catalogue_path(language, "sphinx"))
        if interface is not None and any(msgid not in interface for msgid in UI_MESSAGES):
            for msgid in UI_MESSAGES:
                if msgid not in interface:
                    interface.add(msgid)
            write(catalogue_path(language, "sphinx"), interface)
        for docname, source in extracted.items():
            template = Catalog(locale=None, project="aftalibi", fuzzy=False)
            for msgid in own_messages(docname, extracted):
                template.add(msgid)
            path = catalogue_path(language, docname)
            catalogue = read(path)
            if catalogue is None:
                catalogue = Catalog(locale=language, project="aftalibi", fuzzy=False)
            catalogue.update(template, update_header_comment=False, update_creation_date=False)
            for msgid in [k for k, m in catalogue.obsolete.items() if not m.string]:
                del catalogue.obsolete[msgid]  # an English message gone, never translated
            catalogue.fuzzy = False
            write(path, catalogue)


@dataclass
class Coverage:
    messages: int = 0
    translated: int = 0
    fuzzy: int = 0
    words: int = 0
    translated_words: int = 0


def translations(language: str, docname: str) -> dict[str, tuple[str, bool]]:
    """msgid -> (msgstr, fuzzy) for `docname` in `language`: its catalogue and, for an annotated
    page, its notebooks' catalogues (the page's own translation wins)."""
    found: dict[str, tuple[str, bool]] = {}
    for name in [*shared_notebooks(docname), docname]:
        catalogue = read(catalogue_path(language, name))
        if catalogue is not None:
            found |= {m.id: (m.string, m.fuzzy) for m in catalogue if m.id}
    return found


def coverage(language: str, docname: str, extracted: dict[str, Catalog]) -> Coverage:
    done = translations(language, docname)
    result = Coverage()
    for message in extracted[docname]:
        if not message.id:
            continue
        words = len(message.id.split())
        result.messages += 1
        result.words += words
        string, fuzzy = done.get(message.id, ("", False))
        if string and not fuzzy:
            result.translated += 1
            result.translated_words += words
        elif string:
            result.fuzzy += 1
    return result


def print_coverage(extracted: dict[str, Catalog]) -> None:
    complete = manifest()
    print(f"{'page':34} {'lang':4} {'messages':>14} {'words':>13} {'fuzzy':>5}  complete")
    for docname in extracted:
        for language in LANGUAGES:
            c = coverage(language, docname, extracted)
            flag = "yes" if docname in complete.get(language, []) else ""
            print(f"{docname:34} {language:4} {c.translated:6}/{c.messages:<7} {c.translated_words:6}/{c.words:<6}"
                  f" {c.fuzzy:5}  {flag}")


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("update", "coverage"):
        print(__doc__.strip().splitlines()[2:4], file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as out:
        extracted = extract(Path(out))
        if argv[0] == "update":
            update(extracted)
        print_coverage(extracted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

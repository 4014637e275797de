"""`make docs`: the site in every language, offline, into one folder.

    python docs/_ext/i18n_site.py docs/_build/html

builds English, Japanese and Sinhala into `<out>/en/`, `<out>/ja/` and `<out>/si/`, each a fresh
build (-E: Sphinx does not notice a changed catalogue on its own) with warnings as errors, and with
a language switcher on every page (`i18n_languages`); `<out>/index.html` leads to English.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent
LANGUAGES = ["en", "ja", "si"]
ROOT_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="0; url=en/index.html">
<title>aftalibi</title>
</head>
<body>
<p><a href="en/index.html">aftalibi</a> · <a href="ja/index.html" lang="ja">日本語</a> ·
<a href="si/index.html" lang="si">සිංහල</a></p>
</body>
</html>
"""


def build_language(language: str, out: Path) -> subprocess.CompletedProcess:
    """One language into `out/<language>`: `make docs`'s command for it."""
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-b", "html", "-q",
         "-D", f"language={language}", "-D", "i18n_languages=" + ",".join(LANGUAGES),
         str(DOCS), str(out / language)],
        capture_output=True, text=True, cwd=DOCS.parent)


def build_site(out: Path) -> list[str]:
    """Every language into `out`; the errors of the builds that failed (empty: all built)."""
    out.mkdir(parents=True, exist_ok=True)
    errors = []
    for language in LANGUAGES:
        result = build_language(language, out)
        if result.returncode != 0:
            errors.append(f"the {language} build failed or warned:\n{result.stderr}")
    # MyST-NB writes the notebooks' outputs to jupyter_execute/ beside the output folder; the pages
    # hold their own copies of the images (_images/).
    shutil.rmtree(out / "jupyter_execute", ignore_errors=True)
    (out / "index.html").write_text(ROOT_PAGE, encoding="utf-8")
    return errors


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[2])
    failures = build_site(Path(sys.argv[1]))
    for failure in failures:
        print(failure, file=sys.stderr)
    sys.exit(1 if failures else 0)

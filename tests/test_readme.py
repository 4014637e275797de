"""The README and the pages that say how to use the project say true things: the README is short and
shows the result first, every link to a file of the repository resolves, and what the pages quote
(the Python floor, `make` targets, command-line options, the release, the demo's record) is what the
code has."""

import functools
import re
import tomllib
from pathlib import Path

import pytest

from aftalibi import __all__ as PUBLIC_NAMES, _colab
from aftalibi.__main__ import main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The pages written by hand that say how to use and work on the project.
PAGES = [README, ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md",
         *(ROOT / "docs" / name for name in ("index.md", "install.md", "cli.md", "running-notebooks.md"))]
# [text](target) and ![alt](target); a target ends at the first space or closing parenthesis.
LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)\)")
CODE_BLOCK = re.compile(r"```[^\n]*\n(.*?)```", re.S)
INLINE_CODE = re.compile(r"`([^`]+)`")


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def code_spans(page: str) -> list[str]:
    """The lines of the page's code blocks and its inline code spans."""
    blocks = CODE_BLOCK.findall(page)
    prose = CODE_BLOCK.sub("", page)
    return [line for block in blocks for line in block.splitlines()] + INLINE_CODE.findall(prose)


def github_anchor(heading: str) -> str:
    """The anchor GitHub (and most Markdown renderers) give a heading."""
    heading = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return heading.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {github_anchor(line.lstrip("#")) for line in CODE_BLOCK.sub("", text(path)).splitlines()
            if line.startswith("#")}


def test_the_readme_is_short_and_shows_the_result_first():
    lines = text(README).splitlines()
    assert len(lines) <= 140, f"the README has {len(lines)} lines: move details to the docs pages"
    picture = [i for i, line in enumerate(lines[:25]) if "](docs/_static/extrapolation.png)" in line]
    assert picture, "the README shows docs/_static/extrapolation.png within its first 25 lines"
    alt = LINK.search(lines[picture[0]])[1]
    assert len(alt.split()) >= 10, f"the picture's alt text should say what it shows, got {alt!r}"


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_links_to_the_repository_resolve(page):
    """Relative links name files that exist (a docs page's notebooks/ is the build's copy of the
    repository's notebooks/), anchors name headings, and links to the repository on GitHub name
    files of this checkout."""
    repository = _colab.repository()
    broken = []
    for _, target in LINK.findall(text(page)):
        path, _, anchor = target.partition("#")
        if path.startswith(repository):
            rest = path[len(repository):]
            if rest.startswith("/blob/"):
                file = ROOT / rest.split("/", 3)[3]
            elif rest in ("", "/"):
                file = README
            else:
                broken.append(target)
                continue
        elif re.match(r"[a-z]+:", path):
            continue  # another site
        elif not path:
            file = page
        else:
            file = (page.parent / path).resolve()
            if page.parent == ROOT / "docs" and path.startswith("notebooks/"):
                file = ROOT / path
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    assert not broken, f"{page.name}: links that do not resolve: {broken}"


def test_the_python_floor_is_pyprojects():
    floor = tomllib.loads(text(ROOT / "pyproject.toml"))["project"]["requires-python"]
    stated = f"Python {floor.replace('>=', '>= ')}"
    assert stated in text(ROOT / "docs" / "install.md")
    for page in PAGES:
        others = set(re.findall(r"Python (?:>=|≥) ?[\d.]+", text(page))) - {stated}
        assert not others, f"{page.name} names another Python floor: {others}, pyproject.toml: {floor}"


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", text(ROOT / "Makefile"), re.M))


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_quoted_make_targets_exist(page):
    quoted = {target for span in code_spans(text(page))
              for target in re.findall(r"(?:^\s*|&&\s*|;\s*)make ([a-z][\w-]*)", span)}  # a command
    assert quoted <= make_targets(), f"{page.name} quotes make targets the Makefile lacks: " \
                                     f"{quoted - make_targets()}"


@functools.cache
def options_of(command: str) -> frozenset[str]:
    """The options `python -m aftalibi COMMAND --help` lists."""
    import contextlib
    import io

    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), pytest.raises(SystemExit):
        main([command, "--help"])
    return frozenset(re.findall(r"(--[a-z][\w-]*)", help_text.getvalue()))


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_quoted_commands_and_options_exist(page):
    """Every `python -m aftalibi COMMAND --option` the page quotes is a command with that option."""
    commands = {"train", "generate", "strip-checkpoint", "extrapolate", "run-notebooks", "refresh-notebooks"}
    wrong = []
    for span in code_spans(text(page)):
        for command, arguments in re.findall(r"-m aftalibi ([\w-]+)([^#`]*)", span):
            if command == "COMMAND":
                continue
            if command not in commands:
                wrong.append(command)
                continue
            wrong += [option for option in re.findall(r"(?:^|\s)(--[a-z][\w-]*)", arguments)
                      if option not in options_of(command)]
    assert not wrong, f"{page.name} quotes commands or options that do not exist: {wrong}"


def test_the_command_line_page_quotes_options_train_has():
    """The command-line page's options in prose (`--resume`, `--precision float32`, ...) are
    options of train or extrapolate."""
    known = options_of("train") | options_of("extrapolate") | options_of("run-notebooks")
    quoted = {option for span in INLINE_CODE.findall(text(ROOT / "docs" / "cli.md"))
              for option in re.findall(r"^(--[a-z][\w-]*)", span)}
    assert quoted and quoted <= known, f"docs/cli.md names options no command has: {quoted - known}"


def test_the_release_and_repository_quoted_are_the_packages():
    """A release or GitHub repository named on a page is the one `make export` writes into the
    badges (`aftalibi._colab`): a new release or a fork shows up here."""
    repository, release = _colab.repository(), _colab.release()
    for page in PAGES:
        page_text = text(page)
        assert set(re.findall(r"\bv\d+\.\d+\.\d+\b", page_text)) <= {release}, page.name
        repositories = {f"https://github.com/{name}" for name in
                        re.findall(r"https://github\.com/([\w.-]+/[\w.-]+?)(?=[/#@)\s]|\.git|$)", page_text)}
        assert repositories <= {repository}, f"{page.name} names {repositories - {repository}}"


def test_the_readme_demo_transcript_is_what_make_demo_prints():
    """The README quotes a captured `make demo`: the command, an evaluation every eval_every steps in
    the form the run prints it, the closing line with that run's last evaluation, its speed and
    time (which the prose repeats), and a sample of the length the command draws."""
    from aftalibi.train import TrainConfig

    readme = text(README)
    section = readme[readme.index("## What `make demo` prints"):readme.index("## The notebooks")]
    transcript = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    lines = transcript.splitlines()
    assert lines[0] == ".venv/bin/python -m aftalibi train --overwrite"
    config = TrainConfig()
    evaluations = [re.fullmatch(r"step (\d+)/(\d+)  loss (\d\.\d{3})  validation (\d\.\d{3})", line)
                   for line in lines[1:] if line.startswith("step ") and "/" in line.split()[1]]
    assert all(evaluations), "an evaluation line is not in the form the run prints"
    steps = [int(match[1]) for match in evaluations]
    assert steps == [*range(config.eval_every, config.max_steps, config.eval_every), config.max_steps]
    assert {int(match[2]) for match in evaluations} == {config.max_steps}
    closing = re.search(rf"^step {config.max_steps} of {config.max_steps}: validation loss (\d\.\d{{3}}) nats/char "
                        rf"at step {config.max_steps}; ([\d,]+) tokens/s \((float32|bfloat16|float16)\), "
                        r"([\d.]+) min; checkpoint: runs/demo/checkpoint\.pt$", transcript, re.M)
    assert closing and closing[1] == evaluations[-1][4], "the closing line must repeat the last evaluation"
    prose = " ".join(section[section.index("```", section.index("```text") + 3):].split())
    assert f"{closing[4]} minutes" in prose and closing[1] in prose, "the prose must state the run's time and loss"
    sample = transcript[transcript.index("--- sample ---\n") + len("--- sample ---\n"):]
    assert len(sample.removesuffix("\n")) == 300, "the sample: the 300 characters `python -m aftalibi train` draws"


def test_the_readme_library_example_uses_the_public_api():
    readme = text(README)
    imported = {name.strip() for names in re.findall(r"from aftalibi import ([\w, ]+)", readme)
                for name in names.split(",")}
    assert imported and imported <= set(PUBLIC_NAMES), imported - set(PUBLIC_NAMES)
    from aftalibi import RESULTS_FOLDER

    for name in re.findall(r'RESULTS_FOLDER / "([^"]+)"', readme):
        assert (RESULTS_FOLDER / name).is_file(), name


@pytest.mark.parametrize("fact", [
    r"torch (?:>= ?|older than )?2\.9",  # Muon's torch
    r"shared with other jobs|other jobs shared",  # the machines the figures come from
    r"\b2 to [34] minutes",  # notebook 06 in full mode on a T4
    r"1\.9 to 3\.1 minutes",  # --preset gpu on a T4
    r"2\.46x",  # subnormal floats on an Intel Xeon
])
def test_each_fact_is_stated_once(fact):
    found = {str(page.relative_to(ROOT)): len(re.findall(fact, " ".join(text(page).split())))
             for page in PAGES}
    stated = {name: count for name, count in found.items() if count}
    assert sum(stated.values()) == 1, f"{fact!r} is stated {stated or 'nowhere'}: state it once, link to it"


def test_the_pages_describe_the_presets_the_code_has():
    """The demo's and the GPU recipe's sizes, as the README and the command-line page give them,
    are the code's defaults and presets."""
    from aftalibi.model import ModelConfig
    from aftalibi.train import DEMO_MODEL, EVAL_SEQ_LEN, PRESETS, TrainConfig

    demo, defaults = ModelConfig(vocab_size=80, **DEMO_MODEL), TrainConfig()
    gpu, gpu_train = PRESETS["gpu"]["model"], PRESETS["gpu"]["train"]
    steps = f"{defaults.max_steps} steps of {defaults.batch_size} windows of {defaults.seq_len} characters"
    cli = " ".join(text(ROOT / "docs" / "cli.md").split())
    assert steps in " ".join(text(README).split()) and steps in cli
    assert (f"{demo.n_layers} blocks of width {demo.d_model}, {demo.n_heads} heads and an MLP of "
            f"{demo.d_ff}") in cli
    assert (f"width {gpu['d_model']}, {gpu['n_layers']} blocks of {gpu['n_heads']} heads, MLP "
            f"{gpu['d_ff']}, {gpu_train['batch_size']} windows of {gpu_train['seq_len']} characters, "
            f"{gpu_train['max_steps']} steps, dropout {gpu['dropout']}, weight decay "
            f"{gpu_train['weight_decay']}, into `{gpu_train['out_dir']}`") in cli
    assert (f"Every {defaults.eval_every} steps it scores {defaults.eval_windows} windows of the "
            f"validation plays, each {EVAL_SEQ_LEN} characters long") in cli

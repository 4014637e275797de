"""Training steps of this checkout against those of another commit, side by side in one process.

    python benchmarks/compare_commits.py --base aa94cd7 [--models aft-local alibi demo] [--steps 40]
                                         [--threads 2] [--precision bfloat16 float32] [--batch-size N]

The way to check that a change did not slow training down on a shared machine, where two runs
minutes apart can differ by 30%. The base commit's package is exported with `git archive` into a
temporary folder under the name `aftalibi_base` (its imports of itself renamed), both packages
build the same model from the same seed, and their training steps (forward, backward, gradient
clipping, optimizer) alternate, so a noisy spell slows both alike. Each figure is the median step
time over --steps steps of each, after three warm-up steps. Models: `train_speed.py`'s AFT-local
and ALiBi configurations (AdamW), and the CPU demo's (ALiBi, 6 blocks, T=64, batch 32, the
trainer's default optimizer). Random tokens from an 80-character vocabulary.
"""

import argparse
import importlib
import io
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch
from measure import add_cpu_options, set_up_cpu
from train_speed import CONFIGURATIONS, train_step

from aftalibi.train import DEMO_MODEL

ROOT = Path(__file__).resolve().parent.parent
BASE = "aftalibi_base"
# {name: (ModelConfig options, seq_len, batch_size, TrainConfig options)}
MODELS = {
    **{name: (options, seq_len, batch, {"optimizer": "adamw"})
       for name, (options, seq_len, batch) in CONFIGURATIONS.items()},
    "demo": (DEMO_MODEL, 64, 32, {}),  # the CPU demo: T=64, batch 32, the default optimizer
}


def export_package(revision: str, folder: Path) -> str:
    """Write `aftalibi/` of `revision` into `folder` as the package `aftalibi_base`; return its short hash."""
    def git(*args) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True)

    found = git("rev-parse", "--short", "--verify", f"{revision}^{{commit}}")
    if found.returncode != 0:
        raise SystemExit(f"--base: {revision!r} is not a commit of this repository")
    commit = found.stdout.decode().strip()
    with tarfile.open(fileobj=io.BytesIO(git("archive", commit, "aftalibi").stdout)) as archive:
        archive.extractall(folder, filter="data")
    package = (folder / "aftalibi").rename(folder / BASE)
    for module in package.glob("*.py"):
        text = module.read_text()
        text = re.sub(r"^(\s*)import aftalibi\b(?!\.)", rf"\1import {BASE} as aftalibi", text, flags=re.MULTILINE)
        text = re.sub(r"^(\s*)from aftalibi([. ])", rf"\1from {BASE}\2", text, flags=re.MULTILINE)
        module.write_text(text)
    return commit


def build(package: str, name: str):
    """The model of `name` and its optimizer, from the package `package` (`aftalibi` or the base)."""
    model_module = importlib.import_module(f"{package}.model")
    train_module = importlib.import_module(f"{package}.train")
    options, _, _, training = MODELS[name]
    torch.manual_seed(0)
    try:
        model = model_module.LanguageModel(model_module.ModelConfig(vocab_size=80, **options))
        optimizer = train_module.make_optimizer(model, train_module.TrainConfig(**training))
    except TypeError as error:  # an option that one of the two commits does not know
        raise SystemExit(f"{package} cannot build the {name} model: {error}") from error
    return model, optimizer


def compare(name: str, steps: int, batch: int, bf16: bool) -> dict[str, float]:
    """Median seconds per step of this checkout and of the base, the two alternating step by step,
    on `batch` windows per step."""
    _, seq_len, _, _ = MODELS[name]
    runs = {"this": build("aftalibi", name), "base": build(BASE, name)}
    inputs, targets = torch.randint(0, 80, (2, batch, seq_len), generator=torch.Generator().manual_seed(0))
    times = {side: [] for side in runs}
    for index in range(steps + 3):
        for side in (("this", "base") if index % 2 else ("base", "this")):  # each goes first half the time
            start = time.perf_counter()
            train_step(*runs[side], inputs, targets, bf16)
            seconds = time.perf_counter() - start
            if index >= 3:
                times[side].append(seconds)
    return {side: statistics.median(seconds) for side, seconds in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the commit to compare with (a hash, a tag, HEAD~3, ...)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, help="windows per step instead of each model's own (a smaller "
                        "one checks that the script runs, in seconds)")
    add_cpu_options(parser)
    parser.add_argument("--precision", nargs="+", choices=["bfloat16", "float32"], default=["bfloat16", "float32"])
    args = parser.parse_args()
    if args.batch_size is not None and args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")
    print(set_up_cpu(args))
    with tempfile.TemporaryDirectory() as folder:
        commit = export_package(args.base, Path(folder))
        sys.path.insert(0, folder)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "aftalibi"], cwd=ROOT, capture_output=True, text=True)
        this = head.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")
        print(f"this checkout ({this}) against {args.base} ({commit}), {args.threads} threads, "
              f"{args.steps} alternating steps each")
        print(f"{'model':>10} {'precision':>10} {'this':>12} {'base':>12} {'this / base time':>17}")
        for name in args.models:
            _, seq_len, batch, _ = MODELS[name]
            batch = args.batch_size or batch
            for precision in args.precision:
                seconds = compare(name, args.steps, batch, bf16=precision == "bfloat16")
                print(f"{name:>10} {precision:>10} {batch * seq_len / seconds['this']:>10,.0f}/s "
                      f"{batch * seq_len / seconds['base']:>10,.0f}/s {seconds['this'] / seconds['base']:>17.3f}")


if __name__ == "__main__":
    main()

"""The benchmark scripts run; their timings are printed, never asserted (see benchmarks/README.md).

The GPU benchmark is one prepared script for the rare session that has a GPU, so it must work there
the first time: its CPU mode (small sizes, a few seconds) runs every section here, and its
correctness section, every AFT variant and the ALiBi layer against float64 on both AFT kernels, must
pass. The commit comparison must load two versions of the package side by side. The fused AFT
kernels must fit every GPU generation, which Triton can check by compiling for one it does not have."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Each test runs a benchmark script end to end: minutes on a CPU, so `make check` leaves them out.
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
# The scripts run on one CPU thread here (--threads 1, or OMP_NUM_THREADS where a script takes no
# --threads): the suite's pytest-xdist workers share the cores, and torch's threads waiting on each
# other across two busy workers made the tiny steps of these checks several times slower.
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_gpu_benchmark_runs_on_a_cpu_and_its_correctness_checks_pass():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--device", "cpu", "--quick"],
                            capture_output=True, text=True, timeout=540, cwd=ROOT, env=ONE_THREAD)
    assert result.returncode == 0, result.stdout + result.stderr
    verdicts = re.findall(r"\s(ok|FAIL\w*)\s*$", result.stdout, flags=re.MULTILINE)
    kernels = set(re.findall(r"^aft-\S+\s+(\S+-chunked|triton)\s+(?:float32|bfloat16)", result.stdout,
                             flags=re.MULTILINE))
    from aftalibi import aft_triton
    expected = {"cpu-chunked", "gpu-chunked"} | ({"triton"} if aft_triton.unavailable_reason("cpu") is None else set())
    # 4 AFT variants x 2 dtypes per kernel, and the ALiBi layer in 2 dtypes
    assert len(verdicts) == 8 * len(expected) + 2 and set(verdicts) == {"ok"}, result.stdout
    assert kernels == expected, kernels
    assert "0 correctness check(s) failed" in result.stdout
    for section in ("1. Correctness", "2. One layer", "3. Whole model"):
        assert section in result.stdout, f"section {section!r} missing:\n{result.stdout}"


def test_commit_comparison_builds_both_packages_side_by_side():
    """compare_commits.py exports a commit's package under another name and steps both models in one
    process: against HEAD itself, one step of the ALiBi model (on 4 of its 128 windows) is enough to
    show that the two load."""
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare_commits.py"), "--base", "HEAD",
                             "--models", "alibi", "--steps", "1", "--precision", "float32", "--batch-size", "4",
                             "--threads", "1"],
                            capture_output=True, text=True, timeout=540, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^\s+alibi\s+float32\s+[\d,]+/s\s+[\d,]+/s\s+\d+\.\d{3}$", result.stdout, flags=re.MULTILINE), \
        result.stdout
    refused = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare_commits.py"), "--base", "no-such-rev"],
                             capture_output=True, text=True, timeout=540, cwd=ROOT)
    assert refused.returncode != 0 and "--base: 'no-such-rev' is not a commit of this repository" in refused.stderr


def test_fault_injection_kills_runs_and_finds_nothing_lost():
    """One trial per case: what the closing table must say at any size. No run is lost, no temporary file is left
    after the next run, which takes over every time, and every checkpoint written loads. SIGTERM, a double SIGINT
    (the second 1 to 10 ms after the first, during the save) and a SIGTERM aimed at an evaluation lose no step and
    miss no save; the aimed SIGTERM lands in the evaluation, and the resumed run redoes it."""
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fault_injection.py"), "--trials", "4",
                             "--latest", "1"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {row[1].strip(): [cell.strip() for cell in row[2:-1]] for row in
            (line.split("|") for line in result.stdout.splitlines() if line.startswith("| SIG") or
             line.startswith("| double"))}
    assert set(rows) == {"SIGTERM", "SIGKILL", "double SIGINT", "SIGTERM in evaluation"}, result.stdout
    for name, (trials, status, lost, steps_lost, missed, stray, stray_after, loadable, took_over, evaluations) \
            in rows.items():
        assert trials == "1" and stray_after == "0" and took_over == "1 of 1", result.stdout
        written, of = loadable.split(" of ")
        assert written == of, result.stdout  # every checkpoint written loads
        if name != "SIGTERM in evaluation":
            assert evaluations == "n/a", result.stdout
    for name in rows:
        assert rows[name][2] == "0", result.stdout  # no run lost, however it was stopped
    for name in ("SIGTERM", "double SIGINT", "SIGTERM in evaluation"):
        assert rows[name][3].startswith("0 /") and rows[name][4] == "0", result.stdout  # saved where it stopped
    assert rows["SIGTERM"][1] == "143" and rows["double SIGINT"][1] == "130", result.stdout
    assert rows["SIGTERM in evaluation"][1] == "143", result.stdout
    assert rows["SIGTERM in evaluation"][7] == "1 of 1", result.stdout  # it stopped, and saved, in its evaluation
    # The signal landed in the evaluation, and the resumed run redid it: none lost.
    assert rows["SIGTERM in evaluation"][9] == "0 of 1", result.stdout


def triton_has_ptxas() -> bool:
    """Whether Triton is installed and hands out its NVIDIA assembler (as Triton 3.6 and 3.9 do; 3.0 does not)."""
    if importlib.util.find_spec("triton") is None:
        return False
    from triton.backends.nvidia import compiler
    return hasattr(compiler, "get_ptxas")


needs_ptxas = pytest.mark.skipif(not triton_has_ptxas(), reason="needs a Triton that hands out its assembler (get_ptxas)")


@needs_ptxas
def test_the_triton_kernels_fit_the_shared_memory_of_every_gpu_generation():
    """Compiled for a T4 (64 KiB of shared memory a block), an A10 or L4 (99 KiB) and an H100, with
    the package's launch settings, every AFT kernel fits: a kernel that does not is not launched at
    all on that GPU. The check has teeth: Triton's default launch (3 stages) misses the A10's limit
    in float32."""
    script = [sys.executable, str(ROOT / "benchmarks" / "triton_resources.py"), "--no-spills"]
    result = subprocess.run([*script, "--targets", "75,86,90", "--variants", "causal-band,full"],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = re.findall(r"^sm_(\d+) .*\s(yes|NO)$", result.stdout, flags=re.MULTILINE)
    # 3 targets x 4 kernels x 3 input types (fp32, bf16, fp16) x 2 variants
    assert len(rows) == 72 and {fits for _, fits in rows} == {"yes"}, result.stdout
    assert "0 kernel(s) that do not fit" in result.stdout
    default = subprocess.run([*script, "--targets", "86", "--types", "fp32", "--variants", "causal-band",
                              "--launches", "4x3"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert re.search(r"^sm_86 .* forward .* 144\.0 +99 .*NO$", default.stdout, flags=re.MULTILINE), default.stdout


def test_train_speed_compares_against_plain_mixers_that_compute_the_same_model(monkeypatch):
    """train_speed.py's plain column swaps each token mixer for the papers' formula written directly:
    a ratio against it means something only if the plain model computes the same function."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # where the script finds its helpers
    spec = importlib.util.spec_from_file_location("train_speed", ROOT / "benchmarks" / "train_speed.py")
    train_speed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_speed)
    for options, _, _ in train_speed.CONFIGURATIONS.values():
        torch.manual_seed(0)
        model = train_speed.LanguageModel(train_speed.ModelConfig(vocab_size=80, **{**options, "n_layers": 2}))
        for module in model.modules():  # nonzero AFT-local biases, inside and outside the window
            if isinstance(module, train_speed.AFTLocal):
                torch.nn.init.normal_(module.band, std=2.0)
        tokens = torch.randint(0, 80, (2, 48))
        expected, _ = model(tokens)
        assert train_speed.use_plain_mixers(model) == 2
        plain, _ = model(tokens)
        torch.testing.assert_close(plain, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("script,arguments,expected", [
    ("attention_baseline.py", ["--lengths", "64", "--batch", "1", "--d-model", "32", "--heads", "2", "--repeats", "1"],
     "64"),
    # The dense layer up to T=128 only: T=256 also prints the row of a length the dense layer skips.
    ("aft_local.py", ["--lengths", "128", "256", "--batch", "1", "--d-model", "32", "--window", "8", "--repeats", "1",
                      "--dense-up-to", "128"], "fast time T=256 / T=128"),
    ("alibi_attention.py", ["--lengths", "64", "--batch", "1", "--d-model", "32", "--heads", "2", "--repeats", "1"],
     "alibi/plain time"),
    ("matmul.py", ["--shape", "64", "32", "16", "--repeats", "1"], "bf16 / float32"),
    # Both mixers with their plain forms; ALiBi at T=64 (its training length) takes the same path
    # as at 512 (one call of the CPU kernel up to 2048 queries).
    ("train_speed.py", ["--steps", "1", "--configurations", "aft-local", "alibi", "--batch-size", "1"],
     "alibi  bf16 autocast"),
    # The default optimizer (Muon) needs torch >= 2.9.
    # A small corpus file ({corpus}): the run's evaluations score its validation split.
    ("train_loop.py", ["--steps", "2", "--repeats", "1", "--corpus", "{corpus}", "--batch-size", "4",
                       "--optimizer", "muon" if hasattr(torch.optim, "Muon") else "adamw"], "overhead"),
])
def test_cpu_benchmarks_run_at_tiny_sizes(script, arguments, expected, corpus_file):
    """Every CPU benchmark runs end to end (tiny sizes, one repeat, one thread): a script that rots is
    found here, not by whoever next needs its figures."""
    arguments = [argument.format(corpus=corpus_file) for argument in arguments] + ["--threads", "1"]
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *arguments],
                            capture_output=True, text=True, timeout=540, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert expected in result.stdout, result.stdout

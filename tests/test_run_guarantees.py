"""The guarantees of Appendix D (notebooks/11_runs.ipynb) that a careful operator tried and found missing: a second
signal during a save, a signal during an evaluation, SIGHUP, a full disk, unwritable homes and caches, crafted and
malformed checkpoints, a changed corpus, a model too large for memory, out_dir that cannot be made, and --seed."""

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import aftalibi.train as training
from aftalibi.__main__ import main
from aftalibi.model import LanguageModel, ModelConfig
from aftalibi.runs import model_shapes
from aftalibi.train import CheckpointError, TrainConfig, load_checkpoint, save_checkpoint, train

OPTIMIZER = "muon" if hasattr(torch.optim, "Muon") else "adamw"
TINY_MODEL = {"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32}
TINY = ["--seq-len", "16", "--batch-size", "4", "--eval-windows", "4", "--d-model", "16", "--n-layers", "1",
        "--n-heads", "2", "--d-ff", "32", "--optimizer", OPTIMIZER, "--sample", "0"]

# Run from a temporary folder, and read a refusal's one line, as the other run tests do.
from test_runs import in_tmp_path, one_error_line  # noqa: E402, F401  (in_tmp_path: an autouse fixture)


def tiny_run(corpus_file, out_dir, **overrides) -> TrainConfig:
    return TrainConfig(**{"corpus": corpus_file, "seq_len": 16, "batch_size": 4, "max_steps": 12, "eval_every": 4,
                          "eval_windows": 8, "warmup_steps": 2, "optimizer": OPTIMIZER, "out_dir": str(out_dir),
                          **overrides})


def module_of(function) -> object:
    """The module that defines `function` (where its globals are looked up)."""
    return sys.modules[function.__module__]


# --- Signals ---------------------------------------------------------------------------------------------------

def test_a_second_signal_during_a_save_is_reported_after_it_and_the_checkpoint_is_kept(corpus_file, tmp_path,
                                                                                      monkeypatch, capsys):
    draw, checksum, plan = training.sample_windows, module_of(save_checkpoint).content_checksum, {"draws": 0}

    def interrupted_draw(*args, **kwargs):
        plan["draws"] += 1
        if plan["draws"] == 7:  # Ctrl-C as step 7 is prepared: the run saves step 6
            plan["second"] = True
            raise KeyboardInterrupt
        return draw(*args, **kwargs)

    def checksum_hit_by_a_second_ctrl_c(state):
        if plan.pop("second", False):
            signal.raise_signal(signal.SIGINT)  # 1 ms after the first: during its save
        return checksum(state)

    monkeypatch.setattr(training, "sample_windows", interrupted_draw)
    monkeypatch.setattr(module_of(save_checkpoint), "content_checksum", checksum_hit_by_a_second_ctrl_c)
    result = train(TINY_MODEL, tiny_run(corpus_file, tmp_path / "run"), quiet=True)
    assert result["interrupted"] and result["step"] == 6
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt")["step"] == 6  # the save was not cut short
    out = capsys.readouterr().out
    assert "interrupted at step 6: checkpoint saved" in out
    assert "SIGINT during the save: held until the checkpoint was written" in out



def test_a_signal_while_a_model_is_built_on_the_meta_device_comes_after_torchs_device_context(monkeypatch):
    """A SIGTERM inside torch's device context once left torch's mode stack unbalanced: the experiment ended in
    "pop from empty mode stack" (exit 1) instead of stopping with 143. Now it is delivered after the context."""
    runs, seen_on = module_of(model_shapes), []
    build = runs.LanguageModel

    def build_hit_by_sigterm(config):
        signal.raise_signal(signal.SIGTERM)  # as it came once while the device context was being entered
        return build(config)

    def stop(number, frame):
        seen_on.append(torch.empty(0).device.type)  # "meta" inside torch's device context
        raise runs.Terminated(number)

    monkeypatch.setattr(runs, "LanguageModel", build_hit_by_sigterm)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(runs.Terminated):
            model_shapes(ModelConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, d_ff=32))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen_on == ["cpu"]  # delivered once, after the context closed
    assert torch.empty(0).device.type == "cpu"

@pytest.mark.parametrize("stopped_at", [1, 3], ids=["periodic evaluation", "final evaluation"])
def test_a_run_stopped_during_an_evaluation_redoes_it_on_resume(corpus_file, tmp_path, monkeypatch, stopped_at):
    uninterrupted = train(TINY_MODEL, tiny_run(corpus_file, tmp_path / "whole"), quiet=True)
    evaluate, calls = training.evaluate, {"count": 0}

    def terminated_evaluation(*args, **kwargs):
        calls["count"] += 1
        if calls["count"] == stopped_at:
            raise training.Terminated()  # SIGTERM while the validation windows are scored
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(training, "evaluate", terminated_evaluation)
    config = tiny_run(corpus_file, tmp_path / "stopped")
    stopped = train(TINY_MODEL, config, quiet=True)
    assert stopped["terminated"] and stopped["step"] == 4 * stopped_at
    monkeypatch.setattr(training, "evaluate", evaluate)
    resumed = train(TINY_MODEL, config, resume=True, quiet=True)
    assert [entry["step"] for entry in resumed["history"]] == [4, 8, 12]
    assert resumed["history"] == uninterrupted["history"]  # the evaluation made, at the step it belongs to
    assert resumed["validation_step"] == 12


def start_training(corpus_file: str, out_dir: Path) -> subprocess.Popen:
    arguments = ["train", "--corpus", corpus_file, *TINY, "--out-dir", str(out_dir), "--max-steps", "100000",
                 "--eval-every", "3", "--threads", "1"]
    return subprocess.Popen([sys.executable, "-m", "aftalibi", *arguments], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def test_sighup_stops_a_run_like_sigterm(corpus_file, tmp_path):
    out_dir = tmp_path / "run"
    process = start_training(corpus_file, out_dir)
    deadline = time.monotonic() + 120
    while not (out_dir / "checkpoint.pt").exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the run saved nothing"
        time.sleep(0.05)
    process.send_signal(signal.SIGHUP)  # the terminal was closed
    out, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGHUP, err  # 129, as the shell reports a SIGHUP
    stopped = [line for line in out.splitlines() if line.startswith("stopped by SIGHUP at step")]
    assert len(stopped) == 1, out
    assert load_checkpoint(out_dir / "checkpoint.pt")["step"] == int(stopped[0].split()[5].rstrip(":"))
    assert sorted(p.name for p in out_dir.iterdir()) == ["checkpoint.pt", "labml"]  # the lock released


# --- Writes that fail -------------------------------------------------------------------------------------------

def test_a_full_disk_is_one_line_naming_the_path_and_keeps_the_previous_checkpoint(corpus_file, tmp_path, capsys,
                                                                                   monkeypatch):
    out_dir = tmp_path / "run"
    train(TINY_MODEL, tiny_run(corpus_file, out_dir, max_steps=8), session_steps=4, quiet=True)
    before = (out_dir / "checkpoint.pt").read_bytes()

    def no_space(descriptor):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)
    assert main(["train", "--resume", "--out-dir", str(out_dir)]) != 0
    error = one_error_line(capsys)
    assert str(out_dir / "checkpoint.pt") in error and os.strerror(errno.ENOSPC) in error, error
    assert (out_dir / "checkpoint.pt").read_bytes() == before
    assert sorted(p.name for p in out_dir.iterdir()) == ["checkpoint.pt", "labml"]  # no temporary, no lock


def test_a_lock_that_cannot_be_written_is_one_line(corpus_file, tmp_path, capsys, monkeypatch):
    def no_space(descriptor, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", no_space)
    assert main(["train", "--corpus", corpus_file, *TINY, "--out-dir", str(tmp_path / "run")]) != 0
    error = one_error_line(capsys)
    assert str(tmp_path / "run" / ".lock") in error and os.strerror(errno.ENOSPC) in error, error
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("corpus, unwritable, named", [
    ("tiny-shakespeare", ".cache", "data cache"),
    ("FILE", ".labml", "labml"),
])
def test_home_cache_and_labml_folders_are_checked_before_any_work(corpus_file, tmp_path, capsys, monkeypatch,
                                                                  corpus, unwritable, named):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("AFTALIBI_CACHE", raising=False)
    access = os.access
    (home / unwritable).mkdir()  # as read-only as a HOME on a read-only mount
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != home / unwritable and access(path, mode))

    def no_work(*args, **kwargs):
        raise AssertionError("the corpus was read before the folders were checked")

    monkeypatch.setattr(module_of(training.open_run), "load_corpus", no_work)  # where runs read it
    corpus = corpus_file if corpus == "FILE" else corpus
    assert main(["train", "--corpus", corpus, *TINY, "--out-dir", str(tmp_path / "run")]) == 2
    error = one_error_line(capsys)
    assert named in error and str(home / unwritable) in error, error
    assert not (tmp_path / "run").exists()


# --- Crafted and malformed checkpoints --------------------------------------------------------------------------

@pytest.mark.parametrize("checksum", ["valid", "wrong"])
def test_expanded_tensors_are_refused_before_the_checksum_is_computed(tmp_path, monkeypatch, checksum):
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=5, d_model=8, n_layers=1, n_heads=2, d_ff=16)
    weights = LanguageModel(config).state_dict()
    weights["blocks.0.mlp.0.weight"] = torch.zeros(1).expand(16, 8)  # one number, seen 128 times
    state = {"format": "aftalibi-checkpoint-v1", "model_config": {**config.__dict__},
             "tokenizer": {"kind": "char", "vocabulary": "abcde"}, "model": weights, "step": 3, "history": []}
    checker = module_of(load_checkpoint)
    state["checksum"] = checker.content_checksum(state) if checksum == "valid" else "0" * 64
    torch.save(state, tmp_path / "crafted.pt")

    def not_yet(state):
        raise AssertionError("the checksum was computed before the tensors' layout was checked")

    monkeypatch.setattr(module_of(training.check_checkpoint), "content_checksum", not_yet)
    with pytest.raises(CheckpointError, match="is not stored densely"):
        load_checkpoint(tmp_path / "crafted.pt")


@pytest.fixture
def saved_run(corpus_file, tmp_path) -> Path:
    """A tiny run stopped after 4 of its 8 steps: out_dir/checkpoint.pt can be resumed."""
    out_dir = tmp_path / "run"
    train(TINY_MODEL, tiny_run(corpus_file, out_dir, max_steps=8), session_steps=4, quiet=True)
    return out_dir


@pytest.mark.parametrize("change, message", [
    (lambda s: s["train_config"].update(label_smoothing=0.1), "'label_smoothing', an option this version"),
    (lambda s: s["train_config"].update(seq_len="16"), "train_config seq_len must be int"),
    (lambda s: s["train_config"].update(learning_rate=-1.0), "learning_rate must be a finite number"),
    (lambda s: s.update(optimizer={"optimizers": ["junk"]}), "entry 'optimizer' is not an optimizer's state"),
    (lambda s: s.update(optimizer={"optimizers": [{"state": {}, "param_groups": []}]}),
     "optimizer or batch state does not fit"),
    (lambda s: s.update(history=[{"step": "4"}]), "history entries must be dicts"),
    (lambda s: s.update(step=-5), "step must be in [0, max_steps=8], got -5"),
], ids=["newer option", "wrong type", "out of range", "junk optimizer", "optimizer of another model",
        "malformed history", "negative step"])
def test_resume_refuses_a_malformed_checkpoint_in_one_line(saved_run, capsys, change, message):
    state = load_checkpoint(saved_run / "checkpoint.pt")
    del state["format"], state["checksum"]
    change(state)
    save_checkpoint(saved_run / "checkpoint.pt", state)  # a valid checksum: only the content is wrong
    assert main(["train", "--resume", "--out-dir", str(saved_run)]) == 2
    error = one_error_line(capsys)
    assert message in error and str(saved_run) in error, error


def test_resume_refuses_a_changed_corpus_and_old_checkpoints_still_resume(corpus_file, saved_run, capsys):
    text = Path(corpus_file).read_text()
    Path(corpus_file).write_text(text.replace("soft", "tfos", 1))  # the same characters, two moved
    assert main(["train", "--resume", "--out-dir", str(saved_run)]) == 2
    error = one_error_line(capsys)
    assert f"the corpus {corpus_file!r} is not the one the run in {saved_run} was trained on" in error, error
    state = load_checkpoint(saved_run / "checkpoint.pt")
    del state["format"], state["checksum"], state["corpus_checksum"]  # as written before the corpus was summed
    save_checkpoint(saved_run / "checkpoint.pt", state)
    resumed = train(TINY_MODEL, tiny_run(corpus_file, saved_run, max_steps=8), resume=True, quiet=True)
    assert resumed["step"] == 8


# --- Options checked before any work ----------------------------------------------------------------------------

@pytest.mark.parametrize("option, value", [("--d-model", "100000"), ("--d-ff", "1000000000")])
def test_weights_too_large_for_memory_are_refused_naming_the_model_options(corpus_file, tmp_path, capsys, option,
                                                                           value):
    arguments = ["train", "--corpus", corpus_file, "--out-dir", str(tmp_path / "run"), option, value]
    assert main(arguments) == 2
    error = one_error_line(capsys)
    assert "parameters" in error and option in error and "--seq-len" not in error, error
    assert not (tmp_path / "run").exists()


def test_out_dir_that_cannot_be_created_is_one_line(corpus_file, tmp_path, capsys):
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for out_dir, message in ((tmp_path / "dangling", "is a symbolic link to"),
                             (Path("/proc/nonexistent/x"), "/proc/nonexistent")):
        assert main(["train", "--corpus", corpus_file, *TINY, "--out-dir", str(out_dir)]) == 2
        error = one_error_line(capsys)
        assert "out_dir" in error and message in error, error
    assert not (tmp_path / "nowhere").exists()


def test_seed_out_of_range_names_seed(corpus_file, tmp_path, capsys):
    assert main(["train", "--corpus", corpus_file, *TINY, "--out-dir", str(tmp_path / "run"),
                 "--seed", str(2 ** 64)]) == 2
    error = one_error_line(capsys)
    assert "seed must be an integer in [-2^63, 2^64 - max_steps)" in error, error

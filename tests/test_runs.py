"""Runs that are never lost or half-done: SIGTERM, one run per folder, settings and losses that are not finite,
outputs checked before any work, and checkpoints that are checked when they are read."""

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import aftalibi.aft_triton as aft_triton
import aftalibi.runs as runs
import aftalibi.train as training
from aftalibi.__main__ import main
from aftalibi.extrapolate import ExtrapolationConfig, load_results, run_experiment
from aftalibi.model import MIXERS, LanguageModel, ModelConfig
from aftalibi.train import (CheckpointError, RunInUse, TrainConfig, TrainingDiverged, check_attention_memory,
                            content_checksum, load_checkpoint, remove_stale_temporaries, replace_atomically, run_lock,
                            save_checkpoint, train)

OPTIMIZER = "muon" if hasattr(torch.optim, "Muon") else "adamw"
TINY = ["--seq-len", "16", "--batch-size", "4", "--eval-windows", "4", "--d-model", "16", "--n-layers", "1",
        "--n-heads", "2", "--d-ff", "32", "--optimizer", OPTIMIZER, "--sample", "0"]
RESULTS = Path(__file__).parent.parent / "notebooks" / "results"


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def one_error_line(capsys) -> str:
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1, error
    return error


def start_training(corpus_file: str, out_dir: Path, *more: str) -> subprocess.Popen:
    """The real entry point in a process of its own, training a tiny model for far longer than a test waits."""
    arguments = ["train", "--corpus", corpus_file, *TINY, "--out-dir", str(out_dir), "--max-steps", "100000",
                 "--eval-every", "3", "--threads", "1", *more]
    return subprocess.Popen([sys.executable, "-m", "aftalibi", *arguments], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def tiny_checkpoint(path: Path, **changes) -> dict:
    """A model-only checkpoint of a one-block model, written with `save_checkpoint`."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=5, d_model=8, n_layers=1, n_heads=2, d_ff=16)
    state = {"model_config": {**config.__dict__}, "train_config": {**TrainConfig(seq_len=8).__dict__},
             "tokenizer": {"kind": "char", "vocabulary": "abcde"}, "model": LanguageModel(config).state_dict(), "step": 3,
             "history": [], **changes}
    save_checkpoint(path, state)
    return state


def nan_gradients_at(monkeypatch, call: int) -> dict:
    """Gradients that overflow to nan (as exploding ones do) at the `call`-th gradient clipping of
    this process; returns the count of calls, which a test may reset."""
    clip, calls = torch.nn.utils.clip_grad_norm_, {"count": 0}

    def exploding(parameters, max_norm):
        parameters = list(parameters)
        calls["count"] += 1
        if calls["count"] == call:
            for parameter in parameters:
                parameter.grad.fill_(math.nan)
        return clip(parameters, max_norm)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", exploding)
    return calls


# --- Work that is lost ---------------------------------------------------------------------------------------

def test_sigterm_saves_says_where_and_exits_143(corpus_file, tmp_path):
    out_dir = tmp_path / "run"
    process = start_training(corpus_file, out_dir)
    wait_for(out_dir / "checkpoint.pt", process)  # the first evaluation has been saved: training is under way
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 143, err
    stopped = [line for line in out.splitlines() if line.startswith("stopped by SIGTERM at step")]
    assert len(stopped) == 1 and f"checkpoint saved to {out_dir / 'checkpoint.pt'}; continue with --resume" in stopped[0]
    step = int(stopped[0].split()[5].rstrip(":"))
    assert load_checkpoint(out_dir / "checkpoint.pt")["step"] == step  # no step lost
    assert sorted(p.name for p in out_dir.iterdir()) == ["checkpoint.pt", "labml"]  # no lock, no temporary file


def test_a_second_run_in_the_folder_stops_at_once_naming_the_first(corpus_file, tmp_path):
    out_dir = tmp_path / "run"
    first = start_training(corpus_file, out_dir)
    wait_for(out_dir / "checkpoint.pt", first)
    second = start_training(corpus_file, out_dir, "--overwrite")
    out, err = second.communicate(timeout=120)
    first.send_signal(signal.SIGTERM)
    _, first_err = first.communicate(timeout=120)
    assert second.returncode == 2 and out == ""
    assert err.strip() == (f"aftalibi train: error: {out_dir} is in use by another run: process {first.pid} holds "
                           f"{out_dir / '.lock'}; wait for it to end, stop it, or choose another out_dir")
    assert first.returncode == 143, first_err


def test_the_lock_and_temporary_files_of_a_killed_run_are_taken_over_and_removed(corpus_file, tmp_path):
    out_dir = tmp_path / "run"
    killed = start_training(corpus_file, out_dir)
    wait_for(out_dir / "checkpoint.pt", killed)
    killed.kill()  # SIGKILL: nothing runs in the process after it
    killed.communicate(timeout=60)
    assert (out_dir / ".lock").read_text().strip() == str(killed.pid)  # the lock file stays, its flock is gone
    stale, live = out_dir / f".checkpoint.pt.{killed.pid}.tmp", out_dir / f".checkpoint.pt.{os.getppid()}.tmp"
    stale.write_bytes(b"half a checkpoint")
    live.write_bytes(b"being written by a running process")
    assert main(["train", "--out-dir", str(out_dir), "--resume", "--session-steps", "2", "--sample", "0"]) == 0
    assert not stale.exists() and live.exists() and not (out_dir / ".lock").exists()
    assert remove_stale_temporaries(out_dir) == []


def test_a_refused_run_leaves_no_folder_and_the_lock_is_exclusive_within_a_process_too(tmp_path):
    lock = tmp_path / "a" / "b" / ".lock"
    with pytest.raises(ValueError, match="refused"), run_lock(lock, "out_dir"):
        raise ValueError("refused")
    assert not (tmp_path / "a").exists()
    with run_lock(lock, "out_dir"):
        assert lock.read_text() == f"{os.getpid()}\n"
        with pytest.raises(RunInUse, match=f"process {os.getpid()} holds"), run_lock(lock, "out_dir"):
            pass
    assert not (tmp_path / "a").exists()


def test_a_write_stopped_by_a_signal_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "file"
    path.write_bytes(b"old")

    def stopped(file):
        file.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replace_atomically(path, stopped)
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["file"]


class SignalsMidway:
    """A file that sends `signal_number` to this process on its third write, in the middle of a
    `torch.save`, and goes on writing."""

    def __init__(self, file, signal_number: int):
        self.file, self.signal_number, self.writes = file, signal_number, 0

    def write(self, data) -> int:
        self.writes += 1
        if self.writes == 3:
            os.kill(os.getpid(), self.signal_number)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


@pytest.mark.parametrize("signal_number,stop", [(signal.SIGTERM, training.Terminated),
                                                (signal.SIGINT, KeyboardInterrupt)])
def test_a_signal_during_a_write_is_held_until_the_file_is_whole(tmp_path, signal_number, stop):
    """Raised inside `torch.save`'s writes, an exception comes out of torch's zip writer as a
    RuntimeError ("unexpected pos"), and the run would end with a traceback and exit 1: SIGINT and
    SIGTERM wait until the file is written and renamed, then stop the run as usual."""
    path, state = tmp_path / "checkpoint.pt", {"weights": torch.arange(4096.0)}
    with training.sigterm_stops_like_ctrl_c(), pytest.raises(stop) as stopped:
        replace_atomically(path, lambda file: torch.save(state, SignalsMidway(file, signal_number)))
    assert type(stopped.value) is stop  # not a RuntimeError out of torch.save
    assert torch.equal(torch.load(path)["weights"], state["weights"])
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handlers are back
    assert signal.getsignal(signal.SIGINT) == signal.default_int_handler


@pytest.mark.parametrize("arguments,message", [
    (["--learning-rate", "inf"], "learning_rate must be a finite number in [0, 1], got inf"),
    (["--learning-rate", "1e30"], "learning_rate must be a finite number in [0, 1], got 1e+30"),
    (["--muon-learning-rate", "nan"], "muon_learning_rate must be a finite number in [0, 1], got nan"),
    (["--grad-clip", "nan"], "grad_clip must be a finite number >= 0, got nan"),
    (["--weight-decay", "nan"], "weight_decay must be a finite number >= 0, got nan"),
    (["--weight-decay", "500"], "learning_rate * weight_decay must be below 1"),
    (["--min-learning-rate=-inf"], "min_learning_rate must be a finite number in [0, 1], got -inf"),
])
def test_settings_that_are_not_finite_or_out_of_range_are_refused(corpus_file, tmp_path, capsys, arguments, message):
    assert main(["train", "--corpus", corpus_file, *TINY, "--out-dir", str(tmp_path / "run"), *arguments]) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_a_loss_that_becomes_nan_stops_the_run_and_keeps_the_last_good_checkpoint(corpus_file, tmp_path, monkeypatch,
                                                                                     capsys):
    """Gradients that overflow to nan at the 6th step (as an exploding gradient does): step 6's update makes every
    weight nan, and step 7's loss is nan."""
    calls = nan_gradients_at(monkeypatch, 6)
    out_dir = tmp_path / "run"
    arguments = ["train", "--corpus", corpus_file, *TINY, "--out-dir", str(out_dir), "--max-steps", "10",
                 "--eval-every", "4", "--log-every", "1", "--optimizer", "adamw"]
    assert main(arguments) == 1
    assert one_error_line(capsys) == (
        f"aftalibi train: error: the training loss became nan by step 7: the run stopped, and {out_dir / 'checkpoint.pt'} "
        "still holds step 4, untouched; lower the learning rate (--learning-rate, --muon-learning-rate) or keep "
        "gradient clipping on (--grad-clip)")
    state = load_checkpoint(out_dir / "checkpoint.pt")
    assert state["step"] == 4 and all(torch.isfinite(w).all() for w in state["model"].values())
    assert sorted(p.name for p in out_dir.iterdir()) == ["checkpoint.pt", "labml"]
    calls["count"] = 0
    with pytest.raises(TrainingDiverged, match="no checkpoint was written"):
        train({"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32},
              TrainConfig(corpus=corpus_file, seq_len=16, batch_size=4, max_steps=10, eval_every=8, log_every=1,
                          optimizer="adamw", out_dir=str(tmp_path / "early")), quiet=True)


def test_extrapolate_holds_its_results_file_and_sigterm_keeps_the_finished_models(corpus_file, tmp_path, capsys):
    results = tmp_path / "results.json"
    argv = ["extrapolate", "--corpus", corpus_file, "--train-len", "8", "--factors", "1", "--d-model", "16",
            "--n-layers", "1", "--n-heads", "2", "--d-ff", "32", "--window", "4", "--factor-dim", "4", "--steps", "2",
            "--batch-size", "2", "--warmup-steps", "1", "--eval-tokens", "16", "--eval-segments", "2",
            "--variants", "alibi", "mha-none", "--seeds", *map(str, range(1000)), "--sweep-windows", "--threads", "1",
            "--optimizer", OPTIMIZER, "--out", str(results)]
    first = subprocess.Popen([sys.executable, "-m", "aftalibi", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    wait_for(results, first)  # the first model is done and saved
    assert main(argv) == 2
    assert f"is in use by another run: process {first.pid} holds" in one_error_line(capsys)
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=120)
    assert first.returncode == 143, err
    assert (f"stopped by SIGTERM: {results} holds every model finished before it, the one in training is lost; "
            "the same command continues") in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "results.json"]  # no lock, no temporary file
    assert len(load_results(results)["training"]) >= 1


def test_an_extrapolation_model_that_diverges_stops_the_experiment_keeping_the_models_before_it(corpus_file, tmp_path,
                                                                                                   monkeypatch):
    nan_gradients_at(monkeypatch, 3)  # the second model's first step
    config = ExtrapolationConfig(corpus=corpus_file, train_len=8, factors=(1,), d_model=16, n_layers=1, n_heads=2,
                                 d_ff=32, window=4, factor_dim=4, steps=2, batch_size=2, warmup_steps=1, eval_tokens=16,
                                 eval_segments=2, variants=("alibi", "mha-none"), seeds=(0,), sweep_windows=(),
                                 optimizer="adamw")
    with pytest.raises(TrainingDiverged, match=r"mha \(seed 0\) diverged: its training loss is nan at step 2"):
        run_experiment(config, path=tmp_path / "results.json", log=lambda line: None)
    assert [record["variant"] for record in load_results(tmp_path / "results.json")["training"]] == ["alibi"]


# --- Defaults that work for every mixer ----------------------------------------------------------------------

@pytest.mark.parametrize("mixer", list(MIXERS))
def test_every_mixer_trains_with_the_default_options(corpus_file, tmp_path, capsys, mixer):
    out_dir = tmp_path / "run"
    """Every option but the model's size (kept small here) at its default: the evaluation length follows the mixer."""
    assert main(["train", "--mixer", mixer, "--corpus", corpus_file, "--max-steps", "1", "--sample", "0",
                 "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--d-ff", "32", "--out-dir", str(out_dir)]) == 0
    absolute = ModelConfig(vocab_size=1, mixer=mixer).max_positions is not None
    assert load_checkpoint(out_dir / "checkpoint.pt")["train_config"]["eval_seq_len"] == (64 if absolute else 256)
    assert "step 1 of 1: validation loss" in capsys.readouterr().out


# --- Tracebacks where a line belongs --------------------------------------------------------------------------

def test_output_paths_are_checked_before_the_corpus_is_read(tmp_path, capsys, monkeypatch):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.access(locked, os.W_OK):  # root may write anywhere: the check must still refuse what it is told is locked
        monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked)
    missing = ["--corpus", "no/such/corpus.txt"]
    for out_dir, message in ((a_file, f"--out-dir {a_file} is a file, not a folder"),
                             (a_file / "run", f"--out-dir {a_file / 'run'} lies under {a_file}, which is a file"),
                             (locked / "new" / "run", f"cannot be written: this process may not write in {locked}"),
                             ("", "--out-dir must name a folder, got an empty string")):
        assert main(["train", *missing, "--out-dir", str(out_dir)]) == 2
        assert message in one_error_line(capsys)
    for out, message in ((tmp_path, f"out {tmp_path} is a folder, not a file path"),
                         (a_file / "x", f"out {a_file / 'x'} lies under {a_file}, which is a file")):
        assert main(["strip-checkpoint", "no/such.pt", str(out)]) == 2
        assert message in one_error_line(capsys)
    extrapolate = ["extrapolate", *missing, "--train-len", "16", "--factors", "1", "--eval-tokens", "64",
                   "--eval-segments", "1", "--factor-dim", "4", "--slide-divisor", "1"]
    assert main([*extrapolate, "--out", str(a_file / "results.json")]) == 2
    assert f"--out {a_file / 'results.json'} lies under {a_file}, which is a file" in one_error_line(capsys)
    assert main([*extrapolate, "--out", str(tmp_path / "r.json"), "--save-models", str(a_file)]) == 2
    assert f"--save-models {a_file} is a file, not a folder" in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "locked"]


@pytest.mark.parametrize("device", ["cuda", "cuda:99", "mps"])
def test_a_device_this_machine_lacks_is_one_line(corpus_file, tmp_path, capsys, device):
    present = {"cuda": torch.cuda.is_available(), "cuda:99": torch.cuda.device_count() > 99,
               "mps": torch.backends.mps.is_available()}[device]
    assert not present, "the test needs a machine without this device"
    assert main(["train", "--corpus", corpus_file, *TINY, "--out-dir", str(tmp_path / "run"), "--device", device]) == 2
    assert f"device {device!r}: this machine has" in one_error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_triton_where_it_cannot_run_is_one_line(corpus_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(aft_triton, "unavailable_reason", lambda device: "the AFT kernel 'triton' needs Triton")
    assert main(["train", "--corpus", corpus_file, *TINY, "--out-dir", str(tmp_path / "run"), "--mixer", "aft-local",
                 "--aft-kernel", "triton"]) == 2
    assert "aft_kernel='triton' cannot run on cpu here: the AFT kernel 'triton' needs Triton" in one_error_line(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("mixer", ["aft-simple", "aft-local", "aft-conv", "aft-full"])
def test_a_batch_too_large_for_an_aft_mixer_is_one_line_and_leaves_nothing(corpus_file, tmp_path, capsys, mixer):
    assert main(["train", "--corpus", corpus_file, "--mixer", mixer, "--batch-size", "10000000",
                 "--out-dir", str(tmp_path / "run")]) == 2
    assert f"seq_len=64 with batch_size=10000000 is too large for {mixer} on cpu" in one_error_line(capsys)
    assert not (tmp_path / "run").exists()  # no labml folder either


def test_memory_is_checked_for_mha_on_cuda_and_aft_full_holds_its_pairwise_biases(monkeypatch):
    monkeypatch.setattr(runs, "device_memory", lambda device: 80 * 2 ** 30)
    cuda = torch.device("cuda")
    with pytest.raises(ValueError, match="too large for mha on cuda: the activations backward keeps need at least"):
        check_attention_memory(ModelConfig(vocab_size=80, mixer="mha"), TrainConfig(batch_size=1_000_000), cuda)
    check_attention_memory(ModelConfig(vocab_size=80, mixer="mha"), TrainConfig(batch_size=64, seq_len=256), cuda)
    with pytest.raises(ValueError, match="AFT-full's seq_len\\^2 biases per layer"):
        check_attention_memory(ModelConfig(vocab_size=80, mixer="aft-full", max_len=200_000),
                               TrainConfig(batch_size=1, seq_len=200_000), cuda)


def test_generate_and_refresh_refuse_bad_arguments_in_one_line(tmp_path, capsys):
    tiny_checkpoint(tmp_path / "model.pt")
    assert main(["generate", "--checkpoint", str(tmp_path / "model.pt"), "--temperature", "nan"]) == 2
    assert "--temperature must be a finite number >= 0, got nan" in one_error_line(capsys)
    assert main(["generate", "--checkpoint", str(tmp_path)]) == 2
    assert f"{tmp_path} is a folder, not a checkpoint file" in one_error_line(capsys)
    assert main(["refresh-notebooks", "missing.ipynb"]) == 2
    assert "notebook not found: missing.ipynb" in one_error_line(capsys)


# --- Checkpoints that are checked ----------------------------------------------------------------------------

def test_a_damaged_checkpoint_is_refused_by_its_checksum(tmp_path, capsys):
    state = tiny_checkpoint(tmp_path / "model.pt")
    assert load_checkpoint(tmp_path / "model.pt")["checksum"] == content_checksum({"format": training.CHECKPOINT_FORMAT, **state})
    data = bytearray((tmp_path / "model.pt").read_bytes())
    weights = state["model"]["blocks.0.mlp.0.weight"].numpy().tobytes()  # 512 bytes, stored as they are
    start = data.find(weights)
    assert start > 0
    data[start:start + 100] = bytes(255 - byte for byte in data[start:start + 100])  # 100 flipped bytes
    (tmp_path / "damaged.pt").write_bytes(data)
    assert main(["generate", "--checkpoint", str(tmp_path / "damaged.pt")]) == 2
    assert (f"{tmp_path / 'damaged.pt'} is damaged: its content does not match the checksum stored when it was saved"
            in one_error_line(capsys))


def test_checkpoints_written_before_checksums_still_load():
    for path in sorted(RESULTS.glob("*.pt")):
        state = load_checkpoint(path)
        assert "checksum" not in state, path  # written before checksums: loaded unverified, as documented
        training.model_from_checkpoint(state)


@pytest.mark.parametrize("change,message", [
    ({"step": "3"}, "entry 'step' must be of type int, got str"),
    ({"tokenizer": None}, "entry 'tokenizer' must be of type dict, got NoneType"),
    ({"model": [1, 2]}, "entry 'model' must be of type dict, got list"),
    ({"model_config": {"vocab_size": 5, "colour": "red"}}, "model_config is not a valid ModelConfig"),
    ({"model_config": {"vocab_size": 5, "d_model": 8, "n_layers": 10 ** 9, "n_heads": 2, "d_ff": 16}},
     "model_config has n_layers=1000000000 but the weights hold 1 blocks"),
    ({"model_config": {"vocab_size": 5, "d_model": 8.0, "n_layers": 1, "n_heads": 2, "d_ff": 16}},
     "model_config d_model must be an integer, got 8.0"),
    ({"model_config": {"vocab_size": 5, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 17}},
     "the stored weights do not fit model_config"),
    ({"model_config": {"vocab_size": 5, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 16, "mixer": "aft-local",
                       "max_len": 10 ** 12}}, "the stored weights do not fit model_config"),
])
def test_a_malformed_checkpoint_is_refused_naming_what_is_wrong(tmp_path, change, message):
    tiny_checkpoint(tmp_path / "model.pt", **change)
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_checkpoint(tmp_path / "model.pt")


def test_a_config_asking_for_more_memory_than_the_machine_has_is_refused(tmp_path, monkeypatch):
    tiny_checkpoint(tmp_path / "model.pt")
    monkeypatch.setattr(runs, "device_memory", lambda device: 1000)  # bytes: fewer than the model's weights
    with pytest.raises(CheckpointError, match="model_config asks for 0 GiB of weights and tables, more than"):
        load_checkpoint(tmp_path / "model.pt")


def test_weights_that_are_not_finite_are_refused_by_generate_and_strip(tmp_path, capsys):
    state = tiny_checkpoint(tmp_path / "model.pt")
    state["model"]["blocks.0.mlp.0.weight"][0, 0] = math.nan
    save_checkpoint(tmp_path / "diverged.pt", state)
    for command in (["generate", "--checkpoint", str(tmp_path / "diverged.pt")],
                    ["strip-checkpoint", str(tmp_path / "diverged.pt"), str(tmp_path / "shared.pt")]):
        assert main(command) == 2
        assert ("the checkpoint's weight blocks.0.mlp.0.weight holds nan or inf values: the run that wrote it diverged"
                in one_error_line(capsys))
    assert not (tmp_path / "shared.pt").exists()

"""aftalibi.train and the command line: schedule, optimizers, checkpoints, exact resumption, Ctrl-C, bad input."""

import math
from dataclasses import fields
from pathlib import Path

import pytest
import torch

import aftalibi.train as training
from aftalibi.data import load_corpus
from aftalibi.__main__ import main
from aftalibi.model import MIXERS, LanguageModel, ModelConfig
from aftalibi.train import (CheckpointError, Optimizers, TrainConfig, cpu_has_bf16_matmul,
                            learning_rate_at, learning_rate_factor, load_checkpoint, make_optimizer, model_from_checkpoint,
                            muon_parameters, save_checkpoint, select_device, train, training_precision)

TINY_MODEL = {"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32}
TEXT = ("ROMEO:\nBut, soft! what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n\n"
        "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n\n") * 60


@pytest.fixture
def corpus_file(tmp_path) -> str:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return str(path)


needs_muon = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch >= 2.9")
# The default optimizer (Muon) needs torch >= 2.9; on an older torch the tests that do not test Muon use AdamW.
OPTIMIZER = "muon" if hasattr(torch.optim, "Muon") else "adamw"


def tiny_run(corpus_file, out_dir, **overrides) -> TrainConfig:
    return TrainConfig(**{"corpus": corpus_file, "seq_len": 16, "batch_size": 4, "max_steps": 12, "eval_every": 4,
                          "eval_windows": 8, "warmup_steps": 2, "optimizer": OPTIMIZER, "out_dir": str(out_dir), **overrides})


def test_learning_rate_schedule():
    config = TrainConfig(max_steps=110, warmup_steps=10, learning_rate=1.0, min_learning_rate=0.1)
    assert learning_rate_at(0, config) == pytest.approx(0.1)
    assert learning_rate_at(9, config) == pytest.approx(1.0)
    assert learning_rate_at(60, config) == pytest.approx(0.55)
    assert learning_rate_at(110, config) == pytest.approx(0.1)
    assert select_device("cpu") == torch.device("cpu")


def test_training_lowers_the_loss_and_checkpoints(corpus_file, tmp_path):
    result = train(TINY_MODEL, tiny_run(corpus_file, tmp_path / "run", max_steps=40, eval_every=20), quiet=True)
    first, last = result["history"][0]["validation_loss"], result["history"][-1]["validation_loss"]
    assert last < first < math.log(36)
    model, tokenizer = model_from_checkpoint(load_checkpoint(Path(result["checkpoint"])))
    assert model.config.vocab_size == len(tokenizer) and load_checkpoint(Path(result["checkpoint"]))["step"] == 40


def test_last_evaluation_scores_every_validation_window_at_eval_seq_len(corpus_file, tmp_path):
    result = train(TINY_MODEL, tiny_run(corpus_file, tmp_path / "run", eval_seq_len=32, eval_windows=2), quiet=True)
    model, _ = model_from_checkpoint(load_checkpoint(Path(result["checkpoint"])))
    validation = load_corpus(corpus_file).tokens("validation")
    assert len(validation) > 3 * 33  # more windows than eval_windows, so the last evaluation differs from the others
    assert result["validation_loss"] == pytest.approx(training.evaluate(model, validation, 32), rel=1e-6)
    assert result["validation_loss"] != pytest.approx(training.evaluate(model, validation, 32, max_windows=2), rel=1e-6)


def test_precision_picks_bf16_autocast_where_the_hardware_has_it(monkeypatch):
    cpu, cuda, mps = torch.device("cpu"), torch.device("cuda"), torch.device("mps")
    assert training_precision("auto", cuda) == "bfloat16" and training_precision("auto", mps) == "float32"
    for native in (True, False):
        monkeypatch.setattr(training, "cpu_has_bf16_matmul", lambda: native)
        assert training_precision("auto", cpu) == ("bfloat16" if native else "float32")
        assert training_precision("float32", cpu) == "float32" and training_precision("float32", cuda) == "float32"
        assert training_precision("bfloat16", cpu) == "bfloat16"
    with pytest.raises(ValueError, match="unknown precision 'fp8'; choose one of auto, float32, bfloat16"):
        TrainConfig(precision="fp8")


def test_a_torch_that_cannot_report_cpu_features_trains_in_float32(monkeypatch):
    monkeypatch.delattr(torch.cpu, "get_capabilities", raising=False)
    assert cpu_has_bf16_matmul() is False
    assert training_precision("auto", torch.device("cpu")) == "float32"


@pytest.mark.parametrize("mixer", ["alibi", "mha", "aft-local", "aft-full", "aft-simple", "aft-conv"])
def test_bf16_autocast_trains_like_float32(corpus_file, tmp_path, mixer):
    """Mixed precision changes the rounding of the projections only: the same run in float32 and in
    bf16 autocast ends within a few hundredths of a nat, and the checkpoint stays float32."""
    model = {**TINY_MODEL, "mixer": mixer, "max_len": 16}
    runs = {precision: train(model, tiny_run(corpus_file, tmp_path / precision, max_steps=30, eval_every=30, eval_seq_len=16,
                                             precision=precision), quiet=True)
            for precision in ("float32", "bfloat16")}
    assert [run["precision"] for run in runs.values()] == ["float32", "bfloat16"]
    full, mixed = runs["float32"]["validation_loss"], runs["bfloat16"]["validation_loss"]
    assert math.isfinite(mixed) and mixed == pytest.approx(full, abs=0.03)
    weights = load_checkpoint(Path(runs["bfloat16"]["checkpoint"]))["model"].values()
    assert all(tensor.dtype == torch.float32 for tensor in weights if tensor.is_floating_point())


@pytest.mark.parametrize("optimizer,precision", [("adamw", "float32"), ("adamw", "bfloat16"),
                                                 pytest.param("muon", "auto", marks=needs_muon)])
def test_resumed_run_reaches_the_same_losses(corpus_file, tmp_path, optimizer, precision):
    straight = train(TINY_MODEL, tiny_run(corpus_file, tmp_path / "straight", optimizer=optimizer, precision=precision),
                     quiet=True)
    config = tiny_run(corpus_file, tmp_path / "resumed", optimizer=optimizer, precision=precision)
    assert train(TINY_MODEL, config, session_steps=6, quiet=True)["step"] == 6  # stops between two evaluations
    resumed = train(TINY_MODEL, config, resume=True, quiet=True)
    assert resumed["step"] == 12
    assert resumed["history"] == straight["history"]


@needs_muon
def test_muon_takes_the_blocks_linear_weights_and_adamw_the_rest():
    for mixer in MIXERS:
        model = LanguageModel(ModelConfig(vocab_size=11, mixer=mixer, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                                          max_len=32, window=4))
        optimizer = make_optimizer(model, TrainConfig(optimizer="muon"))
        assert isinstance(optimizer, Optimizers)
        muon, adamw = optimizer.optimizers
        assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
        names = {id(p): n for n, p in model.named_parameters()}
        in_muon = [names[id(p)] for group in muon.param_groups for p in group["params"]]
        in_adamw = [names[id(p)] for group in adamw.param_groups for p in group["params"]]
        assert sorted(in_muon + in_adamw) == sorted(names.values())  # every parameter exactly once
        assert in_muon == muon_parameters(model) and len(in_muon) == 2 * (6 if mixer.startswith("aft") else 4)
        assert all(n.startswith("blocks.") and n.endswith(".weight") and "norm" not in n for n in in_muon)
        assert "embedding.weight" in in_adamw
        aft_biases = [n for n in in_adamw if n.rsplit(".", 1)[1] in ("u", "v", "band", "kernel", "gamma", "beta")]
        assert (mixer in ("aft-full", "aft-local", "aft-conv")) == bool(aft_biases)
        assert [g["weight_decay"] for g in muon.param_groups] == [0.0]


@needs_muon
def test_each_group_follows_its_own_peak():
    config = TrainConfig(max_steps=110, warmup_steps=10, learning_rate=1e-3, min_learning_rate=1e-4,
                         muon_learning_rate=0.02, optimizer="muon")
    assert learning_rate_factor(60, config) == pytest.approx(0.55)
    assert learning_rate_at(60, config) == pytest.approx(0.55e-3)
    optimizer = make_optimizer(LanguageModel(ModelConfig(vocab_size=11, **TINY_MODEL)), config)
    # Muon's group, then AdamW's undecayed one (with mha every decayed matrix is Muon's)
    assert [g["peak_lr"] for g in optimizer.param_groups] == [0.02, 1e-3]


@needs_muon
def test_muon_trains_and_cannot_resume_an_adamw_run(corpus_file, tmp_path):
    config = tiny_run(corpus_file, tmp_path / "run", max_steps=40, eval_every=20, optimizer="muon")
    result = train(TINY_MODEL, config, quiet=True)
    first, last = result["history"][0]["validation_loss"], result["history"][-1]["validation_loss"]
    assert last < first < math.log(36)
    with pytest.raises(CheckpointError, match="holds the state of optimizer 'muon'.* --optimizer muon"):
        train(TINY_MODEL, tiny_run(corpus_file, tmp_path / "run", max_steps=50, optimizer="adamw"), resume=True, quiet=True)


def test_muon_needs_a_recent_torch(monkeypatch):
    monkeypatch.delattr(torch.optim, "Muon")
    model = LanguageModel(ModelConfig(vocab_size=11, **TINY_MODEL))
    with pytest.raises(ValueError, match=r"optimizer='muon' needs torch >= 2.9"):
        make_optimizer(model, TrainConfig(optimizer="muon"))
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
        TrainConfig(optimizer="sgd")


def test_ctrl_c_saves_a_checkpoint_and_resumes_exactly(corpus_file, tmp_path, monkeypatch, capsys):
    straight = train(TINY_MODEL, tiny_run(corpus_file, tmp_path / "straight"), quiet=True)
    calls = {"n": 0}
    draw = training.random_windows

    def interrupted_draw(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 8:  # Ctrl-C while preparing step 8
            raise KeyboardInterrupt
        return draw(*args, **kwargs)

    monkeypatch.setattr(training, "random_windows", interrupted_draw)
    config = tiny_run(corpus_file, tmp_path / "interrupted")
    assert train(TINY_MODEL, config, quiet=True)["step"] == 7
    assert "interrupted at step 7" in capsys.readouterr().out
    monkeypatch.setattr(training, "random_windows", draw)
    assert train(TINY_MODEL, config, resume=True, quiet=True)["history"] == straight["history"]


def test_checkpoints_are_written_atomically(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"step": 1})

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError):
        save_checkpoint(path, {"step": 2})
    assert load_checkpoint(path)["step"] == 1  # the old checkpoint is intact
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temporary left behind


def test_bad_checkpoints_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        load_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="may be corrupted"):
        load_checkpoint(tmp_path / "garbage.pt")
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not an aftalibi checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="incompatible"):
        model_from_checkpoint({"model_config": {"vocab_size": 5, "colour": "red"}})


def test_resume_with_another_vocabulary_is_refused(corpus_file, tmp_path):
    config = tiny_run(corpus_file, tmp_path / "run", max_steps=4)
    train(TINY_MODEL, config, quiet=True)
    other = tmp_path / "other.txt"
    other.write_text("0123456789 " * 200)
    with pytest.raises(CheckpointError, match="vocabulary of 36 characters, the corpus .* has 11"):
        train(TINY_MODEL, tiny_run(str(other), tmp_path / "run", max_steps=8, eval_seq_len=0), resume=True, quiet=True)


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for cls, skip in ((ModelConfig, {"vocab_size"}), (TrainConfig, set())):
        for field in fields(cls):
            if field.name not in skip:
                assert "--" + field.name.replace("_", "-") in text
                assert field.metadata["help"][:20] in " ".join(text.split())


@pytest.mark.parametrize("arguments,message", [
    (["--corpus", "no/such/file.txt"], "corpus file not found: no/such/file.txt"),
    (["--mixer", "lstm"], "unknown mixer 'lstm'"),
    (["--seq-len", "100000"], "fewer than seq_len"),
    (["--mixer", "mha", "--position", "learned", "--max-len", "8"], "seq_len=16 is longer than this model's max_len=8"),
    (["--mixer", "mha", "--position", "learned", "--max-len", "16", "--eval-seq-len", "32"], "eval_seq_len=32 is longer than this model's max_len=16"),
    (["--eval-seq-len", "-1"], "eval_seq_len must be >= 0, got -1"),
    (["--eval-seq-len", "100000"], "fewer than eval_seq_len + 1 = 100001"),
])
def test_cli_bad_input_is_one_line_and_leaves_no_files(corpus_file, tmp_path, capsys, arguments, message):
    out_dir = tmp_path / "run"
    base = ["train", "--corpus", corpus_file, "--seq-len", "16", "--out-dir", str(out_dir), "--max-steps", "2",
            "--optimizer", OPTIMIZER]
    assert main(base + arguments) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1
    assert not out_dir.exists()


def test_cli_train_then_generate(corpus_file, tmp_path, capsys):
    out_dir = tmp_path / "run"
    arguments = ["train", "--corpus", corpus_file, "--seq-len", "16", "--batch-size", "4", "--max-steps", "4",
                 "--eval-every", "2", "--eval-windows", "4", "--d-model", "16", "--n-layers", "1", "--n-heads", "2",
                 "--d-ff", "32", "--optimizer", OPTIMIZER, "--out-dir", str(out_dir), "--sample", "20"]
    assert main(arguments) == 0
    assert "validation loss" in capsys.readouterr().out
    assert main(["generate", "--checkpoint", str(out_dir / "checkpoint.pt"), "--prompt", "ROMEO:", "--max-new-tokens", "30"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")
    (tmp_path / "broken.pt").write_bytes(b"\x00" * 10)
    assert main(["generate", "--checkpoint", str(tmp_path / "broken.pt")]) == 2
    assert "may be corrupted" in capsys.readouterr().err

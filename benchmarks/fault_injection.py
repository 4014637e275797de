"""Stop tiny training runs with signals at random or aimed moments and count what was lost.

Each trial starts `python -m aftalibi train` on a terminal (a pty, so the live progress line names
every step as it finishes) and stops it in one of four ways (`--cases`):

- SIGTERM or SIGKILL a random time after its first step (during a step, an evaluation or the
  writing of a checkpoint);
- a double SIGINT: two Ctrl-Cs 1 to 10 ms apart at a random moment, the second landing while the first
  one's checkpoint is being saved;
- SIGTERM during an evaluation: aimed by watching the output for the progress line of an
  evaluation's step (the evaluation starts right after it), on a corpus and a number of
  validation windows large enough that an evaluation takes a good fraction of a second; half of
  these trials aim at a periodic evaluation, half at the final one (which scores every window).

Then it looks at the run's folder:

- runs lost: the folder holds no loadable checkpoint although the run had one to keep (SIGTERM: it
  had begun training, and saves on the signal; SIGKILL: it had gone past its first evaluation);
- steps lost: the last step the run reported minus the step of its checkpoint (0 before training);
- stray files: temporary files (`.*.tmp`) left in the folder, right after the kill and after the
  next run there (`--resume`, or `--overwrite` where no checkpoint was written), which must take
  over the lock of the killed process and remove them;
- loadable checkpoints: checkpoints that `load_checkpoint` reads (checksum and structure checked);
- saves missed: a signal that saves (SIGTERM, SIGINT) left a checkpoint behind the last step the
  run reported, so the steps in between are lost although the run had time to save them;
- evaluations lost (SIGTERM during an evaluation, when it landed before that evaluation's line was
  printed): the history of the checkpoint after the next run holds no entry for the evaluation's
  step; a run that stopped during an evaluation must redo it on --resume.

    python benchmarks/fault_injection.py --trials 20
    python benchmarks/fault_injection.py --cases double-sigint sigterm-evaluation --trials 10
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
CASES = ("SIGTERM", "SIGKILL", "double SIGINT", "SIGTERM in evaluation")
OPTION_CASES = {case.lower().replace(" ", "-").replace("-in-", "-"): case for case in CASES}
# SIGTERM during an evaluation: 300 validation windows of 128 characters at a periodic evaluation (every 4 steps),
# every window of the validation split (about 20,000 characters of the corpus below) at the final one (step 8).
EVALUATION = {"windows": "300", "seq_len": "128", "every": 4, "max_steps": 8, "copies": 1500}


def run_on_a_terminal(arguments: list[str], kill_after: float | None, kill_signal: int, *, second_after: float | None = None,
                      aim: str = "step ") -> tuple[int, str]:
    """Run `python -m aftalibi ARGUMENTS` with a pty as stdout and stderr; send `kill_signal` `kill_after` seconds
    after it prints `aim` (by default its first step; None: let it end), and again `second_after` seconds later
    when that is given. Returns the exit status and everything it printed."""
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
        while process.poll() is None and aim not in "".join(printed) and time.monotonic() - started < 300:
            time.sleep(0.001)  # start-up (imports, the corpus, the model) takes seconds on a busy machine
        try:
            process.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            process.send_signal(kill_signal)
            if second_after is not None:
                time.sleep(second_after)
                if process.poll() is None:
                    process.send_signal(kill_signal)
    status = process.wait(timeout=300)
    reader.join(timeout=30)
    os.close(controller)
    return status, "".join(printed)


def temporaries(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.tmp")) if folder.is_dir() else []


def trial(folder: Path, corpus: Path, case: str, kill_after: float, eval_every: int, aimed_step: int = 0,
          gap: float = 0.001) -> dict:
    """One run stopped as `case` says, then the next run in its folder. For "SIGTERM in evaluation", `aimed_step` is
    the step whose evaluation the signal aims at (EVALUATION's max_steps: the final one), `corpus` the large one;
    for "double SIGINT", `gap` is the time between the two signals."""
    kill_signal = {"SIGKILL": signal.SIGKILL, "double SIGINT": signal.SIGINT}.get(case, signal.SIGTERM)
    model, max_steps, aim = MODEL, 1000000, "step "
    if case == "SIGTERM in evaluation":
        model = [*MODEL, "--eval-windows", EVALUATION["windows"], "--eval-seq-len", EVALUATION["seq_len"]]
        max_steps, eval_every = EVALUATION["max_steps"], EVALUATION["every"]
        aim = f"step {aimed_step}/{max_steps} "  # the progress line printed just before that step's evaluation
    arguments = ["train", "--corpus", str(corpus), *model, "--max-steps", str(max_steps), "--eval-every",
                 str(eval_every), "--log-every", "1", "--out-dir", str(folder)]
    status, printed = run_on_a_terminal(arguments, kill_after, kill_signal, aim=aim,
                                        second_after=gap if case == "double SIGINT" else None)
    steps = [int(step) for step in re.findall(r"step (\d+)/", printed)]
    last_step = max(steps, default=0)  # the last step the run reported finished
    stopped = re.search(r"(?:stopped by SIGTERM|interrupted) at step (\d+)", printed)
    if stopped:
        last_step = max(last_step, int(stopped.group(1)))
    # the evaluation aimed at had not printed its line when the signal came (it printed none after)
    in_evaluation = (case == "SIGTERM in evaluation" and status == 143
                     and not re.search(rf"step {aimed_step}/{max_steps} .*validation", printed))
    checkpoint = folder / "checkpoint.pt"
    saved_step, loadable = None, None
    if checkpoint.exists():
        try:
            saved_step, loadable = load_checkpoint(checkpoint)["step"], True
        except CheckpointError:
            loadable = False
    saves = kill_signal != signal.SIGKILL  # the run saves a checkpoint at the step it stopped at
    # SIGKILL: a run that reported its first checkpoint's step may have been killed in that save.
    had_one_to_keep = last_step >= 1 if saves else last_step > eval_every
    stray = temporaries(folder)
    # The next run in the folder takes over the lock the killed process may have left and removes its temporaries.
    next_run = ["train", "--out-dir", str(folder), "--session-steps", "1", "--sample", "0", "--threads", "1"]
    if saved_step is None:
        next_run = ["train", "--corpus", str(corpus), *MODEL, "--max-steps", "1", "--out-dir", str(folder),
                    "--overwrite"]
    else:
        next_run.append("--resume")
    next_status, next_printed = run_on_a_terminal(next_run, None, 0)
    evaluation_lost = None
    if in_evaluation:
        try:
            history = load_checkpoint(checkpoint)["history"]
        except (CheckpointError, KeyError):
            history = []
        evaluation_lost = aimed_step not in [entry["step"] for entry in history]
    return {"case": case, "after": kill_after, "status": status, "last_step": last_step,
            "saved_step": saved_step, "loadable": loadable, "lost": had_one_to_keep and not loadable,
            "steps_lost": last_step - (saved_step or 0), "save_missed": saves and last_step > (saved_step or 0),
            "aimed_step": aimed_step, "in_evaluation": in_evaluation, "evaluation_lost": evaluation_lost,
            "stray": len(stray), "stray_after_next_run": len(temporaries(folder)), "next_run_ok": next_status == 0,
            "next_run_output": next_printed if next_status else ""}


def table(trials: list[dict], eval_every: int) -> str:
    rows = ["| signal | trials | exit status | runs lost | steps lost (max / mean) | saves missed | "
            "stray files after the kill | after the next run | loadable checkpoints | next run took over | "
            "evaluations lost |",
            "|---|---:|---|---:|---|---:|---:|---:|---|---:|---|"]
    for name in CASES:
        group = [t for t in trials if t["case"] == name]
        if not group:
            continue
        statuses = ", ".join(sorted({str(t["status"]) for t in group}))
        lost = [t["steps_lost"] for t in group]
        written = [t for t in group if t["loadable"] is not None]
        missed = "n/a" if name == "SIGKILL" else str(sum(t["save_missed"] for t in group))
        aimed = [t for t in group if t["in_evaluation"]]
        evaluations = ("n/a" if name != "SIGTERM in evaluation" else
                       f"{sum(t['evaluation_lost'] for t in aimed)} of {len(aimed)}")
        rows.append(f"| {name} | {len(group)} | {statuses} | {sum(t['lost'] for t in group)} | "
                    f"{max(lost)} / {statistics.mean(lost):.1f} | {missed} | {sum(t['stray'] for t in group)} | "
                    f"{sum(t['stray_after_next_run'] for t in group)} | "
                    f"{sum(bool(t['loadable']) for t in written)} of {len(written)} | "
                    f"{sum(t['next_run_ok'] for t in group)} of {len(group)} | {evaluations} |")
    return "\n".join(rows) + (
        f"\n\n(evaluation and checkpoint every {eval_every} step{'s' if eval_every != 1 else ''}, during an evaluation "
        f"every {EVALUATION['every']} of {EVALUATION['max_steps']}; exit status -9 is SIGKILL; evaluations lost: of the "
        "signals that landed during an evaluation, those whose step has no entry in the history after the next run)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20,
                        help="runs to stop in all, shared evenly among the cases (default: 20, 5 per case)")
    parser.add_argument("--cases", nargs="+", choices=list(OPTION_CASES), default=list(OPTION_CASES),
                        help="how the runs are stopped (default: all four)")
    parser.add_argument("--eval-every", type=int, default=10, help="steps between two checkpoints of each run")
    parser.add_argument("--earliest", type=float, default=0.0, help="earliest kill, in seconds after the first step")
    parser.add_argument("--latest", type=float, default=5.0, help="latest kill, in seconds after the first step")
    parser.add_argument("--seed", type=int, default=0, help="seed of the signals' order and moments")
    args = parser.parse_args()
    cases = [OPTION_CASES[name] for name in dict.fromkeys(args.cases)]
    if args.trials < len(cases) or not 0 <= args.earliest <= args.latest:
        parser.error(f"need --trials >= {len(cases)} (one per case) and 0 <= --earliest <= --latest")
    chance = random.Random(args.seed)
    plan = (cases * args.trials)[:args.trials]
    chance.shuffle(plan)
    with tempfile.TemporaryDirectory() as work:
        corpus, large = Path(work) / "corpus.txt", Path(work) / "large.txt"
        corpus.write_text(SPEECHES * 60, encoding="utf-8")
        large.write_text(SPEECHES * EVALUATION["copies"], encoding="utf-8")
        trials, aims = [], 0
        for number, case in enumerate(plan):
            if case == "SIGTERM in evaluation":  # a periodic evaluation and the final one in turn, right after its line
                aimed_step = EVALUATION["every"] if aims % 2 == 0 else EVALUATION["max_steps"]
                kill_after, aims = chance.uniform(0, 0.05), aims + 1
                result = trial(Path(work) / f"run{number}", large, case, kill_after, args.eval_every, aimed_step)
                moment = f"{1000 * kill_after:.0f} ms after the line of step {aimed_step}"
            else:
                # the second Ctrl-C 1 to 10 ms after the first: while the first one's checkpoint is being saved
                kill_after, gap = chance.uniform(args.earliest, args.latest), chance.uniform(0.001, 0.010)
                result = trial(Path(work) / f"run{number}", corpus, case, kill_after, args.eval_every, gap=gap)
                moment = f"{kill_after:.1f} s after the first step"
                if case == "double SIGINT":
                    moment += f" (the second {1000 * gap:.1f} ms later)"
            trials.append(result)
            evaluation = ("" if result["evaluation_lost"] is None else
                          f", evaluation of step {aimed_step} {'LOST' if result['evaluation_lost'] else 'kept'}")
            print(f"trial {number + 1}/{len(plan)}: {case} {moment}: exit {result['status']}, "
                  f"step {result['last_step']}, checkpoint {result['saved_step']}{evaluation}, "
                  f"{result['stray']} stray file(s), "
                  f"next run {'ok' if result['next_run_ok'] else 'FAILED: ' + result['next_run_output'][-300:]}",
                  flush=True)
    print()
    print(table(trials, args.eval_every))
    start = time.strftime("%Y-%m-%d", time.gmtime())
    print(f"\n{len(trials)} trials on {start}, python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()

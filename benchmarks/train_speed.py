"""Training throughput: tokens per second of full optimizer steps (forward, backward, AdamW).

    python benchmarks/train_speed.py [--steps 10] [--threads 2]

Runs two small models, one AFT-local and one ALiBi, side by side and prints our tokens/s next to
those of a straightforward implementation of the same models (dense AFT-local biases, ALiBi with an
explicit softmax), measured earlier on the same 2-core CPUs:
AFT-local (6 layers, d_model 128, d_ff 256, window 32, T=256, batch 32): 11.9k tokens/s;
ALiBi (4 layers, d_model 128, 8 heads, d_ff 512, T=64, batch 128): 5.3k tokens/s.
Each configuration runs twice, in float32 and with the forward pass under bf16 autocast (what
the trainer's --precision auto picks on CPUs with bf16 dot-product instructions). Each figure is
the median step time over --steps steps after two warm-up steps, random tokens from an
80-character vocabulary.
"""

import argparse
import statistics
import time

import torch

from aftalibi.model import LanguageModel, ModelConfig
from aftalibi.train import TrainConfig, cpu_has_bf16_matmul, make_optimizer

CONFIGURATIONS = {
    "aft-local": (dict(mixer="aft-local", n_layers=6, d_model=128, d_ff=256, window=32, max_len=256), 256, 32, 11_900),
    "alibi": (dict(mixer="alibi", n_layers=4, d_model=128, n_heads=8, d_ff=512), 64, 128, 5_300),
}


def timed_step(model, optimizer, inputs, targets, bf16: bool) -> float:
    """Seconds of one training step: forward (under bf16 autocast if asked), backward, clip, optimizer."""
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        _, loss = model(inputs, targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return time.perf_counter() - start


def tokens_per_second(model_options: dict, seq_len: int, batch_size: int, steps: int, bf16: bool) -> float:
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(vocab_size=80, **model_options))
    optimizer = make_optimizer(model, TrainConfig(optimizer="adamw"))
    inputs, targets = torch.randint(0, 80, (2, batch_size, seq_len))
    times = [timed_step(model, optimizer, inputs, targets, bf16) for _ in range(steps + 2)][2:]  # after 2 warm-ups
    return batch_size * seq_len / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    native = cpu_has_bf16_matmul()
    print(f"bf16 dot-product instructions on this CPU: {'yes' if native else 'no (bf16 is emulated, slowly)'}; "
          f"the trainer's --precision auto uses {'bf16 autocast' if native else 'float32'} here")
    print(f"{'configuration':>14} {'float32':>12} {'bf16 autocast':>14} {'naive':>12} {'float32/naive':>14} {'bf16/naive':>11}")
    for name, (options, seq_len, batch_size, naive) in CONFIGURATIONS.items():
        full, mixed = (tokens_per_second(options, seq_len, batch_size, args.steps, bf16) for bf16 in (False, True))
        print(f"{name:>14} {full:>10,.0f}/s {mixed:>12,.0f}/s {naive:>10,d}/s {full / naive:>13.2f}x {mixed / naive:>10.2f}x")


if __name__ == "__main__":
    main()

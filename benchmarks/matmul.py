"""How fast this CPU multiplies the training's matrices in float32 and in bf16, side by side.

    python benchmarks/matmul.py [--shape 8192 128 256] [--threads 2] [--repeats 20]

Times `torch.matmul` of an `[M, K]` by a `[K, N]` matrix (by default the shape of a linear layer
of the demo model on a batch of 32 x 256 tokens) in float32 and in bf16, and prints GFLOP/s
(2 M K N floating-point operations per product) and their ratio. It is the measurement behind the
trainer's `--precision auto`: on CPUs with AVX512-BF16 or AMX, bf16 products run through oneDNN
and are several times faster than float32; elsewhere bf16 is emulated and slower. Each figure is
the median of --repeats products after one warm-up, the two dtypes interleaved so that both see
the same machine load.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from aftalibi.train import cpu_has_bf16_matmul  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=int, nargs=3, default=(8192, 128, 256), metavar=("M", "K", "N"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    m, k, n = args.shape
    torch.manual_seed(0)
    left, right = torch.randn(m, k), torch.randn(k, n)  # [M, K], [K, N]
    pairs = {dtype: (left.to(dtype), right.to(dtype)) for dtype in (torch.float32, torch.bfloat16)}
    times = {dtype: [] for dtype in pairs}
    for dtype, (a, b) in pairs.items():
        a @ b  # warm-up: oneDNN builds its kernel for this shape once
    for _ in range(args.repeats):
        for dtype, (a, b) in pairs.items():
            start = time.perf_counter()
            a @ b
            times[dtype].append(time.perf_counter() - start)
    gflops = {dtype: 2 * m * k * n / statistics.median(seconds) / 1e9 for dtype, seconds in times.items()}
    print(f"[{m}, {k}] x [{k}, {n}], {args.threads} threads; CPU bf16 instructions: {cpu_has_bf16_matmul()}")
    for dtype, rate in gflops.items():
        print(f"  {str(dtype).removeprefix('torch.'):>9}: {rate:8.1f} GFLOP/s")
    print(f"  bf16 / float32: {gflops[torch.bfloat16] / gflops[torch.float32]:.2f}x")


if __name__ == "__main__":
    main()

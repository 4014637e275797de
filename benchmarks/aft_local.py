"""Time and measure one causal AFT-local layer, fwd + bwd, dense against fast, side by side.

    python benchmarks/aft_local.py [--lengths 4096 8192] [--threads 2]

Three layers on the same input (B=4, d=256, s=32 by default, float32), each including its four
d x d projections (W_Q, W_K, W_V, W_O):

- dense: the naive AFT-local, a `[T, T]` matrix exp(w') (w' = w inside the window, 0 outside,
  -inf above the diagonal) times exp(K - max K) * V, with one max over the whole sequence;
- fast: `aftalibi.aft.AFTLocal` (blocks of max(s, 64) queries: running totals plus a band of
  expm1(w) as batched matmuls, recomputed in a hand-written backward pass);
- projections: the four projections alone, the floor of any such layer.

Time: for each T one child process builds the layers, warms each up once, then runs --repeats
rounds of one fwd+bwd of every layer in turn and takes each layer's median, so that a busy spell of
a shared machine slows all of them alike. Peak memory: each (layer, T) runs in a fresh child
process; the figure is the growth of the process's peak resident set size (`ru_maxrss`) over one
fwd+bwd, see `measure.py`.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn as nn
from measure import Projections, add_cpu_options, interleaved_medians, plain_aft, seconds_and_peak_mib, set_up_cpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # measure the aftalibi of this checkout


class DenseAFTLocal(nn.Module):
    """The naive dense AFT-local layer: builds the `[T, T]` matrix exp(w')."""

    def __init__(self, d_model: int, max_len: int, window: int):
        super().__init__()
        self.to_q, self.to_k, self.to_v, self.out = (nn.Linear(d_model, d_model) for _ in range(4))
        self.w = nn.Parameter(torch.zeros(max_len, max_len))
        self.window = window

    def forward(self, x):
        length = x.shape[1]
        q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        distance = torch.arange(length)[:, None] - torch.arange(length)[None, :]  # t - t'
        w = self.w[:length, :length].masked_fill(distance.abs() >= self.window, 0.0)
        w = w.masked_fill(distance < 0, float("-inf"))  # causal
        return self.out(plain_aft(q, k, v, w))


def make_layer(name: str, d_model: int, length: int, window: int) -> nn.Module:
    from aftalibi.aft import AFTLocal
    if name == "dense":
        return DenseAFTLocal(d_model, length, window)
    if name == "fast":
        return AFTLocal(d_model, length, window, causal=True)
    return Projections(d_model)


def layer_step(name: str, batch: int, d_model: int, length: int, window: int):
    """A fresh seeded layer `name` and its input; returns one fwd+bwd step."""
    torch.manual_seed(0)
    layer = make_layer(name, d_model, length, window)
    x = torch.randn(batch, length, d_model, requires_grad=True)
    return lambda: layer(x).sum().backward()


def child(names: list[str], length: int, args) -> dict:
    """Run in a fresh process: {name: median seconds} of the layers timed in turn (several names), or
    {"peak_mib": ...} of one layer's first fwd+bwd (one name)."""
    torch.set_num_threads(args.threads)
    steps = {name: layer_step(name, args.batch, args.d_model, length, args.window) for name in names}
    if len(names) > 1:
        return interleaved_medians(steps, args.repeats)
    return {"peak_mib": seconds_and_peak_mib(steps[names[0]], repeats=1)["peak_mib"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    add_cpu_options(parser)
    parser.add_argument("--dense-up-to", type=int, default=4096, help="skip the dense layer above this T")
    parser.add_argument("--worker", nargs=2, metavar=("LAYERS", "T"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    cpu = set_up_cpu(args)  # in the parent and in every worker, the process that measures
    if args.worker:
        print(json.dumps(child(args.worker[0].split(","), int(args.worker[1]), args)))
        return
    print(cpu)
    print(f"fwd+bwd of one causal AFT-local layer, B={args.batch}, d={args.d_model}, s={args.window}, "
          f"{args.threads} threads, float32; median of {args.repeats} interleaved rounds")

    def run(names: list[str], length: int) -> dict:
        command = [sys.executable, __file__, "--worker", ",".join(names), str(length), "--batch", str(args.batch),
                   "--d-model", str(args.d_model), "--window", str(args.window),
                   "--repeats", str(args.repeats), "--threads", str(args.threads)] + (
                   ["--keep-subnormals"] if args.keep_subnormals else [])
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        return json.loads(output.strip().splitlines()[-1])

    results = {}
    for length in args.lengths:
        names = (["dense"] if length <= args.dense_up_to else []) + ["fast", "projections"]
        seconds = run(names, length)  # timed side by side, interleaved
        for name in names:
            results[name, length] = {"seconds": seconds[name], **run([name], length)}
    print(f"{'T':>6} {'dense':>16} {'fast':>16} {'projections':>16} {'dense/fast time':>16} "
          f"{'fast/dense mem':>15} {'fast/proj':>10}")
    for length in args.lengths:
        fast, proj = results["fast", length], results["projections", length]
        dense = results.get(("dense", length))
        cell = lambda r: f"{r['seconds']:.3f}s {r['peak_mib']:>5.0f}MiB"  # noqa: E731
        # Past --dense-up-to the dense layer is not run: its columns and ratios show '-'.
        speedup = f"{dense['seconds'] / fast['seconds']:.1f}x" if dense else "-"
        memory = f"{fast['peak_mib'] / dense['peak_mib']:.2f}" if dense else "-"
        print(f"{length:>6} {cell(dense) if dense else '-':>16} {cell(fast):>16} {cell(proj):>16} "
              f"{speedup:>16} {memory:>15} {fast['seconds'] / proj['seconds']:>9.2f}x")
    for shorter, longer in zip(args.lengths, args.lengths[1:]):
        ratio = results["fast", longer]["seconds"] / results["fast", shorter]["seconds"]
        print(f"fast time T={longer} / T={shorter}: {ratio:.2f} (linear in T: {longer / shorter:.1f})")


if __name__ == "__main__":
    main()

"""Time and peak memory of one causal ALiBi attention layer, fwd + bwd, against its yardsticks.

    flock /tmp/aftalibi-bench.lock .venv/bin/python benchmarks/alibi_attention.py [--lengths 1024 2048 4096]

Three layers with the same projections (qkv Linear to 3 d, out Linear), SPEC.md's shapes
(B=4, d=256, H=8, fp32):
- plain: `MultiHeadAttention` (no positions), i.e. `scaled_dot_product_attention(is_causal=True)`;
- alibi: `AlibiMultiHeadAttention`, whose causal path keeps the `is_causal=True` kernel and carries
  the bias as one per-key row m (j - c) shared by all queries (see `aftalibi.alibi`);
- naive: explicit softmax with the `[B, H, T, T]` ALiBi bias (run up to --naive-max, it is slow).

Time: for each T one child process builds the layers, warms each up once, then runs --repeats rounds
of one fwd + bwd step of every layer in turn and takes each layer's median; interleaving puts every
layer under the same machine load, so the ratios hold even on a busy machine. Peak memory: each
(layer, T) runs in a fresh child process; peak = the process's maximum resident set size (getrusage
ru_maxrss) after one fwd + bwd minus its resident set just before it, so it counts every byte the
step touched (activations, the autograd graph, kernel workspaces) whichever allocator made it, and
nothing of another measurement. Ratios are against the plain layer measured in the same run.
"""

import argparse
import json
import math
import statistics
import subprocess
import sys
import time

import torch
from measure import seconds_and_peak_mib


def naive_layer(d_model: int, n_heads: int) -> torch.nn.Module:
    from aftalibi.alibi import alibi_bias, get_slopes

    class NaiveAlibi(torch.nn.Module):
        """The straightforward layer: explicit scores + bias, softmax, weights @ v."""

        def __init__(self):
            super().__init__()
            self.n_heads, self.d_head = n_heads, d_model // n_heads
            self.qkv, self.out = torch.nn.Linear(d_model, 3 * d_model), torch.nn.Linear(d_model, d_model)
            self.register_buffer("slopes", get_slopes(n_heads))

        def forward(self, x):
            batch, length, d = x.shape
            q, k, v = self.qkv(x).view(batch, length, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head) + alibi_bias(self.slopes, length, length)
            y = torch.softmax(scores, dim=-1) @ v  # [B, H, T, d_head]
            return self.out(y.transpose(1, 2).reshape(batch, length, d))

    return NaiveAlibi()


def build(kind: str, d_model: int, n_heads: int) -> torch.nn.Module:
    from aftalibi.alibi import AlibiMultiHeadAttention
    from aftalibi.attention import MultiHeadAttention

    if kind == "plain":
        return MultiHeadAttention(d_model, n_heads)
    if kind == "alibi":
        return AlibiMultiHeadAttention(d_model, n_heads)
    return naive_layer(d_model, n_heads)


def layer_step(kind: str, length: int, args):
    """A fresh seeded layer of `kind` and its input; returns one fwd + bwd step."""
    torch.manual_seed(0)
    layer = build(kind, args.d_model, args.heads)
    x = torch.randn(args.batch, length, args.d_model, requires_grad=True)

    def step():
        layer(x).sum().backward()

    return step


def peak_memory(kind: str, length: int, args) -> dict:
    """Run in a fresh child process: the peak memory of the layer's first fwd + bwd step."""
    torch.set_num_threads(args.threads)
    return {"peak_mib": seconds_and_peak_mib(layer_step(kind, length, args), repeats=1)["peak_mib"]}


def interleaved_seconds(kinds: list[str], length: int, args) -> dict:
    """Run in a child process: {kind: median seconds of one fwd + bwd}, the layers timed in turn each round."""
    torch.set_num_threads(args.threads)
    steps = {kind: layer_step(kind, length, args) for kind in kinds}
    for step in steps.values():  # warm-up
        step()
    times = {kind: [] for kind in kinds}
    for _ in range(args.repeats):
        for kind, step in steps.items():
            start = time.perf_counter()
            step()
            times[kind].append(time.perf_counter() - start)
    return {kind: statistics.median(seconds) for kind, seconds in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--naive-max", type=int, default=2048, help="longest T for the slow naive layer")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "T"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, length = args.child[0], int(args.child[1])
        result = (interleaved_seconds(kind.split(","), length, args) if "," in kind
                  else peak_memory(kind, length, args))
        print(json.dumps(result))
        return

    def run(kind: str, length: int) -> dict:
        command = [sys.executable, __file__, "--child", kind, str(length)] + [
            f"--{name}={getattr(args, name.replace('-', '_'))}" for name in ("batch", "d-model", "heads", "repeats", "threads")]
        return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)

    print(f"B={args.batch} d={args.d_model} H={args.heads} fp32 fwd+bwd, {args.threads} threads, "
          f"torch {torch.__version__}; median of {args.repeats} interleaved rounds")
    print(f"{'T':>5} | {'plain SDPA':>18} | {'ALiBi layer':>18} | {'naive ALiBi':>18} | "
          f"{'alibi/plain time':>16} {'alibi/plain mem':>15} | {'naive/alibi time':>16}")
    for length in args.lengths:
        kinds = ["plain", "alibi"] + (["naive"] if length <= args.naive_max else [])
        seconds = run(",".join(kinds), length)  # timed side by side, interleaved
        result = {kind: {"seconds": seconds[kind], **run(kind, length)} for kind in kinds}
        plain, alibi, naive = result["plain"], result["alibi"], result.get("naive")
        cell = lambda r: "-" if r is None else f"{r['seconds']:.3f} s {r['peak_mib']:6.0f} MiB"
        speedup = "-" if naive is None else f"{naive['seconds'] / alibi['seconds']:.1f}x"
        print(f"{length:>5} | {cell(plain):>18} | {cell(alibi):>18} | {cell(naive):>18} | "
              f"{alibi['seconds'] / plain['seconds']:>15.2f}x {alibi['peak_mib'] / plain['peak_mib']:>14.2f}x | {speedup:>16}")


if __name__ == "__main__":
    main()

"""Time and peak memory of one causal ALiBi attention layer, fwd + bwd, against its yardsticks.

    flock /tmp/aftalibi-bench.lock .venv/bin/python benchmarks/alibi_attention.py [--lengths 1024 2048 4096]
    flock /tmp/aftalibi-bench.lock .venv/bin/python benchmarks/alibi_attention.py --flex --lengths 2048

Three layers with the same projections (qkv Linear to 3 d, out Linear), B=4, d=256, H=8, fp32:
- plain: `MultiHeadAttention` (no positions), i.e. `scaled_dot_product_attention(is_causal=True)`;
- alibi: `AlibiMultiHeadAttention`, whose causal path keeps the `is_causal=True` kernel and carries
  the bias as one per-key row m (j - c) shared by all queries (see `aftalibi.alibi_kernels`);
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
import subprocess
import sys
import time

import torch
from measure import add_cpu_options, interleaved_medians, plain_attention, seconds_and_peak_mib, set_up_cpu


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
            y = plain_attention(q, k, v, alibi_bias(self.slopes, length, length))  # [B, H, T, d_head]
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
    return interleaved_medians({kind: layer_step(kind, length, args) for kind in kinds}, args.repeats)


def flex_inference(length: int, args) -> dict:
    """No-grad forward on `[B, H, T, d_head]`: plain causal SDPA, `alibi_attention`, compiled FlexAttention.

    FlexAttention gets the ALiBi bias as a score_mod and causality as a block mask; it is compiled once,
    its compile time reported apart from the medians. Its CPU backward is tried, the exception reported.
    """
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from aftalibi.alibi import alibi_attention, get_slopes

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    q, k, v = (torch.randn(args.batch, args.heads, length, args.d_model // args.heads) for _ in range(3))
    slopes = get_slopes(args.heads)

    def alibi_score(score, batch, head, query, key):
        return score - slopes[head] * (query - key)

    causal = create_block_mask(lambda batch, head, query, key: key <= query, None, None, length, length, device="cpu")
    flex = torch.compile(flex_attention)
    steps = {"plain": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             "alibi": lambda: alibi_attention(q, k, v, slopes),
             "flex": lambda: flex(q, k, v, score_mod=alibi_score, block_mask=causal)}
    with torch.no_grad():
        start = time.perf_counter()
        flex_out = steps["flex"]()
        compile_seconds = time.perf_counter() - start
        max_difference = (flex_out - steps["alibi"]()).abs().max().item()
        seconds = interleaved_medians(steps, args.repeats)
    try:
        flex_attention(q.requires_grad_(True), k, v, score_mod=alibi_score, block_mask=causal).sum().backward()
        backward = "works"
    except NotImplementedError as error:
        backward = f"NotImplementedError: {error}"
    return {"seconds": seconds, "compile_seconds": compile_seconds, "max_difference": max_difference,
            "backward": backward}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    add_cpu_options(parser)
    parser.add_argument("--naive-max", type=int, default=2048, help="longest T for the slow naive layer")
    parser.add_argument("--flex", action="store_true",
                        help="instead: no-grad forward of alibi_attention vs compiled FlexAttention (CPU inference)")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "T"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    cpu = set_up_cpu(args)  # in the parent and in every child, the process that measures
    if args.child:
        kind, length = args.child[0], int(args.child[1])
        if kind == "flex":
            result = flex_inference(length, args)
        elif "," in kind:
            result = interleaved_seconds(kind.split(","), length, args)
        else:
            result = peak_memory(kind, length, args)
        print(json.dumps(result))
        return

    def run(kind: str, length: int) -> dict:
        command = [sys.executable, __file__, "--child", kind, str(length)] + [
            f"--{name}={getattr(args, name.replace('-', '_'))}" for name in ("batch", "d-model", "heads", "repeats", "threads")] + (
            ["--keep-subnormals"] if args.keep_subnormals else [])
        return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)

    print(cpu)
    if args.flex:
        print(f"B={args.batch} d={args.d_model} H={args.heads} fp32 no-grad forward, {args.threads} threads, "
              f"torch {torch.__version__}; median of {args.repeats} interleaved rounds")
        for length in args.lengths:
            flex = run("flex", length)
            seconds = flex["seconds"]
            print(f"T={length}: plain SDPA {seconds['plain']:.3f} s, alibi_attention {seconds['alibi']:.3f} s, "
                  f"compiled FlexAttention {seconds['flex']:.3f} s (compile {flex['compile_seconds']:.0f} s), "
                  f"flex/alibi {seconds['flex'] / seconds['alibi']:.2f}x, max |flex - alibi| "
                  f"{flex['max_difference']:.1e}; FlexAttention backward on CPU: {flex['backward']}")
        return
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

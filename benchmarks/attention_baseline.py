"""Time one causal softmax-attention layer three ways, fwd + bwd, side by side.

    python benchmarks/attention_baseline.py [--lengths 1024 2048] [--threads 2]

Compares the explicit-softmax reference (`attention_reference`, which builds the T x T
weights), `scaled_dot_product_attention` with a boolean causal mask, and the fused
`is_causal=True` path that `aftalibi.attention.attention` takes when there is no padding.
Shapes as in the other layer benchmarks: B=4, d=256, H=8. Each figure is the median of --repeats
runs after one warm-up; ratios are relative to the fused causal path measured in the same run.
"""

import argparse
import torch
import torch.nn.functional as F

from aftalibi.attention import attention_reference, causal_mask
from measure import add_cpu_options, median_seconds, set_up_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    add_cpu_options(parser)
    args = parser.parse_args()
    print(set_up_cpu(args))
    d_head = args.d_model // args.heads
    print(f"fwd+bwd of causal attention, B={args.batch}, H={args.heads}, d_head={d_head}, {args.threads} threads")
    print(f"{'T':>6} {'explicit':>10} {'bool mask':>10} {'is_causal':>10} {'explicit/fused':>15} {'mask/fused':>11}")
    for length in args.lengths:
        q, k, v = (torch.randn(args.batch, args.heads, length, d_head, requires_grad=True) for _ in range(3))
        mask = causal_mask(length)
        variants = {
            "explicit": lambda: attention_reference(q, k, v, causal=True),
            "bool mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
            "is_causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        }
        seconds = {name: median_seconds(lambda f=f: f().sum().backward(), args.repeats) for name, f in variants.items()}
        fused = seconds["is_causal"]
        print(f"{length:>6} {seconds['explicit']:>9.3f}s {seconds['bool mask']:>9.3f}s {fused:>9.3f}s "
              f"{seconds['explicit'] / fused:>14.1f}x {seconds['bool mask'] / fused:>10.1f}x")


if __name__ == "__main__":
    main()

"""Training throughput: tokens per second of full optimizer steps (forward, backward, AdamW).

    python benchmarks/train_speed.py [--steps 10] [--threads 2] [--configurations alibi ...]

Runs two small models, one AFT-local and one ALiBi, each at its training length and at a longer
one, and prints our tokens/s next to those of a plain implementation of the same models, measured
in the same run: the same model and weights with
its token mixer swapped for the papers' formula written directly in PyTorch (AFT-local as
exp(w) @ (exp(K) * V) with a dense [T, T] bias, ALiBi as an explicit softmax over a [T, T] bias).
Each runs in float32 and with the forward pass under bf16 autocast (what the trainer's
--precision auto picks on CPUs with bf16 dot-product instructions). The four models of a
configuration take their steps in turn, so that a slower spell of a shared CPU slows them all
alike; each figure is the median step time over --steps rounds after two warm-up steps, on random
tokens from an 80-character vocabulary.
"""

import argparse

import torch
from measure import add_cpu_options, interleaved_medians, plain_aft, plain_attention, set_up_cpu
from torch import Tensor

from aftalibi.aft import AFTLocal
from aftalibi.alibi import AlibiMultiHeadAttention, alibi_bias
from aftalibi.model import LanguageModel, ModelConfig
from aftalibi.train import TrainConfig, cpu_has_bf16_matmul, make_optimizer

# {name: (ModelConfig options, seq_len, batch_size)}: the two small models at their training lengths,
# then the same models on 4 and 8 times longer windows (the same tokens a step), where mixing costs more.
CONFIGURATIONS = {
    "aft-local": (dict(mixer="aft-local", n_layers=6, d_model=128, d_ff=256, window=32, max_len=256), 256, 32),
    "alibi": (dict(mixer="alibi", n_layers=4, d_model=128, n_heads=8, d_ff=512), 64, 128),
    "aft-local-1k": (dict(mixer="aft-local", n_layers=6, d_model=128, d_ff=256, window=32, max_len=1024), 1024, 8),
    "alibi-512": (dict(mixer="alibi", n_layers=4, d_model=128, n_heads=8, d_ff=512), 512, 16),
}


class PlainAFTLocal(AFTLocal):
    """AFT-local as the paper writes it (`plain_aft`), the band spread into a dense [T, T] bias: 0
    outside the window, the future masked when causal."""

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        q, k, v = self._project(x, key_padding_mask)
        length = x.shape[1]
        position = torch.arange(length)
        offset = position[None, :] - position[:, None]  # t' - t
        inside = offset.abs() < self.window
        w = self.band[:length].gather(1, (offset + self.window - 1).clamp(0, 2 * self.window - 2))
        w = torch.where(inside, w, torch.zeros(()))  # [T, T]
        if self.causal:
            w = w.masked_fill(offset > 0, float("-inf"))
        return self.out(plain_aft(q, k, v, w))


class PlainAlibi(AlibiMultiHeadAttention):
    """ALiBi as the paper writes it (`plain_attention` with the whole [T, T] ALiBi bias)."""

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, attention_mask: Tensor | None) -> Tensor:
        return plain_attention(q, k, v, alibi_bias(self.slopes, q.shape[-2], k.shape[-2], causal=self.causal))


PLAIN_MIXERS = {AFTLocal: PlainAFTLocal, AlibiMultiHeadAttention: PlainAlibi}


def use_plain_mixers(model: LanguageModel) -> int:
    """Swap every token mixer of `model` for its plain form, in place (the same layers and weights,
    only the mixer's arithmetic replaced); returns how many were swapped."""
    mixers = [module for module in model.modules() if type(module) in PLAIN_MIXERS]
    for module in mixers:
        module.__class__ = PLAIN_MIXERS[type(module)]
    return len(mixers)


def train_step(model: LanguageModel, optimizer, inputs: Tensor, targets: Tensor, bf16: bool) -> None:
    """One full training step: forward (under bf16 autocast if asked), backward, gradient clipping, AdamW."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        _, loss = model(inputs, targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def training_step(model_options: dict, seq_len: int, batch_size: int, bf16: bool, plain: bool):
    """`train_step` of a fresh model (its mixers plain if asked) on one fixed batch, as a function of nothing."""
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(vocab_size=80, **model_options))
    if plain:
        use_plain_mixers(model)
    optimizer = make_optimizer(model, TrainConfig(optimizer="adamw"))
    inputs, targets = torch.randint(0, 80, (2, batch_size, seq_len))
    return lambda: train_step(model, optimizer, inputs, targets, bf16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--configurations", nargs="+", choices=list(CONFIGURATIONS), default=list(CONFIGURATIONS),
                        metavar="NAME", help=f"which of {', '.join(CONFIGURATIONS)} to run (default: all)")
    parser.add_argument("--batch-size", type=int, help="windows per step instead of each configuration's own "
                        "(a smaller one checks that the script runs, in seconds where bf16 is emulated)")
    add_cpu_options(parser)
    args = parser.parse_args()
    if args.batch_size is not None and args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")
    print(set_up_cpu(args))
    native = cpu_has_bf16_matmul()
    print(f"bf16 dot-product instructions on this CPU: {'yes' if native else 'no (bf16 is emulated, slowly)'}; "
          f"the trainer's --precision auto uses {'bf16 autocast' if native else 'float32'} here")
    print(f"{'configuration':>14} {'precision':>14} {'ours':>12} {'plain':>12} {'ours/plain':>11}")
    for name in args.configurations:
        options, seq_len, batch_size = CONFIGURATIONS[name]
        batch_size = args.batch_size or batch_size
        steps = {(bf16, plain): training_step(options, seq_len, batch_size, bf16, plain)
                 for bf16 in (False, True) for plain in (False, True)}
        for step in steps.values():
            step()  # the first of two warm-up steps; interleaved_medians takes the second
        seconds = interleaved_medians(steps, args.steps)
        for bf16, precision in ((False, "float32"), (True, "bf16 autocast")):
            ours, plain = (batch_size * seq_len / seconds[bf16, plain] for plain in (False, True))
            print(f"{name:>14} {precision:>14} {ours:>10,.0f}/s {plain:>10,.0f}/s {ours / plain:>10.2f}x")


if __name__ == "__main__":
    main()

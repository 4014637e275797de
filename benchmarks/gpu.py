"""AFT and ALiBi on a GPU, in one run: correctness, one layer, the whole model, side by side.

    python benchmarks/gpu.py                      # one CUDA GPU, a few minutes
    python benchmarks/gpu.py --device cpu --quick # the same script on a CPU, small sizes, under half a minute
    python benchmarks/gpu.py --triton-launch 8x2  # the Triton kernels with 8 warps and 2 pipeline stages

1. Correctness: every AFT variant (full, simple, local, conv; causal, with padding) and the ALiBi
   layer, in float32 and bf16, against float64 references of the same inputs: the largest error of
   the output and of the gradients, beside its tolerance.
2. One layer, fwd+bwd (B=4, d_model=256, 8 heads, s=32; T = 1K to 64K): milliseconds and peak
   memory of the AFT-local layer (bf16 autocast), its four projections alone, a causal SDPA
   attention layer (bf16), the ALiBi layer in float32 and in bf16, and ALiBi on FlexAttention
   (`score_mod`, compiled; CUDA only).
3. The whole model (6 blocks, d_model 384, 6 heads, d_ff 1536, AdamW, bf16 autocast): tokens/s at
   T=512, B=64 and T=2048, B=16, and peak memory, for each mixer.

Where Triton's kernels can run, every AFT measurement runs under both GPU implementations, the
blockwise `gpu-chunked` and the fused `triton` (on a CPU, in Triton's interpreter: slow, for
checking the script only).

Peak memory is CUDA's peak allocation above what was allocated before the step (not measured on
CPUs: '-'). Runs out of memory are reported as 'OOM' and the run goes on. Imports only torch and
aftalibi's modules (no labml).
"""

import argparse
import importlib
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # measure the aftalibi of this checkout

from aftalibi.aft import (AFTLocal, aft_conv, aft_full, aft_kernel, aft_local, aft_reference, aft_simple,  # noqa: E402
                          default_aft_kernel)
from aftalibi.alibi import AlibiMultiHeadAttention, alibi_attention_reference, get_slopes  # noqa: E402
from aftalibi.attention import MultiHeadAttention  # noqa: E402
from aftalibi.model import LanguageModel, ModelConfig  # noqa: E402
from measure import Launch, Projections  # noqa: E402


def triton_unavailable_reason(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on `device` here (None: they can). Imports them (with or
    without Triton installed), so on a CPU only after TRITON_INTERPRET is set."""
    return importlib.import_module("aftalibi.aft_triton").unavailable_reason(device)


def gpu_kernels(device: torch.device) -> list[str]:
    """The AFT implementations written for GPUs that run on `device` here."""
    return ["gpu-chunked"] + (["triton"] if triton_unavailable_reason(device) is None else [])


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(step, device: torch.device, repeats: int, warmups: int) -> tuple[float, float | None]:
    """Median milliseconds of `step` after `warmups` warm-up calls, and peak MiB of one call above
    the memory allocated before it (CUDA only). Raises torch.OutOfMemoryError through."""
    for _ in range(warmups):
        step()
    synchronize(device)
    peak = None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        synchronize(device)
        peak = (torch.cuda.max_memory_allocated(device) - before) / 2**20
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times), peak


def cell(measurement) -> str:
    if measurement is None:
        return "OOM"
    milliseconds, peak = measurement
    return f"{milliseconds:8.2f} ms" + (f" {peak:7.0f} MiB" if peak is not None else "      - MiB")


def guarded(run):
    """Run a measurement; None when the device runs out of memory."""
    try:
        return run()
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None


# -- 1. correctness ----------------------------------------------------------------------------

def largest_errors(ours_fn, reference_fn, inputs):
    """Largest |ours - reference| of the output and of the gradients (reference in float64)."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    oracle_leaves = [x.detach().double().requires_grad_() for x in inputs]
    out = ours_fn(*leaves)
    expected = reference_fn(*oracle_leaves)
    upstream = torch.randn(expected.shape, dtype=torch.float64, device=expected.device)
    grads = torch.autograd.grad((out.double() * upstream).sum(), leaves, allow_unused=True)
    wanted = torch.autograd.grad((expected * upstream).sum(), oracle_leaves, allow_unused=True)
    forward = (out.double() - expected).abs().max().item()
    backward = max(((g.double() - w).abs().max().item() / (1 + w.abs().max().item())
                    for g, w in zip(grads, wanted) if w is not None), default=0.0)
    return forward, backward


def aft_cases(device, length):
    """(name, op, reference, inputs) for every AFT variant, causal, with left padding."""
    generator = torch.Generator(device=device).manual_seed(0)
    batch, d, heads, window = 2, 16, 4, 32
    randn = lambda *shape: torch.randn(*shape, device=device, generator=generator)  # noqa: E731
    q, k, v = randn(batch, length, d), 4 * randn(batch, length, d), randn(batch, length, d)
    w, kernel = 2 * randn(length, length), randn(heads, window)
    mask = torch.zeros(batch, length, dtype=torch.bool, device=device)
    mask[1, : length // 4] = True
    distance = torch.arange(length, device=device)[:, None] - torch.arange(length, device=device)[None, :]
    local = lambda w: torch.where(distance.abs() < window, w, torch.zeros_like(w))  # noqa: E731
    conv = lambda kernel: torch.where((distance >= 0) & (distance < window),  # noqa: E731
                                      kernel[:, distance.clamp(0, window - 1)], torch.zeros((), dtype=kernel.dtype,
                                                                                             device=device))
    expand = lambda k: k.repeat_interleave(d // heads, -1)  # noqa: E731
    return [
        ("aft-full", lambda q, k, v, w: aft_full(q, k, v, w, causal=True, key_padding_mask=mask),
         lambda q, k, v, w: aft_reference(q, k, v, w, causal=True, key_padding_mask=mask), (q, k, v, w)),
        ("aft-local", lambda q, k, v, w: aft_local(q, k, v, w, window, causal=True, key_padding_mask=mask),
         lambda q, k, v, w: aft_reference(q, k, v, local(w), causal=True, key_padding_mask=mask), (q, k, v, w)),
        ("aft-simple", lambda q, k, v: aft_simple(q, k, v, causal=True, key_padding_mask=mask),
         lambda q, k, v: aft_reference(q, k, v, causal=True, key_padding_mask=mask), (q, k, v)),
        ("aft-conv", lambda q, k, v, kernel: aft_conv(q, k, v, kernel, causal=True, key_padding_mask=mask),
         lambda q, k, v, kernel: aft_reference(q, expand(k), v, conv(kernel), causal=True, key_padding_mask=mask),
         (q, k[..., :heads], v, kernel)),
    ]


def alibi_case(device, length):
    """The ALiBi layer against softmax(q k^T / sqrt(d_head) - m (i - j)) v in float64, public API only."""
    torch.manual_seed(0)
    layer = AlibiMultiHeadAttention(64, 4).to(device)
    slopes = get_slopes(4).to(device)

    def reference(x, qkv_weight, qkv_bias, out_weight, out_bias):
        batch = x.shape[0]
        q, k, v = F.linear(x, qkv_weight, qkv_bias).view(batch, length, 3, 4, 16).permute(2, 0, 3, 1, 4)
        y = alibi_attention_reference(q, k, v, slopes, causal=True)  # [B, H, T, d_head]
        return F.linear(y.transpose(1, 2).reshape(batch, length, 64), out_weight, out_bias)

    def ours(x, qkv_weight, qkv_bias, out_weight, out_bias):
        parameters = {"qkv.weight": qkv_weight, "qkv.bias": qkv_bias, "out.weight": out_weight, "out.bias": out_bias}
        return torch.func.functional_call(layer, parameters, (x,))

    x = torch.randn(2, length, 64, device=device)
    inputs = (x, layer.qkv.weight, layer.qkv.bias, layer.out.weight, layer.out.bias)
    return ("alibi layer", ours, reference, inputs)


def correctness(device, quick):
    """Every case under the device's AFT kernel and under each GPU implementation."""
    length = 96 if quick else 512
    tolerances = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (5e-2, 5e-2)}
    kernels = sorted({default_aft_kernel(device), *gpu_kernels(device)})
    print(f"\n1. Correctness against float64 references (T={length}, causal, left padding)")
    print(f"{'op':<12} {'AFT kernel':<12} {'dtype':<9} {'output error':>13} {'gradient error':>15} {'tolerance':>10}  "
          f"verdict")
    failures = 0
    for kernel in kernels:
        for dtype in (torch.float32, torch.bfloat16):
            cases = aft_cases(device, length) + ([alibi_case(device, length)] if kernel == kernels[0] else [])
            for name, op, reference, inputs in cases:
                with aft_kernel(kernel):
                    forward, backward = largest_errors(op, reference, [x.to(dtype) for x in inputs])
                tolerance = tolerances[dtype]
                ok = forward < tolerance[0] and backward < tolerance[1]
                failures += not ok
                print(f"{name:<12} {kernel if name.startswith('aft') else '-':<12} "
                      f"{str(dtype).removeprefix('torch.'):<9} {forward:13.2e} {backward:15.2e} "
                      f"{tolerance[0]:10.0e}  {'ok' if ok else 'FAIL'}")
    return failures


# -- 2. one layer --------------------------------------------------------------------------------

class FlexAlibi(nn.Module):
    """ALiBi on FlexAttention: a compiled `score_mod` adding -m_h (i - j), and a causal block mask."""

    def __init__(self, d_model: int, n_heads: int, length: int, device):
        super().__init__()
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.register_buffer("slopes", get_slopes(n_heads))
        self.block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, length, length,
                                            device=device)
        self.attend = torch.compile(flex_attention)

    def forward(self, x):
        batch, length, d_model = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        slopes = self.slopes
        alibi = lambda score, b, h, q_idx, kv_idx: score - slopes[h] * (q_idx - kv_idx)  # noqa: E731
        y = self.attend(q, k, v, score_mod=alibi, block_mask=self.block_mask)
        return self.out(y.transpose(1, 2).reshape(batch, length, d_model))


def layer_table(device, quick):
    batch, d_model, heads, window = (2, 64, 4, 32) if quick else (4, 256, 8, 32)
    lengths = [64, 128] if quick else [1024, 4096, 16384, 65536]
    # --quick checks that the script runs: one warm-up and one timed call (Triton's interpreter is slow)
    repeats, warmups = (1, 1) if quick else (5, 2)
    bf16 = dict(device_type=device.type, dtype=torch.bfloat16)
    flex_ok = device.type == "cuda"
    kernels = gpu_kernels(device)
    columns = ([f"AFT-local {kernel} bf16" for kernel in kernels]
               + ["projections bf16", "SDPA MHA bf16", "ALiBi fp32", "ALiBi bf16", "Flex ALiBi bf16"])
    print(f"\n2. One layer, fwd+bwd, B={batch}, d_model={d_model}, {heads} heads, s={window}: ms and peak MiB")
    print(f"{'T':>6} " + " ".join(f"{c:>23}" for c in columns))
    for length in lengths:
        def run(make, autocast, kernel="gpu-chunked"):
            def go():
                torch.manual_seed(0)
                layer = make().to(device)
                x = torch.randn(batch, length, d_model, device=device, requires_grad=True)

                def step():
                    with torch.autocast(**bf16, enabled=autocast), aft_kernel(kernel):
                        out = layer(x)
                    out.float().sum().backward()
                return measure(step, device, repeats, warmups)
            return guarded(go)
        row = [run(lambda: AFTLocal(d_model, length, window), True, kernel) for kernel in kernels]
        row += [run(lambda: Projections(d_model), True),
               run(lambda: MultiHeadAttention(d_model, heads, causal=True), True),
               run(lambda: AlibiMultiHeadAttention(d_model, heads), False),
               run(lambda: AlibiMultiHeadAttention(d_model, heads), True),
               run(lambda: FlexAlibi(d_model, heads, length, device), True) if flex_ok else None]
        cells = [cell(m) for m in row]
        if not flex_ok:
            cells[-1] = "n/a (CUDA only)"
        print(f"{length:>6} " + " ".join(f"{c:>23}" for c in cells), flush=True)


# -- 3. the whole model --------------------------------------------------------------------------

def model_table(device, quick):
    shape = dict(n_layers=2, d_model=64, n_heads=4, d_ff=256) if quick else dict(n_layers=6, d_model=384, n_heads=6,
                                                                               d_ff=1536)
    runs = [(64, 2)] if quick else [(512, 64), (2048, 16)]
    repeats, warmups = (1, 1) if quick else (5, 2)
    mixers = [("mha", "rotary", "-"), ("alibi", "none", "-")]
    mixers += [(mixer, "none", kernel) for mixer in ("aft-simple", "aft-conv", "aft-local", "aft-full")
               for kernel in gpu_kernels(device)]
    print(f"\n3. Whole model ({shape}), AdamW step under bf16 autocast: tokens/s and peak MiB")
    print(f"{'mixer':<12} {'AFT kernel':<12} " + " ".join(f"{f'T={t}, B={b}':>24}" for t, b in runs))
    for mixer, position, kernel in mixers:
        cells = []
        for length, batch in runs:
            def go():
                torch.manual_seed(0)
                config = ModelConfig(vocab_size=256, mixer=mixer, position=position, max_len=length, window=32,
                                     **shape)
                model = LanguageModel(config).to(device)
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
                inputs, targets = torch.randint(0, 256, (2, batch, length), device=device)

                def step():
                    with torch.autocast(device_type=device.type, dtype=torch.bfloat16), \
                            aft_kernel(kernel if kernel != "-" else "gpu-chunked"):
                        _, loss = model(inputs, targets)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                return measure(step, device, repeats, warmups)
            result = guarded(go)
            if result is None:
                cells.append("OOM")
            else:
                milliseconds, peak = result
                tokens = batch * length / (milliseconds / 1e3)
                cells.append(f"{tokens / 1e3:9.1f}k tok/s" + (f" {peak:6.0f} MiB" if peak is not None else "     - MiB"))
        print(f"{mixer:<12} {kernel:<12} " + " ".join(f"{c:>24}" for c in cells), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="small sizes (a CPU check of the script)")
    parser.add_argument("--sections", nargs="+", default=["correctness", "layer", "model"],
                        choices=["correctness", "layer", "model"])
    parser.add_argument("--triton-launch", type=Launch.parse, metavar="WARPSxSTAGES[xMAXNREG]",
                        help="launch the Triton kernels with these settings instead of the package's "
                             "(aftalibi.aft_triton.LAUNCH); to compare settings, run once with each")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":  # Triton's kernels run on CPU tensors in its interpreter only
        os.environ.setdefault("TRITON_INTERPRET", "1")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    reason = triton_unavailable_reason(device)
    triton = f"no Triton kernels ({reason})"
    if reason is None:
        aft_triton = importlib.import_module("aftalibi.aft_triton")
        if args.triton_launch:
            aft_triton.LAUNCH.update(args.triton_launch.options())
        triton = f"Triton {importlib.import_module('triton').__version__} (launched with {aft_triton.LAUNCH})"
    print(f"{name}, torch {torch.__version__}, {triton}, AFT kernel on this device: {default_aft_kernel(device)}")
    start = time.perf_counter()
    failures = correctness(device, args.quick) if "correctness" in args.sections else 0
    if "layer" in args.sections:
        layer_table(device, args.quick)
    if "model" in args.sections:
        model_table(device, args.quick)
    print(f"\n{time.perf_counter() - start:.0f} s; {failures} correctness check(s) failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

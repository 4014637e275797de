"""Measuring helpers shared by the benchmarks (imported from the scripts' own folder).

Peak memory of one step: the process's maximum resident set size (getrusage ru_maxrss) after
the step minus its resident set just before it. Run each measurement in a fresh process so the
maximum belongs to that step alone; it counts every byte the step touched, whichever allocator
made it (torch's CPU allocator keeps no peak counter of its own).
"""

import argparse
import math
import platform
import resource
import statistics
import time
from typing import NamedTuple

import torch
import torch.nn as nn
from torch import Tensor


def add_cpu_options(parser: argparse.ArgumentParser, threads: int = 2) -> None:
    """--threads and --keep-subnormals, the CPU settings every CPU benchmark takes."""
    parser.add_argument("--threads", type=int, default=threads, help=f"CPU threads of torch (default: {threads})")
    parser.add_argument("--keep-subnormals", action="store_true",
                        help="compute with subnormal floats; by default they are flushed to zero, as `python -m "
                             "aftalibi` does (they are slow on many Intel cores: notebook 09)")


def set_up_cpu(args: argparse.Namespace) -> str:
    """Flush subnormal floats to zero (unless --keep-subnormals), then set --threads: in that order, before any
    parallel work, so that every thread torch starts inherits the mode. Returns the line that heads a table:
    the CPU, the threads and the mode, which decide what a CPU figure means."""
    from aftalibi.alibi_kernels import flush_denormals_to_zero

    flushing = not args.keep_subnormals and flush_denormals_to_zero()
    torch.set_num_threads(args.threads)
    return f"CPU: {cpu_name()}, {args.threads} threads, subnormal floats {'flushed to zero' if flushing else 'kept'}"


def cpu_name() -> str:
    """The processor's model name as the kernel reports it (Linux), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def current_rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def median_seconds(step, repeats: int) -> float:
    """Median wall time of `repeats` calls of `step`, after one warm-up call."""
    step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def seconds_and_peak_mib(step, repeats: int) -> dict:
    """{"seconds": median time, "peak_mib": peak memory of the first (warm-up) call}."""
    before = current_rss_kib()
    step()
    peak_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024  # ru_maxrss is KiB on Linux
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "peak_mib": peak_mib}


def interleaved_medians(steps: dict, repeats: int) -> dict:
    """{name: median seconds}: each step warmed up once, then `repeats` rounds calling every step in turn."""
    for step in steps.values():
        step()
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def plain_aft(q: Tensor, k: Tensor, v: Tensor, w: Tensor) -> Tensor:
    """AFT as the paper writes it, sigmoid(Q) * (exp(w) @ (exp(K) * V)) / (exp(w) @ exp(K)), with a dense
    `[T, T]` bias w (-inf for the pairs a query may not use) and q, k, v `[B, T, d]`: the baseline that
    our kernels are timed against. The maxima of K and w come out of the exponentials (they cancel)."""
    exp_w = torch.exp(w - w.max())  # [T, T]
    exp_k = torch.exp(k - k.amax(dim=1, keepdim=True))  # [B, T, d]
    return torch.sigmoid(q) * (exp_w @ (exp_k * v)) / (exp_w @ exp_k)


def plain_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(d_head) + bias) v with the whole `[T, T]` scores in memory: the straightforward
    attention (ALiBi's when `bias` is ALiBi's), q, k, v `[B, H, T, d_head]`."""
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + bias, dim=-1) @ v


class Projections(nn.Module):
    """The four d x d projections of a mixing layer and nothing else: the floor of any such layer."""

    def __init__(self, d_model: int):
        super().__init__()
        self.to_q, self.to_k, self.to_v, self.out = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x):
        return self.out(self.to_q(x) * self.to_k(x) * self.to_v(x))


class Launch(NamedTuple):
    """Launch settings of a Triton kernel: warps a program, pipeline stages, and the most registers a
    thread (None: left out of `options`, so the assembler chooses, or an update of the package's
    `LAUNCH` keeps its setting)."""
    num_warps: int
    num_stages: int
    maxnreg: int | None = None

    @classmethod
    def parse(cls, text: str) -> "Launch":
        """'8x2' or '8x1x255' (WARPSxSTAGES[xMAXNREG]), for argparse."""
        try:
            launch = cls(*(int(part) for part in text.split("x")))
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected WARPSxSTAGES or WARPSxSTAGESxMAXNREG such as 8x2, "
                                             f"got {text!r}") from None
        if launch.num_warps not in (1, 2, 4, 8, 16) or launch.num_stages < 1 or not 0 < (launch.maxnreg or 1) <= 255:
            raise argparse.ArgumentTypeError(f"expected 1, 2, 4, 8 or 16 warps, at least 1 stage and at most 255 "
                                             f"registers, got {text!r}")
        return launch

    def options(self) -> dict:
        """The settings given, as Triton's keyword arguments."""
        return {setting: value for setting, value in self._asdict().items() if value is not None}

    def __str__(self) -> str:
        return "x".join(str(part) for part in self if part is not None)

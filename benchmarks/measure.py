"""Measuring helpers shared by the benchmarks (imported from the scripts' own folder).

Peak memory of one step: the process's maximum resident set size (getrusage ru_maxrss) after
the step minus its resident set just before it. Run each measurement in a fresh process so the
maximum belongs to that step alone; it counts every byte the step touched, whichever allocator
made it (torch's CPU allocator keeps no peak counter of its own).
"""

import resource
import statistics
import time

import torch.nn as nn


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


class Projections(nn.Module):
    """The four d x d projections of a mixing layer and nothing else: the floor of any such layer."""

    def __init__(self, d_model: int):
        super().__init__()
        self.to_q, self.to_k, self.to_v, self.out = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x):
        return self.out(self.to_q(x) * self.to_k(x) * self.to_v(x))

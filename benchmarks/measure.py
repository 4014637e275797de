"""Measuring helpers shared by the benchmarks (imported from the scripts' own folder).

Peak memory of one step: the process's maximum resident set size (getrusage ru_maxrss) after
the step minus its resident set just before it. Run each measurement in a fresh process so the
maximum belongs to that step alone; it counts every byte the step touched, whichever allocator
made it (torch's CPU allocator keeps no peak counter of its own).
"""

import resource
import statistics
import time


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

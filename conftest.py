"""Test set-up shared by the unit tests (tests/) and the notebooks (notebooks/, under nbval)."""

import os
import signal
import time
from collections import defaultdict

import torch

# nbval runs the notebooks as Colab opens them: alone, in a fresh environment (tests/colab_kernel.py).
pytest_plugins = ["tests.colab_kernel"]

# Without a GPU, the Triton kernels (the AFT kernel "triton") run in Triton's interpreter, which is
# chosen when a kernel is defined: before aftalibi.aft_triton is imported, here and in every
# notebook kernel, which inherits the variable.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Notebooks run in their fast mode unless the caller asks otherwise; nbval starts each
# notebook's kernel from this process, so the kernel inherits the variable.
os.environ.setdefault("AFTALIBI_FAST", "1")


def pytest_collection_modifyitems(config, items):
    compare_every_cell(items)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker
        collect_longest_first(items)


def compare_every_cell(items):
    """Compare every notebook cell's outputs, although the notebooks are committed clean.

    `nbdev-clean` strips execution counts so that diffs stay small, and nbval reads a missing
    count as "this cell was never run: do not compare it" (and fails a cell that has outputs
    anyway). Giving each code cell a count in memory makes nbval compare all of them,
    including cells whose committed output is empty.
    """
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is not None and cell.get("cell_type") == "code" and cell.get("execution_count") is None:
            cell.execution_count = 1


# A test over this long that is not marked `slow` is named in every run's output (SuiteTime).
SLOW_TEST_SECONDS = 30.0

# The groups whose times every run prints: a test file's group, or "unit tests".
GROUPS = {"notebooks under nbval, as Colab opens them": ("notebooks/",),
          "docs build and browser": ("tests/test_docs.py", "tests/test_translations.py"),
          "benchmark scripts and fault injection": ("tests/test_benchmarks.py",),
          "signals, processes and runs": ("tests/test_runs.py", "tests/test_run_guarantees.py",
                                          "tests/test_cli.py", "tests/test_ddp.py")}


def group_of(path: str) -> str:
    return next((name for name, prefixes in GROUPS.items() if path.startswith(prefixes)), "unit tests")


class SuiteTime:
    """A guard that keeps the suite fast: every run ends with its wall time, the time of each
    group (GROUPS), its slowest files and tests, and each test over SLOW_TEST_SECONDS that is not
    marked `slow`, one line each, so that a new slow test is seen the day it lands
    (CONTRIBUTING.md). Under pytest-xdist the controller receives every worker's reports, so its
    totals cover the whole run."""

    shown = 15

    def __init__(self):
        self.start = time.perf_counter()
        self.seconds = defaultdict(float)  # per test: set-up, call and teardown summed
        self.marked_slow = set()

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] += report.duration
        if "slow" in report.keywords:
            self.marked_slow.add(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter):
        if not self.seconds:
            return
        per_file = defaultdict(float)
        for nodeid, seconds in self.seconds.items():
            per_file[nodeid.split("::")[0]] += seconds
        slowest = lambda table: sorted(table.items(), key=lambda pair: -pair[1])[:self.shown]  # noqa: E731
        write = terminalreporter.write_line
        terminalreporter.section("suite time")
        write(f"{len(self.seconds)} tests in {time.perf_counter() - self.start:.0f} s of wall time "
              f"({sum(self.seconds.values()):.0f} s of test time, summed over workers)")
        per_group = defaultdict(float)
        for path, seconds in per_file.items():
            per_group[group_of(path)] += seconds
        write("groups:")
        for name, seconds in slowest(per_group):
            write(f"{seconds:8.1f} s  {name}")
        write("slowest files:")
        for path, seconds in slowest(per_file):
            write(f"{seconds:8.1f} s  {path}")
        write("slowest tests:")
        for nodeid, seconds in slowest(self.seconds):
            write(f"{seconds:8.1f} s  {nodeid}")
        for nodeid, seconds in sorted(self.seconds.items()):
            if seconds > SLOW_TEST_SECONDS and nodeid not in self.marked_slow:
                write(f"SLOW TEST: {nodeid} took {seconds:.0f} s, over {SLOW_TEST_SECONDS:.0f} s: make it "
                      "faster, or mark it `slow` with the reason (CONTRIBUTING.md)")


# How pytest-xdist deals the suite out to its workers (`make test` and `make check` run with
# `-n auto`). A work unit goes to one worker whole:
# - a notebook (nbval runs its cells in order in one kernel);
# - a test file whose fixtures are made once per file (ONE_WORKER_PER_FILE: tests/test_docs.py
#   drives one browser over the built site);
# - every other test on its own, so that a long file (the AFT kernels' property tests, the
#   signal and fault-injection tests) is spread over all the cores instead of holding one.
# The longest units start first (LONGEST_FIRST, then the notebooks by their number of cells) and
# the single tests fill in around them, so that no worker is left with a long unit at the end
# (with a whole file per worker, tests/test_aft_kernels.py alone held one worker for 9 minutes).
ONE_WORKER_PER_FILE = ("tests/test_docs.py", "tests/test_translations.py",
                       "tests/test_data.py")
# Longest first, as the "suite time" section of a run lists them (the slowest units of a fresh
# clone's `make test` on 2 idle cores: a whole file or notebook, or a test's node id): keep this in
# step with it, so that no long unit starts last. tests/test_docs.py builds the site that
# tests/test_translations.py reads (`docs_site`), so it starts well before it, and the other worker
# is not left waiting for the build. The run's first notebook builds the base environment that all
# notebooks share, a worker's first notebook installs aftalibi into its own (tests/colab_kernel.py).
LONGEST_FIRST = ("tests/test_docs.py", "notebooks/06_train.ipynb", "notebooks/10_aft_triton.ipynb",
                 "notebooks/07_extrapolation.ipynb",
                 "tests/test_train.py::test_the_shipped_float16_demo_model_scores_what_its_run_recorded",
                 "tests/test_benchmarks.py::test_fault_injection_kills_runs_and_finds_nothing_lost",
                 "notebooks/09_alibi_kernels.ipynb",
                 "tests/test_benchmarks.py::test_gpu_benchmark_runs_on_a_cpu_and_its_correctness_checks_pass",
                 "tests/test_translations.py")


def work_unit(nodeid: str) -> str:
    """The unit of scheduling a test belongs to: its notebook, its file, or the test itself."""
    path = nodeid.split("::", 1)[0]
    return path if path.endswith(".ipynb") or path in ONE_WORKER_PER_FILE else nodeid


def collect_longest_first(items):
    """Under pytest-xdist, collect the longest units first: the scheduler below hands the units out
    in the order of the collection (every worker sorts alike, so their collections agree). The sort
    is stable, so a notebook's cells keep their order."""
    cells = defaultdict(int)
    for item in items:
        cells[item.nodeid.split("::", 1)[0]] += 1

    def order(item):
        path = item.nodeid.split("::", 1)[0]
        rank = next((index for index, unit in enumerate(LONGEST_FIRST)
                     if item.nodeid == unit or path == unit), len(LONGEST_FIRST))
        return rank, -cells[path] if path.endswith(".ipynb") else 0

    items.sort(key=order)


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scheduling by scope, with the work units above, in the collection's order."""
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # keep the collection's order: longest first
    return ByWorkUnit(config, log)


def share_the_cores(config):
    """Under pytest-xdist, give each worker its share of the cores for torch's threads.

    Every worker runs a test at all times, and each would otherwise start one thread per core:
    on 2 cores, 2 workers ran 4 threads, and every parallel operation waited for a thread that
    the other worker's process had taken off its core (the demo model sampled 400 characters
    2.6 times slower on 2 threads than on 1 beside a busy core). The variable reaches what a test
    starts (notebook kernels, the command line, torchrun); a test that measures threads sets its
    own. A caller's OMP_NUM_THREADS is kept."""
    if not hasattr(config, "workerinput"):
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = str(max(1, cores // config.workerinput["workercount"]))
    os.environ.setdefault("OMP_NUM_THREADS", threads)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def hear_ctrl_c_and_hangups():
    """Give Ctrl-C (SIGINT) and SIGHUP their default actions if they arrived ignored, in this
    process and the runs it starts (they inherit them): a suite started in the background by a
    script (`make test &` ignores SIGINT) or under `nohup` (SIGHUP) would otherwise find its runs
    deaf to the signals its tests send them, and fail or wait for its time-outs."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes over 30 s by design; `make check` leaves it out")
    config.pluginmanager.register(SuiteTime(), "suite-time")
    share_the_cores(config)
    hear_ctrl_c_and_hangups()

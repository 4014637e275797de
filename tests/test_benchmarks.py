"""The GPU benchmark is one prepared script for the rare session that has a GPU: it must run there the
first time. Its own CPU mode (small sizes, a few seconds) runs every section here, and its correctness
section, which checks every AFT variant and the ALiBi layer against float64 on both AFT kernels, must
pass. (Timings are printed, never asserted: see benchmarks/README.md.)"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_benchmark_runs_on_a_cpu_and_its_correctness_checks_pass():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--device", "cpu", "--quick"],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    verdicts = re.findall(r"\s(ok|FAIL\w*)\s*$", result.stdout, flags=re.MULTILINE)
    kernels = set(re.findall(r"^aft-\S+\s+(\S+-chunked)\s", result.stdout, flags=re.MULTILINE))
    assert len(verdicts) == 18 and set(verdicts) == {"ok"}, result.stdout
    assert kernels == {"cpu-chunked", "gpu-chunked"}, kernels
    assert "0 correctness check(s) failed" in result.stdout
    for section in ("1. Correctness", "2. One layer", "3. Whole model"):
        assert section in result.stdout, f"section {section!r} missing:\n{result.stdout}"

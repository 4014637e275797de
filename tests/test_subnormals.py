"""Flush-to-zero of subnormal floats (notebook 09): set on every CPU thread when asked first, said
when asked too late, set by the command line, and never changing a result that float32 can show."""

import subprocess
import sys
import textwrap

import torch

from aftalibi.aft import aft_local
from aftalibi.alibi import get_slopes
from aftalibi.alibi_kernels import causal_alibi_cpu_flash


def run_python(program: str, cwd=None) -> str:
    """Run `program` in a fresh interpreter (the floating-point mode is per process and thread)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(program)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_called_first_every_thread_flushes():
    printed = run_python("""
        import warnings
        import torch
        from aftalibi.alibi_kernels import _every_thread_flushes, flush_denormals_to_zero
        warnings.simplefilter("error")
        assert flush_denormals_to_zero()
        torch.set_num_threads(2)  # threads started later copy the setting too
        print(_every_thread_flushes(), torch.exp(torch.full((2**18,), -100.0)).count_nonzero().item())
    """)
    assert printed == "True 0"


def test_called_after_the_threads_started_it_warns_and_says_false():
    printed = run_python("""
        import warnings
        import torch
        from aftalibi.alibi_kernels import flush_denormals_to_zero
        torch.set_num_threads(2)
        torch.ones(2**18).exp()  # a parallel operation starts the threads
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            every_thread = flush_denormals_to_zero()
        print(every_thread, *(warning.message for warning in caught), sep=" | ")
    """)
    assert printed.startswith("False | flush-to-zero reached only the calling thread")
    assert "before torch.set_num_threads" in printed


def test_the_command_line_flushes_on_every_thread(corpus_file, tmp_path):
    """`python -m aftalibi train --threads 2`: the program sets the mode before torch's threads start."""
    arguments = ["train", "--corpus", corpus_file, "--seq-len", "16", "--batch-size", "4", "--eval-windows", "4",
                 "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--d-ff", "32", "--optimizer", "adamw",
                 "--max-steps", "2", "--eval-every", "2", "--sample", "0", "--threads", "2", "--out-dir", "run"]
    printed = run_python(f"""
        import runpy, sys
        sys.argv = ["aftalibi", *{arguments!r}]
        try:
            runpy.run_module("aftalibi", run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            assert stop.code == 0, stop.code
        from aftalibi.alibi_kernels import _every_thread_flushes
        print("every thread flushes:", _every_thread_flushes())
    """, cwd=tmp_path)
    assert printed.splitlines()[-1] == "every thread flushes: True"


def kept_and_flushed(compute):
    """`compute()` with subnormals kept, then flushed. One thread computes both: in this process, whose
    threads have started, the setting reaches the calling thread only."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        kept = compute()
        torch.set_flush_denormal(True)
        return kept, compute()
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)


def test_flushing_changes_no_alibi_output_float32_can_show():
    """The weights it drops are below 2^-126 of a row's largest: outputs agree to float32's rounding."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, 512, 32, generator=generator) * 3 for _ in range(3))
    kept, flushed = kept_and_flushed(lambda: causal_alibi_cpu_flash(q, k, v, get_slopes(8)))
    torch.testing.assert_close(flushed, kept, rtol=2**-20, atol=2**-20)


def test_flushing_changes_no_aft_local_output_float32_can_show():
    """AFT's shifted exponentials exp(K - c): keys that fall 87 to 103 below the running maximum give
    subnormal terms; with keys spread over 120 many do, in every row past the first few."""
    generator = torch.Generator().manual_seed(0)
    length, d = 256, 32
    q, v = (torch.randn(2, length, d, generator=generator) for _ in range(2))
    k = torch.linspace(0, -120, length)[None, :, None] + torch.randn(2, length, d, generator=generator)
    k = k.flip(1).contiguous()  # rising along time: the running maximum moves, earlier keys fall below it
    w = torch.randn(length, length, generator=generator)
    below_last_maximum = k - k.amax(1, keepdim=True)  # the shift of the last query's row
    assert ((below_last_maximum < -87.4) & (below_last_maximum > -103)).sum() > 1000  # the test meets the band
    kept, flushed = kept_and_flushed(lambda: aft_local(q, k, v, w, 32, causal=True))
    torch.testing.assert_close(flushed, kept, rtol=2**-20, atol=2**-20)

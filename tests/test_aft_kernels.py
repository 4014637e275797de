"""The AFT kernels: selection, and the two GPU implementations forced on CPU tensors: the loop-free
blockwise path ("gpu-chunked") and the fused Triton kernels ("triton", in Triton's interpreter),
against the float64 reference of the AFT equation, at numeric extremes, with a dispatch count that
does not grow with the sequence or the batch, and under torch.compile with no graph break."""

import collections
import dataclasses
import importlib.util
import os
import shutil

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from aftalibi.aft import (AFT_KERNELS, AFTConv, AFTFull, AFTLocal, AFTSimple, aft_conv, aft_full, aft_kernel, aft_local,
                          aft_reference, aft_simple, default_aft_kernel)
from aftalibi import aft_triton
from aftalibi.aft_kernels import selected_aft_kernel
from dense_biases import conv_bias, local_bias

float64 = torch.float64
GPU = "gpu-chunked"
# The Triton kernels run on CPU tensors in Triton's interpreter wherever Triton installs (Linux; the
# dev extra installs it there) and its interpreter runs their loops (not Triton 3.6 beside NumPy 2.4).
TRITON_ON_CPU = aft_triton.unavailable_reason("cpu")
needs_triton = pytest.mark.skipif(TRITON_ON_CPU is not None, reason=str(TRITON_ON_CPU))
# The Triton cases run in Triton's interpreter: minutes on a CPU, so `make check` leaves them out.
GPU_KERNELS = [GPU, pytest.param("triton", marks=[needs_triton, pytest.mark.slow])]


@pytest.fixture(autouse=True)
def interpreter_without_overflow_checks():
    """Triton's interpreter checks every integer +, - and * of a kernel for int32 overflow, a debugging
    aid that compiled kernels leave out: 40% of the interpreter's time here, for offsets that at these
    sizes stay below 2^20, where no check can fire. The kernels compute the same without it. Per test
    (the property tests' examples share it, which is why they let a function-scoped fixture be)."""
    builder = None
    if aft_triton.TRITON_AVAILABLE and aft_triton.INTERPRETED:
        from triton.runtime.interpreter import interpreter_builder as builder
    with pytest.MonkeyPatch.context() as patch:
        if getattr(getattr(builder, "options", None), "sanitize_overflow", False):
            patch.setattr(builder, "options", dataclasses.replace(builder.options, sanitize_overflow=False))
        yield


def run_op(op, q, k, v, w, kernel, window, causal, mask):
    """One AFT op and the float64 reference on the same inputs (k of AFT-conv: its first h channels)."""
    heads = kernel.shape[0]
    if op == "local":
        return (aft_local(q, k, v, w, window, causal=causal, key_padding_mask=mask),
                lambda q, k, v, w, kernel: aft_reference(q, k, v, local_bias(w, window), causal=causal,
                                                         key_padding_mask=mask))
    if op == "full":
        return (aft_full(q, k, v, w, causal=causal, key_padding_mask=mask),
                lambda q, k, v, w, kernel: aft_reference(q, k, v, w, causal=causal, key_padding_mask=mask))
    if op == "simple":
        return (aft_simple(q, k, v, causal=causal, key_padding_mask=mask),
                lambda q, k, v, w, kernel: aft_reference(q, k, v, causal=causal, key_padding_mask=mask))
    return (aft_conv(q, k[..., :heads], v, kernel, causal=causal, key_padding_mask=mask),
            lambda q, k, v, w, kernel: aft_reference(q, k[..., :heads].repeat_interleave(q.shape[-1] // heads, -1), v,
                                                     conv_bias(kernel, q.shape[1], causal), causal=causal,
                                                     key_padding_mask=mask))


def test_kernel_selection():
    assert AFT_KERNELS == ("cpu-chunked", "gpu-chunked", "triton")
    assert default_aft_kernel("cpu") == "cpu-chunked" and default_aft_kernel(torch.device("cuda")) == GPU
    assert selected_aft_kernel("cpu") == "cpu-chunked"
    with aft_kernel(GPU):
        assert selected_aft_kernel("cpu") == GPU
        with aft_kernel("cpu-chunked"):
            assert selected_aft_kernel("meta") == "cpu-chunked"
        assert selected_aft_kernel("cpu") == GPU
    assert selected_aft_kernel("cpu") == "cpu-chunked"
    with pytest.raises(ValueError, match="cpu-chunked, gpu-chunked, triton"):
        with aft_kernel("flash"):
            pass


def test_the_triton_kernel_says_what_it_needs(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "triton" else object())
    with pytest.raises(ValueError, match="needs Triton, which is not installed"):
        with aft_kernel("triton"):
            pass


@pytest.mark.skipif(not aft_triton.TRITON_AVAILABLE, reason="Triton is not installed")
def test_the_triton_kernel_on_cpu_tensors_asks_for_the_interpreter(monkeypatch):
    monkeypatch.setattr(aft_triton, "INTERPRETED", False)
    q = torch.randn(1, 4, 2)
    with aft_kernel("triton"), pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        aft_simple(q, q, q)


@pytest.mark.skipif(not aft_triton.TRITON_AVAILABLE, reason="Triton is not installed")
def test_the_triton_kernel_runs_on_cuda_tensors_and_names_the_devices_it_does_not():
    assert aft_triton.unavailable_reason("cuda") is None
    assert "not on mps tensors" in aft_triton.unavailable_reason("mps")


@pytest.mark.skipif(not aft_triton.TRITON_AVAILABLE, reason="Triton is not installed")
def test_an_interpreter_that_cannot_run_the_loops_is_named_with_its_fix(monkeypatch):
    """Triton 3.6's interpreter beside NumPy 2.4 fails every kernel with a loop bounded by an argument
    (all of ours): the kernel says so and what to install, instead of an error deep in Triton."""
    monkeypatch.setattr(aft_triton, "INTERPRETER_LOOP_FAILURE", "TypeError('only 0-dimensional arrays')")
    q = torch.randn(1, 4, 2)
    with aft_kernel("triton"), pytest.raises(RuntimeError, match=r"cannot run the loops .* install triton>=3\.7"):
        aft_simple(q, q, q)


@pytest.mark.skipif(not (aft_triton.TRITON_AVAILABLE and aft_triton.INTERPRETED), reason="no Triton interpreter")
def test_the_triton_tests_are_skipped_only_for_the_known_interpreter_failure():
    """The probe fails only where Triton 3.6 or older meets NumPy 2.4 or newer: anywhere else (CI
    included) the Triton kernels' tests run."""
    import numpy
    import triton
    from packaging.version import Version

    known = Version(triton.__version__).release < (3, 7) and Version(numpy.__version__).release >= (2, 4)
    assert (aft_triton.INTERPRETER_LOOP_FAILURE is not None) == known


# What the property tests draw: every op, lengths of one to three blocks of 64 positions (the
# Triton kernels' L and the blockwise path's least block), windows from 1 to wider than a block.
VARIANTS = dict(op=st.sampled_from(["local", "full", "simple", "conv"]), batch=st.integers(1, 2),
                length=st.integers(1, 150), window=st.integers(1, 70), heads=st.sampled_from([1, 2]),
                causal=st.booleans(), padded=st.booleans(), seed=st.integers(0, 2**16))
# The cases at the blocks' boundaries, tried first on every implementation (the drawn examples hit
# them only by chance).
BOUNDARY_CASES = [
    # T = 1, s = 1: batch element 1's only key is padded (seed 4), a row with no key at all
    dict(op="simple", batch=2, length=1, window=1, heads=1, causal=True, padded=True, seed=4),
    # three blocks, the last of 22 positions: block 0 carried to block 2; causal rows with no key yet
    dict(op="local", batch=2, length=150, window=5, heads=1, causal=True, padded=True, seed=1),
    dict(op="local", batch=1, length=150, window=5, heads=1, causal=False, padded=False, seed=2),
    # a window wider than a block (each block reaches two blocks each side), a last block of one
    # position, two heads
    dict(op="conv", batch=1, length=129, window=70, heads=2, causal=False, padded=True, seed=3),
    # exactly one block; one head (every channel shares its key)
    dict(op="conv", batch=1, length=64, window=9, heads=1, causal=True, padded=False, seed=5),
    # s = 1: only the own position inside the window
    dict(op="conv", batch=1, length=100, window=1, heads=2, causal=True, padded=True, seed=6),
    # AFT-full: two blocks, the second of one position; two whole blocks
    dict(op="full", batch=2, length=65, window=1, heads=1, causal=True, padded=True, seed=7),
    dict(op="full", batch=1, length=128, window=1, heads=1, causal=False, padded=False, seed=8),
    # a window wider than the sequence
    dict(op="local", batch=1, length=40, window=70, heads=1, causal=False, padded=True, seed=9),
]


def with_boundary_cases(test):
    for case in reversed(BOUNDARY_CASES):  # decorators apply bottom up: keep the list's order
        test = example(**case)(test)
    return test


def assert_variant_equals_the_reference(implementation, op, batch, length, window, heads, causal, padded, seed):
    generator = torch.Generator().manual_seed(seed)
    d = 4
    q, k, v = (torch.randn(batch, length, d, dtype=float64, generator=generator, requires_grad=True) for _ in range(3))
    w = torch.randn(length, length, dtype=float64, generator=generator, requires_grad=True)
    kernel = torch.randn(heads, window, dtype=float64, generator=generator, requires_grad=True)
    mask = None
    if padded:
        mask = torch.rand(batch, length, generator=generator) < 0.3
        mask[0, : length // 2] = True  # rows with no key yet (causal)
    inputs = (q, k, v, w, kernel)
    with aft_kernel(implementation):
        ours, reference = run_op(op, q, k, v, w, kernel, window, causal, mask)
    expected = reference(*inputs)
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-10)
    upstream = torch.randn(ours.shape, dtype=float64, generator=generator)
    grads = torch.autograd.grad((ours * upstream).sum(), inputs, allow_unused=True)
    want = torch.autograd.grad((expected * upstream).sum(), inputs, allow_unused=True)
    for name, got, wanted in zip(["q", "k", "v", "w", "kernel"], grads, want):
        if wanted is None:
            continue
        got = torch.zeros_like(wanted) if got is None else got
        torch.testing.assert_close(got, wanted, rtol=1e-9, atol=1e-9, msg=lambda m: f"grad of {name}: {m}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@with_boundary_cases
@given(**VARIANTS)
def test_every_variant_and_its_gradients_equal_the_float64_reference(op, batch, length, window, heads, causal,
                                                                    padded, seed):
    assert_variant_equals_the_reference(GPU, op, batch, length, window, heads, causal, padded, seed)


# Triton's interpreter runs every program of a launch in Python, a few tenths of a second for each
# block of 64 positions and batch element (forward and backward): the boundary cases above, and
# fewer drawn examples than for the blockwise path.
@needs_triton
@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@with_boundary_cases
@given(**VARIANTS)
def test_the_triton_kernels_and_their_gradients_equal_the_float64_reference(op, batch, length, window, heads, causal,
                                                                           padded, seed):
    assert_variant_equals_the_reference("triton", op, batch, length, window, heads, causal, padded, seed)


def extreme(kind, length=200, d=4):
    """Inputs `[2, T, d]` at a numeric extreme. T = 200: four blocks of 64, so that a block is carried
    the totals of two earlier blocks with other shifts, and the last block is partial."""
    generator = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(3, 2, length, d, dtype=float64, generator=generator)
    w = torch.randn(length, length, dtype=float64, generator=generator)
    if kind == "keys rise along time":  # by T over the sequence: a max over the future underflows the start
        k = k + torch.arange(length, dtype=float64)[:, None]
    elif kind == "huge keys":
        k = 1e4 + k
    elif kind == "a jump of 1e4 between blocks":
        k[:, 128:] += 1e4
    elif kind == "keys fall along time":
        k = k - torch.arange(length, dtype=float64)[:, None]
    elif kind == "huge biases":
        w = 60 * w
    elif kind == "biases far below 0":  # the first s queries have no key outside the window to fall back on
        w = w - 150
    return q, k, v, w


def extreme_kernel(kind, heads=2, window=9):
    """AFT-conv's kernel for an extreme case, from its own seed."""
    kernel = torch.randn(heads, window, dtype=float64, generator=torch.Generator().manual_seed(6))
    return {"huge biases": 60 * kernel, "biases far below 0": kernel - 150}.get(kind, kernel)


@pytest.mark.parametrize("kind", ["keys rise along time", "huge keys", "a jump of 1e4 between blocks",
                                  "keys fall along time", "huge biases", "biases far below 0"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("op", ["local", "full", "simple", "conv"])
@pytest.mark.parametrize("implementation", ["cpu-chunked"] + GPU_KERNELS)
def test_extremes_stay_finite_and_exact(implementation, kind, causal, op):
    q, k, v, w = extreme(kind)
    if implementation == "triton":
        # one sequence: the interpreter runs the programs of each batch element in turn, and the
        # batch's offsets are the property tests' to check
        q, k, v = q[:1], k[:1], v[:1]
    kernel = extreme_kernel(kind)
    _, reference = run_op(op, q, k, v, w, kernel, 9, causal, None)
    for dtype, tolerance in [(float64, 1e-9), (torch.float32, 1e-4)]:
        inputs = [x.to(dtype).requires_grad_() for x in (q, k, v, w, kernel)]
        with aft_kernel(implementation):
            got, _ = run_op(op, *inputs, 9, causal, None)
        grads = torch.autograd.grad(got.square().sum(), inputs, allow_unused=True)
        assert torch.isfinite(got).all() and all(g is None or torch.isfinite(g).all() for g in grads), kind
        # against the reference of the same (rounded) inputs: float32 keys near 1e4 keep 3 decimals
        expected = reference(*(x.detach().double() for x in inputs))
        error = (got.double() - expected).abs().max().item()
        assert error < tolerance, f"{op} {kind} {dtype}: error {error:.2e} >= {tolerance}"


@pytest.mark.parametrize("dtype,tolerance", [(torch.bfloat16, 5e-2), (torch.float16, 5e-3)])
@pytest.mark.parametrize("op", ["local", "full", "simple", "conv"])
@pytest.mark.parametrize("implementation", GPU_KERNELS)
def test_low_precision_accumulates_in_float32(implementation, op, dtype, tolerance):
    q, k, v, w = extreme("none", length=200, d=8)
    kernel = torch.randn(2, 9, dtype=float64)
    low = [x.to(dtype) for x in (4 * q, 4 * k, v, 2 * w, kernel)]
    with aft_kernel(implementation):
        got, _ = run_op(op, *low, 9, True, None)
    _, reference = run_op(op, *(x.double() for x in low), 9, True, None)
    expected = reference(*(x.double() for x in low))
    assert got.dtype == dtype and torch.isfinite(got).all()
    error = (got.double() - expected).abs().max().item()
    assert error < tolerance, f"{op} {dtype}: error {error:.2e} >= {tolerance}"


def make_layer(name, d_model=8, max_len=4096):
    torch.manual_seed(0)
    return {"simple": lambda: AFTSimple(d_model), "full": lambda: AFTFull(d_model, max_len),
            "local": lambda: AFTLocal(d_model, max_len, 4), "conv": lambda: AFTConv(d_model, 2, 4)}[name]()


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


def dispatched_ops(layer, batch, length, padded, implementation=GPU):
    layer.zero_grad(set_to_none=True)  # the same gradient accumulation (into None) on every call
    x = torch.randn(batch, length, layer.d_model, requires_grad=True)
    mask = (torch.rand(batch, length) < 0.1) if padded else None
    with aft_kernel(implementation), CountOps() as counter:
        layer(x, key_padding_mask=mask).sum().backward()
    return counter.counts


@pytest.mark.parametrize("name", ["simple", "full", "local", "conv"])
@pytest.mark.parametrize("implementation", GPU_KERNELS)
def test_dispatched_ops_do_not_grow_with_length_or_batch(implementation, name):
    """No loop whose trip count depends on T or B: one fwd+bwd dispatches the same ATen ops (a Triton
    kernel launch is not an ATen op: what is counted is the PyTorch around the kernels)."""
    layer = make_layer(name)
    # lengths of whole blocks of 64 (a partial block adds the ops that pad it)
    length, longer = 256, (4096 if name != "full" else 2048)
    if implementation == "triton":  # the interpreter runs each program in Python: keep the grid small
        length, longer = 128, 512
    short = dispatched_ops(layer, 1, length, padded=True, implementation=implementation)
    assert dispatched_ops(layer, 1, longer, padded=True, implementation=implementation) == short
    assert dispatched_ops(layer, 8, length, padded=True, implementation=implementation) == short
    assert not any("item" in op or "local_scalar_dense" in op for op in short), "a host-device sync"


def assert_compiled_matches_eager(layer, implementation, backend):
    """`torch.compile(layer, backend=backend, fullgraph=True)` traces the layer in one graph and gives
    the eager outputs and gradients (of the input and of every parameter), with a padded row."""
    torch._dynamo.reset()
    x = torch.randn(2, 20, layer.d_model, requires_grad=True)
    mask = torch.zeros(2, 20, dtype=torch.bool)
    mask[1, :5] = True
    results = []
    with aft_kernel(implementation):
        for run in (layer, torch.compile(layer, backend=backend, fullgraph=True)):
            layer.zero_grad()
            x.grad = None
            out = run(x, key_padding_mask=mask)
            out.square().sum().backward()
            results.append((out.detach(), x.grad, *(p.grad.clone() for p in layer.parameters())))
    eager, compiled = results
    assert torch.isfinite(compiled[1]).all()
    for got, expected in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("name", ["simple", "full", "local", "conv"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("implementation", GPU_KERNELS)
def test_compiles_into_one_graph(implementation, name, causal):
    layer = make_layer(name, max_len=32)
    layer.causal = causal
    assert_compiled_matches_eager(layer, implementation, backend="eager")


# Inductor compiles its CPU kernels with the C++ compiler torch finds (g++ unless $CXX says otherwise).
needs_cxx = pytest.mark.skipif(not any(shutil.which(cxx) for cxx in (os.environ.get("CXX"), "g++", "clang++") if cxx),
                               reason="inductor's CPU code needs a C++ compiler (g++ or clang++; Debian: apt-get install g++)")


@needs_cxx
@pytest.mark.slow  # inductor generates and compiles C++ for every graph
@pytest.mark.parametrize("name", ["full", "local"])  # the two ways into the kernels: the [T, T] bias and the band
@pytest.mark.parametrize("implementation", GPU_KERNELS)
def test_inductor_compiles_the_gpu_paths(implementation, name):
    """`--compile` on a GPU runs inductor, which lowers the graph rather than only tracing it (here
    into inductor's CPU code)."""
    # Inductor picks its vector width from the CPU, not from ATEN_CPU_CAPABILITY: where that variable
    # narrows ATen's kernels, inductor's code must be as narrow (torch 2.13 does not do it itself:
    # under "default" its vector code does not compile, under "avx2" it computes NaN).
    width = {"default": 1, "avx2": 256}.get(os.environ.get("ATEN_CPU_CAPABILITY", ""))
    with torch._inductor.config.patch({} if width is None else {"cpp.simdlen": width}):
        assert_compiled_matches_eager(make_layer(name, max_len=32), implementation, backend="inductor")

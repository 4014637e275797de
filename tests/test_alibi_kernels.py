"""aftalibi.alibi_kernels: each kernel that `alibi_attention` may choose equals the float64 reference
(values and gradients, fp32 and bf16), the choice itself, and the properties a GPU run relies on that a
CPU can check (padded head dims, no host sync under torch.compile, no bias kept alive)."""

import gc
import math
import warnings
import weakref

import pytest
import torch

import aftalibi.alibi as alibi
import aftalibi.alibi_kernels as kernels
from aftalibi.alibi import AlibiMultiHeadAttention, alibi_attention, alibi_attention_reference, get_slopes
from aftalibi.alibi_kernels import (ALIBI_KERNELS, causal_alibi_cpu_flash, causal_alibi_extra_columns,
                                    causal_alibi_flex, choose_alibi_kernel, run_alibi_kernel)
from aftalibi.attention import KVCache

# Tolerances against the float64 reference: values, and gradients relative to their largest entry.
TOLERANCE = {torch.float32: (2e-5, 1e-4), torch.bfloat16: (3e-2, 5e-2)}


def random_qkv(batch, heads, length, d_head, seed=0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, heads, length, d_head, generator=generator).to(dtype) for _ in range(3))


def forced(monkeypatch, kernel):
    """Make `alibi_attention` run `kernel` whenever its inputs allow a per-key kernel."""
    choose = kernels.choose_alibi_kernel
    monkeypatch.setattr(alibi, "choose_alibi_kernel",
                        lambda *args, causal_whole_sequence, **kwargs:
                        kernel if causal_whole_sequence else choose(*args, causal_whole_sequence=False, **kwargs))


def assert_values_and_grads_match(run, q, k, v, slopes, dtype):
    """`run(q, k, v)` in `dtype` against the float64 reference: outputs and the gradients of a weighted sum."""
    value_tolerance, grad_tolerance = TOLERANCE[dtype]
    inputs = [t.to(dtype).requires_grad_(True) for t in (q, k, v)]
    exact_inputs = [t.double().requires_grad_(True) for t in (q, k, v)]
    out = run(*inputs)
    exact = alibi_attention_reference(*exact_inputs, slopes)
    assert out.dtype == dtype and out.isfinite().all()
    assert (out.double() - exact).abs().max() < value_tolerance
    weights = torch.randn(exact.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads = torch.autograd.grad((out.double() * weights).sum(), inputs)
    exact_grads = torch.autograd.grad((exact * weights).sum(), exact_inputs)
    for got, expected in zip(grads, exact_grads):
        assert got.isfinite().all()
        assert (got.double() - expected).abs().max() < grad_tolerance * expected.abs().max()


def test_kernel_choice():
    choose = lambda device, dtype, d_head=32, whole=True, dropout=False: choose_alibi_kernel(
        device, dtype, d_head, causal_whole_sequence=whole, dropout=dropout)
    assert choose("cpu", torch.float32) == choose("cpu", torch.bfloat16) == choose("cpu", torch.float64) == "cpu_flash"
    assert choose("cpu", torch.float32, dropout=True) == "extra_columns"  # the CPU flash kernel has no dropout
    assert choose("cpu", torch.float16) == "float_bias"
    assert choose("cuda", torch.float32) == choose("cuda", torch.float32, dropout=True) == "extra_columns"
    flex = "flex" if kernels._FLEX_AVAILABLE else "extra_columns"
    assert choose("cuda", torch.bfloat16) == flex and choose("cuda", torch.bfloat16, d_head=24) == "extra_columns"
    assert choose("cuda", torch.float16) == (flex if flex == "flex" else "float_bias")
    assert choose("cuda", torch.bfloat16, dropout=True) == "extra_columns"  # FlexAttention has no dropout
    for device in ("cpu", "cuda", "mps"):
        assert choose(device, torch.float32, whole=False) == "float_bias"
    assert set(ALIBI_KERNELS) == {"cpu_flash", "flex", "extra_columns", "float_bias"}


def test_run_alibi_kernel_runs_the_named_kernel_and_refuses_the_rest():
    q, k, v = random_qkv(1, 2, 9, 8)
    slopes = get_slopes(2)
    assert torch.equal(run_alibi_kernel("cpu_flash", q, k, v, slopes), causal_alibi_cpu_flash(q, k, v, slopes))
    assert torch.equal(run_alibi_kernel("extra_columns", q, k, v, slopes),
                       causal_alibi_extra_columns(q, k, v, slopes))
    with pytest.raises(ValueError, match="kernel must be 'cpu_flash', 'flex' or 'extra_columns', got 'float_bias'"):
        run_alibi_kernel("float_bias", q, k, v, slopes)
    with pytest.raises(ValueError, match="kernel 'cpu_flash' has no dropout"):
        run_alibi_kernel("cpu_flash", q, k, v, slopes, dropout_p=0.1)


def test_the_layer_chooses_from_metadata_only(monkeypatch):
    """Causal whole sequences take a per-key kernel; padding, decoding, bidirectional and learned slopes do not."""
    seen = []
    choose = kernels.choose_alibi_kernel
    monkeypatch.setattr(alibi, "choose_alibi_kernel", lambda *args, **kwargs: seen.append(kwargs) or choose(*args, **kwargs))
    q, k, v = random_qkv(1, 2, 6, 4)
    slopes = get_slopes(2)
    alibi_attention(q, k, v, slopes)
    alibi_attention(q, k, v, slopes, attention_mask=torch.ones(1, 6, dtype=torch.bool))
    alibi_attention(q[:, :, -1:], k, v, slopes)
    alibi_attention(q, k, v, slopes, causal=False)
    alibi_attention(q, k, v, slopes.clone().requires_grad_(True))
    assert [kwargs["causal_whole_sequence"] for kwargs in seen] == [True, False, False, False, False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kernel", ["cpu_flash", "extra_columns", "float_bias"])
def test_every_kernel_through_alibi_attention(monkeypatch, kernel, dtype):
    forced(monkeypatch, kernel)
    q, k, v = random_qkv(2, 4, 70, 16, seed=3)
    slopes = get_slopes(4)
    assert_values_and_grads_match(lambda a, b, c: alibi_attention(a, b, c, slopes), q, k, v, slopes, dtype)


@pytest.mark.parametrize("run", ["alibi_attention", "cpu_flash", "extra_columns"])
def test_a_sequence_of_no_tokens_gives_an_empty_output(run):
    """T = 0 gives an empty output, as softmax attention does: torch's CPU flash kernel, given no
    queries, stopped the whole process with SIGFPE (a language model fed an empty slice did)."""
    q, k, v = (t.requires_grad_(True) for t in random_qkv(2, 4, 0, 16))
    slopes = get_slopes(4)
    out = (alibi_attention(q, k, v, slopes) if run == "alibi_attention"
           else run_alibi_kernel(run, q, k, v, slopes))
    assert out.shape == (2, 4, 0, 16)
    out.sum().backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim_multiple", [1, 8, 16])
def test_extra_columns_padded_to_a_kernel_friendly_head_dim(dtype, head_dim_multiple):
    """The zero columns and the explicit scale leave the result unchanged, values and gradients."""
    q, k, v = random_qkv(2, 3, 50, 12, seed=4)
    slopes = get_slopes(3)
    assert_values_and_grads_match(
        lambda a, b, c: causal_alibi_extra_columns(a, b, c, slopes, head_dim_multiple=head_dim_multiple),
        q, k, v, slopes, dtype)


def test_extra_columns_float64_exact_with_padding():
    q, k, v = (t.double().requires_grad_(True) for t in random_qkv(1, 2, 9, 5, seed=5))
    slopes = get_slopes(2)
    assert torch.autograd.gradcheck(lambda a, b, c: causal_alibi_extra_columns(a, b, c, slopes, head_dim_multiple=8),
                                    (q, k, v))
    padded = causal_alibi_extra_columns(q, k, v, slopes, head_dim_multiple=8)
    assert torch.allclose(padded, alibi_attention_reference(q, k, v, slopes), atol=1e-12)


def test_extra_columns_head_dims_seen_by_the_kernel(monkeypatch):
    """fp32: 32 + 1 column -> 40; bf16: 32 + 3 columns -> 40; CPU default: no padding."""
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording_sdpa(q, k, v, **kwargs):
        seen.append((q.shape[-1], k.shape[-1], v.shape[-1], kwargs["scale"]))
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(kernels.F, "scaled_dot_product_attention", recording_sdpa)
    slopes = get_slopes(2)
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = random_qkv(1, 2, 8, 32, dtype=dtype)
        causal_alibi_extra_columns(q, k, v, slopes, head_dim_multiple=8)
    causal_alibi_extra_columns(*random_qkv(1, 2, 8, 32), slopes)
    scale = 1 / math.sqrt(32)
    assert seen == [(40, 40, 40, scale), (40, 40, 40, scale), (33, 33, 33, scale)]


def test_extra_columns_with_dropout():
    q, k, v = random_qkv(1, 2, 16, 8)
    slopes = get_slopes(2)
    torch.manual_seed(0)
    dropped = causal_alibi_extra_columns(q, k, v, slopes, dropout_p=0.5, head_dim_multiple=8)
    assert dropped.isfinite().all() and not torch.allclose(dropped, causal_alibi_extra_columns(q, k, v, slopes))
    assert (causal_alibi_extra_columns(q, k, v, slopes, dropout_p=1.0) == 0).all()  # every weight dropped


def test_extra_columns_when_the_cpu_kernel_is_missing(monkeypatch):
    """Builds without the CPU flash operator fall back to the extra columns."""
    monkeypatch.setattr(kernels, "_flash_attention_cpu", None)
    assert choose_alibi_kernel("cpu", torch.float32, 16, causal_whole_sequence=True, dropout=False) == "extra_columns"
    q, k, v = random_qkv(2, 8, 300, 16, seed=3)
    slopes = get_slopes(8)
    expected = alibi_attention_reference(q, k, v, slopes)
    assert torch.allclose(alibi_attention(q.double(), k.double(), v.double(), slopes), expected, atol=1e-12)
    assert torch.allclose(alibi_attention(q, k, v, slopes).double(), expected, atol=2e-5)


@pytest.mark.parametrize("length, block", [(1, 4), (7, 3), (9, 3), (300, 64), (300, 300)])
def test_cpu_flash_in_blocks_equals_the_reference(length, block):
    """Several query blocks, each with its own centre, merged by log-sum-exp: values and gradients."""
    q, k, v = (t.double().requires_grad_(True) for t in random_qkv(2, 3, length, 8, seed=length))
    slopes = get_slopes(3)
    expected = alibi_attention_reference(q, k, v, slopes)
    got = causal_alibi_cpu_flash(q, k, v, slopes, block=block)
    assert torch.allclose(got, expected, atol=1e-12)
    weights = torch.randn_like(expected)
    got_grads = torch.autograd.grad((got * weights).sum(), (q, k, v))
    expected_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    for got_grad, expected_grad in zip(got_grads, expected_grads):
        assert torch.allclose(got_grad, expected_grad, atol=1e-12)
    for dtype in (torch.float32, torch.bfloat16):
        blocked = causal_alibi_cpu_flash(*(t.detach().to(dtype) for t in (q, k, v)), slopes, block=block)
        assert blocked.dtype == dtype and (blocked.double() - expected).abs().max() < TOLERANCE[dtype][0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_flash_in_blocks_gradients_in_low_precision(dtype):
    q, k, v = random_qkv(1, 2, 40, 8, seed=6)
    slopes = get_slopes(2)
    assert_values_and_grads_match(lambda a, b, c: causal_alibi_cpu_flash(a, b, c, slopes, block=16), q, k, v, slopes,
                                  dtype)


def test_cpu_flash_gradcheck_in_blocks():
    q, k, v = (t.double().requires_grad_(True) for t in random_qkv(1, 2, 7, 3))
    slopes = get_slopes(2)
    assert torch.autograd.gradcheck(lambda a, b, c: causal_alibi_cpu_flash(a, b, c, slopes, block=3), (q, k, v))


def test_query_blocks_keep_the_fp32_error_flat_in_length():
    """One centre for all queries: error ~ 2^-24 m T / 2 grows with T; a centre per block of 512 does not."""
    slopes = torch.tensor([0.5])  # the steepest slope of 8 heads
    q, k, v = random_qkv(1, 1, 4096, 32, seed=1)
    expected = alibi_attention_reference(q, k, v, slopes)
    blocked = (causal_alibi_cpu_flash(q, k, v, slopes, block=512).double() - expected).abs().max()
    one_centre = (causal_alibi_cpu_flash(q, k, v, slopes, block=4096).double() - expected).abs().max()
    assert blocked < 1.5e-5 < 3e-5 < one_centre


@pytest.mark.skipif(kernels.flex_attention is None, reason="this torch has no FlexAttention (torch < 2.5)")
@pytest.mark.parametrize("length", [1, 127, 128, 129, 300])
def test_flex_block_mask_is_causal(length):
    n_blocks = -(-length // 128)
    dense = kernels._causal_block_mask(length, torch.device("cpu")).to_dense()[0, 0]
    assert torch.equal(dense, torch.ones(n_blocks, n_blocks, dtype=dense.dtype).tril())


@pytest.mark.skipif(kernels.flex_attention is None, reason="this torch has no FlexAttention (torch < 2.5)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flex_forward_equals_the_reference(dtype):
    """FlexAttention's unfused implementation on CPU (no CPU backward exists): the score_mod and block mask."""
    q, k, v = random_qkv(2, 4, 200, 16, seed=7)
    slopes = get_slopes(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "flex_attention called without torch.compile()": meant here
        got = causal_alibi_flex(q.to(dtype), k.to(dtype), v.to(dtype), slopes, compiled=False)
    assert got.dtype == dtype
    assert (got.double() - alibi_attention_reference(q, k, v, slopes)).abs().max() < TOLERANCE[dtype][0]


def test_float_bias_path_keeps_no_bias_alive(monkeypatch):
    """Decoding makes a new bias shape every step: none of them may outlive its call."""
    made = []
    make_bias = alibi.alibi_bias

    def recording_bias(*args, **kwargs):
        bias = make_bias(*args, **kwargs)
        made.append(weakref.ref(bias))
        return bias

    monkeypatch.setattr(alibi, "alibi_bias", recording_bias)
    torch.manual_seed(0)
    for causal in (True, False):
        layer, cache = AlibiMultiHeadAttention(16, 2, causal=causal).eval(), KVCache()
        x = torch.randn(1, 6, 16)
        with torch.no_grad():
            layer(x)
            for t in range(6):
                layer(x[:, t : t + 1], kv_cache=cache)
    gc.collect()
    assert len(made) >= 12 and all(ref() is None for ref in made)


@pytest.mark.parametrize("case", ["causal", "padded", "bidirectional", "decoding"])
def test_layer_traces_with_no_graph_break(case):
    """`torch.compile(fullgraph=True)` fails on any host sync or data-dependent branch in the kernel choice."""
    torch.manual_seed(0)
    layer = AlibiMultiHeadAttention(32, 4, causal=case != "bidirectional")
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    x = torch.randn(2, 12, 32, requires_grad=True)
    mask = torch.arange(12)[None, :] >= torch.tensor([[0], [5]]) if case == "padded" else None
    if case == "decoding":
        with torch.no_grad():
            expected, got = [], []
            for run, outputs in ((layer, expected), (compiled, got)):
                cache = KVCache()
                outputs += [run(x[:, t : t + 1], kv_cache=cache) for t in range(4)]
        assert torch.allclose(torch.cat(got, 1), torch.cat(expected, 1), atol=1e-6)
        return
    out = compiled(x, attention_mask=mask)
    out.sum().backward()
    assert torch.allclose(out, layer(x, attention_mask=mask), atol=1e-6) and x.grad.isfinite().all()


@pytest.mark.parametrize("kernel", ["blocks", "extra_columns"])
def test_kernels_trace_with_no_graph_break(kernel):
    q, k, v = (t.requires_grad_(True) for t in random_qkv(1, 2, 20, 8))
    slopes = get_slopes(2)
    run = ((lambda a, b, c: causal_alibi_cpu_flash(a, b, c, slopes, block=8)) if kernel == "blocks" else
           (lambda a, b, c: causal_alibi_extra_columns(a, b, c, slopes, head_dim_multiple=8)))
    out = torch.compile(run, backend="eager", fullgraph=True)(q, k, v)
    out.sum().backward()
    assert torch.allclose(out, run(q, k, v), atol=1e-6) and q.grad.isfinite().all()

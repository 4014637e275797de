"""aftalibi.alibi against the paper's slope rule, a literal float64 reference of the biased softmax,
and the properties ALiBi attention must have (causality, padding, decoding, precision)."""


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aftalibi.alibi import (AlibiMultiHeadAttention, MinimalAlibiAttention, alibi_attention,
                            alibi_attention_reference, alibi_bias, get_slopes, token_positions)
from aftalibi.attention import KVCache, MultiHeadAttention

float64 = torch.float64


def oracle_slopes(n):
    """The paper's rule, written independently: 2^(-8h/n) for powers of two, else p slopes + every other of 2p."""
    def geometric(count):
        return [2 ** (-8 * h / count) for h in range(1, count + 1)]
    if n & (n - 1) == 0:
        return geometric(n)
    p = 1 << (n.bit_length() - 1)
    return geometric(p) + geometric(2 * p)[::2][: n - p]


def oracle_bias(slopes, q_len, k_len, causal, mask, offset):
    """The bias entry by entry with Python loops: positions count real tokens only."""
    batch = 1 if mask is None else mask.shape[0]
    out = torch.full((batch, len(slopes), q_len, k_len), float("-inf"), dtype=float64)
    for b in range(batch):
        real = [True] * k_len if mask is None else [bool(x) for x in mask[b]]
        position = [sum(real[: j + 1]) - 1 for j in range(k_len)]
        for h, m in enumerate(slopes.tolist()):
            for t in range(q_len):
                i = offset + t
                for j in range(k_len):
                    if real[j] and (j <= i or not causal):
                        out[b, h, t, j] = -m * abs(position[i] - position[j])
    return out


def left_padding_mask(lengths, total):
    return torch.stack([torch.arange(total) >= total - n for n in lengths])


def random_qkv(batch, heads, q_len, k_len, d_head, seed=0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, d_head, generator=generator, dtype=dtype)
    k = torch.randn(batch, heads, k_len, d_head, generator=generator, dtype=dtype)
    v = torch.randn(batch, heads, k_len, d_head, generator=generator, dtype=dtype)
    return q, k, v


def test_slopes_match_the_rule_for_1_to_64_heads():
    for n in range(1, 65):
        assert torch.allclose(get_slopes(n).double(), torch.tensor(oracle_slopes(n), dtype=float64), rtol=1e-7), n


def test_slopes_hand_worked_cases():
    assert get_slopes(8).tolist() == [2.0 ** -h for h in range(1, 9)]
    expected = [2.0 ** -h for h in range(1, 9)] + [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]
    assert torch.allclose(get_slopes(12), torch.tensor(expected))


def test_slopes_errors():
    with pytest.raises(ValueError, match="n_heads must be >= 1"):
        get_slopes(0)
    with pytest.raises(TypeError, match="n_heads must be an int"):
        get_slopes(2.0)


@settings(max_examples=30, deadline=None)
@given(heads=st.integers(1, 3), q_len=st.integers(1, 6), extra=st.integers(0, 4), causal=st.booleans(),
       padded=st.booleans(), seed=st.integers(0, 2**16))
def test_bias_equals_the_loop_oracle(heads, q_len, extra, causal, padded, seed):
    k_len = q_len + extra
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.rand(2, k_len, generator=generator) > 0.3) if padded else None
    offset = int(torch.randint(0, extra + 1, (1,), generator=generator))
    slopes = get_slopes(heads)
    got = alibi_bias(slopes, q_len, k_len, causal=causal, attention_mask=mask, offset=offset)
    assert torch.equal(got.double(), oracle_bias(slopes, q_len, k_len, causal, mask, offset))


def test_positions_count_real_tokens_only():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert token_positions(mask).tolist() == [[-1, -1, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_bias_errors_name_the_argument():
    slopes = get_slopes(2)
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        alibi_bias(slopes, 3, 3, attention_mask=torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="attention_mask must be bool or integer"):
        alibi_bias(slopes, 3, 3, attention_mask=torch.ones(1, 3))
    with pytest.raises(ValueError, match="offset"):
        alibi_bias(slopes, 3, 3, offset=1)
    with pytest.raises(ValueError, match="slopes must have shape"):
        alibi_bias(slopes[None], 3, 3)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 3), heads=st.integers(1, 3), q_len=st.integers(1, 9), extra=st.integers(0, 5),
       d_head=st.integers(1, 8), causal=st.booleans(), padded=st.booleans(), seed=st.integers(0, 2**16))
def test_attention_equals_the_float64_reference(batch, heads, q_len, extra, d_head, causal, padded, seed):
    k_len = q_len + extra
    q, k, v = random_qkv(batch, heads, q_len, k_len, d_head, seed)
    lengths = torch.randint(0, k_len + 1, (batch,), generator=torch.Generator().manual_seed(seed)).tolist()
    mask = left_padding_mask(lengths, k_len) if padded else None
    slopes = get_slopes(heads)
    got = alibi_attention(q, k, v, slopes, causal=causal, attention_mask=mask)
    expected = alibi_attention_reference(q, k, v, slopes, causal=causal, attention_mask=mask)
    assert got.dtype == torch.float32 and got.isfinite().all()
    assert torch.allclose(got.double(), expected, atol=1e-5)


def test_reference_is_the_literal_equation():
    q, k, v = random_qkv(1, 2, 5, 5, 4, dtype=float64)
    slopes = get_slopes(2).double()
    i, j = torch.arange(5)[:, None], torch.arange(5)[None, :]
    scores = q @ k.transpose(-2, -1) / 2.0 - slopes[:, None, None] * (i - j)
    expected = torch.softmax(scores.masked_fill(j > i, float("-inf")), dim=-1) @ v
    assert torch.allclose(alibi_attention_reference(q, k, v, slopes), expected)


@pytest.mark.parametrize("length", [1, 7, 300])
def test_fused_causal_path_float64_and_float32(length):
    q, k, v = random_qkv(2, 8, length, length, 16, seed=length)
    slopes = get_slopes(8)
    expected = alibi_attention_reference(q, k, v, slopes)
    assert torch.allclose(alibi_attention(q.double(), k.double(), v.double(), slopes), expected, atol=1e-12)
    assert torch.allclose(alibi_attention(q, k, v, slopes).double(), expected, atol=2e-5)


def test_fused_path_precision_on_a_long_sequence():
    """One block of 2048 queries: fp32 error about 2^-24 m T / 2; bf16 matches the float-bias path."""
    length, slopes = 2048, get_slopes(8)
    q, k, v = random_qkv(1, 8, length, length, 32, seed=1)
    expected = alibi_attention_reference(q, k, v, slopes)
    fused = alibi_attention(q, k, v, slopes)
    assert (fused.double() - expected).abs().max() < 5e-5
    everything_real = torch.ones(1, length, dtype=torch.bool)
    q16, k16, v16 = q.bfloat16(), k.bfloat16(), v.bfloat16()
    fused16 = (alibi_attention(q16, k16, v16, slopes).double() - expected).abs()
    biased16 = (alibi_attention(q16, k16, v16, slopes, attention_mask=everything_real).double() - expected).abs()
    assert fused16.max() < 3e-2
    assert fused16.mean() < 1.2 * biased16.mean()


def test_dropout():
    """The CPU flash kernel has no dropout: with dropout_p > 0 the extra-column kernel runs."""
    q, k, v = random_qkv(1, 2, 16, 16, 8)
    torch.manual_seed(0)
    dropped = alibi_attention(q, k, v, get_slopes(2), dropout_p=0.5)
    assert dropped.isfinite().all() and not torch.allclose(dropped, alibi_attention(q, k, v, get_slopes(2)))
    assert (alibi_attention(q, k, v, get_slopes(2), dropout_p=1.0) == 0).all()  # every weight dropped


def test_no_future_leak_in_values_or_gradients():
    q, k, v = random_qkv(1, 4, 12, 12, 8)
    k.requires_grad_(True)
    v.requires_grad_(True)
    out = alibi_attention(q, k, v, get_slopes(4))
    out[:, :, 5].sum().backward()
    assert k.grad[:, :, 6:].abs().max() == 0 and v.grad[:, :, 6:].abs().max() == 0
    assert v.grad[:, :, :6].abs().max() > 0


def test_left_padded_batch_equals_each_sequence_alone():
    lengths, total = [10, 6, 1, 0], 10
    q, k, v = random_qkv(4, 2, total, total, 8)
    mask = left_padding_mask(lengths, total)
    slopes = get_slopes(2)
    out = alibi_attention(q, k, v, slopes, attention_mask=mask)
    assert out.isfinite().all()
    for b, n in enumerate(lengths):
        assert (out[b, :, : total - n] == 0).all()  # pad queries see no real key: 0, not NaN
        if n:
            alone = alibi_attention(q[b : b + 1, :, total - n :], k[b : b + 1, :, total - n :],
                                    v[b : b + 1, :, total - n :], slopes)
            assert torch.allclose(out[b, :, total - n :], alone[0], atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fully_padded_row_has_finite_gradients(dtype):
    q, k, v = (t.to(dtype).requires_grad_(True) for t in random_qkv(2, 2, 5, 5, 4))
    mask = torch.tensor([[0, 0, 0, 0, 0], [0, 1, 1, 1, 1]])
    out = alibi_attention(q, k, v, get_slopes(2), attention_mask=mask)
    assert (out[0] == 0).all() and (out[1, :, 0] == 0).all()  # queries with no real key give 0
    out.sum().backward()
    assert all(t.grad.isfinite().all() for t in (q, k, v))


@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck_float64(causal):
    q, k, v = (t.double().requires_grad_(True) for t in random_qkv(1, 2, 4, 4, 3))
    slopes = get_slopes(2)
    assert torch.autograd.gradcheck(lambda a, b, c: alibi_attention(a, b, c, slopes, causal=causal), (q, k, v))
    mask = torch.tensor([[0, 1, 1, 1]])
    assert torch.autograd.gradcheck(lambda a, b, c: alibi_attention(a, b, c, slopes, causal=causal,
                                                                    attention_mask=mask), (q, k, v))


def test_extreme_scores_stay_finite():
    q, k, v = random_qkv(1, 2, 64, 64, 8)
    out = alibi_attention(q * 1e3, k * 1e3, v, get_slopes(2))
    assert out.isfinite().all()
    assert torch.allclose(out.double(), alibi_attention_reference(q * 1e3, k * 1e3, v, get_slopes(2)), atol=1e-3)


def test_attention_errors_name_the_argument():
    q, k, v = random_qkv(1, 2, 4, 4, 8)
    slopes = get_slopes(2)
    with pytest.raises(ValueError, match="k must have shape"):
        alibi_attention(q, k[:, :1], v, slopes)
    with pytest.raises(ValueError, match="v must have shape"):
        alibi_attention(q, k, v[:, :, :3], slopes)
    with pytest.raises(ValueError, match="slopes must have shape"):
        alibi_attention(q, k, v, get_slopes(3))
    with pytest.raises(ValueError, match="q must have shape"):
        alibi_attention(q[0], k, v, slopes)
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        alibi_attention(q, k, v, slopes, attention_mask=torch.ones(1, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="attention_mask must be bool or integer"):
        alibi_attention(q, k, v, slopes, attention_mask=torch.ones(1, 4))


@pytest.mark.parametrize("n_heads, length", [(4, 37), (3, 5)])
def test_minimal_layer_equals_the_package_layer_and_the_reference(n_heads, length):
    """Notebook 03's few-line layer and the package's layer, with the same weights, compute the same
    function: both equal the float64 oracle, and in float32 their outputs and gradients agree."""
    torch.manual_seed(0)
    minimal = MinimalAlibiAttention(24, n_heads).double()
    layer = AlibiMultiHeadAttention(24, n_heads).double().eval()
    layer.load_state_dict(minimal.state_dict())
    x = torch.randn(2, length, 24, dtype=float64)
    q, k, v = minimal.qkv(x).view(2, length, 3, n_heads, 24 // n_heads).permute(2, 0, 3, 1, 4)
    heads = alibi_attention_reference(q, k, v, get_slopes(n_heads))  # [B, H, T, d_head]
    expected = minimal.out(heads.transpose(1, 2).reshape(2, length, 24))
    with torch.no_grad():
        assert (minimal(x) - expected).abs().max() < 1e-12
        assert (layer(x) - expected).abs().max() < 1e-12
    minimal, layer, x = minimal.float(), layer.float(), x.float().requires_grad_(True)
    out_minimal, out_layer = minimal(x), layer(x)
    assert (out_minimal - out_layer).abs().max() < 1e-5
    weights = torch.randn(out_layer.shape)
    grads_minimal = torch.autograd.grad((out_minimal * weights).sum(), [x, minimal.qkv.weight])
    grads_layer = torch.autograd.grad((out_layer * weights).sum(), [x, layer.qkv.weight])
    for got, expected in zip(grads_layer, grads_minimal):
        assert (got - expected).abs().max() < 1e-4 * expected.abs().max()


def test_layer_kv_cache_decoding_equals_full_forward():
    torch.manual_seed(0)
    layer = AlibiMultiHeadAttention(32, 4).eval()
    x = torch.randn(3, 11, 32)
    mask = left_padding_mask([11, 7, 3], 11)
    for attention_mask in (None, mask):
        full = layer(x, attention_mask=attention_mask)
        cache = KVCache()
        with torch.no_grad():
            # A prompt block, then one token at a time.
            steps = [layer(x[:, :4], attention_mask=None if attention_mask is None else attention_mask[:, :4],
                           kv_cache=cache)]
            for t in range(4, 11):
                step_mask = None if attention_mask is None else attention_mask[:, : t + 1]
                steps.append(layer(x[:, t : t + 1], attention_mask=step_mask, kv_cache=cache))
        assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


def test_layer_bf16_and_bidirectional():
    torch.manual_seed(0)
    layer = AlibiMultiHeadAttention(32, 4)
    x = torch.randn(2, 40, 32)
    full = layer(x)
    assert torch.allclose(layer.bfloat16()(x.bfloat16()).float(), full, atol=5e-2)
    both_ways = AlibiMultiHeadAttention(32, 4, causal=False)
    y = both_ways(x)
    y[:, 0].sum().backward()
    assert both_ways.qkv.weight.grad.isfinite().all() and y.shape == x.shape


def test_layer_errors():
    with pytest.raises(ValueError, match="n_heads must be >= 1"):
        AlibiMultiHeadAttention(32, 0)
    with pytest.raises(ValueError, match="divisible"):
        AlibiMultiHeadAttention(30, 4)
    with pytest.raises(ValueError, match="dropout"):
        AlibiMultiHeadAttention(32, 4, dropout=1.0)
    with pytest.raises(ValueError, match="x must have shape"):
        AlibiMultiHeadAttention(32, 4)(torch.randn(2, 5, 16))


def test_float16_takes_the_float_bias_path_within_tolerance():
    q, k, v = random_qkv(2, 4, 50, 50, 16)
    slopes = get_slopes(4)
    expected = alibi_attention_reference(q, k, v, slopes)
    got = alibi_attention(q.half(), k.half(), v.half(), slopes)
    assert got.dtype == torch.float16 and torch.allclose(got.double(), expected, atol=1e-2)


@pytest.mark.parametrize("make", [lambda: AlibiMultiHeadAttention(32, 4), lambda: MultiHeadAttention(32, 4, rotary=True)])
def test_cpu_autocast_projects_in_bf16_and_attends_in_float32(make, monkeypatch):
    """Under CPU bf16 autocast the layer's heads reach the attention kernel in float32 (its CPU kernels
    are slow in bf16); the output stays within bf16 rounding of the float32 layer's."""
    torch.manual_seed(0)
    layer, x = make(), torch.randn(3, 40, 32)
    seen = []
    attend = type(layer)._attend

    def recording_attend(self, q, k, v, mask):
        out = attend(self, q, k, v, mask)
        seen.append((q.dtype, out.dtype))  # float32 out: autocast did not cast the kernel's inputs back to bf16
        return out

    monkeypatch.setattr(type(layer), "_attend", recording_attend)
    expected = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = layer(x)
    assert seen == [(torch.float32, torch.float32)] * 2
    assert mixed.dtype == torch.bfloat16 and torch.isfinite(mixed).all()
    torch.testing.assert_close(mixed.float(), expected, atol=0.05, rtol=0.05)

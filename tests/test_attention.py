"""aftalibi.attention against the float64 reference of the equation, PyTorch's own layers,
and the properties a causal layer must have."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from aftalibi.attention import (KVCache, LearnedPositionEncoding, MultiHeadAttention, RotaryPositionEncoding,
                                SinusoidalPositionEncoding, attention, attention_reference, causal_mask,
                                sinusoidal_position_encoding)

float64 = torch.float64


def left_padding_mask(lengths, total):
    """[B, total] mask with 1 on the last `length` positions of each row."""
    return torch.stack([torch.arange(total) >= total - n for n in lengths]).long()


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 3), heads=st.integers(1, 3), q_len=st.integers(1, 9), extra=st.integers(0, 5),
       d_head=st.integers(1, 8), causal=st.booleans(), padded=st.booleans(), seed=st.integers(0, 2**16))
def test_attention_equals_the_float64_reference(batch, heads, q_len, extra, d_head, causal, padded, seed):
    generator = torch.Generator().manual_seed(seed)
    k_len = q_len + extra
    q = torch.randn(batch, heads, q_len, d_head, dtype=float64, generator=generator)
    k, v = torch.randn(2, batch, heads, k_len, d_head, dtype=float64, generator=generator)
    mask = torch.randint(0, 2, (batch, k_len), generator=generator) if padded else None
    allowed = causal_mask(q_len, k_len) if causal else torch.ones(q_len, k_len, dtype=torch.bool)
    if padded:
        allowed = allowed & mask.bool()[:, None, None, :]
    expected = attention_reference(q, k, v, mask=allowed)
    torch.testing.assert_close(attention(q, k, v, causal=causal, attention_mask=mask), expected, rtol=1e-10, atol=1e-10)


def test_reference_matches_torch_sdpa():
    q, k, v = torch.randn(3, 2, 4, 16, 8, dtype=float64)
    torch.testing.assert_close(attention_reference(q, k, v, causal=True),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True))
    torch.testing.assert_close(attention_reference(q, k, v), F.scaled_dot_product_attention(q, k, v))


def copy_into_torch_mha(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    theirs = nn.MultiheadAttention(ours.d_model, ours.n_heads, batch_first=True).to(ours.qkv.weight.dtype)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(ours.qkv.weight)
        theirs.in_proj_bias.copy_(ours.qkv.bias)
        theirs.out_proj.weight.copy_(ours.out.weight)
        theirs.out_proj.bias.copy_(ours.out.bias)
    return theirs


@pytest.mark.parametrize("causal", [True, False])
def test_layer_equals_torch_multihead_attention(causal):
    torch.manual_seed(0)
    ours = MultiHeadAttention(24, 3, causal=causal).double()
    theirs = copy_into_torch_mha(ours)
    x = torch.randn(2, 11, 24, dtype=float64)
    attention_mask = left_padding_mask([11, 7], 11)
    expected, _ = theirs(x, x, x, attn_mask=~causal_mask(11) if causal else None,
                         key_padding_mask=~attention_mask.bool(), need_weights=False)
    real = attention_mask.bool()
    if causal:  # torch gives NaN for the keyless padding queries; compare the real tokens
        torch.testing.assert_close(ours(x, attention_mask)[real], expected[real])
    else:
        torch.testing.assert_close(ours(x, attention_mask), expected)
    torch.testing.assert_close(ours(x), theirs(x, x, x, attn_mask=~causal_mask(11) if causal else None,
                                               need_weights=False)[0])


@pytest.mark.parametrize("rotary", [False, True])
def test_future_tokens_never_change_past_outputs(rotary):
    torch.manual_seed(1)
    layer = MultiHeadAttention(16, 4, rotary=rotary).double()
    x = torch.randn(2, 12, 16, dtype=float64)
    changed = x.clone()
    changed[:, 7:] = 100 * torch.randn(2, 5, 16, dtype=float64)
    torch.testing.assert_close(layer(changed)[:, :7], layer(x)[:, :7], rtol=0, atol=0)


@pytest.mark.parametrize("rotary", [False, True])
def test_kv_cache_decoding_equals_the_full_forward(rotary):
    torch.manual_seed(2)
    layer = MultiHeadAttention(16, 2, rotary=rotary).double()
    x = torch.randn(3, 9, 16, dtype=float64)
    attention_mask = left_padding_mask([9, 6, 2], 9)
    cache = KVCache()
    prompt = layer(x[:, :4], attention_mask[:, :4], kv_cache=cache)  # a prompt block, then one token at a time
    steps = [layer(x[:, t:t + 1], attention_mask[:, :t + 1], kv_cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat([prompt, *steps], dim=1), layer(x, attention_mask))
    assert len(cache) == 9


def test_left_padded_batch_equals_each_sequence_alone():
    torch.manual_seed(3)
    layer = MultiHeadAttention(16, 4, rotary=True).double()
    short, long = torch.randn(1, 5, 16, dtype=float64), torch.randn(1, 8, 16, dtype=float64)
    batch = torch.cat([torch.cat([torch.zeros(1, 3, 16, dtype=float64), short], 1), long])
    out = layer(batch, left_padding_mask([5, 8], 8))
    torch.testing.assert_close(out[:1, 3:], layer(short))
    torch.testing.assert_close(out[1:], layer(long))


def test_fully_padded_rows_give_zeros_and_finite_gradients():
    layer = MultiHeadAttention(8, 2)
    x = torch.randn(2, 6, 8, requires_grad=True)
    attention_mask = torch.tensor([[0] * 6, [1] * 6])
    out = layer(x, attention_mask)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    torch.testing.assert_close(out[0], layer.out.bias.expand(6, 8).detach())  # no key: attention output 0


def test_gradcheck_in_float64():
    q, k, v = (torch.randn(1, 2, 5, 3, dtype=float64, requires_grad=True) for _ in range(3))
    mask = left_padding_mask([5], 5)
    assert torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, attention_mask=mask), (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v), (q, k, v))


@pytest.mark.parametrize("dtype,tolerance", [(torch.bfloat16, 3e-2), (torch.float16, 4e-3)])
def test_low_precision_stays_near_the_float64_reference(dtype, tolerance):
    torch.manual_seed(4)
    q, k, v = torch.randn(3, 2, 4, 64, 16, dtype=float64)
    q = q * 4  # sharp softmax: large scores
    expected = attention_reference(q, k, v, causal=True)
    got = attention(q.to(dtype), k.to(dtype), v.to(dtype), attention_mask=left_padding_mask([64, 64], 64))
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert (got.double() - expected).abs().max() < tolerance * 4


def test_sinusoidal_encoding_values():
    pe = sinusoidal_position_encoding(10, 6, offset=3, dtype=float64)
    position, i = 3 + 4, 1
    assert pe[4, 2 * i].item() == pytest.approx(math.sin(position / 10000 ** (2 * i / 6)), abs=1e-15)
    assert pe[4, 2 * i + 1].item() == pytest.approx(math.cos(position / 10000 ** (2 * i / 6)), abs=1e-15)
    x = torch.zeros(2, 10, 6, dtype=float64)
    torch.testing.assert_close(SinusoidalPositionEncoding(6)(x, offset=3), pe.expand(2, 10, 6))
    x = torch.randn(2, 10, 6, dtype=float64)
    torch.testing.assert_close(SinusoidalPositionEncoding(6, amplitude=0.02)(x, offset=3), x + 0.02 * pe)


def test_rotary_scores_depend_only_on_relative_position():
    rope = RotaryPositionEncoding(16)
    q, k = torch.randn(2, 1, 1, 1, 16, dtype=float64)
    score = lambda m, n: (rope(q, offset=m) * rope(k, offset=n)).sum()
    torch.testing.assert_close(score(2, 9), score(4002, 4009))
    torch.testing.assert_close(rope(q, offset=123).norm(), q.norm())


def test_learned_encoding_refuses_positions_past_max_len():
    encoding = LearnedPositionEncoding(max_len=16, d_model=4)
    assert encoding(torch.zeros(1, 16, 4)).shape == (1, 16, 4)
    with pytest.raises(ValueError, match=r"max_len=16 .* up to 17; sinusoidal, rotary and ALiBi"):
        encoding(torch.zeros(1, 1, 4), offset=16)


@pytest.mark.parametrize("make,message", [
    (lambda: MultiHeadAttention(16, 0), "n_heads must be >= 1"),
    (lambda: MultiHeadAttention(16, 3), r"d_model \(16\) must be divisible by n_heads \(3\)"),
    (lambda: MultiHeadAttention(16, 4, dropout=1.0), r"dropout must be in \[0, 1\)"),
    (lambda: RotaryPositionEncoding(7), "d_head must be even"),
    (lambda: sinusoidal_position_encoding(4, 5), "d_model must be even"),
    (lambda: SinusoidalPositionEncoding(4, amplitude=0.0), "amplitude must be > 0, got 0.0"),
    (lambda: causal_mask(5, 3), "q_len <= k_len"),
])
def test_bad_construction_is_named(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("x,attention_mask,error,message", [
    (torch.randn(5, 16), None, ValueError, r"x must have shape \[B, T, d_model\] \(3 dims\), got \(5, 16\)"),
    (torch.randn(2, 5, 8), None, ValueError, r"x must have shape \[B, T, d_model\] = \(\*, \*, 16\)"),
    (torch.randint(0, 3, (2, 5, 16)), None, TypeError, "x must be a floating-point tensor"),
    (torch.randn(2, 5, 16), torch.ones(2, 4), ValueError, r"attention_mask must have shape \[B, T_k\]"),
    (torch.randn(2, 5, 16), torch.ones(2, 5), TypeError, "attention_mask must be bool or integer 0/1"),
    (torch.randn(2, 5, 16), torch.full((2, 5), 2), ValueError, "only 0 .padding. and 1 .real token."),
])
def test_bad_input_is_named(x, attention_mask, error, message):
    with pytest.raises(error, match=message):
        MultiHeadAttention(16, 4)(x, attention_mask)

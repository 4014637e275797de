"""aftalibi.aft against the float64 reference of the AFT equation, and the properties a causal,
stable layer must have."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aftalibi import aft_triton
from aftalibi.aft import (AFT_KERNELS, AFTConv, AFTFull, AFTLocal, AFTSimple, MinimalAFTLocal, aft_conv, aft_full,
                          aft_kernel, aft_local, aft_reference, aft_simple, conv_band)
from dense_biases import conv_bias, local_bias

float64 = torch.float64
TRITON_ON_CPU = aft_triton.unavailable_reason("cpu")


def random_padding(batch, length, generator):
    return torch.rand(batch, length, generator=generator) < 0.3


shapes = dict(batch=st.integers(1, 2), length=st.integers(1, 40), window=st.integers(1, 12),
              d=st.sampled_from([2, 4, 6]), causal=st.booleans(), padded=st.booleans(), seed=st.integers(0, 2**16))


@settings(max_examples=30, deadline=None)
@given(**shapes)
def test_local_and_full_equal_the_float64_reference(batch, length, window, d, causal, padded, seed):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(3, batch, length, d, dtype=float64, generator=generator)
    w = torch.randn(length, length, dtype=float64, generator=generator)
    mask = random_padding(batch, length, generator) if padded else None
    torch.testing.assert_close(aft_local(q, k, v, w, window, causal=causal, key_padding_mask=mask),
                               aft_reference(q, k, v, local_bias(w, window), causal=causal, key_padding_mask=mask),
                               rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(aft_full(q, k, v, w, causal=causal, key_padding_mask=mask),
                               aft_reference(q, k, v, w, causal=causal, key_padding_mask=mask), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(aft_simple(q, k, v, causal=causal, key_padding_mask=mask),
                               aft_reference(q, k, v, causal=causal, key_padding_mask=mask), rtol=1e-10, atol=1e-10)


@settings(max_examples=30, deadline=None)
@given(heads=st.sampled_from([1, 2]), **shapes)
def test_conv_equals_the_float64_reference(heads, batch, length, window, d, causal, padded, seed):
    generator = torch.Generator().manual_seed(seed)
    d = d * heads
    q, v = torch.randn(2, batch, length, d, dtype=float64, generator=generator)
    k = torch.randn(batch, length, heads, dtype=float64, generator=generator)
    kernel = torch.randn(heads, window, dtype=float64, generator=generator)
    mask = random_padding(batch, length, generator) if padded else None
    expected = aft_reference(q, k.repeat_interleave(d // heads, -1), v, conv_bias(kernel, length, causal),
                             causal=causal, key_padding_mask=mask)
    torch.testing.assert_close(aft_conv(q, k, v, kernel, causal=causal, key_padding_mask=mask), expected,
                               rtol=1e-10, atol=1e-10)


def test_conv_band_is_the_kernel_at_its_offsets():
    kernel = torch.arange(1.0, 4.0).view(1, 3)
    assert torch.equal(conv_band(kernel, 2, causal=True)[0, 0], torch.tensor([3.0, 2.0, 1.0, 0.0, 0.0]))
    assert torch.equal(conv_band(kernel, 2, causal=False)[0, 0], torch.tensor([0.0, 3.0, 2.0, 1.0, 0.0]))


@pytest.mark.parametrize("length,window", [(1, 1), (1, 5), (5, 1), (4, 9), (9, 9), (200, 3)])
def test_edge_sizes(length, window):
    q, k, v = torch.randn(3, 2, length, 4, dtype=float64)
    w = torch.randn(length, length, dtype=float64)
    for causal in (True, False):
        torch.testing.assert_close(aft_local(q, k, v, w, window, causal=causal),
                                   aft_reference(q, k, v, local_bias(w, window), causal=causal))
    if window >= length:  # the window covers everything: local is full
        torch.testing.assert_close(aft_local(q, k, v, w, window), aft_full(q, k, v, w))


def test_reference_by_hand():
    q = torch.full((1, 2, 1), 50.0, dtype=float64)  # sigmoid(q) = 1
    k = torch.tensor([0.0, 0.6931471805599453], dtype=float64).view(1, 2, 1)  # weights 1 : 2
    v = torch.tensor([3.0, 0.0], dtype=float64).view(1, 2, 1)
    torch.testing.assert_close(aft_reference(q, k, v).flatten(), torch.tensor([1.0, 1.0], dtype=float64))
    torch.testing.assert_close(aft_reference(q, k, v, causal=True).flatten(), torch.tensor([3.0, 1.0], dtype=float64))


def make_layers(dtype=float64):
    torch.manual_seed(0)
    layers = [AFTSimple(8), AFTFull(8, 24), AFTFull(8, 24, factor_dim=None), AFTLocal(8, 24, 4), AFTConv(8, 2, 5)]
    for layer in layers:
        layer.to(dtype)
        with torch.no_grad():
            for parameter in layer.parameters():
                parameter.normal_()  # non-zero biases: the band matters
    return layers


@pytest.mark.parametrize("layer", make_layers(), ids=lambda layer: type(layer).__name__)
def test_future_tokens_never_change_past_outputs(layer):
    x = torch.randn(2, 20, 8, dtype=float64)
    changed = x.clone()
    changed[:, 13:] = 10 * torch.randn(2, 7, 8, dtype=float64)  # keys rise by less than the shift head-room
    torch.testing.assert_close(layer(changed)[:, :13], layer(x)[:, :13], rtol=0, atol=0)


@pytest.mark.parametrize("layer", make_layers(), ids=lambda layer: type(layer).__name__)
def test_step_by_step_decoding_equals_the_parallel_form(layer):
    x = torch.randn(3, 20, 8, dtype=float64)
    state = layer.new_state()
    stepwise = torch.stack([layer.step(x[:, t], state) for t in range(20)], dim=1)
    torch.testing.assert_close(stepwise, layer(x), rtol=1e-9, atol=1e-9)
    assert state.position == 20 and state.keys.shape[1] <= max(layer._state_window(), 1)


def test_decoding_state_is_bounded_by_the_window():
    layer = AFTConv(8, 2, 3)
    state = layer.new_state()
    for _ in range(50):
        layer.step(torch.randn(1, 8), state)
    assert state.keys.shape == (1, 3, 8) and state.num.shape == (1, 8)


def test_gradcheck_in_float64():
    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 7, 2, dtype=float64, generator=generator, requires_grad=True) for _ in range(3))
    w = torch.randn(7, 7, dtype=float64, generator=generator, requires_grad=True)
    kc = torch.randn(1, 7, 1, dtype=float64, generator=generator, requires_grad=True)
    kernel = torch.randn(1, 3, dtype=float64, generator=generator, requires_grad=True)
    mask = torch.tensor([[True, False, False, False, False, False, False]])
    for causal in (True, False):
        assert torch.autograd.gradcheck(lambda q, k, v, w: aft_local(q, k, v, w, 3, causal=causal,
                                                                      key_padding_mask=mask), (q, k, v, w))
        assert torch.autograd.gradcheck(lambda q, k, v, w: aft_full(q, k, v, w, causal=causal), (q, k, v, w))
        assert torch.autograd.gradcheck(lambda q, k, v, kernel: aft_conv(q, k, v, kernel, causal=causal),
                                        (q, kc, v, kernel))
        assert torch.autograd.gradcheck(lambda q, k, v: aft_simple(q, k, v, causal=causal), (q, k, v))


def extreme_inputs(kind, length=128, d=4):
    torch.manual_seed(6)
    q, k, v = torch.randn(3, 2, length, d, dtype=float64)
    w = torch.randn(length, length, dtype=float64)
    if kind == "keys x 100":
        k = 100 * k
    elif kind == "keys grow along time":  # a max over the whole sequence underflows early positions
        k = k + torch.arange(length, dtype=float64)[:, None]
    elif kind == "large biases":
        w = 60 * w
    return q, k, v, w


@pytest.mark.parametrize("kind", ["keys x 100", "keys grow along time", "large biases"])
@pytest.mark.parametrize("causal", [True, False])
def test_extreme_inputs_stay_finite_and_exact(kind, causal):
    q, k, v, w = extreme_inputs(kind)
    window = 8
    for dtype, tolerance in [(float64, 1e-9), (torch.float32, 1e-4)]:
        got = aft_local(q.to(dtype), k.to(dtype), v.to(dtype), w.to(dtype), window, causal=causal)
        assert torch.isfinite(got).all()
        expected = aft_reference(q, k, v, local_bias(w, window), causal=causal)
        if kind == "keys grow along time" or dtype == float64:  # float32 keys x 100 lose digits in k itself
            assert (got.double() - expected).abs().max() < tolerance
        full = aft_full(q.to(dtype), k.to(dtype), v.to(dtype), w.to(dtype), causal=causal)
        assert torch.isfinite(full).all()
        assert torch.isfinite(aft_simple(q.to(dtype), k.to(dtype), v.to(dtype), causal=causal)).all()


def test_float32_keys_x_100_stay_near_the_reference_of_the_same_inputs():
    q, k, v, w = (x.float() for x in extreme_inputs("keys x 100"))
    expected = aft_reference(q.double(), k.double(), v.double(), local_bias(w.double(), 8), causal=True)
    assert (aft_local(q, k, v, w, 8, causal=True).double() - expected).abs().max() < 1e-4


@pytest.mark.parametrize("layer", make_layers(torch.float32), ids=lambda layer: type(layer).__name__)
def test_fully_padded_rows_give_finite_outputs_and_gradients(layer):
    x = torch.randn(2, 6, 8, requires_grad=True)
    mask = torch.tensor([[True] * 6, [False] * 3 + [True] * 3])
    out = layer(x, key_padding_mask=mask)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    torch.testing.assert_close(out[0], layer.out.bias.expand(6, 8).detach())  # no key: mixing output 0


def test_padding_equals_dropping_the_padded_tokens():
    layer = make_layers()[3]  # AFTLocal, bidirectional comparison needs causal=False
    layer.causal = False
    x = torch.randn(1, 10, 8, dtype=float64)
    mask = torch.zeros(1, 10, dtype=torch.bool)
    mask[:, 7:] = True  # right padding: positions stay the same
    torch.testing.assert_close(layer(x, key_padding_mask=mask)[:, :7], layer(x[:, :7]))


@pytest.mark.parametrize("dtype,tolerance", [(torch.bfloat16, 5e-2), (torch.float16, 5e-3)])
def test_low_precision_stays_near_the_float64_reference(dtype, tolerance):
    torch.manual_seed(7)
    q, k, v = torch.randn(3, 2, 96, 16, dtype=float64)
    k = 4 * k
    w = 2 * torch.randn(96, 96, dtype=float64)
    low = [x.to(dtype) for x in (q, k, v, w)]
    expected = aft_reference(*(x.double() for x in low[:3]), local_bias(low[3].double(), 8), causal=True)
    got = aft_local(*low[:3], low[3], 8, causal=True)
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert (got.double() - expected).abs().max() < tolerance
    kernel = torch.randn(2, 8, dtype=dtype)
    got = aft_conv(low[0], low[1][..., :2], low[2], kernel, causal=True)
    expected = aft_reference(low[0].double(), low[1][..., :2].double().repeat_interleave(8, -1), low[2].double(),
                             conv_bias(kernel.double(), 96, True), causal=True)
    assert got.dtype == dtype and (got.double() - expected).abs().max() < tolerance


def test_conv_and_simple_run_past_any_length():
    x = torch.randn(1, 300, 8)
    assert AFTConv(8, 2, 4)(x).shape == (1, 300, 8) and AFTSimple(8)(x).shape == (1, 300, 8)


def test_a_fresh_conv_layer_is_aft_simple():
    torch.manual_seed(8)
    conv, simple = AFTConv(8, 8, 4, causal=True), AFTSimple(8, causal=True)
    simple.load_state_dict({name: p for name, p in conv.state_dict().items() if not name.startswith(("kernel", "gamma", "beta"))},
                           strict=False)
    simple.to_k = torch.nn.Linear(8, 8)
    with torch.no_grad():  # one key channel per head, d/h = 1 channel per head: the same keys
        simple.to_k.weight.copy_(conv.to_k.weight)
        simple.to_k.bias.copy_(conv.to_k.bias)
    x = torch.randn(2, 9, 8)
    torch.testing.assert_close(conv(x), simple(x))


@pytest.mark.parametrize("make,error,message", [
    (lambda: AFTLocal(8, 4, 2)(torch.randn(1, 5, 8)), ValueError,
     r"AFTLocal was built for max_len=4 .* got T=5; AFT-simple and AFT-conv have no such limit"),
    (lambda: AFTFull(8, 4)(torch.randn(1, 5, 8)), ValueError, r"AFTFull was built for max_len=4"),
    (lambda: AFTLocal(8, 4, 0), ValueError, r"window must be an int >= 1, got 0"),
    (lambda: aft_local(*torch.randn(3, 1, 4, 2), torch.zeros(4, 4), 0), ValueError, r"window must be an int >= 1"),
    (lambda: AFTConv(8, 3, 2), ValueError, r"d_model \(8\) must be divisible by n_heads \(3"),
    (lambda: AFTFull(8, 4, factor_dim=0), ValueError, r"factor_dim must be >= 1 or None"),
    (lambda: AFTSimple(8)(torch.randn(5, 8)), ValueError, r"x must have shape \[B, T, d_model\] \(3 dims\)"),
    (lambda: AFTSimple(8)(torch.randn(1, 5, 8), key_padding_mask=torch.zeros(1, 4, dtype=torch.bool)), ValueError,
     r"key_padding_mask must have shape \[B, T\]"),
    (lambda: AFTSimple(8)(torch.randn(1, 5, 8), key_padding_mask=torch.zeros(1, 5)), TypeError,
     r"key_padding_mask must be a bool tensor \(True = padding\)"),
    (lambda: aft_full(*torch.randn(3, 1, 4, 2), torch.zeros(3, 4)), ValueError, r"w must have shape \[T, T\]"),
    (lambda: aft_simple(torch.randn(1, 4, 2), torch.randn(1, 4, 3), torch.randn(1, 4, 2)), ValueError,
     r"k must have shape \[B, T, d\]"),
    (lambda: aft_simple(torch.randn(1, 4, 2), torch.randn(1, 4, 2).double(), torch.randn(1, 4, 2)), TypeError,
     r"q, k and v must share one dtype"),
    (lambda: aft_simple(*torch.randint(0, 3, (3, 1, 4, 2))), TypeError, r"q must be a floating-point tensor"),
    (lambda: aft_conv(*torch.randn(3, 1, 4, 6)[[0]], torch.randn(1, 4, 4), torch.randn(1, 4, 6), torch.randn(4, 2)),
     ValueError, r"d=6\) must be divisible by the heads of k \(h=4\)"),
    (lambda: aft_conv(torch.randn(1, 4, 6), torch.randn(1, 4, 2), torch.randn(1, 4, 6), torch.randn(3, 2)),
     ValueError, r"kernel must have shape \[h, s\]"),
    (lambda: AFTLocal(8, 4, 2, causal=False).step(torch.randn(1, 8), AFTLocal(8, 4, 2).new_state()), ValueError,
     r"step needs a causal layer"),
])
def test_bad_input_is_named(make, error, message):
    with pytest.raises(error, match=message):
        make()


# The AFT-local fast path (`_aft_local_fast`): a custom autograd.Function with a hand-written backward.

def local_inputs(batch, length, d, window, seed, padded):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, length, d, dtype=float64, generator=generator, requires_grad=True) for _ in range(3))
    w = torch.randn(length, length, dtype=float64, generator=generator, requires_grad=True)
    mask = None
    if padded:
        mask = random_padding(batch, length, generator)
        mask[0] = True  # a fully padded row: output 0, gradient 0
    return q, k, v, w, mask


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("length,window", [(66, 3), (9, 3), (6, 9), (65, 1)])
def test_fast_local_backward_passes_gradcheck(length, window, causal):
    from aftalibi.aft_kernels import aft_local_chunked
    generator = torch.Generator().manual_seed(length + window)
    qkv = torch.randn(2, length, 3, dtype=float64, generator=generator, requires_grad=True)  # d = 1
    band = torch.randn(length, 2 * window - 1, dtype=float64, generator=generator, requires_grad=True)
    mask = random_padding(2, length, generator)
    mask[1, : length // 2] = True  # left padding, and rows with no key yet (causal)
    # fast_mode checks random projections of the Jacobian: several blocks stay quick
    assert torch.autograd.gradcheck(lambda qkv, band: aft_local_chunked(qkv, band, window, causal, mask), (qkv, band),
                                    fast_mode=length > 64)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("length,window", [(150, 8), (130, 64), (129, 65), (100, 1), (30, 50)])
def test_fast_local_gradients_equal_the_references(length, window, padded, causal):
    q, k, v, w, mask = local_inputs(2, length, 3, window, seed=length + window, padded=padded)
    upstream = torch.randn(2, length, 3, dtype=float64)
    ours = torch.autograd.grad((aft_local(q, k, v, w, window, causal=causal, key_padding_mask=mask) * upstream).sum(),
                               (q, k, v, w))
    expected = aft_reference(q, k, v, local_bias(w, window), causal=causal, key_padding_mask=mask)
    reference = torch.autograd.grad((expected * upstream).sum(), (q, k, v, w))
    for name, got, want in zip("qkvw", ours, reference):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10, msg=lambda m: f"grad of {name}: {m}")


@pytest.mark.parametrize("kind", ["keys x 100", "keys grow along time", "large biases"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_fast_local_gradients_of_extreme_inputs(kind, causal):
    q, k, v, w = extreme_inputs(kind, length=200)
    upstream = torch.randn(2, 200, 4, dtype=float64)
    inputs = [x.clone().requires_grad_() for x in (q, k, v, w)]
    expected = aft_reference(*inputs[:3], local_bias(inputs[3], 8), causal=causal)
    reference = torch.autograd.grad((expected * upstream).sum(), inputs)
    for dtype, tolerance in [(float64, 1e-8), (torch.float32, 1e-3)]:
        low = [x.detach().to(dtype).requires_grad_() for x in (q, k, v, w)]
        out = aft_local(*low[:3], low[3], 8, causal=causal)
        grads = torch.autograd.grad((out * upstream.to(dtype)).sum(), low)
        assert all(torch.isfinite(g).all() for g in grads)
        if kind == "keys grow along time" or dtype == float64:  # float32 keys x 100 lose digits in k itself
            for got, want in zip(grads, reference):
                assert (got.double() - want).abs().max() <= tolerance * (1 + want.abs().max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fast_local_low_precision_gradients_are_finite(dtype):
    layer = AFTLocal(16, 80, 8).to(dtype)
    x = torch.randn(2, 80, 16, dtype=dtype, requires_grad=True)
    mask = torch.zeros(2, 80, dtype=torch.bool)
    mask[1, :30] = True
    out = layer(x, key_padding_mask=mask)
    out.float().sum().backward()
    assert out.dtype == dtype and torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


def test_local_layer_equals_its_projections_through_the_reference():
    torch.manual_seed(9)
    layer = AFTLocal(8, 150, 6, causal=True).double()
    with torch.no_grad():
        layer.band.normal_()
    x = torch.randn(2, 150, 8, dtype=float64)
    q, k, v = layer.to_q(x), layer.to_k(x), layer.to_v(x)
    w = torch.zeros(150, 150, dtype=float64)
    distance = torch.arange(150)[:, None] - torch.arange(150)[None, :]
    inside = distance.abs() < 6
    w[inside] = layer.band.detach()[torch.arange(150)[:, None].expand(150, 150)[inside], (5 - distance)[inside]]
    torch.testing.assert_close(layer(x), layer.out(aft_reference(q, k, v, w, causal=True)))


def test_local_of_an_empty_sequence_is_empty():
    assert aft_local(*torch.randn(3, 1, 0, 2), torch.zeros(0, 0), 3).shape == (1, 0, 2)
    assert AFTLocal(4, 8, 3)(torch.randn(2, 0, 4)).shape == (2, 0, 4)


@pytest.mark.parametrize("op", ["local", "full", "conv", "simple"])
def test_autocast_leaves_the_mixing_in_float32(op):
    """Inside a bf16 autocast region the ops turn autocast off for their own matmuls (forward and the
    hand-written backward): float32 inputs give exactly the float32 outputs and gradients."""
    generator = torch.Generator().manual_seed(11)
    length, d, heads = 150, 8, 2
    q, v = (torch.randn(2, length, d, generator=generator, requires_grad=True) for _ in range(2))
    k = torch.randn(2, length, heads if op == "conv" else d, generator=generator, requires_grad=True)
    w = torch.randn(length, length, generator=generator, requires_grad=True)
    kernel = torch.randn(heads, 5, generator=generator, requires_grad=True)
    run = {"local": lambda: aft_local(q, k, v, w, 32, causal=True), "full": lambda: aft_full(q, k, v, w, causal=True),
           "conv": lambda: aft_conv(q, k, v, kernel, causal=True), "simple": lambda: aft_simple(q, k, v, causal=True)}[op]
    inputs = (q, k, v, w, kernel)
    expected = run()
    expected_grads = torch.autograd.grad(expected.square().sum(), inputs, allow_unused=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = run()
    grads = torch.autograd.grad(mixed.square().sum(), inputs, allow_unused=True)
    assert mixed.dtype == torch.float32 and torch.equal(mixed, expected)
    for grad, expected_grad in zip(grads, expected_grads):
        assert (grad is None and expected_grad is None) or torch.equal(grad, expected_grad)


def test_kept_buffers_give_the_recomputed_gradients(monkeypatch):
    """Short sequences keep the forward pass's sums for the backward pass (`_KEEP_BYTES`): the same
    gradients as recomputing them, and a second backward pass (retain_graph) recomputes."""
    import aftalibi.aft_kernels as aft_module

    generator = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(5, 150, 8, generator=generator, requires_grad=True) for _ in range(3))
    w = torch.randn(150, 150, generator=generator, requires_grad=True)
    mask = torch.rand(5, 150, generator=generator) < 0.2
    monkeypatch.setattr(aft_module, "_CHUNK_BYTES", 150 * 16 * 4 * 2)  # two elements per chunk: 3 chunks

    def gradients(keep_bytes, twice=False):
        monkeypatch.setattr(aft_module, "_KEEP_BYTES", keep_bytes)
        out = aft_local(q, k, v, w, 16, causal=True, key_padding_mask=mask)
        first = torch.autograd.grad(out.square().sum(), (q, k, v, w), retain_graph=twice)
        return (first, torch.autograd.grad(out.square().sum(), (q, k, v, w))) if twice else first

    recomputed = gradients(0)
    kept, again = gradients(2**30, twice=True)
    for a, b, c in zip(recomputed, kept, again):
        assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("kernel", [pytest.param(name, marks=pytest.mark.skipif(
    name == "triton" and TRITON_ON_CPU is not None, reason=str(TRITON_ON_CPU))) for name in AFT_KERNELS])
@pytest.mark.parametrize("length,window", [(1, 1), (10, 3), (5, 8), (70, 4)])
@pytest.mark.parametrize("causal", [True, False])
def test_the_layer_equals_the_minimal_layer_of_notebook_2(kernel, length, window, causal):
    """AFTLocal (the fast form, by every kernel) and MinimalAFTLocal (the equation, a dense [T, T]
    bias) with the same parameters: the same outputs and the same gradients."""
    torch.manual_seed(length + window)
    minimal = MinimalAFTLocal(6, max_len=80, window=window, causal=causal).double()
    torch.nn.init.normal_(minimal.band)
    layer = AFTLocal(6, max_len=80, window=window, causal=causal).double()
    layer.load_state_dict(minimal.state_dict())
    x = torch.randn(2, length, 6, dtype=float64)
    with aft_kernel(kernel):
        ours = layer(x)
        ours_grads = torch.autograd.grad(ours.square().sum(), list(layer.parameters()))
    theirs = minimal(x)
    theirs_grads = torch.autograd.grad(theirs.square().sum(), list(minimal.parameters()))
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    for (name, _), a, b in zip(layer.named_parameters(), ours_grads, theirs_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=lambda text: f"{name}: {text}")

"""aftalibi.model: configuration checks, causality, tied embeddings and cached generation."""

import math
from dataclasses import asdict

import pytest
import torch

from aftalibi.alibi import AlibiMultiHeadAttention
from aftalibi.model import (MIXERS, POSITIONS, LanguageModel, ModelConfig, SlidingKVCache, decoding_window, generate,
                            generate_tokens)

VARIANTS = [("mha", p) for p in POSITIONS] + [(m, "none") for m in MIXERS if m != "mha"]


def small(**overrides) -> ModelConfig:
    return ModelConfig(**{"vocab_size": 30, "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64, **overrides})


@pytest.mark.parametrize("mixer,position", VARIANTS)
def test_causal_and_starts_near_uniform(mixer, position):
    torch.manual_seed(0)
    model = LanguageModel(small(mixer=mixer, position=position))
    ids = torch.randint(0, 30, (2, 24))
    logits, loss = model(ids, targets=torch.randint(0, 30, (2, 24)))
    assert abs(loss.item() - math.log(30)) < 0.1
    changed = ids.clone()
    changed[:, 15:] = (changed[:, 15:] + 1) % 30
    torch.testing.assert_close(model(changed)[0][:, :15], logits[:, :15], rtol=0, atol=0)


def test_embeddings_are_tied_and_config_round_trips():
    model = LanguageModel(small())
    names = [name for name, _ in model.named_parameters()]
    assert not any("head" in name for name in names)  # no separate output matrix
    assert ModelConfig(**asdict(model.config)) == model.config


@pytest.mark.parametrize("mixer,position", VARIANTS)
@pytest.mark.parametrize("temperature,top_k", [(0.0, None), (1.0, 5)])
def test_cached_generation_equals_recomputation(mixer, position, temperature, top_k):
    torch.manual_seed(1)
    model = LanguageModel(small(mixer=mixer, position=position)).double()
    prompt = torch.randint(0, 30, (3, 4))
    kwargs = dict(temperature=temperature, top_k=top_k)
    cached = generate(model, prompt, 12, generator=torch.Generator().manual_seed(2), **kwargs)
    recomputed = generate(model, prompt, 12, generator=torch.Generator().manual_seed(2), use_cache=False, **kwargs)
    assert torch.equal(cached, recomputed) and cached.shape == (3, 16)
    assert torch.equal(cached[:, :4], prompt)


def test_padding_mask_reaches_the_mixers():
    torch.manual_seed(3)
    model = LanguageModel(small()).eval()
    ids = torch.randint(0, 30, (1, 10))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.tensor([[0] * 3 + [1] * 10])
    torch.testing.assert_close(model(padded, attention_mask=mask)[0][:, 3:], model(ids)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides,message", [
    ({"mixer": "lstm"}, "unknown mixer 'lstm'; choose one of"),
    ({"position": "relative"}, "unknown position encoding 'relative'"),
    ({"n_heads": 3}, r"d_model \(32\) must be divisible by n_heads \(3\)"),
    ({"n_layers": 0}, "n_layers must be >= 1"),
])
def test_bad_config_is_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        small(**overrides)


def test_learned_positions_refuse_longer_sequences_and_name_alternatives():
    model = LanguageModel(small(position="learned", max_len=8))
    model(torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="longer than max_len=8 of the absolute positions of mha; .*alibi, aft-simple, aft-conv"):
        model(torch.zeros(1, 9, dtype=torch.long))
    # generate reads only the last max_len tokens (as nanoGPT does), so it runs past max_len, cached or not
    prompt = torch.randint(0, 30, (1, 6))
    cached, recomputed = (generate(model, prompt, 10, temperature=0, use_cache=use_cache) for use_cache in (True, False))
    assert cached.shape == (1, 16) and torch.equal(cached, recomputed) and torch.equal(cached[:, :6], prompt)
    window = cached[:, -9:-1]  # the last step's context: the 8 tokens before the last one
    assert cached[0, -1] == model(window)[0][0, -1].argmax()


@pytest.mark.parametrize("kwargs,message", [
    ({"temperature": -1.0}, "temperature must be >= 0"),
    ({"top_k": 0}, r"top_k must be in \[1, vocab_size=30\]"),
    ({"context_len": 0}, "context_len must be >= 1, got 0"),
])
def test_bad_generation_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(LanguageModel(small()), torch.zeros(1, 2, dtype=torch.long), 3, **kwargs)


@pytest.mark.parametrize("options", [{"mixer": "aft-local", "window": 4, "max_len": 16}, {"mixer": "alibi"}])
def test_generation_reads_only_the_last_context_len_tokens(options):
    model = LanguageModel(small(**options))
    prompt = torch.randint(0, 30, (1, 3))
    cached, recomputed = (generate(model, prompt, 12, temperature=0, use_cache=use_cache, context_len=6)
                          for use_cache in (True, False))
    assert torch.equal(cached, recomputed)
    for end in range(7, cached.shape[1]):  # every token past the first six was predicted from the 6 before it
        assert cached[0, end] == model(cached[:, end - 6:end])[0][0, -1].argmax()


@pytest.mark.parametrize("mixer", ["aft-full", "aft-local"])
def test_aft_with_absolute_biases_is_bounded_by_max_len(mixer):
    model = LanguageModel(small(mixer=mixer, max_len=8, window=4))
    with pytest.raises(ValueError, match=f"max_len=8 of the absolute positions of {mixer}"):
        model(torch.zeros(1, 9, dtype=torch.long))


# Fairness between mixers: the same initial scale in the residual stream and the same weight decay rule.

def linear_outputs_into_residual(block, d_model: int) -> list[torch.nn.Linear]:
    """Found by shape and order, independently of `residual_projections`: the last linear layer of the
    mixer, and of the MLP, that outputs d_model features."""
    def last_linear(module):
        return [m for m in module.modules() if isinstance(m, torch.nn.Linear) and m.out_features == d_model][-1]
    return [last_linear(block.mixer), last_linear(block.mlp)]


def test_every_mixer_writes_into_the_residual_stream_at_the_same_initial_scale():
    n_layers, expected = 3, 0.02 / math.sqrt(2 * 3)
    for mixer, position in VARIANTS:
        torch.manual_seed(0)
        model = LanguageModel(small(mixer=mixer, position=position, d_model=64, d_ff=256, n_layers=n_layers, window=8))
        for block in model.blocks:
            projections = block.residual_projections()
            assert list(projections) == linear_outputs_into_residual(block, 64), mixer
            for layer in projections:
                std = layer.weight.std().item()
                assert abs(std - expected) < 0.1 * expected, f"{mixer}: output projection std {std:.4f}, expected {expected:.4f}"
            others = [m for m in block.modules() if isinstance(m, torch.nn.Linear) and m not in projections]
            for layer in others:  # every other linear layer keeps GPT-2's 0.02
                assert abs(layer.weight.std().item() - 0.02) < 0.002, mixer


@pytest.mark.parametrize("mixer,position", VARIANTS)
def test_weight_decay_reaches_linear_weights_only(mixer, position):
    from aftalibi.train import TrainConfig, make_optimizer

    model = LanguageModel(small(mixer=mixer, position=position, max_len=32, window=4))
    optimizer = make_optimizer(model, TrainConfig(optimizer="adamw", weight_decay=0.1))
    decay_of = {id(p): group["weight_decay"] for group in optimizer.param_groups for p in group["params"]}
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert len(decay_of) == len(list(model.parameters()))  # every parameter in exactly one group
    for name, parameter in model.named_parameters():
        expected = 0.1 if id(parameter) in linear_weights else 0.0
        assert decay_of[id(parameter)] == expected, f"{name}: weight decay {decay_of[id(parameter)]}, expected {expected}"
    position_tables = [n for n, _ in model.named_parameters() if n.rsplit(".", 1)[1] in ("u", "v", "band", "kernel", "gamma", "beta")]
    assert (mixer in ("aft-full", "aft-local", "aft-conv")) == bool(position_tables)
    assert all(decay_of[id(p)] == 0.0 for n, p in model.named_parameters() if n in position_tables)


def test_aft_full_factorises_its_biases_with_factor_dim():
    model = LanguageModel(small(mixer="aft-full", max_len=64, factor_dim=8))
    layer = model.blocks[0].mixer.layer
    assert layer.u.shape == layer.v.shape == (64, 8)
    with pytest.raises(ValueError, match="factor_dim must be >= 1"):
        small(mixer="aft-full", factor_dim=0)


def test_paper_sinusoids_scale_the_embeddings_and_stay_as_large():
    torch.manual_seed(0)
    faint, paper = (LanguageModel(small(position=p, d_model=64)) for p in ("sinusoidal", "sinusoidal-paper"))
    assert faint.embedding_scale == 1.0 and paper.embedding_scale == math.sqrt(64)
    assert faint.position.amplitude == 0.02 and paper.position.amplitude == 1.0
    embedded = paper.embedding.weight * paper.embedding_scale
    assert 0.5 < paper.position.amplitude / embedded.pow(2).mean().sqrt().item() < 10  # same order, not 50x smaller


def test_generate_tokens_yields_each_token_as_it_is_drawn_and_checks_its_arguments_at_the_call():
    torch.manual_seed(4)
    model = LanguageModel(small(mixer="alibi"))
    prompt = torch.randint(0, 30, (2, 3))
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        generate_tokens(model, prompt, -1)  # at the call, not at the first token
    drawn = []
    original = torch.multinomial

    def counted(*args, **kwargs):
        drawn.append(1)
        return original(*args, **kwargs)

    stream = generate_tokens(model, prompt, 10, generator=torch.Generator().manual_seed(1))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "multinomial", counted)
        first = next(stream)
        assert first.shape == (2, 1) and len(drawn) == 1  # one token drawn, nine to come
        rest = list(stream)
    assert len(drawn) == 10 and model.training  # the caller's mode is back once the stream ends
    whole = generate(model, prompt, 10, generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.cat([prompt, first, *rest], dim=1), whole)


def test_generation_copies_a_bounded_amount_per_token(monkeypatch):
    """Decoding appended each token to the KV caches and to the sequence with torch.cat, copying the whole past at
    every step: quadratic in the length. Now the caches grow by doubling and the tokens are gathered once."""
    model = LanguageModel(small(mixer="alibi")).eval()
    copied, original = [0], torch.cat

    def counted(tensors, *args, **kwargs):
        result = original(tensors, *args, **kwargs)
        copied[0] += result.numel()
        return result

    monkeypatch.setattr(torch, "cat", counted)
    per_token = []
    for length in (200, 400):
        copied[0] = 0
        generate(model, torch.zeros(1, 1, dtype=torch.long), length, generator=torch.Generator().manual_seed(0))
        per_token.append(copied[0] / length)
    assert per_token[1] < 1.2 * per_token[0] and per_token[1] < 10, per_token


def test_sliding_cache_holds_the_last_window_positions_in_a_bounded_buffer():
    keys = torch.randn(1, 2, 300, 4, dtype=torch.float64)
    values = torch.randn(1, 2, 300, 4, dtype=torch.float64)
    growing, sliding = SlidingKVCache(), SlidingKVCache(window=7)
    sizes = set()
    for t in range(0, 300, 3):  # three positions a step
        growing.append(keys[..., t:t + 3, :], values[..., t:t + 3, :])
        k, v = sliding.append(keys[..., t:t + 3, :], values[..., t:t + 3, :])
        assert torch.equal(k, keys[..., max(0, t + 3 - 7):t + 3, :]) and torch.equal(v, values[..., max(0, t + 3 - 7):t + 3, :])
        sizes.add(sliding.buffers[0].shape[-2])
    assert torch.equal(growing.keys, keys) and torch.equal(growing.values, values) and len(growing) == 300
    assert max(sizes) <= 64 and len(sliding) == 7


def banded_alibi(window: int):
    """ALiBi attention that reads only the last `window` positions, written out in float64: the reference."""
    def attend(self, q, k, v, attention_mask):
        i = torch.arange(k.shape[-2] - q.shape[-2], k.shape[-2])[:, None]
        j = torch.arange(k.shape[-2])[None, :]
        distance = (i - j).double()  # [T_q, T_k]
        bias = -self.slopes.double()[:, None, None] * distance  # -m_h (i - j)
        bias = bias.masked_fill((distance < 0) | (distance >= window), float("-inf"))
        scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1]) + bias
        return (scores.softmax(dim=-1) @ v.double()).to(q.dtype)
    return attend


def test_windowed_alibi_decoding_equals_attention_over_the_last_window_positions(monkeypatch):
    torch.manual_seed(5)
    model = LanguageModel(small(mixer="alibi", n_layers=3)).double()
    prompt = torch.randint(0, 30, (2, 4))
    windowed = generate(model, prompt, 20, temperature=0, window=6)
    unwindowed = generate(model, prompt, 20, temperature=0)
    assert torch.equal(generate(model, prompt, 20, temperature=0, window=24), unwindowed)  # wider than the text
    monkeypatch.setattr(AlibiMultiHeadAttention, "_attend", banded_alibi(6))
    for end in range(4, windowed.shape[1]):  # each token from the whole past, every layer reading 6 positions
        assert torch.equal(model(windowed[:, :end])[0][:, -1].argmax(dim=-1), windowed[:, end])
    assert not torch.equal(windowed, unwindowed)  # the window mattered here


def test_decoding_window_is_where_every_alibi_head_lowers_a_score_by_40_nats():
    from aftalibi.alibi import get_slopes
    assert decoding_window(small(mixer="alibi", n_heads=4)) == 40 * 2 ** 8  # slopes 1/4 .. 1/256
    window = decoding_window(small(mixer="alibi", n_heads=8, d_model=64))
    assert get_slopes(8).min() * window >= 40 > get_slopes(8).min() * (window - 1)
    assert decoding_window(small(mixer="mha")) is None and decoding_window(small(mixer="aft-conv")) is None


@pytest.mark.parametrize("overrides,kwargs,message", [
    ({"mixer": "mha", "position": "rotary"}, {"window": 8}, "window applies to the mixers that read no absolute"),
    ({"mixer": "alibi"}, {"window": 0}, "window must be >= 1"),
    ({"mixer": "alibi"}, {"window": 8, "context_len": 8}, "given without context_len"),
])
def test_a_window_is_refused_where_it_would_change_the_positions(overrides, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(LanguageModel(small(**overrides)), torch.zeros(1, 2, dtype=torch.long), 3, **kwargs)


@pytest.mark.parametrize("mixer,position", VARIANTS)
def test_every_model_takes_a_sequence_of_no_tokens(mixer, position):
    """An empty slice of a corpus gives empty logits (the ALiBi model once stopped the process)."""
    model = LanguageModel(ModelConfig(vocab_size=10, mixer=mixer, position=position, d_model=16, n_layers=1,
                                      n_heads=2, d_ff=32)).eval()
    logits, loss = model(torch.zeros(2, 0, dtype=torch.long))
    assert logits.shape == (2, 0, 10) and loss is None

"""aftalibi.model: configuration checks, causality, tied embeddings and cached generation."""

import math
from dataclasses import asdict

import pytest
import torch

from aftalibi.model import MIXERS, POSITIONS, LanguageModel, ModelConfig, generate

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
])
def test_bad_generation_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(LanguageModel(small()), torch.zeros(1, 2, dtype=torch.long), 3, **kwargs)


@pytest.mark.parametrize("mixer", ["aft-full", "aft-local"])
def test_aft_with_absolute_biases_is_bounded_by_max_len(mixer):
    model = LanguageModel(small(mixer=mixer, max_len=8, window=4))
    with pytest.raises(ValueError, match=f"max_len=8 of the absolute positions of {mixer}"):
        model(torch.zeros(1, 9, dtype=torch.long))

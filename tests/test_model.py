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

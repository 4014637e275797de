"""aftalibi: the Attention Free Transformer and ALiBi, built step by step and tested.

The modules are generated from the notebooks in `notebooks/` by `nbdev-export`:
edit the notebook, not the module. The main API is importable from the top level
(`from aftalibi import LanguageModel, ModelConfig, generate`); each name is imported from its
module on first use, so `import aftalibi` stays light (no torch until a name needs it).

Two functions share their module's name and stay in it: a package attribute cannot be both
its submodule and a function, so `aftalibi.train` is the training module (call
`aftalibi.train.train`) and `aftalibi.attention` the attention module (`aftalibi.attention.attention`).
"""
__version__ = "0.1.0"

import importlib
import pathlib

from ._compat import patch_ipython_display_for_labml

patch_ipython_display_for_labml()

# The committed results that notebooks 02, 03, 06 and 07 read (trained models, the extrapolation experiment),
# shipped as package data: wherever aftalibi is installed, they are there, with no checkout and no network.
RESULTS_FOLDER = pathlib.Path(__file__).parent / "results"

# {public name: the module (notebook) that defines it}
_EXPORTS = {
    # softmax attention, the baseline (notebook 01)
    **dict.fromkeys(["attention_reference", "causal_mask", "MultiHeadAttention", "KVCache",
                     "SinusoidalPositionEncoding", "LearnedPositionEncoding", "RotaryPositionEncoding"], "attention"),
    # the Attention Free Transformer (notebook 02)
    **dict.fromkeys(["aft_reference", "aft_full", "aft_simple", "aft_local", "aft_conv", "aft_step", "AFTState",
                     "AFTFull", "AFTSimple", "AFTLocal", "AFTConv", "MinimalAFTLocal"], "aft"),
    # ALiBi (notebook 03)
    **dict.fromkeys(["get_slopes", "alibi_bias", "alibi_attention", "alibi_attention_reference",
                     "AlibiMultiHeadAttention", "MinimalAlibiAttention"], "alibi"),
    # the language model (notebook 04)
    **dict.fromkeys(["MIXERS", "POSITIONS", "ModelConfig", "LanguageModel", "generate"], "model"),
    # the data (notebook 05)
    **dict.fromkeys(["load_corpus", "Corpus", "CharTokenizer", "CorpusError"], "data"),
    # training (notebook 06)
    **dict.fromkeys(["TrainConfig", "PRESETS", "evaluate", "load_checkpoint", "model_from_checkpoint",
                     "CheckpointError"], "train"),
}

__all__ = ["__version__", "RESULTS_FOLDER", *_EXPORTS]


def __getattr__(name: str):
    """Import a public name from its module the first time it is asked for (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'aftalibi' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})

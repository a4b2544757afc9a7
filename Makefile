# Two commands do all the set-up on a fresh machine (see README.md):
#   make demo   runs the main job on the CPU default
#   make test   runs ruff and the test suite
# Both create ./.venv on first use and install exactly torch==2.13.0 (the CPU build) before the package.

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
export HF_HUB_OFFLINE = 1
export TOKENIZERS_PARALLELISM = false

.PHONY: install demo test bench lint clean

install: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

demo: install
	$(BIN)/whale train demo --out runs/demo $(if $(wildcard runs/demo/state.json),--resume)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python -m pytest benchmarks --benchmark-enable --benchmark-only -q

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache .benchmarks .hypothesis

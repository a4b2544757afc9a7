# Two commands do all the set-up on a fresh machine (see README.md):
#   make demo   runs the main job on the CPU default
#   make test   runs ruff and the test suite
# Both create ./.venv on first use and install exactly torch==2.13.0 (the CPU build) before the package.
# `make test` then runs the backend, RSFT and trainer tests a second time in ./.venv-pinned, on the
# transformers release the `gpu` extra resolves to (vllm 0.33 allows transformers>=5.16.1,<5.21), so a
# name that exists in only one of the two transformers versions fails CI (the fast ones: every API the
# slow ones use is exercised by a fast one too, and the slow ones would double CI time).

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
PINNED ?= .venv-pinned
# What `pip install --dry-run '.[gpu]'` resolves transformers to (re-check when the gpu extra changes).
PINNED_TRANSFORMERS = 5.20.2
PINNED_TESTS = tests/test_llm_backends.py tests/test_rsft.py tests/test_trainer.py tests/test_realmodel.py tests/test_vllm_push.py
export HF_HUB_OFFLINE = 1
export TOKENIZERS_PARALLELISM = false

.PHONY: install install-pinned demo test test-pinned bench lint clean

install: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install-pinned: $(PINNED)/.installed

$(PINNED)/.installed: setup.cfg pyproject.toml Makefile
	test -x $(PINNED)/bin/python || $(PYTHON) -m venv $(PINNED)
	$(PINNED)/bin/python -m pip install --quiet --upgrade pip
	$(PINNED)/bin/python -m pip install --quiet torch==2.13.0
	$(PINNED)/bin/python -m pip install --quiet -e '.[dev]' 'transformers==$(PINNED_TRANSFORMERS)'
	touch $@

demo: install
	$(BIN)/whale train demo --out runs/demo $(if $(wildcard runs/demo/state.json),--resume)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -q
	$(MAKE) test-pinned

test-pinned: install-pinned
	$(PINNED)/bin/python -c "import transformers as t; assert t.__version__ == '$(PINNED_TRANSFORMERS)', t.__version__"
	$(PINNED)/bin/python -m pytest -q -p no:cacheprovider -m "not slow" $(PINNED_TESTS)

bench: install
	$(BIN)/python -m pytest benchmarks --benchmark-enable --benchmark-only -q

clean:
	rm -rf $(VENV) $(PINNED) *.egg-info .pytest_cache .ruff_cache .benchmarks .hypothesis

